"""The controller restarted as a real process: operations and instances survive; hostd is untouched."""

from __future__ import annotations

import os
import signal
import stat
from pathlib import Path
from typing import Any

import httpx
import trio

from tests.controller.conftest import (
    ADMIN_TOKEN,
    ControllerProcess,
    LiveHostd,
    controller_env,
    provision,
    wait_operation,
)


def _client(url: str, token: str = ADMIN_TOKEN) -> httpx.AsyncClient:
    return httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=15)


async def _wait_ready(client: httpx.AsyncClient) -> None:
    with trio.fail_after(15):
        while (await client.get("/readyz")).status_code != 200:
            await trio.sleep(0.05)


def _without_url(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    # The AgentCard URL follows the address the client used; the new process has a new port.
    return [{k: v for k, v in item.items() if k != "agent_card_url"} for item in items]


async def test_operations_and_instances_survive_a_restart(hostd: LiveHostd, tmp_path: Path) -> None:
    env = controller_env(tmp_path / "c", hostd.socket_path)
    async with trio.open_nursery() as nursery:
        first = ControllerProcess(env)
        url = await first.start(nursery)
        async with _client(url) as client:
            await _wait_ready(client)
            running = await provision(client, "keeper", start=True)
            stopped = await provision(client, "sleeper")
            stop_op = await client.post(f"/api/v2/admin/instances/{running['result']['instance_id']}/restart")
            restart = await wait_operation(client, stop_op.json()["id"])
            ops = [running, stopped, restart]
            before = (await client.get("/api/v2/admin/instances")).json()["items"]
        assert await first.stop() == 0, first.output()
        hostd_pid = hostd.pid

        second = ControllerProcess(env)
        url = await second.start(nursery)
        async with _client(url) as client:
            await _wait_ready(client)
            for op in ops:
                response = await client.get(f"/api/v2/admin/operations/{op['id']}")
                assert response.status_code == 200
                assert response.json() == op
            after = (await client.get("/api/v2/admin/instances")).json()["items"]
            assert _without_url(after) == _without_url(before)
            assert {i["name"]: i["state"] for i in after} == {"keeper": "running", "sleeper": "stopped"}
        assert await second.stop() == 0, second.output()
        nursery.cancel_scope.cancel()
    assert hostd.pid == hostd_pid and hostd.proc.proc.poll() is None  # type: ignore[union-attr]


async def test_operation_cut_by_a_crash_is_failed_after_restart(hostd: LiveHostd, tmp_path: Path) -> None:
    env = controller_env(tmp_path / "c", hostd.socket_path)
    async with trio.open_nursery() as nursery:
        first = ControllerProcess(env)
        url = await first.start(nursery)
        async with _client(url) as client:
            await _wait_ready(client)
            os.kill(hostd.pid, signal.SIGSTOP)  # the provision call hangs in hostd...
            try:
                response = await client.post("/api/v2/admin/instances", json={"name": "cut", "runtime": "host"})
                assert response.status_code == 202
                op_id = response.json()["id"]
                await first.stop(signal.SIGKILL)  # ...and the controller dies meanwhile
            finally:
                os.kill(hostd.pid, signal.SIGCONT)

        second = ControllerProcess(env)
        url = await second.start(nursery)
        async with _client(url) as client:
            await _wait_ready(client)
            op = (await client.get(f"/api/v2/admin/operations/{op_id}")).json()
            assert op["state"] == "failed"
            assert op["error"]["code"] == "operation.interrupted"
            assert "completed_at" in op
            # The instance shows what hostd says (it may or may not have made it), never "provisioning".
            items = (await client.get("/api/v2/admin/instances")).json()["items"]
            assert all(i["state"] != "provisioning" for i in items), items
        assert await second.stop() == 0, second.output()
        nursery.cancel_scope.cancel()


async def test_dev_mode_token_file_and_dev_instance_once(hostd: LiveHostd, tmp_path: Path) -> None:
    env = controller_env(tmp_path / "c", hostd.socket_path)
    del env["AIWG_ADMIN_TOKEN"]
    token_file = tmp_path / "c" / "admin-token"
    async with trio.open_nursery() as nursery:
        first = ControllerProcess(env, dev=True)
        url = await first.start(nursery)
        with trio.fail_after(15):
            dev_id = await first.wait_line(r"dev instance:\s+dev (\S+) \(running\)")
            card = await first.wait_line(r"AgentCard:\s+(\S+)")
        assert card == f"{url}/agents/{dev_id}/.well-known/agent-card.json"
        assert stat.S_IMODE(token_file.stat().st_mode) == 0o600
        token = token_file.read_text().strip()
        assert f"admin token: {token_file}" in first.output()
        async with _client(url, token) as client:
            items = (await client.get("/api/v2/admin/instances")).json()["items"]
            assert [(i["id"], i["name"], i["state"]) for i in items] == [(dev_id, "dev", "running")]
        assert await first.stop() == 0

        second = ControllerProcess(env, dev=True)
        url = await second.start(nursery)
        with trio.fail_after(15):
            assert await second.wait_line(r"dev instance:\s+dev (\S+) \(running\)") == dev_id
        async with _client(url, token) as client:
            assert len((await client.get("/api/v2/admin/instances")).json()["items"]) == 1
        assert await second.stop() == 0
        nursery.cancel_scope.cancel()
