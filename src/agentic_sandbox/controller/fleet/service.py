"""fleet-workload/v1: the neutral boundary between an orchestrator and this executor.

The orchestrator owns intent (admission, placement, budgets); this executor owns what it observes.
:class:`FleetService` keeps one durable record per admitted workload in the controller's store
(:mod:`controller.store.fleet`: SQLite, or PostgreSQL shared by several controllers), so
admission, replay, observations, inventory and reconciliation survive a restart.

Rules, where the contract leaves a choice, as decided here (docs/fleet.md says the same):

* **Admission** takes a ``workload`` document at revision 0 in ``pending``. Its idempotency key
  (``lineage.idempotency_key``, per ``orchestrator_id``) makes a retry safe: the same key with the
  same payload (transport timestamp ``status.last_seen`` aside) is answered 200 with the stored
  record; with another payload 422 ``fleet.idempotency_conflict``; a new key for a ``child_id``
  that exists 409 ``fleet.child_exists``.
* **Observations** advance a record by exactly one revision: ``expected_revision`` must be the
  current one (else 409 ``fleet.revision_conflict``, the writer is stale), the new status's
  ``revision`` the next one (else 422), and a runtime identity may go from null to a value once
  (the same value again is fine; another is 409 ``fleet.runtime_identity_immutable`` and nothing
  advances). The write is a compare-and-set in the database: of concurrent observers exactly one
  wins.
* **Task projection.** A record whose ``lineage.task_id`` names a task of this executor's A2A task
  store takes that task's newer state when it is read (one record, the inventory, reconcile),
  written as the next revision through the same compare-and-set; an unchanged projection writes
  nothing. Running -> ``running`` (a record already in a live state keeps it), waiting on input
  -> ``blocked`` (backpressure ``approval``), completed -> ``succeeded`` with a ``result``
  artifact, failed or rejected -> ``failed``, canceled -> ``cancelled``. A daemon whose task ended
  is ``operator-review-required`` (health ``unknown``), unless an observation written since the
  task ended says it is live and healthy: that independent evidence stands.
* **Reconcile** classifies each expected child: not on record -> ``unknown``; in a terminal state
  -> ``terminal`` when it ended as desired (``succeeded``, or ``cancelled``/``stopped`` when that
  was the intent), else ``failed-or-aborted``; ``operator-review-required`` or ``missed`` ->
  ``operator-review-required``; ``unknown``, or bound to a task the store no longer has ->
  ``unknown`` (never terminal success); anything live -> ``re-adopted``.
"""

from __future__ import annotations

import copy
import hashlib
import time
from typing import Any

import rfc8785

from ..errors import Conflict, NotFound, ValidationFailed
from ..events.bus import EventBus
from ..store import Admission, FleetRow, Store, TaskRecord
from ..store.tasks import INTERRUPTED
from .documents import (
    API_VERSION,
    IDENTITIES,
    TERMINAL_STATES,
    Observation,
    ReconcileRequest,
    check,
    check_size,
    now_stamp,
    payload_hash,
    refuse_credentials,
)

IDEMPOTENCY_CONFLICT = "fleet.idempotency_conflict"
CHILD_EXISTS = "fleet.child_exists"
REVISION_CONFLICT = "fleet.revision_conflict"
IDENTITY_IMMUTABLE = "fleet.runtime_identity_immutable"
NOT_FOUND = "fleet.workload_not_found"
#: Observed states in which a workload is alive, as the orchestrator last said.
LIVE_STATES = frozenset(
    {"admitted", "starting", "running", "blocked", "detached", "retained", "healthy", "degraded", "restarting"}
    | {"scheduled", "catching-up", "stopping"}
)
#: How often a projection retries when another writer moved the record meanwhile.
PROJECTION_TRIES = 3


def _field(field: str, message: str, code: str = "invalid") -> ValidationFailed:
    return ValidationFailed([{"field": field, "message": message, "code": code}])


class FleetService:
    def __init__(self, store: Store, events: EventBus | None = None) -> None:
        self.store = store
        #: Where each change is announced (``fleet.workload_admitted``, ``fleet.workload_observed``).
        self.events = events

    def _announce(self, kind: str, record: dict[str, Any]) -> None:
        if self.events is not None:
            status = record["status"]
            data = {"revision": status["revision"], "observed_state": status["observed_state"], "kind": record["kind"]}
            self.events.publish(kind, f"fleet/{record['lineage']['child_id']}", data)

    # -- admission --------------------------------------------------------------------------------

    async def admit(self, document: Any) -> tuple[bool, dict[str, Any]]:
        """Store a new workload: (True, record), or (False, record) for an identical replay."""
        refuse_credentials(document)
        check("workload_record", document)
        check_size(document)
        status = document["status"]
        if status["revision"] != 0:
            raise _field("/status/revision", "an admitted workload starts at revision 0")
        if status["observed_state"] != "pending":
            raise _field("/status/observed_state", "an admitted workload is pending until it is observed")
        lineage = document["lineage"]
        now = time.time()
        row = FleetRow(
            child_id=lineage["child_id"],
            orchestrator_id=lineage["orchestrator_id"],
            idempotency_key=lineage["idempotency_key"],
            payload_hash=payload_hash(document),
            record=document,
            revision=0,
            admitted_at=now,
            updated_at=now,
        )
        outcome, stored = await self.store.fleet.admit(row)
        if outcome is Admission.KEY_CONFLICT:
            raise ValidationFailed(
                [
                    {
                        "field": "/lineage/idempotency_key",
                        "message": "already used with another payload",
                        "code": "conflict",
                    }
                ],
                f"idempotency key {row.idempotency_key!r} was admitted with another payload "
                f"(child {stored.child_id!r})",
                code=IDEMPOTENCY_CONFLICT,
            )
        if outcome is Admission.CHILD_EXISTS:
            raise Conflict(
                CHILD_EXISTS,
                f"child {row.child_id!r} was admitted with another idempotency key",
                details={"child_id": row.child_id},
            )
        if outcome is Admission.CREATED:
            self._announce("fleet.workload_admitted", stored.record)
        return outcome is Admission.CREATED, stored.record

    # -- reads ------------------------------------------------------------------------------------

    async def get(self, child_id: str) -> dict[str, Any]:
        row = await self.store.fleet.get(child_id)
        if row is None:
            raise NotFound(NOT_FOUND, f"no workload with child_id {child_id!r}")
        return (await self._project(row)).record

    async def inventory(self) -> dict[str, Any]:
        revision, rows = await self.store.fleet.inventory()
        # The bound tasks in one read; only a record whose task says something new is written.
        bound = {row.child_id: row.record["lineage"].get("task_id") for row in rows}
        tasks = await self.store.tasks.get_many(task_id for task_id in bound.values() if task_id)
        changed = False
        for row in rows:
            task = tasks.get(bound[row.child_id] or "")
            if task is not None and await self._projected(row, task) is not None:
                changed = (await self._project(row)) is not row or changed
        if changed:
            revision, rows = await self.store.fleet.inventory()  # the records and their revision, together
        return {
            "document_type": "inventory",
            "api_version": API_VERSION,
            "inventory_revision": revision,
            "generated_at": now_stamp(),
            "records": [row.record for row in rows],
        }

    # -- observations -----------------------------------------------------------------------------

    async def observe(self, child_id: str, observation: Observation) -> dict[str, Any]:
        row = await self.store.fleet.get(child_id)
        if row is None:
            raise NotFound(NOT_FOUND, f"no workload with child_id {child_id!r}")
        refuse_credentials(observation.status)
        check("workload_record/properties/status", observation.status, prefix="/status")
        self._expect(row, observation.expected_revision)
        record = copy.deepcopy(row.record)
        lineage = record["lineage"]
        for name, value in (observation.runtime_identity.given() if observation.runtime_identity else {}).items():
            bound = lineage.get(name)
            if bound is not None and bound != value:
                raise Conflict(
                    IDENTITY_IMMUTABLE,
                    f"{name} of {child_id!r} is {bound!r} already; an assigned identity does not change",
                    details={"child_id": child_id, "identity": name},
                )
            lineage[name] = value
        if observation.status["revision"] != row.revision + 1:
            raise _field(
                "/status/revision", f"must be {row.revision + 1}: an observation advances exactly one revision"
            )
        record["status"] = observation.status
        check("workload_record", record)  # the whole: a daemon's health, the identities' form
        check_size(record)
        if not await self.store.fleet.advance(child_id, row.revision, record):
            current = await self.store.fleet.get(child_id)
            self._expect(current, observation.expected_revision, lost=True)
        self._announce("fleet.workload_observed", record)
        return record

    def _expect(self, row: FleetRow | None, expected: int, *, lost: bool = False) -> None:
        if row is None:
            raise NotFound(NOT_FOUND, "the workload is gone")
        if row.revision != expected or lost:
            raise Conflict(
                REVISION_CONFLICT,
                f"the workload {row.child_id!r} is at revision {row.revision}, not {expected}: read it again",
                details={"child_id": row.child_id, "revision": str(row.revision)},
            )

    # -- reconciliation ---------------------------------------------------------------------------

    async def reconcile(self, request: ReconcileRequest) -> dict[str, Any]:
        if len(set(request.child_ids)) != len(request.child_ids):
            raise _field("/child_ids", "names a child twice")
        rows: list[dict[str, Any]] = []
        for child_id in request.child_ids:
            row = await self.store.fleet.get(child_id)
            if row is None:
                rows.append(
                    {
                        "child_id": child_id,
                        "classification": "unknown",
                        "observed_state": "unknown",
                        "revision": 0,
                        "reason": "no workload record for this child",
                    }
                )
                continue
            row = await self._project(row)
            task = await self._task(row.record)
            rows.append(self._classify(row, task))
        return {
            "document_type": "reconciliation",
            "api_version": API_VERSION,
            "generated_at": now_stamp(),
            "before_revision": request.before_revision,
            "after_revision": await self.store.fleet.revision(),
            "rows": rows,
        }

    def _classify(self, row: FleetRow, task: TaskRecord | bool | None) -> dict[str, Any]:
        record = row.record
        state = record["status"]["observed_state"]
        out: dict[str, Any] = {"child_id": row.child_id, "observed_state": state, "revision": row.revision}
        desired = record["spec"]["desired_state"]
        if state in TERMINAL_STATES:
            as_desired = state == "succeeded" or (state == "cancelled" and desired in ("cancelled", "stopped"))
            out["classification"] = "terminal" if as_desired else "failed-or-aborted"
            if not as_desired:
                out["reason"] = f"ended {state} while desired {desired}"
        elif state == "operator-review-required":
            out["classification"] = "operator-review-required"
            out["reason"] = record["status"].get("error_code") or "the workload waits on an operator"
        elif state == "missed":
            out["classification"] = "operator-review-required"
            out["reason"] = "a missed run: catching up needs an operator's approval"
        elif state == "unknown":
            out["classification"] = "unknown"
            out["reason"] = "its state is not known"
        elif task is False:
            out["classification"] = "unknown"
            out["reason"] = f"the bound task {record['lineage']['task_id']!r} is not in the task store"
        else:
            out["classification"] = "re-adopted"
        return out

    # -- projection of a bound A2A task -----------------------------------------------------------

    async def _task(self, record: dict[str, Any]) -> TaskRecord | bool | None:
        """The bound task; None when none is bound, False when it is bound but not in the store."""
        task_id = record["lineage"].get("task_id")
        if not task_id:
            return None
        task = await self.store.tasks.get(task_id)
        return task if task is not None else False

    async def _project(self, row: FleetRow) -> FleetRow:
        """``row`` with its bound task's newer state written in (next revision), or as it is."""
        for _ in range(PROJECTION_TRIES):
            task = await self._task(row.record)
            if not isinstance(task, TaskRecord):
                return row
            status = await self._projected(row, task)
            if status is None:
                return row
            record = {**row.record, "status": status}
            if await self.store.fleet.advance(row.child_id, row.revision, record):
                self._announce("fleet.workload_projected", record)
                return await self.store.fleet.get(row.child_id) or row
            fresh = await self.store.fleet.get(row.child_id)
            if fresh is None:
                return row
            row = fresh
        return row

    async def _projected(self, row: FleetRow, task: TaskRecord) -> dict[str, Any] | None:
        """The status the task says, or None when it says nothing new."""
        record = row.record
        current = record["status"]
        kind = record["kind"]
        status: dict[str, Any] = {k: v for k, v in current.items() if k not in ("backpressure", "exit_classification")}
        state = task.state
        if state in ("TASK_STATE_SUBMITTED", "TASK_STATE_WORKING"):
            status["observed_state"] = (
                current["observed_state"] if current["observed_state"] in LIVE_STATES else "running"
            )
            if status["observed_state"] == "blocked":
                status["observed_state"] = "running"  # its answer came: it works again
        elif state in INTERRUPTED:
            status["observed_state"] = "blocked"
            status["backpressure"] = {"reason": "approval", "retryable": True}
        elif kind == "daemon" and _healthy_since(row, task):
            return None  # ended, but observed healthy since: that evidence stands
        elif kind == "daemon":  # ended: a daemon is not meant to
            status["observed_state"] = "operator-review-required"
            status["health"] = "unknown"
            status["error_code"] = f"fleet.daemon_task_{state.removeprefix('TASK_STATE_').lower()}"
        elif state == "TASK_STATE_COMPLETED":
            status["observed_state"] = "succeeded"
            status["exit_classification"] = "success"
            uri = _result_uri(task)
            reported = current.get("artifacts", [])
            if not any(a.get("kind") == "result" and a.get("uri") == uri for a in reported):
                # Once (an ended task's artifacts stay), beside what the orchestrator reported.
                status["artifacts"] = [*reported, await self._result(task)]
        elif state == "TASK_STATE_CANCELED":
            status["observed_state"] = "cancelled"
            status["exit_classification"] = "cancelled"
        else:  # failed, rejected
            status["observed_state"] = "failed"
            status["exit_classification"] = "failure"
            status["error_code"] = f"task.{state.removeprefix('TASK_STATE_').lower()}"
        if _same(status, current):
            return None
        status["revision"] = current["revision"] + 1
        status["last_seen"] = now_stamp()
        return status

    async def _result(self, task: TaskRecord) -> dict[str, Any]:
        """The result reference of a completed task: where to read it, and the SHA-256 of its
        artifacts as the task store keeps them (RFC 8785), which do not change once it ended."""
        artifacts = await self.store.tasks.artifacts(task.id)
        digest = hashlib.sha256(rfc8785.dumps(artifacts)).hexdigest()
        return {"kind": "result", "uri": _result_uri(task), "sha256": digest}


def _healthy_since(row: FleetRow, task: TaskRecord) -> bool:
    """Whether an observation written after ``task`` ended says the daemon is live and healthy: the
    independent health evidence that keeps it out of operator review. Only an observation can
    write that (a projection of an ended task says health ``unknown``; an admission is pending)."""
    status = row.record["status"]
    live = status["observed_state"] in LIVE_STATES and status.get("health") == "healthy"
    return live and row.updated_at > task.status_at


def _result_uri(task: TaskRecord) -> str:
    return f"/agents/{task.instance_id}/v1/tasks/{task.id}"


def _same(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Two statuses alike but for their revision and transport time."""

    def core(status: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in status.items() if k not in ("revision", "last_seen")}

    return core(a) == core(b)


__all__ = ["IDENTITIES", "FleetService"]
