"""The log ids a hostd request names: what ``proto.log_context`` is given around its handler.

``instance_id``, ``session_id`` and ``exec_id`` are read from the request's fields of those names
(whichever the message type has); the client's ``trace_id`` (the controller sends the id of the
HTTP request or operation that caused the call) becomes ``request_id``, so a hostd line can be
joined with the controller's. Nothing else of a request is ever put in a log line.
"""

from __future__ import annotations

from agentic_sandbox.proto import messages as m

_ID_FIELDS = ("instance_id", "session_id", "exec_id")


def request_log_ids(request: m.Request) -> dict[str, str | None]:
    ids: dict[str, str | None] = {name: getattr(request, name, None) for name in _ID_FIELDS}
    ids["request_id"] = request.trace_id
    return ids
