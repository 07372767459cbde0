"""hostd's failures translated once (controller.hostlink): every explicit answer pinned code by code
to the controller error it becomes, an unknown code failing closed, a limit hostd names becoming a
429 that names it; then live: a real hostd with small limits behind a real controller answers a full
session table 429 over the admin API. (The link's streams and posted writes run against a real hostd
in tests/controller/pty/ and the admin tests; the A2A and pty-ws/v1 limit answers in
tests/controller/a2a/test_errors.py and tests/controller/pty/test_launch.py.)"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from agentic_sandbox.controller.config import load_config
from agentic_sandbox.controller.errors import (
    Conflict,
    InvalidState,
    LimitReached,
    NotFound,
    OperationFailed,
    Unavailable,
    Unimplemented,
    ValidationFailed,
)
from agentic_sandbox.controller.hostlink import hostd_failure
from agentic_sandbox.proto import ErrorCode, HostdRemoteError, Limit

from .conftest import LiveController, LiveHostd, controller_env, provision, serve_controller
from .http.test_problems import assert_problem

#: Every hostd error code and the controller error it becomes (class, code); a new hostd code must
#: be placed here, so that nothing is translated by accident.
TRANSLATED = {
    ErrorCode.INSTANCE_NOT_FOUND: (NotFound, "instance.not_found"),
    ErrorCode.INSTANCE_EXISTS: (Conflict, "instance.already_exists"),
    ErrorCode.INSTANCE_INVALID_STATE: (InvalidState, "instance.invalid_state"),
    ErrorCode.INSTANCE_SLEEPING: (InvalidState, "instance.sleeping"),
    ErrorCode.INSTANCE_WAKE_FAILED: (Unavailable, "instance.wake_failed"),
    ErrorCode.INSTANCE_BUSY: (Conflict, "instance.busy"),
    ErrorCode.WORKING_DIR_NOT_FOUND: (ValidationFailed, "validation.failed"),
    ErrorCode.REQUEST_INVALID: (ValidationFailed, "validation.failed"),
    ErrorCode.SPAWN_FAILED: (OperationFailed, "instance.spawn_failed"),
    ErrorCode.PROVIDER_UNAVAILABLE: (Unavailable, "runtime.unavailable"),
    ErrorCode.IMAGE_NOT_FOUND: (ValidationFailed, "validation.failed"),
    ErrorCode.PROVIDER_FAILED: (OperationFailed, "runtime.provider_failed"),
    ErrorCode.CHECKPOINT_NOT_FOUND: (NotFound, "checkpoint.not_found"),
    ErrorCode.POOL_NOT_FOUND: (NotFound, "warm_pool.not_found"),
    ErrorCode.POOL_EMPTY: (Conflict, "warm_pool.empty"),
    ErrorCode.UNSUPPORTED: (Unimplemented, "capability.unsupported"),
    ErrorCode.SESSION_NOT_FOUND: (NotFound, "session.not_found"),
    ErrorCode.SESSION_EXITED: (InvalidState, "session.exited"),
    ErrorCode.SESSION_PENDING: (InvalidState, "session.pending"),
    # A limit hostd does not name (an older hostd): still an answer, not an outage.
    ErrorCode.LIMIT_REACHED: (LimitReached, "limit.reached"),
    # An upgrade in place: not done, to send again to the new image.
    ErrorCode.RESTARTING: (Unavailable, "hostd.restarting"),
}
#: What fails closed: hostd shutting down, broken, or asked what it cannot place.
UNAVAILABLE_CODES = {
    ErrorCode.PROTOCOL_VERSION_MISMATCH,
    ErrorCode.PROTOCOL_MALFORMED_FRAME,
    ErrorCode.PROTOCOL_FRAME_TOO_LARGE,
    ErrorCode.PROTOCOL_HELLO_REQUIRED,
    ErrorCode.PROTOCOL_DUPLICATE_ID,
    ErrorCode.PEER_REFUSED,
    ErrorCode.INPUT_TOO_LARGE,
    ErrorCode.SIGNAL_UNKNOWN,
    ErrorCode.SEQ_OUT_OF_RANGE,
    ErrorCode.EXEC_NOT_FOUND,
    ErrorCode.EXEC_EXITED,
    ErrorCode.CONTROL_UNAVAILABLE,
    ErrorCode.SHUTTING_DOWN,
    ErrorCode.UPGRADE_REFUSED,
    ErrorCode.INTERNAL,
}


@pytest.mark.parametrize("code", list(ErrorCode), ids=lambda code: code.value)
def test_every_hostd_error_code_has_its_one_translation(code: ErrorCode) -> None:
    assert set(TRANSLATED) | UNAVAILABLE_CODES == set(ErrorCode)
    error = hostd_failure(HostdRemoteError(code.value, "what hostd said", {}))
    expected_class, expected_code = TRANSLATED.get(code, (Unavailable, "internal.unavailable"))
    assert (type(error), error.code) == (expected_class, expected_code)
    assert error.details["hostd_code"] == code.value
    if code in TRANSLATED:
        assert error.message == "what hostd said"
    else:
        assert error.message == f"hostd refused the call: {code.value}: what hostd said"


@pytest.mark.parametrize(
    ("code", "field"), [(ErrorCode.WORKING_DIR_NOT_FOUND, "working_dir"), (ErrorCode.IMAGE_NOT_FOUND, "image")]
)
def test_invalid_answers_name_their_field(code: ErrorCode, field: str) -> None:
    error = hostd_failure(HostdRemoteError(code.value, "no such thing", {}))
    assert error.fields == [{"field": field, "message": "no such thing", "code": code.value}]
    assert hostd_failure(HostdRemoteError(ErrorCode.REQUEST_INVALID.value, "bad", {})).fields == []


def test_an_unknown_code_fails_closed() -> None:
    error = hostd_failure(HostdRemoteError("something.new", "from a newer hostd", {}))
    assert (type(error), error.code) == (Unavailable, "internal.unavailable")


@pytest.mark.parametrize(
    ("limit", "retry_after_s", "words"),
    [
        (
            Limit(name="sessions", limit=3, setting="AIWG_MAX_SESSIONS", retry_after_s=5),
            5,
            "set by AIWG_MAX_SESSIONS on hostd",
        ),
        (Limit(name="exited_execs", limit=12, setting="AIWG_MAX_EXECS"), None, "set by AIWG_MAX_EXECS on hostd"),
        (Limit(name="checkpoints", limit=256), None, "fixed in hostd"),
    ],
)
def test_a_named_limit_is_a_limit_answer_naming_it(limit: Limit, retry_after_s: int | None, words: str) -> None:
    error = hostd_failure(HostdRemoteError(ErrorCode.LIMIT_REACHED.value, "full", {**limit.details(), "extra": 1}))
    assert isinstance(error, LimitReached)
    assert error.code == f"limit.{limit.name}"
    assert error.message == f"full (limit {limit.limit}, {words})"
    assert error.retry_after_s == retry_after_s  # only where waiting helps
    assert error.details["hostd_code"] == "limit.reached" and error.details["limit"] == str(limit.limit)
    assert error.details.get("setting") == (limit.setting or None)


# -- live: a hostd with small limits behind a real controller ---------------------------------------


@asynccontextmanager
async def small_limits(base: Path, state_dir: Path, **controller: str) -> AsyncIterator[LiveController]:
    """A real hostd that runs one session and one exec at a time, and a controller in front of it."""
    hostd = LiveHostd(base, env={"AIWG_MAX_SESSIONS": "1", "AIWG_MAX_EXECS": "1"})
    await hostd.start()
    try:
        async with serve_controller(
            load_config(env=controller_env(state_dir, hostd.socket_path, **controller))
        ) as live:
            yield live
    finally:
        await hostd.close()


async def test_full_tables_are_429_over_the_admin_api(short_dir: Path, tmp_path: Path) -> None:
    async with small_limits(short_dir, tmp_path / "controller") as live, live.client() as admin:
        op = await provision(admin, "limits", start=True)
        sessions = f"/api/v2/admin/instances/{op['result']['instance_id']}/sessions"
        first = await admin.post(sessions, json={"argv": ["/bin/cat"]})
        assert first.status_code == 201, first.text

        full = await admin.post(sessions, json={"argv": ["/bin/cat"]})
        body = assert_problem(full, 429, "limit.sessions")
        assert body["detail"] == "at most 1 sessions may run at once (limit 1, set by AIWG_MAX_SESSIONS on hostd)"
        assert full.headers["Retry-After"] == "5"  # a session that ends frees its slot

        # Pending sessions have a table of their own: one may wait, the next is refused.
        assert (await admin.post(sessions, json={"argv": ["/bin/cat"], "start": False})).status_code == 201
        waiting = await admin.post(sessions, json={"argv": ["/bin/cat"], "start": False})
        body = assert_problem(waiting, 429, "limit.pending_sessions")
        assert "limit 1, set by AIWG_MAX_SESSIONS" in body["detail"] and waiting.headers["Retry-After"] == "5"

        # It was the limit, not an outage: the slot the first session frees is taken at once.
        deleted = await admin.delete(f"{sessions}/{first.json()['id']}")
        assert deleted.status_code in (200, 204), deleted.text
        assert (await admin.post(sessions, json={"argv": ["/bin/cat"]})).status_code == 201
        assert (await admin.get("/readyz")).status_code == 200
