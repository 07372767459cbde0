"""Asynchronous operations: ``op_<ULID>`` records, ``pending → running → succeeded|failed|canceled``.

Resource handling: the service runs each operation's work as a task in the app's nursery (handed in
with :meth:`OperationService.attach`), never in the request's, so a client that disconnects does not
cancel the work. Every state change is written to the store before it is visible, so operations are
durable across controller restarts.

Keys: an operation holds one or more keys (``name:<instance name>``, ``instance:<id>``) while it is
not terminal; callers ask :meth:`in_flight` to return the existing operation for a second provision
of the same name, or to refuse a second lifecycle verb on a busy instance.

Error handling: the work function returns the ``result`` dict or raises. A :class:`Problem` becomes
the operation's ``error`` envelope as is; a ``HostdError`` becomes 503 ``internal.unavailable`` (or
its explicit meaning); anything else is logged and becomes 500 ``internal.error``.

Restart policy (chosen): an operation found ``pending`` or ``running`` when the controller starts was
interrupted by the controller's own end. It is marked ``failed`` with code ``operation.interrupted``;
it is not resumed, because hostd is the source of truth for what runs and the instance catalog is
re-read from hostd on start, so the instance itself shows its real state. Ended operations stay
readable for ``retention_s`` (24 h by default), then a timer purges them.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Awaitable, Callable
from typing import Any

import trio

from proto import HostdError, bind_log_ids

from .metrics import Metrics
from .models import OperationView, iso
from .problems import Problem, from_hostd_error, internal_error
from .store import TERMINAL_STATES, OperationRecord, Store, StoreClosed

log = logging.getLogger(__name__)

Work = Callable[[OperationRecord], Awaitable[dict[str, Any]]]

_CROCKFORD = "0123456789ABCDEFGHJKMNPQRSTVWXYZ"


def new_ulid() -> str:
    """A ULID: 48-bit Unix milliseconds then 80 random bits, 26 Crockford base32 characters."""
    value = (time.time_ns() // 1_000_000) << 80 | int.from_bytes(os.urandom(10), "big")
    chars = []
    for _ in range(26):
        chars.append(_CROCKFORD[value & 31])
        value >>= 5
    return "".join(reversed(chars))


def new_operation_id() -> str:
    return "op_" + new_ulid()


def operation_path(op_id: str) -> str:
    return f"/api/v2/admin/operations/{op_id}"


def to_view(op: OperationRecord) -> OperationView:
    return OperationView(
        id=op.id,
        kind=op.kind,
        state=op.state,
        created_at=iso(op.created_at),
        started_at=None if op.started_at is None else iso(op.started_at),
        completed_at=None if op.completed_at is None else iso(op.completed_at),
        result=op.result,
        error=op.error,
    )


class OperationService:
    def __init__(self, store: Store, metrics: Metrics, *, retention_s: float) -> None:
        self.store = store
        self.metrics = metrics
        self.retention_s = retention_s
        self._nursery: trio.Nursery | None = None
        self._inflight: dict[str, str] = {}
        self._done: dict[str, trio.Event] = {}

    def attach(self, nursery: trio.Nursery) -> None:
        self._nursery = nursery

    # -- queries ------------------------------------------------------------------------------

    def in_flight(self, key: str) -> str | None:
        """Id of the operation holding ``key``, if it has not ended."""
        return self._inflight.get(key)

    async def get(self, op_id: str) -> OperationRecord | None:
        op = await self.store.get_operation(op_id)
        if op is None:
            return None
        if op.completed_at is not None and op.completed_at < time.time() - self.retention_s:
            return None  # expired; the purge timer deletes it soon
        return op

    async def wait(self, op_id: str) -> None:
        """Return once the operation (started by this process) has ended."""
        event = self._done.get(op_id)
        if event is not None:
            await event.wait()

    # -- submitting ---------------------------------------------------------------------------

    async def submit(
        self, kind: str, work: Work, *, keys: tuple[str, ...] = (), instance_id: str | None = None
    ) -> OperationRecord:
        """Record a pending operation and start ``work`` in the app's nursery; returns the record.

        The caller checks :meth:`in_flight` first; the keys are taken before the first await so
        two requests in the same tick cannot both pass that check.
        """
        if self._nursery is None:
            raise RuntimeError("OperationService.attach() was not called")
        busy = [key for key in keys if key in self._inflight]
        if busy:
            raise RuntimeError(f"keys already held: {busy}")
        op = OperationRecord(
            id=new_operation_id(), kind=kind, state="pending", instance_id=instance_id, created_at=time.time()
        )
        for key in keys:
            self._inflight[key] = op.id
        self._done[op.id] = trio.Event()
        try:
            await self.store.save_operation(op)
        except BaseException:
            self._release(op.id, keys)
            raise
        self._nursery.start_soon(self._run, op, keys, work, name=f"operation {op.id} {kind}")
        return OperationRecord(**{f: getattr(op, f) for f in op.__struct_fields__})

    def _release(self, op_id: str, keys: tuple[str, ...]) -> None:
        for key in keys:
            if self._inflight.get(key) == op_id:
                del self._inflight[key]
        event = self._done.pop(op_id, None)
        if event is not None:
            event.set()

    async def _run(self, op: OperationRecord, keys: tuple[str, ...], work: Work) -> None:
        bind_log_ids(operation_id=op.id, instance_id=op.instance_id)  # this task's own context
        try:
            op.state = "running"
            op.started_at = time.time()
            await self.store.save_operation(op)
            try:
                op.result = await work(op)
                op.state = "succeeded"
            except Problem as problem:
                op.error = problem.body(operation_path(op.id))
                op.state = "failed"
            except HostdError as exc:
                op.error = from_hostd_error(exc).body(operation_path(op.id))
                op.state = "failed"
            except Exception:
                log.exception("operation %s (%s) failed unexpectedly", op.id, op.kind)
                op.error = internal_error().body(operation_path(op.id))
                op.state = "failed"
            op.completed_at = time.time()
            await self.store.save_operation(op)
            self.metrics.operations.labels(kind=op.kind, state=op.state).inc()
            log.info("operation %s %s %s", op.id, op.kind, op.state)
        except StoreClosed:
            log.warning("operation %s (%s) ended after the store closed; restart marks it interrupted", op.id, op.kind)
        finally:
            self._release(op.id, keys)

    # -- lifecycle of the records ---------------------------------------------------------------

    async def recover(self) -> int:
        """Mark operations left unfinished by a previous controller process as failed."""
        count = 0
        for op in await self.store.unfinished_operations():
            if op.id in self._done:
                continue  # started by this process
            op.state = "failed"
            op.completed_at = time.time()
            op.error = Problem(
                500,
                "operation.interrupted",
                "Operation interrupted",
                "the controller stopped while this operation was in progress; it was not resumed. "
                "The instance's state is re-read from hostd.",
            ).body(operation_path(op.id))
            await self.store.save_operation(op)
            count += 1
        if count:
            log.warning("marked %d interrupted operation(s) as failed", count)
        return count

    async def run_purger(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Delete ended operations older than the retention, on a timer, forever."""
        interval = min(max(self.retention_s / 4, 0.05), 300.0)
        task_status.started()
        while True:
            try:
                purged = await self.store.purge_operations(time.time() - self.retention_s)
            except StoreClosed:
                return
            if purged:
                log.info("purged %d ended operation(s) past retention", purged)
            await trio.sleep(interval)


def is_terminal(state: str) -> bool:
    return state in TERMINAL_STATES
