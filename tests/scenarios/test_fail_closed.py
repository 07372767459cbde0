"""Fail closed: hostd killed, hung or speaking garbage → 503 problems and /readyz false; then recovery."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import httpx
import trio

from agentic_sandbox.controller.config import load_config
from tests.controller.conftest import LiveController, LiveHostd, controller_env, provision, serve_controller
from tests.controller.http.test_problems import assert_problem

ADMIN_READS = ("/api/v2/admin/instances", "/api/v1/vms")


async def _readyz(client: httpx.AsyncClient) -> tuple[int, dict]:
    response = await client.get("/readyz")
    return response.status_code, response.json()


async def test_readyz_and_healthz_when_hostd_is_up(anon: httpx.AsyncClient) -> None:
    assert (await anon.get("/healthz")).json() == {"status": "alive"}
    assert await _readyz(anon) == (200, {"ready": True})


async def test_hostd_killed_mid_flight_then_back(
    admin: httpx.AsyncClient, hostd: LiveHostd, controller: LiveController
) -> None:
    iid = (await provision(admin, "survivor", start=True))["result"]["instance_id"]
    statuses: list[int] = []

    async def hammer(path: str) -> None:
        # Requests in flight while hostd dies: every answer is a success or a 503 problem.
        for _ in range(30):
            response = await admin.get(path)
            statuses.append(response.status_code)
            if response.status_code != 200:
                assert_problem(response, 503, "internal.unavailable")
            await trio.sleep(0)

    async with trio.open_nursery() as nursery:
        for path in ADMIN_READS * 2:
            nursery.start_soon(hammer, path)
        await trio.sleep(0.02)
        hostd.kill()
    assert set(statuses) <= {200, 503}

    # Down: readiness says why, every hostd-backed operation is a 503 problem, nothing falls back.
    status, body = await _readyz(admin)
    assert status == 503 and body["ready"] is False and body["reason"]
    for path in ADMIN_READS:
        problem = assert_problem(await admin.get(path), 503, "internal.unavailable")
        assert "hostd" in problem["detail"]
    assert_problem(await admin.get(f"/api/v2/admin/instances/{iid}"), 503, "internal.unavailable")
    assert_problem(
        await admin.post("/api/v2/admin/instances", json={"name": "while-down", "runtime": "host"}),
        503,
        "internal.unavailable",
    )
    assert_problem(await admin.post(f"/api/v2/admin/instances/{iid}/stop"), 503, "internal.unavailable")
    assert (await admin.get("/healthz")).status_code == 200
    metrics = (await admin.get("/metrics")).text
    assert "aiwg_hostd_up 0.0" in metrics

    # hostd comes back on the same state: the controller reconnects by itself.
    await hostd.start()
    with trio.fail_after(10):
        await controller.state.link.wait_ready()
    assert await _readyz(admin) == (200, {"ready": True})
    items = (await admin.get("/api/v2/admin/instances")).json()["items"]
    assert [(i["id"], i["name"]) for i in items] == [(iid, "survivor")]


async def test_hung_hostd_times_out_then_recovers(hostd: LiveHostd, tmp_path: Path) -> None:
    env = controller_env(tmp_path / "c", hostd.socket_path, AIWG_HOSTD_CALL_TIMEOUT_S="0.3")
    async with serve_controller(load_config(env=env)) as live, live.client() as admin:
        os.kill(hostd.pid, signal.SIGSTOP)
        try:
            with trio.fail_after(5):
                problem = assert_problem(await admin.get("/api/v2/admin/instances"), 503, "internal.unavailable")
            assert "0.3 s" in problem["detail"]  # the deadline passed
            with trio.fail_after(10):
                while (await _readyz(admin))[0] != 503:
                    await trio.sleep(0.05)
            assert "ping" in (await _readyz(admin))[1]["reason"] or "hostd" in (await _readyz(admin))[1]["reason"]
        finally:
            os.kill(hostd.pid, signal.SIGCONT)
        with trio.fail_after(10):
            await live.state.link.wait_ready()
        assert (await admin.get("/api/v2/admin/instances")).status_code == 200


async def test_garbage_speaking_peer_is_not_ready(short_dir: Path, tmp_path: Path) -> None:
    path = str(short_dir / "garbage.sock")
    listener = trio.socket.socket(trio.socket.AF_UNIX, trio.socket.SOCK_STREAM)
    await listener.bind(path)
    listener.listen(8)

    async def answer_garbage() -> None:
        while True:
            conn, _ = await listener.accept()
            with conn:
                await conn.send(b"\x00\x00\x00\x05garbage and more garbage")

    env = controller_env(tmp_path / "c", path)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(answer_garbage)
        async with serve_controller(load_config(env=env), wait_ready=False) as live, live.client() as admin:
            with trio.fail_after(10):
                while (await _readyz(admin))[1].get("reason", "").startswith("not connected"):
                    await trio.sleep(0.02)
            status, body = await _readyz(admin)
            assert status == 503 and body["ready"] is False
            assert "not connected" not in body["reason"], body
            assert_problem(await admin.get("/api/v2/admin/instances"), 503, "internal.unavailable")
        nursery.cancel_scope.cancel()
    listener.close()


async def test_controller_starts_before_hostd(hostd: LiveHostd, tmp_path: Path) -> None:
    await hostd.stop()
    env = controller_env(tmp_path / "c", hostd.socket_path)
    async with serve_controller(load_config(env=env), wait_ready=False) as live, live.client() as admin:
        status, body = await _readyz(admin)
        assert status == 503 and "does not exist" in body["reason"]
        await hostd.start()
        with trio.fail_after(10):
            await live.state.link.wait_ready()
        assert await _readyz(admin) == (200, {"ready": True})
