"""pty-ws/v1 frames in memory: what we encode validates against upstream's schemas; what clients send
is decoded strictly, with the binding's error codes."""

from __future__ import annotations

import json
import struct

import pytest

from agentic_sandbox.controller.pty import frames as f
from agentic_sandbox.proto import messages as m
from tests.contracts import validate_pty_frame

from .wsclient import cframe


def test_server_frames_validate() -> None:
    frames = [
        f.hello("sid", 0, [f.PTY_EXTENSIONS_URI]),
        f.output_json(7, b"\x00\xffbytes"),
        f.session_frame(f.Resize(cols=80, rows=24)),
        f.session_frame(f.RoleAssigned(role="observer", client_id="c", downgraded=True, reason="full")),
        f.session_frame(f.MembershipChanged(controllers=[f.ClientRef(client_id="a")], observers=[])),
        f.session_frame(
            f.Keyframe(
                snapshot=b"x", snapshot_format=f.SNAPSHOT_FORMAT, snapshot_cols=1, snapshot_rows=1, anchor_sequence=0
            )
        ),
        f.session_frame(f.closed(m.SessionExited(exit_code=None, signal=9, reason="killed", last_seq=3))),
        f.session_frame(f.PtyError(code="PTY_OUTPUT_LAGGED", message="m")),
        f.error_frame("REPLAY_OUT_OF_RANGE", "m", cframe("x")["id"]),
        f.goodbye("session_closed"),
        f.encode("ping", {"client_ts": f.now_ts()}),
    ]
    for text in frames:
        validate_pty_frame(json.loads(text))
    output = json.loads(frames[1])
    assert output["sequence"] == 7 and output["payload"]["stream"] == "stdout"


def test_an_error_frame_names_the_a2a_error_only_when_given() -> None:
    a2a_error = {"code": 429, "status": "RESOURCE_EXHAUSTED", "message": "full", "details": []}
    limited = json.loads(f.error_frame("RATE_LIMITED", "full", retryable=True, a2a_error=a2a_error))
    validate_pty_frame(limited)
    assert limited["payload"] == {"code": "RATE_LIMITED", "message": "full", "retryable": True, "a2a_error": a2a_error}
    plain = json.loads(f.error_frame("INTERNAL", "m"))
    validate_pty_frame(plain)
    assert "a2a_error" not in plain["payload"]


def test_binary_output_header() -> None:
    frame = f.output_binary(2**40 + 5, b"data")
    assert struct.unpack(">4sQB", frame[:13]) == (b"PW1O", 2**40 + 5, 1)
    assert frame[13:] == b"data"


def test_client_frames_decode() -> None:
    frame, payload = f.decode_client(json.dumps(cframe("pty.session_input", {"data": "aGk="}, replay_from=3)))
    assert payload.data == b"hi" and frame.replay_from == 3
    frame, payload = f.decode_client(
        json.dumps({k: v for k, v in cframe("pty.leave_session").items() if k != "payload"})
    )
    assert isinstance(payload, f.LeaveSession)


@pytest.mark.parametrize(
    ("frame", "code"),
    [
        ("{", "INVALID_REQUEST"),
        (json.dumps({**cframe("ping"), "id": "not-a-uuid7"}), "INVALID_REQUEST"),
        (json.dumps({**cframe("ping"), "sequence": 3}), "INVALID_REQUEST"),  # server-only field
        (json.dumps(cframe("pty.join_session", {"role": "boss"})), "INVALID_REQUEST"),
        (json.dumps(cframe("pty.join_session", {"role": "observer", "cols": 1025})), "INVALID_REQUEST"),
        (json.dumps(cframe("pty.session_input", {"data": "!!"})), "INVALID_REQUEST"),
        (json.dumps(cframe("GetTask", {"task_id": "t"})), "UNSUPPORTED_OPERATION"),
    ],
)
def test_client_frames_refused(frame: str, code: str) -> None:
    with pytest.raises(f.FrameError) as info:
        f.decode_client(frame)
    assert info.value.code == code
