"""HostdLink's session output and posted writes over a scripted client: stream overflows resumed
where they stopped, a start hostd no longer holds as a lag (or an error), every proto failure a
ControllerError; a posted write's failure given to its callback translated."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import aclosing, asynccontextmanager
from typing import Any

import pytest

from agentic_sandbox.controller.errors import (
    Conflict,
    ControllerError,
    InvalidState,
    NotFound,
    OperationFailed,
    OutcomeUnknown,
    Unavailable,
    Unimplemented,
    ValidationFailed,
)
from agentic_sandbox.controller.hostlink import HostdLink, follow_session, hostd_failure
from agentic_sandbox.proto import ErrorCode, HostdConnectionLost, HostdRemoteError, HostdStreamOverflow
from agentic_sandbox.proto import messages as m


class ScriptedClient:
    """Each stream opened plays the next script: events, then an exception or the end."""

    broken = None

    def __init__(self, *scripts: list[Any]) -> None:
        self.scripts = list(scripts)
        self.opened: list[int] = []
        self.posted: list[tuple[Any, Any, Any]] = []

    @asynccontextmanager
    async def stream(self, request: m.SessionSubscribeRequest) -> AsyncIterator[AsyncIterator[Any]]:
        self.opened.append(request.from_seq)
        script = self.scripts.pop(0)

        async def events() -> AsyncIterator[Any]:
            for item in script:
                if isinstance(item, BaseException):
                    raise item
                yield item

        yield events()

    async def post(self, request: Any, on_error: Any, on_success: Any = None) -> None:
        self.posted.append((request, on_error, on_success))


def out(seq: int) -> m.SessionOutput:
    return m.SessionOutput(seq=seq, data=b"%d" % seq)


async def collect(client: ScriptedClient, start: int, **kwargs: Any) -> list[Any]:
    async with aclosing(follow_session(client, "s", start, **kwargs)) as events:  # type: ignore[arg-type]
        return [event async for event in events]


async def test_an_overflowed_stream_is_opened_again_where_it_stopped() -> None:
    lagged = m.SessionLagged(missed_from=4, resume_seq=9)
    client = ScriptedClient(
        [out(2), out(3), HostdStreamOverflow("behind")], [lagged, HostdStreamOverflow("behind")], [out(9)]
    )
    assert await collect(client, 2) == [out(2), out(3), lagged, out(9)]
    assert client.opened == [2, 4, 9]


async def test_a_start_hostd_no_longer_holds() -> None:
    gone = HostdRemoteError(ErrorCode.SEQ_OUT_OF_RANGE.value, "too old", {"first_seq": 7})
    client = ScriptedClient([gone], [out(7)])
    assert await collect(client, 2, lost_as_lag=True) == [m.SessionLagged(missed_from=2, resume_seq=7), out(7)]
    assert client.opened == [2, 7]
    with pytest.raises(Unavailable) as failure:
        await collect(ScriptedClient([gone]), 2)
    assert failure.value.details["hostd_code"] == ErrorCode.SEQ_OUT_OF_RANGE.value


async def test_proto_failures_are_controller_errors() -> None:
    with pytest.raises(OutcomeUnknown):
        await collect(ScriptedClient([out(1), HostdConnectionLost("gone")]), 1)
    with pytest.raises(ControllerError):
        await collect(ScriptedClient([HostdRemoteError(ErrorCode.SESSION_NOT_FOUND.value, "no such session")]), 1)


async def test_a_posted_write_fails_translated() -> None:
    link = HostdLink("/nonexistent", call_timeout_s=1, connect_timeout_s=1, ping_interval_s=1, reconnect_max_s=1)
    errors: list[ControllerError] = []
    with pytest.raises(Unavailable):
        await link.post(m.SessionWriteRequest(session_id="s", data=b"x"), errors.append)
    client = ScriptedClient()
    link._client = client  # type: ignore[assignment]
    await link.post(m.SessionWriteRequest(session_id="s", data=b"x"), errors.append)
    (_request, on_error, _on_success) = client.posted[0]
    on_error(HostdRemoteError(ErrorCode.SESSION_EXITED.value, "it exited"))
    assert isinstance(errors[0], InvalidState) and errors[0].code == "session.exited"


#: Every hostd error code and the controller error it becomes (class, code); a new hostd code must
#: be placed here, so that nothing is translated by accident.
TRANSLATED = {
    ErrorCode.INSTANCE_NOT_FOUND: (NotFound, "instance.not_found"),
    ErrorCode.INSTANCE_EXISTS: (Conflict, "instance.already_exists"),
    ErrorCode.INSTANCE_INVALID_STATE: (InvalidState, "instance.invalid_state"),
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
}
#: What fails closed: hostd at a limit, shutting down, broken, or asked what it cannot place.
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
    ErrorCode.LIMIT_REACHED,
    ErrorCode.SHUTTING_DOWN,
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
