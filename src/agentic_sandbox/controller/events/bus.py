"""The controller's event bus: what happened to instances, operations, storage and sessions.

Served by ``GET /api/v2/admin/events`` (a JSON snapshot, or SSE with ``follow=true``; see
:mod:`controller.admin.streams`). An event is the contract's ``Event``: ``id`` (``ev_<ULID>``),
``kind`` (dotted), ``timestamp`` (RFC 3339 UTC), ``subject`` (``<kind>/<id>``) and ``data``.
The bus is a :class:`~controller.ring.Ring` (bounded, ``AIWG_EVENT_RING_SIZE``): every event gets
a monotonic sequence number (the SSE ``id:``), followers read by cursor, a slow one is told what it
lost (a ``stream.lagged`` notice) and never slows a publisher or another follower.

Two modes, chosen by the store it is given:

* Alone (no store, or SQLite): ``publish`` appends to the ring, which numbers the event.
* Shared (a store that several controllers use: PostgreSQL): the store numbers every controller's
  events, so an id means the same at each of them and ``Last-Event-ID`` resumes at any. ``publish``
  queues the event for the writer (:meth:`EventBus.run`, in the app's nursery), which stores it;
  the ring is filled only from the store (:meth:`EventBus.catch_up`, called by
  :mod:`controller.cluster` on each notification, after a reconnect and on its poll timer), each
  event under the id the store gave it. How: :mod:`controller.events.journal`.

Publishing API (for every surface; this is what the A2A and PTY surfaces call too)::

    seq = bus.publish(kind, subject, data)     # never blocks, never awaits, any thread

``seq`` is the event's id in the ring when alone; shared, the id is not known yet (the writer gives
it at commit) and ``seq`` is 0. Nothing but tests reads it.

``kind`` is dotted lower-case (``<domain>.<what>``), ``subject`` is ``"<domain>/<id>"`` (or None),
``data`` a small JSON-able dict (encoded once, at publish; an event above :data:`MAX_DATA_BYTES`
encoded has its data replaced by ``{"truncated": true}``). Never put a token, an env value or file content in it:
events are readable by the operator role. The typed helpers below are the kinds in use; a new
surface adds its own helper here beside them, in its own domain:

==========================  ==============================  =========================================
kind                        subject                         data
==========================  ==============================  =========================================
instance.state_changed      ``instance/<id>``               ``from`` (None when created), ``to``,
                                                            ``cause`` (``operation``: an operation's
                                                            work; ``reconcile``: hostd's view folded
                                                            in, e.g. a main process that exited, or
                                                            the catalog re-read after a restart),
                                                            ``operation_id``, ``note``
instance.removed            ``instance/<id>``               ``name``, ``operation_id``, ``reason``
                                                            (``decommissioned``, or
                                                            ``provision_refused``: hostd made nothing)
instance.slept              ``instance/<id>``               ``how`` (``freeze`` | ``save``), ``cause``
                                                            (``idle``, ``operator``, ...)
instance.woke               ``instance/<id>``               ``cause`` (``exec``, ``attach``, ``pty.input``,
                                                            ``operator``, ...), ``how``, ``took_ms``,
                                                            ``slept_s`` (its total asleep)
operation.created           ``operation/<id>``              ``kind``, ``state``, ``instance_id``
operation.started           ``operation/<id>``              same
operation.completed         ``operation/<id>``              same, plus ``error_code`` when failed
storage.object_written      ``storage/<scope>/<path>``      ``scope``, ``path``, ``size_bytes``,
                                                            ``sha256``, ``created``
storage.object_deleted      ``storage/<scope>/<path>``      ``scope``, ``path``
session.created             ``session/<id>``                ``instance_id``
session.exited              ``session/<id>``                ``instance_id``, ``exit_code``, ``signal``,
                                                            ``end_reason``
task.created                ``task/<id>``                   ``instance_id``, ``context_id``, ``state``
task.status_changed         ``task/<id>``                   ``instance_id``, ``context_id``, ``state``
==========================  ==============================  =========================================

Sessions are seen by :mod:`controller.instances.watch`, which polls hostd (so a session made by any client,
``agentic-hostctl`` included, is reported once, within a poll interval); a surface that creates
sessions need not publish ``session.created`` itself. A2A tasks are published by
:class:`controller.tasks.service.TaskService` once each change is stored (a task's artifacts stay
on its own A2A stream). Reserved for further PTY facts: ``session.attached``, ``session.detached``.
"""

from __future__ import annotations

import logging
import re
import time
from typing import TYPE_CHECKING, Any

import msgspec
import trio

from agentic_sandbox.proto import messages as m

from ..models import iso
from ..store.database import StoreClosed, StoreUnavailable
from ..ulid import new_ulid
from .journal import Journal
from .ring import Ring

if TYPE_CHECKING:
    from ..store import Store

log = logging.getLogger(__name__)

DEFAULT_CAPACITY = 4096
#: Largest encoded event; past it the event's ``data`` is replaced by ``{"truncated": true}``.
MAX_DATA_BYTES = 16 * 1024
KIND_RE = re.compile(r"^[a-z][a-z0-9_]*(\.[a-z][a-z0-9_]*)+$")

INSTANCE_STATE_CHANGED = "instance.state_changed"
INSTANCE_REMOVED = "instance.removed"
INSTANCE_SLEPT = "instance.slept"
INSTANCE_WOKE = "instance.woke"
OPERATION_CREATED = "operation.created"
OPERATION_STARTED = "operation.started"
OPERATION_COMPLETED = "operation.completed"
STORAGE_OBJECT_WRITTEN = "storage.object_written"
STORAGE_OBJECT_DELETED = "storage.object_deleted"
SESSION_CREATED = "session.created"
SESSION_EXITED = "session.exited"
TASK_CREATED = "task.created"
TASK_STATUS_CHANGED = "task.status_changed"
#: The notice a follower gets in place of events it lost (never stored in the ring).
STREAM_LAGGED = "stream.lagged"


class Event(msgspec.Struct, kw_only=True, omit_defaults=True):
    """admin-api ``Event``."""

    id: str
    kind: str
    timestamp: str
    subject: str | None = None
    data: dict[str, Any] = {}


def _kind_of(event: Event) -> str:
    return event.kind


_decode_event = msgspec.json.Decoder(Event).decode


class EventBus:
    """See the module docstring. One per app (``AppState.events``).

    Shared mode when ``store`` is shared (:attr:`Store.shared`): the queue of events not yet stored
    holds at most ``capacity`` of them (more could not all be in a ring either) and the store keeps
    the newest ``capacity`` rows."""

    def __init__(self, capacity: int = DEFAULT_CAPACITY, store: Store | None = None) -> None:
        self.ring: Ring[Event] = Ring(capacity, _kind_of)
        #: The shared store's side (shared mode only).
        self.journal: Journal[Event] | None = None
        if store is not None and store.shared:
            self.journal = Journal(store.admin_events, self.ring, _decode_event, max_pending=capacity, keep=capacity)

    @property
    def shared(self) -> bool:
        """Event ids are the shared store's (see the module docstring)."""
        return self.journal is not None

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Shared mode: the writer that stores published events (:meth:`Journal.run`), until
        cancelled. Alone there is nothing to write: it reports started and returns at once."""
        if self.journal is None:
            task_status.started()
            return
        await self.journal.run(task_status=task_status)

    async def catch_up(self, upto: int | None = None) -> None:
        """Shared mode: take what the store holds past the ring's newest event into the ring
        (:meth:`Journal.catch_up`; raises what the store raises); nothing when ``upto``, a
        notification's id, is in the ring already. Alone: nothing to do."""
        if self.journal is not None:
            await self.journal.catch_up(upto)

    async def catch_up_to(self, seq: int) -> None:
        """Shared mode: if ``seq`` (a follower's ``Last-Event-ID``) is past the ring's newest id,
        catch up once first: another controller may have handed it out a moment ago. A store
        that is down does not fail the stream: the ring answers as it stands (and a follower
        whose id it does not know yet is told so)."""
        if self.journal is None or seq <= self.ring.last_seq:
            return
        try:
            await self.journal.catch_up()
        except (StoreUnavailable, StoreClosed) as exc:
            log.debug("events: catching up for a follower failed: %s", exc)

    def publish(self, kind: str, subject: str | None = None, data: dict[str, Any] | None = None) -> int:
        """Publish one event; returns its sequence number (0 in shared mode, where the writer
        numbers it later). ValueError for a malformed ``kind`` (a programming error: kinds are
        constants)."""
        if not KIND_RE.match(kind):
            raise ValueError(f"event kind {kind!r} is not dotted lower-case")
        event = Event(
            id="ev_" + new_ulid(), kind=kind, timestamp=iso(time.time()), subject=subject, data=dict(data or {})
        )
        encoded = msgspec.json.encode(event)  # once: the ring keeps these bytes in the SSE frame
        if len(encoded) > MAX_DATA_BYTES:
            event.data = {"truncated": True}
            encoded = msgspec.json.encode(event)
        if self.journal is not None:
            self.journal.put(encoded)
            return 0
        return self.ring.append(event, encoded)

    # -- the kinds in use (see the table above) --------------------------------------------------

    def instance_state_changed(
        self,
        instance_id: str,
        *,
        before: str | None,
        after: str,
        cause: str,
        operation_id: str | None = None,
        note: str | None = None,
    ) -> int:
        data: dict[str, Any] = {"from": before, "to": after, "cause": cause}
        if operation_id:
            data["operation_id"] = operation_id
        if note:
            data["note"] = note
        return self.publish(INSTANCE_STATE_CHANGED, f"instance/{instance_id}", data)

    def instance_slept(self, instance_id: str, *, how: str | None, cause: str | None) -> int:
        return self.publish(INSTANCE_SLEPT, f"instance/{instance_id}", {"how": how, "cause": cause})

    def instance_woke(self, instance_id: str, *, wake: m.WakeDetail, slept_s: float) -> int:
        data = {"cause": wake.cause, "how": wake.how, "took_ms": round(wake.took_s * 1000, 3), "slept_s": slept_s}
        return self.publish(INSTANCE_WOKE, f"instance/{instance_id}", data)

    def task_changed(self, kind: str, task_id: str, *, instance_id: str, context_id: str, state: str) -> int:
        data = {"instance_id": instance_id, "context_id": context_id, "state": state}
        return self.publish(kind, f"task/{task_id}", data)

    def instance_removed(self, instance_id: str, *, name: str, operation_id: str | None, reason: str) -> int:
        data = {"name": name, "operation_id": operation_id, "reason": reason}
        return self.publish(INSTANCE_REMOVED, f"instance/{instance_id}", data)

    def operation_changed(
        self, op_id: str, *, kind: str, state: str, instance_id: str | None, error_code: str | None = None
    ) -> int:
        event = {"pending": OPERATION_CREATED, "running": OPERATION_STARTED}.get(state, OPERATION_COMPLETED)
        data: dict[str, Any] = {"kind": kind, "state": state, "instance_id": instance_id}
        if error_code:
            data["error_code"] = error_code
        return self.publish(event, f"operation/{op_id}", data)

    def storage_written(self, scope: str, path: str, *, size_bytes: int, sha256: str, created: bool) -> int:
        data = {"scope": scope, "path": path, "size_bytes": size_bytes, "sha256": sha256, "created": created}
        return self.publish(STORAGE_OBJECT_WRITTEN, f"storage/{scope}/{path}", data)

    def storage_deleted(self, scope: str, path: str) -> int:
        return self.publish(STORAGE_OBJECT_DELETED, f"storage/{scope}/{path}", {"scope": scope, "path": path})

    def session_created(self, session_id: str, *, instance_id: str) -> int:
        return self.publish(SESSION_CREATED, f"session/{session_id}", {"instance_id": instance_id})

    def session_exited(
        self,
        session_id: str,
        *,
        instance_id: str,
        exit_code: int | None,
        signal: int | None,
        end_reason: str | None,
    ) -> int:
        data = {"instance_id": instance_id, "exit_code": exit_code, "signal": signal, "end_reason": end_reason}
        return self.publish(SESSION_EXITED, f"session/{session_id}", data)
