"""Admin streams: ``GET /events`` (the event bus) and ``GET /logs`` (the controller's log ring).

Both answer a JSON snapshot by default, ``{"items": [...], "last_id": N}``: the newest ``limit``
entries (1..5000, default 200) that pass the filters, oldest first; ``last_id`` is the id of the
newest entry in the ring, so a client can take a snapshot and then follow from it with
``Last-Event-ID: N`` without a gap. With ``follow=true`` they answer ``text/event-stream``: one SSE
event per entry (``id:`` its monotonic id, ``event:`` the event's kind or ``log``, ``data:`` one
JSON object), from the next entry on, or from the one after ``Last-Event-ID`` when the client sends
it. Entries the ring no longer holds are not skipped silently: the stream first sends a
``stream.lagged`` event (no ``id:``, so a client that reconnects still names the last entry it got)
whose ``data`` is an ``Event`` with ``data: {reason, first_missed, last_missed, missed,
resumed_at}``; the same notice reaches a follower too slow to keep up, which then resumes at the
oldest entry held. Keep-alive comments (``: keepalive``) go out after ``AIWG_SSE_KEEPALIVE_S``
(15 s) without a write, which is also how a client that went away is noticed (hypercorn's trio
worker may not say so).

Filters: events by ``kind`` (a glob, ``instance.*``) and ``instance_id`` (the events about one
instance: its own, ``instance/<id>``, and those whose data names it: its operations, sessions and
tasks; both filters together must both pass); logs by ``level`` (the minimum:
``trace``, ``debug``, ``info``, ``warn``, ``error``) and ``target`` (a logger and its children;
``::`` reads as ``.``). A bad parameter is a 422 naming it. Followers are bounded per stream
(``AIWG_MAX_STREAM_FOLLOWERS``, checked when the request arrives; 429 ``rate_limit.exceeded``
above). Who may read what is in :mod:`controller.auth.tokens` (events: admin and operator; logs: admin).

Each follower is a cursor into the ring (:mod:`controller.events.ring`): no queue per follower, frames
encoded once at publish, everything new since the last wake written in one chunk.

Several controllers on one PostgreSQL database give events the same ids (:mod:`controller.events.bus`),
so ``Last-Event-ID`` from one resumes at another; an id this controller has not read yet (another
one handed it out a moment ago) makes the stream catch up from the store once before it starts.
"""

from __future__ import annotations

import fnmatch
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import msgspec
import trio
from quart import Response, request

from ..auth.tokens import ADMIN_ONLY, READ
from ..errors import LimitReached, ValidationFailed
from ..events.bus import STREAM_LAGGED, Event
from ..events.logs import LEVELS, LogEntry
from ..events.ring import Gap, Ring, sse_frame
from ..http.roles import require_role
from ..models import iso
from ..state import AppState, app_state
from ..ulid import new_ulid
from .blueprint import admin

T = TypeVar("T")

DEFAULT_LIMIT = 200
MAX_LIMIT = 5000
MAX_FILTER_CHARS = 256
KEEPALIVE = b": keepalive\n\n"
TRUE = ("true", "1")
FALSE = ("false", "0", "")
_LAST_EVENT_ID_RE = re.compile(r"^\d{1,18}$")


class Snapshot(msgspec.Struct, kw_only=True):
    items: list[Any]
    last_id: int


def _invalid(field: str, message: str, code: str) -> ValidationFailed:
    return ValidationFailed([{"field": field, "message": message, "code": code}])


def _follow() -> bool:
    raw = request.args.get("follow", "false").lower()
    if raw not in TRUE + FALSE:
        raise _invalid("follow", "must be true or false", "type")
    return raw in TRUE


def _limit() -> int:
    raw = request.args.get("limit")
    if raw is None:
        return DEFAULT_LIMIT
    if not raw.isdigit() or not 1 <= int(raw) <= MAX_LIMIT:
        raise _invalid("limit", f"must be an integer from 1 to {MAX_LIMIT}", "range")
    return int(raw)


def _text_filter(name: str) -> str | None:
    raw = request.args.get(name)
    if raw is not None and (not raw or len(raw) > MAX_FILTER_CHARS):
        raise _invalid(name, f"must be 1 to {MAX_FILTER_CHARS} characters", "length")
    return raw


def _last_event_id() -> int | None:
    raw = request.headers.get("Last-Event-ID")
    if raw is None or raw.strip() == "":
        return None
    if not _LAST_EVENT_ID_RE.match(raw.strip()):
        raise _invalid("Last-Event-ID", "must be the id of an event this stream sent (digits)", "type")
    return int(raw.strip())


def _lag_notice(gap: Gap) -> bytes:
    notice = Event(
        id="ev_" + new_ulid(),
        kind=STREAM_LAGGED,
        timestamp=iso(time.time()),
        data=msgspec.structs.asdict(gap),
    )
    return sse_frame(None, STREAM_LAGGED, msgspec.json.encode(notice))


async def _stream(ring: Ring[T], after: int, keep: Callable[[T], bool], keepalive_s: float) -> AsyncIterator[bytes]:
    """One follower: a cursor into the ring (see the module docstring)."""
    cursor = after
    next_keepalive = trio.current_time() + keepalive_s
    while True:
        gap, records = ring.read(cursor)
        if gap is not None:
            yield _lag_notice(gap)
            next_keepalive = trio.current_time() + keepalive_s
        if records:
            cursor = records[-1].seq
            chunk = b"".join(r.frame for r in records if keep(r.value))
            if chunk:
                yield chunk
                next_keepalive = trio.current_time() + keepalive_s
            continue
        with trio.move_on_at(next_keepalive):
            await ring.wait_beyond(cursor)
        if trio.current_time() >= next_keepalive:
            yield KEEPALIVE
            next_keepalive = trio.current_time() + keepalive_s


def _respond(
    state: AppState,
    stream: str,
    ring: Ring[T],
    keep: Callable[[T], bool],
    catch_up_to: Callable[[int], Awaitable[None]] | None = None,
) -> Response:
    if not _follow():
        records = ring.newest(keep, _limit())
        return Response(
            msgspec.json.encode(Snapshot(items=[r.value for r in records], last_id=ring.last_seq)),
            content_type="application/json",
        )
    _limit()  # validated even though a stream has no limit
    last = _last_event_id()
    if state.followers.get(stream, 0) >= state.config.max_stream_followers:
        limit = state.config.max_stream_followers
        raise LimitReached(
            "rate_limit.exceeded",  # upstream's code for it (docs/compatibility.md)
            f"{limit} clients already follow /{stream}; retry later (limit {limit}, set by AIWG_MAX_STREAM_FOLLOWERS)",
            retry_after_s=1,
            details={"limit": str(limit), "setting": "AIWG_MAX_STREAM_FOLLOWERS"},
        )
    after = ring.last_seq if last is None else last

    async def body() -> AsyncIterator[bytes]:
        state.followers[stream] = state.followers.get(stream, 0) + 1
        try:
            if catch_up_to is not None:
                await catch_up_to(after)
            async for chunk in _stream(ring, after, keep, state.config.sse_keepalive_s):
                yield chunk
        finally:
            state.followers[stream] -= 1

    response = Response(
        body(),
        content_type="text/event-stream",
        headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"},
    )
    response.timeout = None  # only the streams lift the response timeout
    return response


def _event_filter(pattern: str | None, instance_id: str | None) -> Callable[[Event], bool]:
    matches = re.compile(fnmatch.translate(pattern)).match if pattern is not None else None
    subject = f"instance/{instance_id}"

    def keep(event: Event) -> bool:
        if matches is not None and matches(event.kind) is None:
            return False
        return instance_id is None or event.subject == subject or event.data.get("instance_id") == instance_id

    return keep


@admin.get("/events")
@require_role(*READ)
async def stream_events() -> Response:
    state = app_state()
    keep = _event_filter(_text_filter("kind"), _text_filter("instance_id"))
    return _respond(state, "events", state.events.ring, keep, state.events.catch_up_to)


@admin.get("/logs")
@require_role(*ADMIN_ONLY)
async def stream_logs() -> Response:
    state = app_state()
    level = request.args.get("level")
    if level is not None and level not in LEVELS:
        raise _invalid("level", f"must be one of {', '.join(LEVELS)}", "enum")
    floor = LEVELS.index(level) if level else 0
    target = _text_filter("target")
    prefix = target.replace("::", ".") if target else None

    def keep(entry: LogEntry) -> bool:
        if LEVELS.index(entry.level) < floor:
            return False
        return prefix is None or entry.target == prefix or entry.target.startswith(prefix + ".")

    return _respond(state, "logs", state.logs.ring, keep)
