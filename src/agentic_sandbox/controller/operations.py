"""Asynchronous operations: ``op_<ULID>`` records, ``pending → running → succeeded|failed|canceled``.

Resource handling: the service runs each operation's work as a task in the app's nursery (handed in
with :meth:`OperationService.attach`), never in the request's, so a client that disconnects does not
cancel the work. Every state change is written to the store before it is visible, so operations are
durable across controller restarts.

Events: each transition is published on the event bus after it is stored (``operation.created``,
``operation.started``, ``operation.completed`` with the state and, when failed, the error code).

Keys: an operation holds one or more keys (``name:<instance name>``, ``instance:<id>``) while it is
not terminal; callers ask :meth:`in_flight` to return the existing operation for a second provision
of the same name, or to refuse a second lifecycle verb on a busy instance.

Error handling: the work function returns the ``result`` dict or raises. A
:class:`~controller.errors.ControllerError` becomes the operation's ``error``; anything else is
logged with its traceback and becomes ``internal.error``. The stored ``error`` is the admin
surface's problem envelope, rendered when the operation ends by the ``error_body`` callable the app
hands in (``controller.problems.error_body``). Rendered then, not when served, because the stored
record is what the admin API serves and what databases already hold: storing a neutral record
instead would change the stored shape and leave two shapes to read. Injected, because this service
knows neither HTTP nor the problem+json translation (operations are an admin concept; another
surface reads them through the admin view or not at all).

Restart policy (chosen): an operation found ``pending`` or ``running`` when the controller starts was
interrupted by the controller's own end. It is marked ``failed`` with code ``operation.interrupted``;
it is not resumed, because hostd is the source of truth for what runs and the instance catalog is
re-read from hostd on start, so the instance itself shows its real state. Ended operations stay
readable for ``retention_s`` (24 h by default), then a timer purges them.

Several controllers (a shared store): a running operation is claimed by its controller in the
store (a lease named ``operation:<id>``, renewed with the controller's other claims), so another
controller's start does not take it for interrupted. An operation whose controller died is marked
failed the same way by whichever controller notices first (:meth:`OperationService.run_sweeps`).
Keys (``in_flight``) are per controller: two controllers may accept the same lifecycle verb at once,
and hostd, which serialises what it does per instance, is what keeps the instance consistent.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from typing import Any

import trio

from agentic_sandbox.proto import bind_log_ids

from .errors import ControllerError, InternalError, NotFound, ValidationFailed
from .events.bus import EventBus
from .metrics import Metrics
from .store import TERMINAL_STATES, OperationRecord, Store, StoreClosed, StoreUnavailable
from .ulid import new_ulid

log = logging.getLogger(__name__)

#: Every state an operation can be in, in the order it passes through them.
STATES = ("pending", "running", *TERMINAL_STATES)
Work = Callable[[OperationRecord], Awaitable[dict[str, Any]]]
#: Renders a failure as the operation's stored ``error``: ``(exception, operation id) -> body``.
ErrorBody = Callable[[BaseException, str], dict[str, Any]]


def new_operation_id() -> str:
    return "op_" + new_ulid()


def _lease(op_id: str) -> str:
    return f"operation:{op_id}"


class OperationService:
    def __init__(
        self,
        store: Store,
        metrics: Metrics,
        events: EventBus,
        *,
        retention_s: float,
        error_body: ErrorBody,
        owner: str = "",
        lease_ttl_s: float = 2.0,
    ) -> None:
        self.store = store
        self.owner = owner
        self.lease_ttl_s = lease_ttl_s
        self.metrics = metrics
        self.events = events
        self.retention_s = retention_s
        self.error_body = error_body
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
        op = await self.store.operations.get(op_id)
        if op is None:
            return None
        if op.completed_at is not None and op.completed_at < time.time() - self.retention_s:
            return None  # expired; the purge timer deletes it soon
        return op

    async def require(self, op_id: str) -> OperationRecord:
        """Like :meth:`get`, but NotFound (``operation.not_found``) instead of None."""
        op = await self.get(op_id)
        if op is None:
            raise NotFound("operation.not_found", f"no operation with id {op_id!r} (ended ones are kept for a day)")
        return op

    async def page(
        self,
        *,
        state: str | None = None,
        kind: str | None = None,
        instance_id: str | None = None,
        after: tuple[float, str] | None = None,
        limit: int,
    ) -> tuple[list[OperationRecord], bool]:
        """One page of the operations still kept (ended ones for ``retention_s``), newest first,
        after ``after`` (``(created_at, id)``), and whether more follow; 422 for a state that is not one."""
        if state is not None and state not in STATES:
            raise ValidationFailed(
                [{"field": "state", "message": f"must be one of {', '.join(STATES)}", "code": "enum"}]
            )
        return await self.store.operations.page(
            state=state,
            kind=kind,
            instance_id=instance_id,
            completed_since=time.time() - self.retention_s,
            after=after,
            limit=limit,
        )

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
            if self.store.shared:
                now = time.time()
                await self.store.leases.acquire(_lease(op.id), self.owner, now + self.lease_ttl_s, now)
            await self.store.operations.save(op)
        except BaseException:
            self._release(op.id, keys)
            raise
        self._publish(op)
        self._nursery.start_soon(self._run, op, keys, work, name=f"operation {op.id} {kind}")
        return OperationRecord(**{f: getattr(op, f) for f in op.__struct_fields__})

    def _publish(self, op: OperationRecord) -> None:
        """The transition just stored, on the event bus (after the store: an event never names a
        state a reader could not then GET)."""
        code = op.error.get("code") if op.error else None
        self.events.operation_changed(op.id, kind=op.kind, state=op.state, instance_id=op.instance_id, error_code=code)

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
            await self.store.operations.save(op)
            self._publish(op)
            try:
                op.result = await work(op)
                op.state = "succeeded"
            except ControllerError as exc:
                op.error = self.error_body(exc, op.id)
                op.state = "failed"
            except Exception as exc:
                log.exception("operation %s (%s) failed unexpectedly", op.id, op.kind)
                op.error = self.error_body(exc, op.id)
                op.state = "failed"
            op.completed_at = time.time()
            await self.store.operations.save(op)
            self._publish(op)
            self.metrics.operations.labels(kind=op.kind, state=op.state).inc()
            log.info("operation %s %s %s", op.id, op.kind, op.state)
        except StoreClosed:
            log.warning("operation %s (%s) ended after the store closed; restart marks it interrupted", op.id, op.kind)
        except StoreUnavailable as exc:
            # Its end could not be stored: once its claim runs out it is marked interrupted (sweep).
            log.warning("operation %s (%s) ended unrecorded: %s", op.id, op.kind, exc.message)
        finally:
            self._release(op.id, keys)
            if self.store.shared:
                with trio.CancelScope(shield=True):
                    try:
                        await self.store.leases.release(_lease(op.id), self.owner)
                    except (StoreClosed, ControllerError):
                        pass  # the claim runs out by itself

    # -- lifecycle of the records ---------------------------------------------------------------

    async def recover(self) -> int:
        """Mark operations left unfinished by a previous controller process as failed (on a shared
        store: those no live controller holds)."""
        count = 0
        unfinished = await self.store.operations.unfinished()
        held: set[str] = set()
        if self.store.shared:
            held = await self.store.leases.held([_lease(op.id) for op in unfinished], time.time())
        for op in unfinished:
            if op.id in self._done or _lease(op.id) in held:
                continue  # started by this process, or running at another controller
            op.state = "failed"
            op.completed_at = time.time()
            interrupted = InternalError(
                "operation.interrupted",
                "the controller stopped while this operation was in progress; it was not resumed. "
                "The instance's state is re-read from hostd.",
            )
            op.error = self.error_body(interrupted, op.id)
            await self.store.operations.save(op)
            self._publish(op)
            count += 1
        if count:
            log.warning("marked %d interrupted operation(s) as failed", count)
        return count

    async def run_sweeps(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """On a shared store: fail the operations of controllers that died, every lease period."""
        task_status.started()
        while True:
            await trio.sleep(self.lease_ttl_s)
            try:
                await self.recover()
            except StoreClosed:
                return
            except ControllerError as exc:  # the database is away: next round
                log.debug("operation sweep failed: %s", exc)

    async def run_purger(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Delete ended operations older than the retention, on a timer, forever."""
        interval = min(max(self.retention_s / 4, 0.05), 300.0)
        task_status.started()
        while True:
            try:
                purged = await self.store.operations.purge(time.time() - self.retention_s)
            except StoreClosed:
                return
            except StoreUnavailable as exc:
                log.warning("operation purge: %s (tried again later)", exc.message)
                purged = 0
            if purged:
                log.info("purged %d ended operation(s) past retention", purged)
            await trio.sleep(interval)


def is_terminal(state: str) -> bool:
    return state in TERMINAL_STATES
