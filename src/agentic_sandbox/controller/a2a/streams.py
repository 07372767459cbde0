"""The bodies of a task's SSE streams (``message:stream``, ``:subscribe``): the Task first, then its updates.

Each event is one ``data: <StreamResponse JSON>`` line and a blank line. The first is the Task (for
a new task, as it was created: submitted, with its message), then every status and artifact
update stored after it, in order; the stream ends after a terminal or interrupted status. A
failure mid-stream is an ``event: error`` whose data is the A2A error body.

Fan-out without buffers: a stream holds nothing of its own. It reads the task's events from the
hub's in-memory tail or the store, after the last sequence it sent, at its own pace, and waits on
the hub's wake-up when it has sent everything; so any number of streams follow one task, and a
slow one holds up neither the others nor the task. When nothing happens for
``sse_keepalive_s`` it writes a ``: keep-alive`` comment: a client that went away makes that write
fail, which ends the stream (hypercorn does not always say that a client left), and nothing else
runs on its behalf (the task goes on; it belongs to its runner, not to any stream).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from typing import Any

import msgspec
import trio

from ..errors import ControllerError
from ..store import Store
from ..store.tasks import INTERRUPTED, TERMINAL, rfc3339_us
from ..tasks.hub import TaskHub
from ..tasks.prompts import shown_event
from .caller import Caller
from .errors import A2AError, internal_error, to_a2a
from .views import WIRE_KEYS_1_0, read_snapshot, task_view

log = logging.getLogger(__name__)

END_STATES = frozenset(TERMINAL) | frozenset(INTERRUPTED)
KIND_MEMBER = {"status": "statusUpdate", "artifact": "artifactUpdate"}


KEEPALIVE = b": keep-alive\n\n"
_OUTCOME_SPELLINGS = frozenset(WIRE_KEYS_1_0) | frozenset(WIRE_KEYS_1_0.values())


class Framing:
    """How a binding writes stream items: HTTP+JSON sends the StreamResponse (errors as the A2A
    error body); JSON-RPC wraps each in a JSON-RPC response of the request's id."""

    def data(self, obj: dict[str, Any]) -> bytes:
        return b"data: " + msgspec.json.encode(obj) + b"\n\n"

    def error(self, error: A2AError) -> bytes:
        return b"event: error\ndata: " + msgspec.json.encode(error.body()) + b"\n\n"

    def keepalive(self) -> bytes:
        """Written when the stream has been idle ``sse_keepalive_s``; empty bytes write nothing
        (gRPC keeps its connections alive itself and learns of a departed client without it)."""
        return KEEPALIVE


async def creation_view(store: Store, caller: Caller, task_id: str) -> tuple[dict[str, Any], int]:
    """The Task as it was created (submitted, its first message), and the sequence it stands at."""
    snap = await read_snapshot(store, caller.instance.id, task_id, 0, artifacts=False)
    view = task_view(
        snap,
        caller.instance,
        disclose_host=caller.discloses_host,
        prompts=caller.sees_prompts,
        base_url=caller.base_url,
        wire=caller.wire,
    )
    view["status"] = {"state": "TASK_STATE_SUBMITTED", "timestamp": rfc3339_us(snap.record.created_at)}
    # The outcome was not set yet then (in either spelling).
    view["metadata"] = {k: v for k, v in view["metadata"].items() if k not in _OUTCOME_SPELLINGS}
    [first] = await store.tasks.events_after(task_id, 0, limit=1)
    view["history"] = [first.body]
    return view, first.seq


class TaskStreams:
    """Makes the body of each task stream, from the store and the task hub it is built with."""

    def __init__(self, store: Store, hub: TaskHub, *, keepalive_s: float) -> None:
        self._store = store
        self._hub = hub
        self._keepalive_s = keepalive_s

    def events(
        self, caller: Caller, task_id: str, *, from_creation: bool, framing: Framing | None = None
    ) -> AsyncIterator[bytes]:
        """The stream's body (an async iterator that runs after the request has returned)."""
        return self._events(caller, task_id, from_creation=from_creation, framing=framing or Framing())

    async def _events(
        self, caller: Caller, task_id: str, *, from_creation: bool, framing: Framing
    ) -> AsyncIterator[bytes]:
        keepalive = self._keepalive_s
        store = self._store
        with self._hub.watch(task_id) as watch:
            try:
                changed = watch.changed()
                if from_creation:
                    view, seq = await creation_view(store, caller, task_id)
                else:
                    # One read: the Task's artifacts hold the output of exactly the events up to
                    # ``seq``, so the updates after it repeat none of it and miss none.
                    snap = await read_snapshot(store, caller.instance.id, task_id, None)
                    view = task_view(
                        snap,
                        caller.instance,
                        disclose_host=caller.discloses_host,
                        prompts=caller.sees_prompts,
                        base_url=caller.base_url,
                        wire=caller.wire,
                    )
                    seq = snap.record.last_seq
                yield framing.data({"task": view})
                if not from_creation and snap.record.state in END_STATES:
                    return
                while True:
                    events = watch.tail_after(seq)
                    if events is None:
                        events = await store.tasks.events_after(task_id, seq)
                    for event in events:
                        seq = event.seq
                        member = KIND_MEMBER.get(event.kind)
                        if member is None:
                            continue  # history messages are not stream events
                        yield framing.data({member: shown_event(event, caller.sees_prompts)})
                        if event.kind == "status" and event.body["status"]["state"] in END_STATES:
                            return
                    if events:
                        changed = watch.changed()
                        continue
                    with trio.move_on_after(keepalive):
                        await changed.wait()
                    if not changed.is_set():
                        yield framing.keepalive()
                    changed = watch.changed()
            except ControllerError as exc:
                yield framing.error(to_a2a(exc))
            except Exception:
                log.exception("task %s: stream failed", task_id)
                yield framing.error(internal_error())
