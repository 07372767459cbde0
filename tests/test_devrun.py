"""``make run``'s wrapper: both halves start, and every way of stopping it stops both."""

from __future__ import annotations

import importlib.util
import os
import re
import select
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest
import trio

from tests.hostd_process import ROOT
from tests.podman_service import podman_available
from tests.processes import alive
from tests.shells import type_into_a_session


def devrun_module() -> Any:
    """scripts/devrun.py as a module (the script is not a package)."""
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        spec = importlib.util.spec_from_file_location("devrun", ROOT / "scripts" / "devrun.py")
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    return module


def devrun_podman_env(state_dir: str) -> dict[str, str]:
    """scripts/devrun.py's podman settings for ``state_dir``."""
    result: dict[str, str] = devrun_module().podman_env(state_dir)
    return result


def test_the_wrapper_finds_the_controller_where_upstreams_listen_addr_puts_it() -> None:
    base_url = devrun_module()._base_url
    assert base_url({}) == "http://127.0.0.1:8122"
    assert base_url({"LISTEN_ADDR": "127.0.0.1:9120"}) == "http://127.0.0.1:9122"
    assert base_url({"LISTEN_ADDR": "127.0.0.1:9120", "AIWG_LISTEN": "127.0.0.1:7000"}) == "http://127.0.0.1:7000"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start(tmp_path: Path) -> tuple[subprocess.Popen[bytes], str]:
    port = _free_port()
    env = {
        **os.environ,
        "AIWG_STATE_DIR": str(tmp_path / "run"),
        "AIWG_LISTEN": f"127.0.0.1:{port}",
        "AIWG_CGROUP_ROOT": "off",
        "AIWG_LIBVIRT_URI": "",  # no VM setup (libvirt daemons, guest image) for the wrapper's tests
        "PYTHONPATH": str(ROOT),
    }
    proc = subprocess.Popen(
        [sys.executable, str(ROOT / "scripts" / "devrun.py")],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        cwd=tmp_path,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.stdout.read().decode() if proc.stdout else ""
        try:
            if httpx.get(f"{url}/readyz", timeout=1).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    proc.kill()
    raise AssertionError("make run's controller never became ready")


def cleanup(proc: subprocess.Popen[bytes], children: set[int], tmp_path: Path) -> None:
    """Whatever a wrapper test left running goes (by SIGKILL), with the podman run root it made."""
    for pid in alive(children):
        os.kill(pid, signal.SIGKILL)
    if proc.poll() is None:
        proc.kill()
        proc.wait()
    if proc.stdout is not None:
        proc.stdout.close()
    # The wrapper gave hostd a podman service whose run root lives in /tmp, not in tmp_path.
    shutil.rmtree(devrun_podman_env(str(tmp_path / "run"))["AIWG_PODMAN_RUNROOT"], ignore_errors=True)


def _read_until(proc: subprocess.Popen[bytes], pattern: re.Pattern[bytes], timeout: float = 30) -> str:
    """What the wrapper printed, read until ``pattern`` matches it (or the time is up)."""
    assert proc.stdout is not None
    said = b""
    deadline = time.monotonic() + timeout
    while pattern.search(said) is None and time.monotonic() < deadline:
        ready, _, _ = select.select([proc.stdout], [], [], 0.2)
        if ready:
            said += os.read(proc.stdout.fileno(), 65536)
    return said.decode(errors="replace")


@pytest.mark.parametrize(
    "signals", [[signal.SIGINT], [signal.SIGTERM, signal.SIGTERM]], ids=["ctrl-c", "sigterm-twice"]
)
def test_stopping_the_wrapper_stops_both_halves(tmp_path: Path, signals: list[int]) -> None:
    proc, url = _start(tmp_path)
    children = {p.pid for p in psutil.Process(proc.pid).children()}
    try:
        assert len(children) == 2
        token = (tmp_path / "run" / "admin-token").read_text().strip()
        assert oct((tmp_path / "run" / "admin-token").stat().st_mode & 0o777) == "0o600"
        listed = httpx.get(f"{url}/api/v2/admin/instances", headers={"Authorization": f"Bearer {token}"})
        assert [item["name"] for item in listed.json()["items"]] == ["dev"]
        dev_id = listed.json()["items"][0]["id"]
        token_file = tmp_path / "run" / "instances" / "dev.token"
        deadline = time.monotonic() + 30
        while not token_file.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert oct(token_file.stat().st_mode & 0o777) == "0o600"
        said = _read_until(proc, re.compile(rb"web console: .*\n"))
        assert f"web console: {url}/console/  (sign in with the admin token in {tmp_path / 'run' / 'admin-token'})" in (
            said
        ), said
        card = httpx.get(
            f"{url}/agents/{dev_id}/extendedAgentCard",
            headers={"Authorization": f"Bearer {token_file.read_text().strip()}", "A2A-Version": "1.0"},
        )
        assert card.status_code == 200, card.text
        for sig in signals:  # `timeout` signals the wrapper twice: directly and through its group
            proc.send_signal(sig)
            time.sleep(0.02)  # the second one lands while the wrapper is stopping the controller
        assert proc.wait(30) == 0
        assert not alive(children), "a half of make run outlived the wrapper"

        assert not (tmp_path / "run" / "hostd.sock").exists()
    finally:
        cleanup(proc, children, tmp_path)


@pytest.mark.podman
def test_make_run_serves_a_busybox_container(tmp_path: Path) -> None:
    """Dev mode brings podman up by itself: a podman service on a private socket, the busybox image
    built locally, the built-in busybox loadout; a container reaches running and a session in it
    answers typed commands."""
    missing = podman_available()
    if missing is not None:
        pytest.skip(missing)
    proc, url = _start(tmp_path)
    runroot = devrun_podman_env(str(tmp_path / "run"))["AIWG_PODMAN_RUNROOT"]
    try:
        token = (tmp_path / "run" / "admin-token").read_text().strip()
        with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=30) as admin:
            response = admin.post(
                "/api/v2/admin/instances", json={"name": "c1", "runtime": "container", "loadout": "busybox"}
            )
            assert response.status_code == 202, response.text
            op_path = f"/api/v2/admin/operations/{response.json()['id']}"
            deadline = time.monotonic() + 60
            while (op := admin.get(op_path).json())["state"] in ("pending", "running"):
                assert time.monotonic() < deadline, op
                time.sleep(0.1)
            assert op["state"] == "succeeded", op
            iid = op["result"]["instance_id"]
            assert admin.get(f"/api/v2/admin/instances/{iid}").json()["state"] == "running"
            out = trio.run(type_into_a_session, str(tmp_path / "run" / "hostd.sock"), iid)
            assert b"42-typed" in out
            assert admin.delete(f"/api/v2/admin/instances/{iid}", params={"force": "true"}).status_code == 202
            while admin.get(f"/api/v2/admin/instances/{iid}").status_code != 404:
                assert time.monotonic() < deadline
                time.sleep(0.1)
        proc.send_signal(signal.SIGINT)
        assert proc.wait(30) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()
        shutil.rmtree(runroot, ignore_errors=True)


def test_the_wrapper_finds_the_admin_token_where_the_controller_takes_it(tmp_path: Path) -> None:
    admin_token = devrun_module().admin_token
    secrets = tmp_path / "secrets"
    secrets.mkdir()
    env = {"AIWG_STATE_DIR": str(tmp_path / "run"), "SECRETS_DIR": str(secrets)}
    with pytest.raises(FileNotFoundError):
        admin_token(env)
    tokens = secrets / "operator-tokens.toml"
    tokens.write_text('[[tokens]]\ntoken = "an-operator-token-12345"\nrole = "operator"\n')
    with pytest.raises(FileNotFoundError, match="no admin token"):
        admin_token(env)
    tokens.write_text(tokens.read_text() + '[[tokens]]\ntoken = "the-admin-token-123456"\nrole = "admin"\n')
    assert admin_token(env) == ("the-admin-token-123456", str(tokens))
    (secrets / "admin.token").write_text("from-the-file-0123456\n")
    assert admin_token(env) == ("from-the-file-0123456", str(secrets / "admin.token"))
    assert admin_token({**env, "AIWG_ADMIN_TOKEN": "x" * 16}) == ("x" * 16, "$AIWG_ADMIN_TOKEN")
