"""The SSE response of a task's stream (``message:stream``, ``:subscribe``); its body is made by
:class:`~agentic_sandbox.controller.a2a.streams.TaskStreams`."""

from __future__ import annotations

from collections.abc import AsyncIterator

from quart import Response

from .caller import Caller
from .edge import echo_extensions


def sse_response(caller: Caller, body: AsyncIterator[bytes]) -> Response:
    response = Response(body, status=200, content_type="text/event-stream")
    response.timeout = None  # a stream lasts as long as its task (quart's response timeout would cut it)
    response.headers["Cache-Control"] = "no-store"
    response.headers["X-Accel-Buffering"] = "no"
    return echo_extensions(response, caller)
