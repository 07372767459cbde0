"""The bodies of a task's SSE streams (``message:stream``, ``:subscribe``): the Task first, then its updates.

Each event is one ``data: <StreamResponse JSON>`` line and a blank line. The first is the Task (for
a new task, as it was created: submitted, with its message), then every status and artifact
update stored after it, in order; the stream ends after a terminal or interrupted status. A
failure mid-stream is an ``event: error`` whose data is the A2A error body.

Fan-out without buffers: a stream holds nothing of its own. It reads the task's events from the
hub's in-memory tail or the store, after the last sequence it sent, at its own pace, and waits on
the hub's wake-up when it has sent everything; so any number of streams follow one task, and a
slow one holds up neither the others nor the task (a stream whose client stopped reading waits in
its own socket write; once it reads again the stream goes on from its last sequence, from the
store if the tail has moved past it, with nothing lost). When nothing happens for
``sse_keepalive_s`` it writes a ``: keep-alive`` comment: a client that went away makes that write
fail, which ends the stream (hypercorn does not always say that a client left), and nothing else
runs on its behalf (the task goes on; it belongs to its runner, not to any stream).

Encoded once: an update's StreamResponse is encoded once per wire form (:attr:`Framing.form`) and
kept beside the event in the hub's tail (:class:`~agentic_sandbox.controller.tasks.hub.Told`);
a stream only puts its own envelope around those bytes (:meth:`Framing.wrap`: the SSE line, a
JSON-RPC response of its request's id). Everything a stream finds new at a wake-up goes out in one
write of at most :data:`MAX_CHUNK_BYTES` (for the framings that allow it: :attr:`Framing.joins`),
so a stream that fell behind catches up in few writes.
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
from ..tasks.hub import TaskHub, Told
from ..tasks.prompts import shown_event
from .caller import Caller
from .errors import A2AError, internal_error, to_a2a
from .views import WIRE_KEYS_1_0, read_snapshot, task_view

log = logging.getLogger(__name__)

END_STATES = frozenset(TERMINAL) | frozenset(INTERRUPTED)
KIND_MEMBER = {"status": "statusUpdate", "artifact": "artifactUpdate"}
#: One write holds at most about this much (more news waits for the next write, at once).
MAX_CHUNK_BYTES = 256 * 1024

KEEPALIVE = b": keep-alive\n\n"
_OUTCOME_SPELLINGS = frozenset(WIRE_KEYS_1_0) | frozenset(WIRE_KEYS_1_0.values())


class Framing:
    """How a binding writes stream items: HTTP+JSON sends the StreamResponse (errors as the A2A
    error body); JSON-RPC wraps each in a JSON-RPC response of the request's id.

    An item is :meth:`payload` (the StreamResponse in the binding's wire form, the same bytes for
    every stream of that :attr:`form`, so made once per event) inside :meth:`wrap` (what is this
    stream's own). A subclass changes the form by overriding :meth:`payload` *and* :attr:`form`."""

    #: Names what :meth:`payload` makes: streams of one form share each event's encoding.
    form = "1.0"
    #: Whether consecutive items may go out as one write (SSE: yes; a gRPC message: no).
    joins = True

    def payload(self, obj: dict[str, Any]) -> bytes:
        return msgspec.json.encode(obj)

    def wrap(self, payload: bytes) -> bytes:
        return b"data: " + payload + b"\n\n"

    def data(self, obj: dict[str, Any]) -> bytes:
        return self.wrap(self.payload(obj))

    def error(self, error: A2AError) -> bytes:
        return b"event: error\ndata: " + msgspec.json.encode(error.body()) + b"\n\n"

    def keepalive(self) -> bytes:
        """Written when the stream has been idle ``sse_keepalive_s``; empty bytes write nothing
        (gRPC keeps its connections alive itself and learns of a departed client without it)."""
        return KEEPALIVE


def update_payload(told: Told, framing: Framing, member: str, prompts: bool) -> bytes:
    """The StreamResponse of one update in ``framing``'s form, encoded by the first stream that
    needed it and kept on the event for the rest."""
    return told.encoded((framing.form, prompts), lambda: framing.payload({member: shown_event(told.event, prompts)}))


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
        prompts = caller.sees_prompts
        wrap = framing.wrap
        joins = framing.joins
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
                        prompts=prompts,
                        base_url=caller.base_url,
                        wire=caller.wire,
                    )
                    seq = snap.record.last_seq
                yield framing.data({"task": view})
                if not from_creation and snap.record.state in END_STATES:
                    return
                while True:
                    news = watch.told_after(seq)
                    if news is None:  # fell behind the tail: from the store (encoded for this stream alone)
                        news = [Told(event) for event in await store.tasks.events_after(task_id, seq)]
                    if not news:
                        with trio.move_on_after(keepalive):
                            await changed.wait()
                        if not changed.is_set():
                            yield framing.keepalive()
                        changed = watch.changed()
                        continue
                    changed = watch.changed()  # before writing: news told meanwhile wakes the next round
                    chunk: list[bytes] = []
                    size = 0
                    ended = False
                    for told in news:
                        seq = told.event.seq
                        member = KIND_MEMBER.get(told.event.kind)
                        if member is None:
                            continue  # history messages are not stream events
                        item = wrap(update_payload(told, framing, member, prompts))
                        if told.event.kind == "status" and told.event.body["status"]["state"] in END_STATES:
                            ended = True
                        if not joins:
                            yield item
                        else:
                            chunk.append(item)
                            size += len(item)
                        if ended or size >= MAX_CHUNK_BYTES:
                            break
                    if chunk:
                        yield b"".join(chunk) if len(chunk) > 1 else chunk[0]
                    if ended:
                        return
            except ControllerError as exc:
                yield framing.error(to_a2a(exc))
            except Exception:
                log.exception("task %s: stream failed", task_id)
                yield framing.error(internal_error())
