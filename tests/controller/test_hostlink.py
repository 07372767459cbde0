"""hostd's failures translated once (controller.hostlink): every explicit answer pinned code by code
to the controller error it becomes, an unknown code failing closed. (The link's streams and posted
writes run against a real hostd in tests/controller/pty/ and the admin tests.)"""

from __future__ import annotations

import pytest

from agentic_sandbox.controller.errors import (
    Conflict,
    InvalidState,
    NotFound,
    OperationFailed,
    Unavailable,
    Unimplemented,
    ValidationFailed,
)
from agentic_sandbox.controller.hostlink import hostd_failure
from agentic_sandbox.proto import ErrorCode, HostdRemoteError

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
