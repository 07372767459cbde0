"""Wake-ups for whoever waits on a task: blocking sends, cancels, SSE subscribers.

The store holds every event; the hub only says "task T has news" (:meth:`TaskHub.pulse`). A waiter
takes the task's current :class:`trio.Event` *before* reading the store and waits on it when it
has read everything, so no event is missed between the read and the wait. Nobody is ever sent
anything through the hub: each waiter reads from the store (or the small in-memory tail of recent
events) at its own pace, so a slow reader holds up no one and needs no buffer of its own.

The tail keeps the last :data:`TAIL_EVENTS` events of tasks with live readers (at most about
:data:`TAIL_BYTES` of artifact content: an agent streaming a large file must not pin it in memory),
so the readers of a busy task are fed from memory rather than a database read each. Each event
in the tail is a :class:`Told`, which also keeps the event's wire forms as the first reader that
needed each made them (:meth:`Told.encoded`): a thousand SSE streams of one task encode each
event once per wire form, and each stream only writes bytes.

Several controllers (a shared store): events another controller stored reach this hub through
:meth:`TaskHub.behind` (the store's notifications and polls say how far a task has got) and are
then told like local ones; an event told twice (a notification of this controller's own write, a
catch-up racing a local write) is kept once.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

import trio

from ..store import TaskEvent

TAIL_EVENTS = 256
TAIL_BYTES = 4 * 1024 * 1024


def parts_weight(parts: object) -> int:
    """About the bytes a list of A2A parts holds (their text and raw content), plus a little for the
    rest: what bounds the tail here and the runner's batches."""
    if not isinstance(parts, list):
        return 256
    return 256 + sum(len(p.get("raw") or p.get("text") or "") for p in parts if isinstance(p, dict))


def _weight(event: TaskEvent) -> int:
    artifact = event.body.get("artifact") if event.kind == "artifact" else None
    return parts_weight(artifact.get("parts") if isinstance(artifact, dict) else None)


class Told:
    """An event as the hub holds it: the stored event and its encodings, made once each.

    ``encoded(key, make)`` answers the bytes kept under ``key`` (a wire form and whatever else
    changes the bytes, such as whether the reader sees prompts), making them with ``make()`` for
    the first reader that asks. The encodings live as long as the event stays in the tail (their
    size is about the event's, which the tail's byte budget counts once; at most a few forms are
    ever asked for)."""

    __slots__ = ("event", "forms")

    def __init__(self, event: TaskEvent) -> None:
        self.event = event
        self.forms: dict[object, bytes] = {}

    @property
    def seq(self) -> int:
        return self.event.seq

    def encoded(self, key: object, make: Callable[[], bytes]) -> bytes:
        data = self.forms.get(key)
        if data is None:
            data = self.forms[key] = make()
        return data


class _Entry:
    __slots__ = ("bytes", "changed", "seen", "tail", "users")

    def __init__(self) -> None:
        self.changed = trio.Event()
        self.tail: deque[Told] = deque()
        self.bytes = 0
        self.users = 0
        #: The highest sequence told (kept or only announced).
        self.seen = 0

    def keep(self, event: TaskEvent) -> None:
        tail = self.tail
        if tail and event.seq <= tail[-1].seq:
            if any(e.seq == event.seq for e in tail):
                return  # told already
            # Stored earlier, told later (two writers whose writes went through worker threads
            # finished in the other order): the tail stays in sequence order.
            ordered = sorted([*tail, Told(event)], key=lambda e: e.seq)
            tail.clear()
            tail.extend(ordered)
        else:
            tail.append(Told(event))
        self.bytes += _weight(event)
        while len(tail) > 1 and (len(tail) > TAIL_EVENTS or self.bytes > TAIL_BYTES):
            self.bytes -= _weight(tail.popleft().event)


class TaskHub:
    def __init__(self) -> None:
        self._entries: dict[str, _Entry] = {}

    def _entry(self, task_id: str) -> _Entry:
        entry = self._entries.get(task_id)
        if entry is None:
            entry = self._entries[task_id] = _Entry()
        return entry

    def pulse(self, task_id: str, event: TaskEvent | None = None) -> None:
        entry = self._entries.get(task_id)
        if entry is None:
            return  # nobody waits
        if event is not None:
            entry.keep(event)
            entry.seen = max(entry.seen, event.seq)
        entry.changed.set()
        entry.changed = trio.Event()

    def behind(self, task_id: str, seq: int) -> int | None:
        """The sequence told last for a watched task that the store has taken past it to ``seq``;
        None when nobody here waits on it or it is told up to ``seq`` already. A task told nothing
        yet (0) is marked seen up to ``seq``: its waiters read the store when pulsed."""
        entry = self._entries.get(task_id)
        if entry is None or seq <= entry.seen:
            return None
        seen = entry.seen
        if seen == 0:
            entry.seen = seq
        return seen

    def watched(self) -> list[str]:
        """The tasks someone here waits on."""
        return list(self._entries)

    def watchers(self, task_id: str) -> int:
        """How many waiters (blocking sends, streams) follow the task now."""
        entry = self._entries.get(task_id)
        return 0 if entry is None else entry.users

    def watch(self, task_id: str) -> Watch:
        return Watch(self, task_id)

    def _release(self, task_id: str) -> None:
        entry = self._entries.get(task_id)
        if entry is not None:
            entry.users -= 1
            if entry.users <= 0:
                del self._entries[task_id]


class Watch:
    """``with hub.watch(tid) as w``: ``w.changed()`` before a read, then ``await`` it."""

    def __init__(self, hub: TaskHub, task_id: str) -> None:
        self._hub = hub
        self._task_id = task_id

    def __enter__(self) -> Watch:
        self._hub._entry(self._task_id).users += 1
        return self

    def __exit__(self, *exc: object) -> None:
        self._hub._release(self._task_id)

    def changed(self) -> trio.Event:
        return self._hub._entry(self._task_id).changed

    def tail_after(self, seq: int) -> list[TaskEvent] | None:
        """The events after ``seq`` from memory, in order and without a gap (an event stored but
        not told yet ends the list: its pulse comes), or None if the tail does not reach back that
        far."""
        told = self.told_after(seq)
        return None if told is None else [t.event for t in told]

    def told_after(self, seq: int) -> list[Told] | None:
        """:meth:`tail_after` as the tail holds them (with their encodings)."""
        tail = self._hub._entry(self._task_id).tail
        if not tail or tail[0].event.seq > seq + 1:
            return None
        if tail[-1].event.seq <= seq:
            return []  # the common case of a reader that is up to date
        out: list[Told] = []
        for told in reversed(tail):  # the news is at the end
            if told.event.seq <= seq:
                break
            out.append(told)
        out.reverse()
        for i, told in enumerate(out):
            if told.event.seq != seq + 1 + i:
                return out[:i]
        return out
