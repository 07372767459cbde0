"""Starting a pending session from pty-ws/v1 (controller.pty.launch): a start that hostd refuses
because its session table is full is ``RATE_LIMITED``, retryable, the limit itself named in the
frame's ``a2a_error``; the session stays pending and starts once a slot is free. A real hostd that
runs one session at a time, the controller on hypercorn, `websockets` clients whose every JSON frame
is validated against upstream's schemas."""

from __future__ import annotations

from pathlib import Path

from agentic_sandbox.controller.errors import LimitReached, Unavailable, ValidationFailed
from agentic_sandbox.controller.pty.launch import start_failure
from tests.controller.conftest import provision
from tests.controller.test_hostlink import small_limits

from .conftest import Instance
from .wsclient import cframe


def test_start_failures_as_the_binding_says_them() -> None:
    full = start_failure(LimitReached("limit.sessions", "full", retry_after_s=5), "r1")
    assert (full.code, full.retryable, full.request_id) == ("RATE_LIMITED", True, "r1")
    assert full.a2a_error is not None and full.a2a_error["status"] == "RESOURCE_EXHAUSTED"
    fixed = start_failure(LimitReached("limit.exited_sessions", "kept"), None)
    assert (fixed.code, fixed.retryable) == ("RATE_LIMITED", False)  # waiting does not help
    away = start_failure(Unavailable("internal.unavailable", "gone"), None)
    assert (away.code, away.retryable, away.a2a_error) == ("INTERNAL", True, None)
    bad = start_failure(ValidationFailed([], "no"), None)
    assert (bad.code, bad.retryable) == ("INVALID_REQUEST", False)


async def test_a_start_past_the_session_limit_is_rate_limited(short_dir: Path, tmp_path: Path) -> None:
    async with small_limits(short_dir, tmp_path / "controller") as live, live.client() as admin:
        op = await provision(admin, "limits-pty", start=True)
        instance = Instance(live, admin, str(op["result"]["instance_id"]))
        running = await instance.session(["/bin/cat"])
        created = await admin.post(
            f"/api/v2/admin/instances/{instance.id}/sessions", json={"argv": ["/bin/cat"], "start": False}
        )
        assert created.status_code == 201, created.text
        ws = await instance.attach(created.json()["id"])

        await ws.send(cframe("pty.join_session", {"role": "controller"}))
        error = (await ws.error())["payload"]
        assert (error["code"], error["retryable"]) == ("RATE_LIMITED", True), error
        assert "AIWG_MAX_SESSIONS" in error["message"]
        a2a = error["a2a_error"]
        assert (a2a["code"], a2a["status"]) == (429, "RESOURCE_EXHAUSTED")
        [info] = [d for d in a2a["details"] if d["@type"].endswith("ErrorInfo")]
        assert (info["metadata"]["code"], info["metadata"]["limit"]) == ("limit.sessions", "1")
        assert {"@type": "type.googleapis.com/google.rpc.RetryInfo", "retryDelay": "5s"} in a2a["details"]

        # The session still waits; once the running one is gone the same socket starts it.
        deleted = await admin.delete(f"/api/v2/admin/instances/{instance.id}/sessions/{running}")
        assert deleted.status_code in (200, 204), deleted.text
        assert (await ws.join())["role"] == "controller"
        await ws.close()
