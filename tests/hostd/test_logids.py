"""hostd.logids: the ids a request names, and nothing else of it."""

from __future__ import annotations

from agentic_sandbox.hostd.logids import request_log_ids
from agentic_sandbox.proto import messages as m
from agentic_sandbox.proto.ids import new_id


def test_ids_come_from_the_request_fields() -> None:
    iid, sid = new_id(), new_id()
    request = m.SessionCreateRequest(
        instance_id=iid, argv=["sh"], env={"SECRET": "x"}, session_id=sid, trace_id="t" * 32
    )
    assert request_log_ids(request) == {"instance_id": iid, "session_id": sid, "exec_id": None, "request_id": "t" * 32}
    assert request_log_ids(m.PingRequest()) == {
        "instance_id": None,
        "session_id": None,
        "exec_id": None,
        "request_id": None,
    }
