"""The controller started exactly as upstream's CI starts upstream's server: its variables and a
secrets directory only, then the preflight its conformance harness runs.

hostd runs beside it as its systemd unit would (upstream's one binary is our two daemons), with
podman and libvirt's test hypervisor, so the conformance fleet of three spans the three runtimes.
"""

from __future__ import annotations

import socket
from pathlib import Path

import httpx
import pytest
import trio

from agentic_sandbox.controller.config import load_config
from tests.controller.conftest import ControllerProcess, LiveHostd, controller_env, serve_controller
from tests.libvirt_service import fake_guest_image
from tests.podman_service import PodmanStorage

ADMIN = "conformance-admin-" + "c" * 24
FLEET = [f"00000000-0000-7000-8000-{n:012d}" for n in (1, 2, 3)]


def three_free_ports() -> int:
    """P with P, P+1 and P+2 free on loopback (upstream's layout: gRPC, WS, HTTP)."""
    for _ in range(50):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        if port + 2 > 65535:
            continue
        try:
            held = []
            for offset in (0, 1, 2):
                s = socket.socket()
                held.append(s)
                s.bind(("127.0.0.1", port + offset))
            return port
        except OSError:
            continue
        finally:
            for s in held:
                s.close()
    raise RuntimeError("no three consecutive free ports")


def listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


async def test_the_preflight_of_upstreams_ci(short_dir: Path, tmp_path: Path, podman_storage: PodmanStorage) -> None:
    hostd_env = podman_storage.hostd_env(short_dir / "podman.sock")
    hostd_env.update(AIWG_LIBVIRT_URI="test:///default", AIWG_VM_IMAGE_DIR=str(fake_guest_image(tmp_path / "image")))
    hostd = LiveHostd(short_dir, env=hostd_env)
    await hostd.start()
    try:
        secrets = tmp_path / "secrets"
        secrets.mkdir()
        (secrets / "operator-tokens.toml").write_text(f'[[tokens]]\ntoken = "{ADMIN}"\nrole = "admin"\n')
        (secrets / "operator-tokens.toml").chmod(0o600)
        port = three_free_ports()
        env = {
            "LISTEN_ADDR": f"127.0.0.1:{port}",
            "SECRETS_DIR": str(secrets),
            "AIWG_CONFORMANCE_MODE": "1",
            "AIWG_CONFORMANCE_FLEET_SIZE": "3",
            # Where this host keeps its state and finds hostd (the unit files' defaults elsewhere).
            "AIWG_STATE_DIR": str(tmp_path / "state"),
            "AIWG_HOSTD_SOCKET": hostd.socket_path,
        }
        controller = ControllerProcess(env)
        async with trio.open_nursery() as nursery:
            url = await controller.start(nursery)
            assert url == f"http://127.0.0.1:{port + 2}"  # HTTP on P+2
            with trio.fail_after(10):
                while not (listening(port) and listening(port + 1)):  # gRPC on P, the v1 WS on P+1
                    await trio.sleep(0.05)
            async with httpx.AsyncClient(base_url=url, timeout=20) as anon:
                health = await anon.get("/healthz/http")
                assert (health.status_code, health.json()) == (200, {"status": "alive"})
                assert (await anon.get("/api/v2/admin/instances")).status_code == 401
                refused = await anon.get(f"/agents/{FLEET[0]}/v1/tasks")
                assert refused.status_code == 401 and refused.headers["www-authenticate"].startswith("Bearer")
            admin = httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {ADMIN}"}, timeout=20)
            async with admin:
                with trio.fail_after(90):  # the three provisions run side by side
                    while True:
                        items = (await admin.get("/api/v2/admin/instances")).json()["items"]
                        fleet = {i["id"]: i for i in items if i["id"] in FLEET}
                        if len(fleet) == 3 and all(i["state"] == "running" for i in fleet.values()):
                            break
                        assert not any(i["state"] == "failed" for i in fleet.values()), fleet
                        await trio.sleep(0.2)
                assert [fleet[i]["runtime"] for i in FLEET] == ["host", "docker", "qemu"]
                for instance_id in FLEET:
                    card = await admin.get(f"/agents/{instance_id}/.well-known/agent-card.json")
                    assert card.status_code == 200 and card.json()["signatures"], card.text
                # A minimal send, as the harness sends it: no A2A-Extensions (conformance mode).
                body = {"message": {"messageId": "m-1", "role": "user", "parts": [{"kind": "text", "text": "hi"}]}}
                sent = await admin.post(f"/agents/{FLEET[0]}/v1/messages:send", json=body)
                assert sent.status_code in (200, 202), sent.text
            assert await controller.stop() == 0
    finally:
        await hostd.close()


async def test_a_host_without_containers_or_vms_still_serves_its_host_member(
    hostd: LiveHostd, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    env = controller_env(tmp_path / "c", hostd.socket_path, AIWG_CONFORMANCE_MODE="1", AIWG_CONFORMANCE_FLEET_SIZE="3")
    async with serve_controller(load_config(env=env)) as live, live.client() as admin:
        with trio.fail_after(30):
            while True:
                items = {i["id"]: i for i in (await admin.get("/api/v2/admin/instances")).json()["items"]}
                running = items.get(FLEET[0], {}).get("state") == "running"
                if running and "'conformance-2'" in caplog.text and "'conformance-3'" in caplog.text:
                    break
                await trio.sleep(0.1)
        assert "runtime.unavailable" in caplog.text  # each failed member says why
        assert (await admin.get("/healthz/http")).status_code == 200  # the controller still serves
        card = await admin.get(f"/agents/{FLEET[0]}/.well-known/agent-card.json")
        assert card.status_code == 200
