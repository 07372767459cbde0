"""Fill a task store to a size for bench_growth.py, through the store's own write path.

``python bench/growth_fill.py controller DB_FILE INSTANCE_ID COUNT`` or
``python bench/growth_fill.py peer SQLITE_FILE COUNT [--via save|mapping]`` adds COUNT completed
one-line echo tasks and prints one JSON line: ``{"filled", "seconds", "sample"}`` (``sample``: up to
:data:`SAMPLE` of the new task ids, spread over the fill, for GetTask). The server must be stopped:
the file is written from this process. Run in a child process so that the bench's own process
never holds the store (nor SQLAlchemy) open.

The controller's store (:func:`fill_controller`): the file is opened as the controller opens it
(``Store.open``: its migrations), and each task is written with the calls the task service and the
runner make for a one-line echo task, the changes built with the controller's own helpers:
``TaskTable.create`` (the row, submitted, and the message that started it), ``append_many`` (the
working status with its exec) and ``append_many`` (the stdout artifact, its closing chunk and the
completed status with exit code 0). One thing differs, the transaction: the table runs against
:class:`_InsideBatch`, a stand-in for the store's ``Database`` whose ``transaction``, ``quick`` and
``run`` run the table's function at once on the connection, inside one ``BEGIN IMMEDIATE`` ...
``COMMIT`` per :data:`BATCH` tasks held here (three commits per task would be the WAL's append and
the lock's round trips three times over: most of an hour for a million). The rows are what the
table writes; only their grouping into transactions is ours.

a2a-sdk's store (:func:`fill_peer`): the SDK's ``DatabaseTaskStore`` on the SQLite file as
``peer_a2a_server.py`` opens it (WAL, ``synchronous=NORMAL``), with ``Task`` objects equal to what
the peer's own echo send leaves (completed, a status timestamp, one artifact of one text part, no
history: the SDK stores none for it). ``--via save`` calls ``DatabaseTaskStore.save`` for each, all
saves of a batch in one session (``async_session_maker`` replaced by one that hands them the
batch's session): about 1 ms per task here (``save`` is a ``merge``, a lookup then an insert),
which is long at a million. ``--via mapping`` (the default) adds the store's own ORM rows
(``DatabaseTaskStore._to_orm``, what ``save`` merges) to the batch's session: the same rows, about
a quarter of the time.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
import uuid
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any, TypeVar, cast

T = TypeVar("T")

#: Tasks per transaction.
BATCH = 2000
#: Task ids kept for GetTask (spread over the fill).
SAMPLE = 500
#: The one line of the echo task: what bench_growth.py sends.
TEXT = "ping"
#: The runtime extension bench_growth.py's sends activate (kept in the task's metadata).
RUNTIME_EXTENSION = "https://agentic-sandbox.aiwg.io/extensions/runtime/v1"
#: Filled tasks' times: one every this many seconds, ending when the fill starts.
SPACING_S = 0.001


def _done(coro: Coroutine[Any, Any, T]) -> T:
    """The result of a store call that never waits (:class:`_InsideBatch` runs it at once)."""
    try:
        coro.send(None)
    except StopIteration as stop:
        return cast(T, stop.value)
    coro.close()
    raise RuntimeError("the store call waited for something: it cannot run inside the fill's transaction")


class _InsideBatch:
    """The store's Database as its tables see it, inside the transaction the filler holds: each
    function runs at once on the connection (no transaction of its own). Anything else the tables
    read (``for_update``, ``shared``, ...) is the real database's."""

    def __init__(self, real: Any, conn: Any) -> None:
        self._real, self._conn = real, conn

    def __getattr__(self, name: str) -> Any:
        return getattr(self._real, name)

    def transaction(self, fn: Callable[[Any], T]) -> Callable[[Any], T]:
        return fn

    async def quick(self, fn: Callable[[Any], T]) -> T:
        return fn(self._conn)

    async def run(self, fn: Callable[[Any], T]) -> T:
        return fn(self._conn)

    def lock_table(self, conn: Any, table: str) -> None:
        pass


def fill_controller(db_file: Path, instance_id: str, count: int) -> dict[str, Any]:
    import msgspec

    from agentic_sandbox.controller.store import Append, Store, TaskRecord
    from agentic_sandbox.controller.store.tasks import TaskTable, rfc3339_us
    from agentic_sandbox.controller.tasks.agentio import EXTENSIONS, message_dict
    from agentic_sandbox.controller.tasks.model import Message
    from agentic_sandbox.controller.tasks.runner import status_change
    from agentic_sandbox.controller.tasks.service import TASK_CREATED_AT
    from agentic_sandbox.proto import new_id

    owner = new_id()  # as a controller's id looks
    first_at = time.time() - count * SPACING_S
    sample_every = max(1, count // SAMPLE)
    sample: list[str] = []

    def one(table: TaskTable, i: int) -> None:
        now = first_at + i * SPACING_S
        task_id, context_id, message_id = new_id(), new_id(), str(uuid.uuid4())
        msg = msgspec.convert({"messageId": message_id, "role": "ROLE_USER", "parts": [{"text": TEXT}]}, Message)
        rec = TaskRecord(
            id=task_id,
            instance_id=instance_id,
            context_id=context_id,
            state="TASK_STATE_SUBMITTED",
            status={"state": "TASK_STATE_SUBMITTED", "timestamp": rfc3339_us(now)},
            metadata={TASK_CREATED_AT: rfc3339_us(now), EXTENSIONS: [RUNTIME_EXTENSION]},
            last_at=now,
            created_at=now,
            status_at=now,
        )
        first = Append(kind="message", body=message_dict(msg, task_id=task_id, context_id=context_id))
        _done(table.create(rec, first, owner=owner, until=now + 2.0, message_id=message_id))
        working = status_change(rec, "TASK_STATE_WORKING", exec_id=new_id())
        _, rec = _done(table.append_many(task_id, [working], now + 0.002, owner=owner))
        out = {"artifactId": "stdout", "name": "stdout", "parts": [{"text": TEXT}]}
        body = {"taskId": task_id, "contextId": context_id, "artifact": out}
        tail = {"artifactId": "stdout", "name": "stdout", "parts": [{"text": ""}]}
        closing = {"taskId": task_id, "contextId": context_id, "artifact": tail, "append": True, "lastChunk": True}
        done = status_change(
            rec, "TASK_STATE_COMPLETED", metadata={**rec.metadata, "exit_code": 0}, exec_seq=1, unless_terminal=True
        )
        changes = [
            Append(kind="artifact", body=body, artifact=out, append=False, exec_seq=1),
            Append(kind="artifact", body=closing, artifact=tail, append=True, unless_terminal=True),
            done,
        ]
        _done(table.append_many(task_id, changes, now + 0.004, owner=owner))
        if i % sample_every == 0 and len(sample) < SAMPLE:
            sample.append(task_id)

    store = Store.open(db_file)
    t0 = time.perf_counter()
    try:
        for start in range(0, count, BATCH):

            def batch(conn: Any, start: int = start) -> None:
                table = TaskTable(cast(Any, _InsideBatch(store.db, conn)))
                conn.execute("BEGIN IMMEDIATE")
                try:
                    for i in range(start, min(count, start + BATCH)):
                        one(table, i)
                except BaseException:
                    conn.execute("ROLLBACK")
                    raise
                conn.execute("COMMIT")

            store.db.locked(batch)
    finally:
        store.close()  # the last connection: SQLite checkpoints the WAL into the file and removes it
    return {"filled": count, "seconds": time.perf_counter() - t0, "sample": sample}


class _BatchSession:
    """Stands in for ``DatabaseTaskStore.async_session_maker`` during a batch: ``begin()`` hands
    every save the batch's one session and commits nothing (the batch does, once)."""

    def __init__(self, session: Any) -> None:
        self.session = session

    def begin(self) -> _BatchSession:
        return self

    async def __aenter__(self) -> Any:
        return self.session

    async def __aexit__(self, *exc: object) -> None:
        return None


async def _fill_peer(path: Path, count: int, via: str) -> dict[str, Any]:
    from a2a.server.context import ServerCallContext
    from a2a.types import Artifact, Part, Task, TaskState, TaskStatus
    from google.protobuf.timestamp_pb2 import Timestamp
    from peer_a2a_server import sqlite_store

    store: Any = sqlite_store(str(path))
    await store.initialize()
    context = ServerCallContext()  # the peer's requests carry no user: owner ''
    owner = store.owner_resolver(context)
    first_us = time.time_ns() // 1000 - int(count * SPACING_S * 1e6)
    sample_every = max(1, count // SAMPLE)
    sample: list[str] = []
    real = store.async_session_maker
    t0 = time.perf_counter()
    try:
        for start in range(0, count, BATCH):
            tasks = []
            for i in range(start, min(count, start + BATCH)):
                stamp = Timestamp()
                stamp.FromMicroseconds(first_us + int(i * SPACING_S * 1e6))  # what the SDK stamps: µs
                task = Task(
                    id=str(uuid.uuid4()),
                    context_id=str(uuid.uuid4()),
                    status=TaskStatus(state=TaskState.TASK_STATE_COMPLETED, timestamp=stamp),
                    artifacts=[Artifact(artifact_id=str(uuid.uuid4()), parts=[Part(text=TEXT)])],
                )
                tasks.append(task)
                if i % sample_every == 0 and len(sample) < SAMPLE:
                    sample.append(task.id)
            async with real.begin() as session:
                if via == "save":
                    store.async_session_maker = _BatchSession(session)
                    try:
                        for task in tasks:
                            await store.save(task, context)
                    finally:
                        store.async_session_maker = real
                else:
                    session.add_all([store._to_orm(task, owner) for task in tasks])
    finally:
        await store.engine.dispose()
    return {"filled": count, "seconds": time.perf_counter() - t0, "sample": sample}


def fill_peer(path: Path, count: int, via: str = "mapping") -> dict[str, Any]:
    return asyncio.run(_fill_peer(path, count, via))


def main() -> None:
    args = sys.argv[1:]
    via = "mapping"
    if "--via" in args:
        at = args.index("--via")
        via = args[at + 1]
        del args[at : at + 2]
    if args[:1] == ["controller"] and len(args) == 4:
        result = fill_controller(Path(args[1]), args[2], int(args[3]))
    elif args[:1] == ["peer"] and len(args) == 3 and via in ("save", "mapping"):
        result = fill_peer(Path(args[1]), int(args[2]), via)
    else:
        raise SystemExit(__doc__.split("\n\n")[1])
    print(json.dumps(result), flush=True)


if __name__ == "__main__":
    main()
