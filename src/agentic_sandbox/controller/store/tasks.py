"""A2A tasks: the task row, its ordered event timeline and its artifacts.

Every change to a task is one :meth:`TaskTable.append` transaction: the event gets the next
sequence number of its task (``last_seq + 1``) and a timeline time strictly after the previous
one, the row takes the new status (if the event carries one) and the exec position it came from,
and an artifact chunk is folded into the stored artifact. So a reader never sees a status without
the events before it, and a restarted controller resumes an exec's output exactly where the last
acknowledged event left it (``exec_seq``). Several changes may go in one transaction
(:meth:`TaskTable.append_many`): the row is read once at its start, the changes are applied to it
in memory (what is returned is that row, not a second read) and it is written once at its end.

Ownership (schema step 8): a task's exec stream is followed by one controller at a time, the
task's ``owner``, whose claim lasts until ``owner_until`` unless it renews it
(:meth:`TaskTable.renew`, all its tasks in one statement). A task is created owned by the
controller that starts it; an unfinished task whose claim ran out (:meth:`TaskTable.orphans`) is
taken by another (:meth:`TaskTable.claim`), which resumes the stream from the stored ``exec_seq``.
The changes a runner makes carry its controller's id (``append_many(..., owner=...)``): written
only while the task is still its own, else :class:`LeaseLost` and nothing is written; so a
controller that stalled past its claim cannot write an event its successor writes too.

Event kinds: ``message`` (a Message of the history), ``status`` (a TaskStatusUpdateEvent) and
``artifact`` (a TaskArtifactUpdateEvent); bodies are their A2A JSON. Times are Unix seconds.
"""

from __future__ import annotations

from collections.abc import Iterable
from datetime import UTC, datetime
from typing import Any

import msgspec

from .database import Connection, Database, from_json, to_json

TERMINAL = ("TASK_STATE_COMPLETED", "TASK_STATE_FAILED", "TASK_STATE_CANCELED", "TASK_STATE_REJECTED")
INTERRUPTED = ("TASK_STATE_INPUT_REQUIRED", "TASK_STATE_AUTH_REQUIRED")
#: Timeline times of one task are at least this far apart, so they order as they were stored.
TICK_S = 1e-6
#: Tasks deleted by one purge transaction at most (a short hold of the store; the purger repeats).
PURGE_BATCH = 500
#: hitl-prompt/v1: a waiting task's status message holds its prompt under this metadata key.
HITL_EXTENSION = "https://agentic-sandbox.aiwg.io/extensions/hitl-prompt/v1"
#: The gateway's timeline key (kagent metadata note), set on every message and artifact stored.
TIMELINE_POSITION = "kagent.dev/a2a/timeline-position"


class LeaseLost(RuntimeError):
    """The task is owned by another controller now: the change was not written."""


def rfc3339_us(ts: float) -> str:
    """RFC 3339 UTC with microseconds (what timeline positions need to order)."""
    return datetime.fromtimestamp(ts, UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")


def stamp(kind: str, body: dict[str, Any], at: float) -> None:
    """Set the timeline position on the message or artifact an event carries."""
    target: dict[str, Any] | None = None
    if kind == "message":
        target = body
    elif kind == "status":
        body["status"]["timestamp"] = rfc3339_us(at)
        target = body["status"].get("message")
    elif kind == "artifact":
        target = body.get("artifact")
    if target is not None:
        target["metadata"] = {**(target.get("metadata") or {}), TIMELINE_POSITION: rfc3339_us(at)}


class TaskRecord(msgspec.Struct, kw_only=True):
    id: str
    instance_id: str
    context_id: str
    state: str
    status: dict[str, Any]
    metadata: dict[str, Any] = {}
    exec_id: str | None = None
    exec_seq: int = 0
    last_seq: int = 0
    last_at: float
    created_at: float
    status_at: float

    @property
    def terminal(self) -> bool:
        return self.state in TERMINAL


class TaskEvent(msgspec.Struct, frozen=True, kw_only=True):
    task_id: str
    seq: int
    kind: str
    body: dict[str, Any]
    at: float


class TaskSnapshot(msgspec.Struct, kw_only=True):
    """A task read at one point of its timeline: its artifacts hold exactly the output of its
    events up to ``record.last_seq``, so a reader that goes on from there sees each chunk once."""

    record: TaskRecord
    artifacts: list[dict[str, Any]]
    #: The last messages asked for, oldest first.
    history: list[dict[str, Any]]


class Append(msgspec.Struct, kw_only=True):
    """One change: an event, and what it changes on the row."""

    kind: str
    body: dict[str, Any]
    status: dict[str, Any] | None = None
    exec_id: str | None = None
    exec_seq: int | None = None
    metadata: dict[str, Any] | None = None
    #: An artifact chunk: (artifact, append) folded into the stored artifact.
    artifact: dict[str, Any] | None = None
    append: bool = False
    #: Skip the change (append returns None) if the task is terminal already: the one guard
    #: between two writers that both want to end a task (an exit and a cancel).
    unless_terminal: bool = False
    #: Skip the change unless the task waits on the hitl-prompt/v1 prompt of this id: the guard
    #: that lets exactly one answer through.
    if_prompt: str | None = None
    #: A control message for the task's agent, queued in the agent outbox with this event.
    outbox: dict[str, Any] | None = None


def _record(row: Any) -> TaskRecord:
    return TaskRecord(
        id=row["id"],
        instance_id=row["instance_id"],
        context_id=row["context_id"],
        state=row["state"],
        status=from_json(row["status"]),
        metadata=from_json(row["metadata"]) or {},
        exec_id=row["exec_id"],
        exec_seq=row["exec_seq"],
        last_seq=row["last_seq"],
        last_at=row["last_at"],
        created_at=row["created_at"],
        status_at=row["status_at"],
    )


def _event(row: Any) -> TaskEvent:
    """An event row read with its task's ``context_id``, its body whole again (:func:`_whole`)."""
    task_id, kind, at = row["task_id"], row["kind"], row["at"]
    body = _whole(from_json(row["body"]), task_id, row["context_id"], kind, at)
    return TaskEvent(task_id=task_id, seq=row["seq"], kind=kind, body=body, at=at)


# -- the compact event body ------------------------------------------------------------------------
#
# An event's body is stored without what the row says already: the task and context ids every A2A
# event and message of a task repeats, and the timeline stamps (:func:`stamp`), which are the
# event's own time. Read back, a body is made whole again, so a reader sees exactly what was
# stored before (a body stored whole, by an older controller, reads the same way).


def _compact(event: TaskEvent, context_id: str) -> dict[str, Any]:
    """The body to store: ``event.body`` without its ids and stamps (the body itself, shared with
    the readers in memory, is left as it is)."""
    body, position = event.body, rfc3339_us(event.at)
    out = {k: v for k, v in body.items() if not _said((k, v), event.task_id, context_id)}
    if event.kind == "message":
        _unstamp(out, position)
    elif event.kind == "status" and isinstance(status := out.get("status"), dict):
        status = out["status"] = {k: v for k, v in status.items() if not (k == "timestamp" and v == position)}
        if isinstance(status.get("message"), dict):
            status["message"] = _unstamp(dict(status["message"]), position)
    elif event.kind == "artifact" and isinstance(out.get("artifact"), dict):
        out["artifact"] = _unstamp(dict(out["artifact"]), position)
    return out


def _said(item: tuple[str, Any], task_id: str, context_id: str) -> bool:
    key, value = item
    return (key == "taskId" and value == task_id) or (key == "contextId" and value == context_id)


def _unstamp(target: dict[str, Any], position: str) -> dict[str, Any]:
    metadata = target.get("metadata")
    if isinstance(metadata, dict) and metadata.get(TIMELINE_POSITION) == position:
        rest = {k: v for k, v in metadata.items() if k != TIMELINE_POSITION}
        if rest:
            target["metadata"] = rest
        else:
            del target["metadata"]
    return target


def _whole(body: dict[str, Any], task_id: str, context_id: str, kind: str, at: float) -> dict[str, Any]:
    """A stored body as it was before :func:`_compact`."""
    if kind == "message":
        body = {**body, "taskId": body.get("taskId", task_id), "contextId": body.get("contextId", context_id)}
    else:
        body = {"taskId": task_id, "contextId": context_id, **body}
    stamp(kind, body, at)
    return body


def fold_artifact(stored: dict[str, Any] | None, chunk: dict[str, Any], append: bool) -> dict[str, Any]:
    """The artifact after a chunk: a new one replaces, an appended one adds its parts (text
    following text is joined, so an artifact reads as one text however it was chunked; a part
    marked ``_joins`` is the artifact's last part grown, and replaces it: see
    :mod:`controller.tasks.agentevents`)."""
    if stored is None or not append:
        return {**chunk, "parts": [_unmarked(p) for p in chunk["parts"]]}
    parts = [dict(p) for p in stored["parts"]]
    for part in chunk["parts"]:
        if part.get("_joins") and parts:
            parts[-1] = _unmarked(part)
        elif parts and set(parts[-1]) == {"text"} and set(part) == {"text"}:
            parts[-1]["text"] += part["text"]
        else:
            parts.append(_unmarked(part))
    return {**stored, "parts": parts}


def _unmarked(part: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in part.items() if k != "_joins"}


class TaskTable:
    def __init__(self, db: Database) -> None:
        self._db = db
        self._read_for_update = f"SELECT * FROM tasks WHERE id = ?{db.for_update}"

    async def create(
        self,
        rec: TaskRecord,
        first: Append,
        *,
        owner: str | None = None,
        until: float = 0.0,
        message_id: str | None = None,
    ) -> TaskEvent:
        """Insert the task with its first event (the message that started it), owned by ``owner``
        until ``until``; ``rec`` is brought up to date with it."""

        def create(db: Connection) -> TaskEvent:
            rec.last_seq, rec.last_at = 0, rec.created_at - TICK_S
            event = _apply(rec, first, rec.created_at)
            assert event is not None
            db.execute(
                f"INSERT INTO tasks ({_INSERTED}) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)",
                (
                    rec.id,
                    rec.instance_id,
                    rec.context_id,
                    rec.state,
                    to_json(rec.status),
                    to_json(rec.metadata),
                    rec.exec_id,
                    rec.exec_seq,
                    rec.last_seq,
                    rec.last_at,
                    rec.created_at,
                    rec.status_at,
                    owner,
                    until,
                    message_id,
                ),
            )
            rows: list[tuple[Any, ...]] = []
            _store_event(db, event, first, rows, rec.context_id)
            _insert_events(db, rows)
            _recount(db, {(rec.instance_id, rec.state): 1})
            return event

        return await self._db.quick(self._db.transaction(create))

    async def append(self, task_id: str, change: Append, now: float) -> tuple[TaskEvent | None, TaskRecord]:
        """Add one event (see the module docstring); returns it (None if skipped) and the row."""
        events, rec = await self.append_many(task_id, [change], now)
        return events[0], rec

    async def append_many(
        self, task_id: str, changes: list[Append], now: float, *, owner: str | None = None
    ) -> tuple[list[TaskEvent | None], TaskRecord]:
        """Several events in one transaction (a task's last chunks and its final status); the
        row is read once, at the start, and the one returned is what the changes made of it.
        With ``owner``: only while the task is that controller's (else :class:`LeaseLost`)."""

        def append(db: Connection) -> tuple[list[TaskEvent | None], TaskRecord]:
            row = db.execute(self._read_for_update, (task_id,)).fetchone()
            if owner is not None and row["owner"] != owner:
                raise LeaseLost(f"task {task_id} is followed by controller {row['owner']} now")
            rec = _record(row)
            before = msgspec.structs.astuple(rec)
            events = []
            rows: list[tuple[Any, ...]] = []
            for change in changes:
                event = _apply(rec, change, now)
                if event is not None:
                    _store_event(db, event, change, rows, rec.context_id)
                events.append(event)
            _insert_events(db, rows)
            _update_row(db, rec, before)
            return events, rec

        return await self._db.quick(self._db.transaction(append))

    async def get(self, task_id: str) -> TaskRecord | None:
        row = await self._db.quick(lambda db: db.execute("SELECT * FROM tasks WHERE id = ?", (task_id,)).fetchone())
        return None if row is None else _record(row)

    async def get_many(self, task_ids: Iterable[str]) -> dict[str, TaskRecord]:
        """The tasks of ``task_ids`` that exist, by id, in one read per 500 ids."""
        wanted = sorted(set(task_ids))

        def read(db: Connection) -> dict[str, TaskRecord]:
            found: dict[str, TaskRecord] = {}
            for start in range(0, len(wanted), 500):
                chunk = wanted[start : start + 500]
                marks = ",".join("?" * len(chunk))
                for row in db.execute(f"SELECT * FROM tasks WHERE id IN ({marks})", chunk).fetchall():
                    found[row["id"]] = _record(row)
            return found

        return await self._db.run(read) if wanted else {}

    async def snapshot(self, task_id: str, history_limit: int | None, *, artifacts: bool = True) -> TaskSnapshot | None:
        """The task with its artifacts (unless ``artifacts`` is false) and last ``history_limit``
        messages, in one read (see :class:`TaskSnapshot`); None if there is no such task."""

        def read(db: Connection) -> TaskSnapshot | None:
            row = db.execute("SELECT * FROM tasks WHERE id = ?", (task_id,)).fetchone()
            if row is None:
                return None
            found, history = _contents(db, task_id, history_limit, artifacts=artifacts)
            return TaskSnapshot(record=_record(row), artifacts=found, history=history)

        return await self._db.quick(read)

    async def events_after(self, task_id: str, seq: int, limit: int = 500) -> list[TaskEvent]:
        rows = await self._db.quick(
            lambda db: db.execute(
                "SELECT e.*, t.context_id FROM task_events e JOIN tasks t ON t.id = e.task_id"
                " WHERE e.task_id = ? AND e.seq > ? ORDER BY e.seq LIMIT ?",
                (task_id, seq, limit),
            ).fetchall()
        )
        return [_event(r) for r in rows]

    async def history(self, task_id: str, limit: int | None) -> list[dict[str, Any]]:
        """The task's messages, oldest first; the last ``limit`` of them when given."""
        return await self._db.run(lambda db: _history(db, task_id, limit))

    async def artifacts(self, task_id: str) -> list[dict[str, Any]]:
        rows = await self._db.run(
            lambda db: db.execute(
                "SELECT body FROM task_artifacts WHERE task_id = ? ORDER BY position", (task_id,)
            ).fetchall()
        )
        return [from_json(r["body"]) for r in rows]

    async def page(
        self,
        instance_id: str | None,
        *,
        context_id: str | None,
        state: str | None,
        status_after: float | None,
        after: tuple[float, str] | None,
        limit: int,
    ) -> tuple[list[TaskRecord], int]:
        """One page, newest status first (ties by id), after the ``after`` cursor; and the total
        number of tasks matching the filters. ``instance_id`` None: every instance's tasks."""
        where: list[str] = []
        args: list[Any] = []
        # With a context, its index is the one to read (a context holds few tasks, an instance
        # or a state may hold the whole history); SQLite's planner, which has no statistics
        # here, would take an index of more equalities that also gives the order. ``|| ''``
        # keeps a column's term off every index, in SQLite and PostgreSQL alike.
        off_index = " || ''" if context_id is not None else ""
        if instance_id is not None:
            where.append(f"instance_id{off_index} = ?")
            args.append(instance_id)
        if context_id is not None:
            where.append("context_id = ?")
            args.append(context_id)
        if state is not None:
            where.append(f"state{off_index} = ?")
            args.append(state)
        if status_after is not None:
            where.append("status_at >= ?")
            args.append(status_after)
        filters = " AND ".join(where) or "1 = 1"
        page_where, page_args = filters, list(args)
        if after is not None:
            page_where += " AND (status_at < ? OR (status_at = ? AND id < ?))"
            page_args += [after[0], after[0], after[1]]

        counted = context_id is None and status_after is None
        count = _COUNTED.format(
            instance="instance_id = ?" if instance_id is not None else "1 = 1",
            states="state = ?" if state is not None else "1 = 1",
        )
        count_args = ([instance_id] if instance_id is not None else []) + ([state] if state is not None else [])

        def query(db: Connection) -> tuple[list[TaskRecord], int]:
            if counted:  # kept as tasks change: a few rows, whatever the history
                total = db.execute(count, count_args).fetchone()[0] or 0
            else:  # the rows of one context, or those changed since a time: an index range
                total = db.execute(f"SELECT COUNT(*) FROM tasks WHERE {filters}", args).fetchone()[0]
            rows = db.execute(
                f"SELECT * FROM tasks WHERE {page_where} ORDER BY status_at DESC, id DESC LIMIT ?", [*page_args, limit]
            ).fetchall()
            return [_record(r) for r in rows], int(total)

        return await self._db.run(query)

    async def purge(self, ended_before: float, limit: int = PURGE_BATCH) -> list[str]:
        """Delete up to ``limit`` terminal tasks whose last status is older than ``ended_before``,
        oldest first, with their events, artifacts, push configs and queued agent messages; returns
        their ids. One short transaction: the caller repeats while a whole batch went."""
        marks = ",".join("?" * len(TERMINAL))
        # tasks_by_status_at from its old end; an unfinished task there is stepped over.
        oldest = f"SELECT id FROM tasks WHERE status_at < ? AND state IN ({marks}) ORDER BY status_at, id LIMIT ?"

        def purge(db: Connection) -> list[str]:
            ids = [row[0] for row in db.execute(oldest, (ended_before, *TERMINAL, limit)).fetchall()]
            return _delete(db, ids)

        return await self._db.run(self._db.transaction(purge))

    async def trim(self, keep: int, limit: int = PURGE_BATCH) -> list[str]:
        """Delete the oldest terminal tasks of each instance that has more than ``keep`` of them
        (at most ``limit`` in all), as :meth:`purge` does; returns their ids."""
        marks = ",".join("?" * len(TERMINAL))
        over = (
            f"SELECT instance_id, SUM(n) FROM task_counts WHERE state IN ({marks})"
            " GROUP BY instance_id HAVING SUM(n) > ?"
        )
        oldest = "SELECT id, status_at FROM tasks WHERE instance_id = ? AND state = ? ORDER BY status_at, id LIMIT ?"

        def trim(db: Connection) -> list[str]:
            doomed: list[str] = []
            for instance_id, ended in db.execute(over, (*TERMINAL, keep)).fetchall():
                excess = min(int(ended) - keep, limit - len(doomed))
                if excess <= 0:
                    break
                # The oldest of each ended state, merged: the instance's ``excess`` oldest ended tasks.
                found = [r for state in TERMINAL for r in db.execute(oldest, (instance_id, state, excess)).fetchall()]
                found.sort(key=lambda r: (r[1], r[0]))
                doomed += [r[0] for r in found[:excess]]
            return _delete(db, doomed)

        return await self._db.run(self._db.transaction(trim))

    async def unfinished(self) -> list[TaskRecord]:
        rows = await self._db.run(
            lambda db: db.execute(f"SELECT * FROM tasks WHERE {UNFINISHED} ORDER BY created_at").fetchall()
        )
        return [_record(r) for r in rows]

    async def by_message(self, instance_id: str, message_id: str) -> TaskRecord | None:
        """The instance's task started by the message ``message_id``, if any."""
        row = await self._db.quick(
            lambda db: db.execute(
                "SELECT * FROM tasks WHERE instance_id = ? AND message_id = ?", (instance_id, message_id)
            ).fetchone()
        )
        return None if row is None else _record(row)

    async def last_seqs(self, task_ids: list[str]) -> dict[str, int]:
        """The last event sequence of each of these tasks (those that exist)."""
        marks = ",".join("?" * len(task_ids))
        rows = await self._db.run(
            lambda db: db.execute(f"SELECT id, last_seq FROM tasks WHERE id IN ({marks})", task_ids).fetchall()
        )
        return {row[0]: int(row[1]) for row in rows}

    # -- ownership (see the module docstring) ---------------------------------------------------

    async def orphans(self, now: float, limit: int = 100, *, host_id: str | None = None) -> list[TaskRecord]:
        """Unfinished tasks whose owner's claim ran out before ``now``, oldest first. With
        ``host_id``, none of an instance placed on another host: only a controller of an
        instance's host can follow its exec. Those of unplaced instances (rows from before hosts
        were recorded) and of instances gone from the catalog are still offered: any controller
        can end them, and none would if every host passed them over."""
        elsewhere = (
            ""
            if host_id is None
            else " AND NOT EXISTS (SELECT 1 FROM instances i WHERE i.id = tasks.instance_id"
            " AND i.host_id IS NOT NULL AND i.host_id <> ?)"
        )
        args: tuple[Any, ...] = (now, limit) if host_id is None else (now, host_id, limit)
        rows = await self._db.run(
            lambda db: db.execute(
                f"SELECT * FROM tasks WHERE {UNFINISHED} AND owner_until < ?{elsewhere} ORDER BY created_at LIMIT ?",
                args,
            ).fetchall()
        )
        return [_record(r) for r in rows]

    async def instance_of(self, task_id: str) -> str | None:
        """The instance a task belongs to; None if there is no such task."""
        row = await self._db.quick(
            lambda db: db.execute("SELECT instance_id FROM tasks WHERE id = ?", (task_id,)).fetchone()
        )
        return None if row is None else str(row[0])

    async def claim(self, task_id: str, owner: str, until: float, now: float, *, steal: bool = False) -> bool:
        """Make the task ``owner``'s until ``until`` if its claim ran out (or it is ``owner``'s
        already, or ``steal``: the embedded store has one controller, whose predecessor is dead)."""
        taken = "" if steal else " AND (owner_until < ? OR owner = ?)"
        args: tuple[Any, ...] = (owner, until, task_id) if steal else (owner, until, task_id, now, owner)
        cursor = await self._db.quick(
            lambda db: db.execute(
                f"UPDATE tasks SET owner = ?, owner_until = ? WHERE id = ? AND {UNFINISHED}{taken}", args
            )
        )
        return cursor.rowcount == 1


def _contents(
    db: Connection, task_id: str, history_limit: int | None, *, artifacts: bool = True
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    found: list[Any] = []
    if artifacts:
        found = db.execute("SELECT body FROM task_artifacts WHERE task_id = ? ORDER BY position", (task_id,)).fetchall()
    return [from_json(r["body"]) for r in found], _history(db, task_id, history_limit)


_MESSAGES = (
    "SELECT e.body, e.at, t.context_id FROM task_events e JOIN tasks t ON t.id = e.task_id"
    " WHERE e.task_id = ? AND e.kind = 'message' ORDER BY e.seq DESC"
)


def _history(db: Connection, task_id: str, limit: int | None) -> list[dict[str, Any]]:
    """The task's messages, oldest first; the last ``limit`` of them when given."""
    if limit == 0:
        return []
    if limit is None:
        rows = db.execute(_MESSAGES, (task_id,)).fetchall()
    else:
        rows = db.execute(_MESSAGES + " LIMIT ?", (task_id, limit)).fetchall()
    return [_whole(from_json(r["body"]), task_id, r["context_id"], "message", r["at"]) for r in reversed(rows)]


def _apply(rec: TaskRecord, change: Append, now: float) -> TaskEvent | None:
    """``change`` as the task's next event, applied to ``rec`` (the row as it stands in this
    transaction, kept up to date here so that it is never read again); None if it is skipped."""
    if change.unless_terminal and rec.state in TERMINAL:
        return None
    if change.if_prompt is not None and waits_on(rec) != change.if_prompt:
        return None
    seq, at = rec.last_seq + 1, max(now, rec.last_at + TICK_S)
    stamp(change.kind, change.body, at)  # the body's status / artifact are the change's own dicts
    rec.last_seq, rec.last_at = seq, at
    if change.status is not None:
        rec.status, rec.state, rec.status_at = change.status, change.status["state"], at
    if change.exec_id is not None:
        rec.exec_id = change.exec_id
    if change.exec_seq is not None:
        rec.exec_seq = change.exec_seq
    if change.metadata is not None:
        rec.metadata = change.metadata
    return TaskEvent(task_id=rec.id, seq=seq, kind=change.kind, body=change.body, at=at)


_INSERT_EVENT = "INSERT INTO task_events VALUES (?,?,?,?,?)"


def _store_event(
    db: Connection, event: TaskEvent, change: Append, rows: list[tuple[Any, ...]], context_id: str
) -> None:
    """Store the artifact chunk and the outbox message the event carries; the event's own row
    goes on ``rows``, inserted with the transaction's others (:func:`_insert_events`)."""
    rows.append((event.task_id, event.seq, event.kind, to_json(_compact(event, context_id)), event.at))
    if change.artifact is not None:
        shown = event.body.get("artifact")
        if isinstance(shown, dict) and shown is not change.artifact and "metadata" in shown:
            change.artifact["metadata"] = shown["metadata"]  # the timeline position stamped on it
        _fold_into_store(db, event.task_id, change.artifact, change.append)
    if change.outbox is not None:
        db.execute("INSERT INTO agent_outbox VALUES (?,?,?)", (event.task_id, event.seq, to_json(change.outbox)))


def _insert_events(db: Connection, rows: list[tuple[Any, ...]]) -> None:
    """A transaction's event rows in one go (one round trip to a database server: a pipeline)."""
    if len(rows) == 1:
        db.execute(_INSERT_EVENT, rows[0])
    elif rows:
        db.executemany(_INSERT_EVENT, rows)


UNFINISHED = "state NOT IN ('TASK_STATE_COMPLETED','TASK_STATE_FAILED','TASK_STATE_CANCELED','TASK_STATE_REJECTED')"
_INSERTED = ", ".join((*TaskRecord.__struct_fields__, "owner", "owner_until", "message_id"))

#: The row's columns a change may set (each held by the TaskRecord field of the same name).
_CHANGING = frozenset({"state", "status", "metadata", "exec_id", "exec_seq", "last_seq", "last_at", "status_at"})
_JSON_COLUMNS = frozenset({"status", "metadata"})
_FIELDS = TaskRecord.__struct_fields__


def _update_row(db: Connection, rec: TaskRecord, before: tuple[Any, ...]) -> None:
    """One UPDATE of the columns the transaction's changes set (none if every change was skipped)."""
    sets: list[str] = []
    args: list[Any] = []
    for name, old in zip(_FIELDS, before, strict=True):
        value = getattr(rec, name)
        if name in _CHANGING and value is not old:
            sets.append(f"{name} = ?")
            args.append(to_json(value) if name in _JSON_COLUMNS else value)
    if sets:
        db.execute(f"UPDATE tasks SET {', '.join(sets)} WHERE id = ?", [*args, rec.id])
    was = before[_STATE_AT]
    if rec.state != was:
        _recount(db, {(rec.instance_id, was): -1, (rec.instance_id, rec.state): 1})


#: Where the state is in a TaskRecord as a tuple.
_STATE_AT = _FIELDS.index("state")
#: One count of ``task_counts``, moved by ``excluded.n`` (its row made at the first task).
_BUMP = (
    "INSERT INTO task_counts VALUES (?,?,?)"
    " ON CONFLICT (instance_id, state) DO UPDATE SET n = task_counts.n + excluded.n"
)
#: The count of an instance's tasks in the states asked; every instance's (a row per instance and
#: state: no row that every task's change would lock) with ``{instance}`` ``1 = 1``.
_COUNTED = "SELECT SUM(n) FROM task_counts WHERE {instance} AND {states}"


def _recount(db: Connection, deltas: dict[tuple[str, str], int]) -> None:
    """Move the counts of (instance, state) by their deltas. In key order: two transactions of a
    shared store lock the rows in one order."""
    moves = [(*key, delta) for key, delta in sorted(deltas.items()) if delta]
    if moves:
        db.executemany(_BUMP, moves)


def _delete(db: Connection, ids: list[str]) -> list[str]:
    """Delete these tasks with everything of theirs; the counts go down by the rows this
    transaction deleted (another controller's purge may have taken some first)."""
    if not ids:
        return []
    marks = ",".join("?" * len(ids))
    for table in ("task_events", "task_artifacts", "push_configs", "agent_outbox"):
        db.execute(f"DELETE FROM {table} WHERE task_id IN ({marks})", ids)
    gone = db.execute(f"DELETE FROM tasks WHERE id IN ({marks}) RETURNING id, instance_id, state", ids).fetchall()
    deltas: dict[tuple[str, str], int] = {}
    for _id, instance_id, state in gone:
        deltas[(instance_id, state)] = deltas.get((instance_id, state), 0) - 1
    _recount(db, deltas)
    return [row[0] for row in gone]


def _fold_into_store(db: Connection, task_id: str, chunk: dict[str, Any], append: bool) -> None:
    artifact_id = chunk["artifactId"]
    key = (task_id, artifact_id)
    if append and all(part == {"text": ""} for part in chunk["parts"]):
        # An empty chunk (a closing ``lastChunk``) changes nothing of a stored artifact: it is
        # neither read nor written again (it may be large).
        if db.execute("SELECT 1 FROM task_artifacts WHERE task_id = ? AND artifact_id = ?", key).fetchone():
            return
        found = None
    else:
        found = db.execute("SELECT body FROM task_artifacts WHERE task_id = ? AND artifact_id = ?", key).fetchone()
    folded = to_json(fold_artifact(from_json(found["body"]) if found else None, chunk, append))
    if found is None:  # a new artifact goes after the task's others
        db.execute(
            "INSERT INTO task_artifacts SELECT ?, ?, COUNT(*), ? FROM task_artifacts WHERE task_id = ?",
            (task_id, artifact_id, folded, task_id),
        )
    else:
        db.execute("UPDATE task_artifacts SET body = ? WHERE task_id = ? AND artifact_id = ?", (folded, *key))


def waits_on(rec: TaskRecord) -> str | None:
    """The id of the hitl-prompt/v1 prompt the task waits on (lowercase), if any."""
    if rec.state != "TASK_STATE_INPUT_REQUIRED":
        return None
    message = rec.status.get("message")
    metadata = message.get("metadata") if isinstance(message, dict) else None
    envelope = metadata.get(HITL_EXTENSION) if isinstance(metadata, dict) else None
    prompt_id = envelope.get("prompt_id") if isinstance(envelope, dict) else None
    return prompt_id.lower() if isinstance(prompt_id, str) else None
