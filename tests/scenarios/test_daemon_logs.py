"""Both daemons' logs for real: JSON lines with the ids they concern, and never a secret.

A hostd process and a controller process run with ``AIWG_LOG_FORMAT=json`` at DEBUG; the test drives
provisioning, lifecycle verbs, storage, sessions and execs with the admin and operator tokens (and
a wrong one), passes secret values in instance, session and exec environments, then reads every
line both processes wrote.
"""

from __future__ import annotations

import json
import os
import secrets
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from agentic_sandbox.proto import HostdRemoteError, new_id, open_hostd
from agentic_sandbox.proto import messages as m
from tests.controller.conftest import (
    ADMIN_TOKEN,
    OPERATOR_TOKEN,
    ControllerProcess,
    LiveHostd,
    controller_env,
    provision,
    wait_operation,
)
from tests.hostd_process import ROOT

JSON_DEBUG = {"AIWG_LOG_FORMAT": "json", "AIWG_LOG_LEVEL": "DEBUG"}
WRONG_TOKEN = "wrong-token-" + "w" * 24
SECRET_ENV = {"AIWG_TEST_SECRET": "env-secret-" + "s" * 20, "API_KEY": "env-api-key-" + "k" * 20}
SECRETS = [ADMIN_TOKEN, OPERATOR_TOKEN, WRONG_TOKEN, *SECRET_ENV.values()]


def _client(url: str, token: str | None) -> httpx.AsyncClient:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return httpx.AsyncClient(base_url=url, headers=headers, timeout=15)


def _parse(lines: list[str], who: str) -> list[dict[str, Any]]:
    records = []
    for line in lines:
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError:
            raise AssertionError(f"{who} wrote a line that is not JSON: {line!r}") from None
        assert {"time", "level", "logger", "message"} <= set(record), (who, record)
        records.append(record)
    return records


async def _drive_hostd(socket_path: str) -> tuple[str, str, str]:
    """Secrets in an instance's, a session's and an exec's environment; returns their ids."""
    async with open_hostd(socket_path, client_name="test-logs") as client:
        iid = new_id()
        await client.call(m.InstanceProvisionRequest(instance_id=iid, name="env-holder", env=SECRET_ENV, start=True))
        sid = (
            await client.call(m.SessionCreateRequest(instance_id=iid, argv=["sh", "-c", "exit 3"], env=SECRET_ENV))
        ).session.session_id
        xid = (
            await client.call(m.ExecStartRequest(instance_id=iid, argv=["sh", "-c", "exit 0"], env=SECRET_ENV))
        ).exec.exec_id
        with pytest.raises(HostdRemoteError):  # a spawn that fails
            await client.call(m.SessionCreateRequest(instance_id=iid, argv=["/nonexistent/cmd"], env=SECRET_ENV))
        with trio.fail_after(10):
            while (await client.call(m.ExecGetRequest(exec_id=xid))).exec.state != "exited":
                await trio.sleep(0.05)
            while (await client.call(m.SessionGetRequest(session_id=sid))).session.state != "exited":
                await trio.sleep(0.05)
        await client.call(m.SessionDeleteRequest(session_id=sid))
        await client.call(m.ExecDeleteRequest(exec_id=xid))
    return iid, sid, xid


async def _drive_controller(url: str, trace: str) -> tuple[str, str]:
    """Admin calls with both tokens and a wrong one; returns the traced provision's op and instance."""
    async with _client(url, ADMIN_TOKEN) as admin, _client(url, OPERATOR_TOKEN) as operator:
        with trio.fail_after(15):
            while (await admin.get("/readyz")).status_code != 200:
                await trio.sleep(0.05)
        response = await admin.post(
            "/api/v2/admin/instances",
            json={"name": "logged", "runtime": "host", "start": True},
            headers={"traceparent": f"00-{trace}-{'1' * 16}-01"},
        )
        assert response.status_code == 202, response.text
        op = await wait_operation(admin, response.json()["id"])
        assert op["state"] == "succeeded", op
        iid = op["result"]["instance_id"]
        assert (await operator.get("/api/v2/admin/instances")).status_code == 200
        for verb in ("stop", "start", "restart"):
            done = await wait_operation(
                operator, (await operator.post(f"/api/v2/admin/instances/{iid}/{verb}")).json()["id"]
            )
            assert done["state"] == "succeeded", done
        box = f"/api/v2/admin/storage/outbox/{iid}/note.txt"
        assert (await operator.put(box, json={"content": "hello"})).status_code == 201
        assert (await operator.get(box)).status_code == 200
        assert (await admin.delete(box)).status_code == 204
        assert (await admin.get("/metrics")).status_code == 200  # reconciles: adopts hostd's own instance
        assert (await operator.options("/api/v2/admin/instances")).status_code == 204
        async with _client(url, WRONG_TOKEN) as wrong, _client(url, None) as anon:
            assert (await wrong.get("/api/v2/admin/instances")).status_code == 401
            assert (await wrong.post("/api/v2/admin/instances", json={})).status_code == 401
            assert (await anon.options("/api/v1/agents")).status_code == 401
        assert (await operator.delete(f"/api/v2/admin/instances/{iid}?force=true")).status_code == 403
        other = (await provision(admin, "second"))["result"]["instance_id"]
        for gone in (iid, other):
            done = await wait_operation(
                admin, (await admin.post(f"/api/v2/admin/instances/{gone}/destroy")).json()["id"]
            )
            assert done["state"] == "succeeded", done
    return op["id"], iid


async def test_logs_are_json_with_ids_and_never_hold_a_secret(short_dir: Path) -> None:
    hostd = LiveHostd(short_dir)
    hostd.proc.env.update(JSON_DEBUG)
    await hostd.start()
    trace = secrets.token_hex(16)
    try:
        async with trio.open_nursery() as nursery:
            controller = ControllerProcess(controller_env(short_dir / "controller", hostd.socket_path, **JSON_DEBUG))
            url = await controller.start(nursery)
            env_iid, sid, xid = await _drive_hostd(hostd.socket_path)
            op_id, iid = await _drive_controller(url, trace)
            assert await controller.stop() == 0, controller.output()
            nursery.cancel_scope.cancel()
    finally:
        await hostd.close()

    controller_log = _parse(controller.lines, "the controller")
    hostd_log = _parse(hostd.proc.log_path.read_text().splitlines(), "hostd")
    everything = "\n".join(controller.lines) + "\n" + hostd.proc.log_path.read_text()
    for secret in SECRETS:
        assert secret not in everything, f"a secret reached the logs: {secret[:12]}..."
    # The env file really held the values (so the check above could have failed).
    assert all(len(v) > 20 for v in SECRET_ENV.values())

    # The controller: the traced request's operation names both ids, and the instance.
    assert any(
        r.get("operation_id") == op_id and r.get("request_id") == trace and r.get("instance_id") == iid
        for r in controller_log
    ), [r for r in controller_log if r.get("operation_id") == op_id]
    assert any(r["message"].startswith("agentic-controller listening on") for r in controller_log)
    # hostd: the provision that request caused carries its id (the trace id travels over RPC) ...
    assert any(
        r.get("request_id") == trace and r.get("instance_id") == iid and "InstanceProvision" in r["message"]
        for r in hostd_log
    ), [r for r in hostd_log if r.get("request_id") == trace]
    # ... and lines about a session or an exec name it (and its instance), also in their own tasks.
    session_lines = [r for r in hostd_log if r.get("session_id") == sid]
    ended = [r for r in session_lines if " ended" in r["message"]]  # logged by the session's own task
    assert ended and ended[0].get("instance_id") == env_iid, session_lines
    assert any(r.get("exec_id") == xid for r in hostd_log)


@pytest.mark.parametrize("module", ["agentic_sandbox.hostd.main", "agentic_sandbox.controller.main"])
def test_a_bad_log_format_is_a_configuration_error(module: str, short_dir: Path) -> None:
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "AIWG_STATE_DIR": str(short_dir / "state"),
        "AIWG_HOSTD_SOCKET": str(short_dir / "hostd.sock"),
        "AIWG_LOG_FORMAT": "yaml",
    }
    done = subprocess.run(
        [sys.executable, "-m", module, "--dev"], env=env, cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 2, done
    assert "configuration error" in done.stderr and "AIWG_LOG_FORMAT='yaml'" in done.stderr, done.stderr
    assert not (short_dir / "hostd.sock").exists()


@pytest.mark.parametrize(
    ("setting", "says"),
    [
        ("AIWG_GRPC_LISTEN", "gRPC cannot listen on {taken}: Address already in use (AIWG_GRPC_LISTEN)"),
        ("AIWG_LISTEN", "cannot listen on {taken}: Address already in use (AIWG_LISTEN)"),
        ("AIWG_LEGACY_PTY_LISTEN", "cannot listen on {taken}: Address already in use (AIWG_LEGACY_PTY_LISTEN)"),
    ],
)
def test_a_taken_port_is_one_line_and_exit_1(tmp_path: Path, setting: str, says: str) -> None:
    """An address in use: one error line naming it, its setting and why, no traceback, exit 1, and
    nothing printed as listening (the controller stops before saying anything)."""
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        taken = f"127.0.0.1:{holder.getsockname()[1]}"
        env = {
            **os.environ,
            "PYTHONPATH": str(ROOT),
            **controller_env(tmp_path / "state", str(tmp_path / "no-hostd.sock"), **{setting: taken}),
        }
        done = subprocess.run(
            [sys.executable, "-m", "agentic_sandbox.controller.main"],
            env=env,
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert done.returncode == 1, done
    assert "Traceback" not in done.stderr and "listening on" not in done.stdout + done.stderr, done
    errors = [line for line in done.stderr.splitlines() if " ERROR " in line]
    assert len(errors) == 1, done.stderr
    assert errors[0].endswith(says.format(taken=taken)), errors
