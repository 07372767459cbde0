"""The fleet rules on each real store: admission and replay, observations that advance exactly one
revision under concurrent observers, identities bound once, a bound A2A task projected into its
record, and reconciliation's five classifications; every document the service answers validates
against upstream's schema."""

from __future__ import annotations

import copy
import time
from typing import Any

import pytest
import trio

from agentic_sandbox.controller.errors import Conflict, NotFound, TooLarge, ValidationFailed
from agentic_sandbox.controller.fleet.documents import Observation, ReconcileRequest, RuntimeIdentity, errors
from agentic_sandbox.controller.fleet.service import FleetService
from agentic_sandbox.controller.store import Append, Store
from tests.controller.fleet.workloads import admission, fixture, records
from tests.controller.store.conftest import OpenStore
from tests.controller.store.records import task

FIRST = Append(kind="message", body={"messageId": "m", "role": "ROLE_USER", "parts": []})


def observation(revision: int, state: str, **extra: Any) -> Observation:
    status: dict[str, Any] = {"observed_state": state, "revision": revision + 1, "last_seen": "2026-08-02T15:00:00Z"}
    status["artifacts"] = []
    identity = extra.pop("identity", None)
    status.update(extra)
    return Observation(expected_revision=revision, status=status, runtime_identity=identity)


async def end_task(store: Store, task_id: str, state: str) -> None:
    status = {"state": state}
    await store.tasks.append(task_id, Append(kind="status", body={"status": status}, status=status), time.time())


async def test_the_mixed_inventory_is_admitted_and_observed_into_its_fixture(store: Store) -> None:
    fleet = FleetService(store)
    wanted = records()
    for record in wanted.values():
        doc = admission(record)
        assert await fleet.admit(doc) == (True, doc)
        # A retry with a new transport timestamp is the same admission.
        retry = copy.deepcopy(doc)
        retry["status"]["last_seen"] = "2026-08-02T14:59:00Z"
        assert await fleet.admit(retry) == (False, doc)
    for child, record in wanted.items():
        target = record["status"]
        for revision in range(target["revision"]):
            rest = {k: v for k, v in target.items() if k not in ("revision", "observed_state")}
            await fleet.observe(child, observation(revision, target["observed_state"], **rest))
        assert await fleet.get(child) == record
    inventory = await fleet.inventory()
    assert errors("inventory_snapshot", inventory) == []
    assert inventory["records"] == list(wanted.values())
    # 4 admissions and one per revision observed: the inventory moved once for each.
    assert inventory["inventory_revision"] == 4 + sum(r["status"]["revision"] for r in wanted.values())


async def test_admission_refusals(store: Store) -> None:
    fleet = FleetService(store)
    doc = admission(records()["child-command"])
    await fleet.admit(doc)
    clash = copy.deepcopy(doc)
    clash["spec"]["budgets"]["timeout_seconds"] = 601
    with pytest.raises(ValidationFailed) as caught:
        await fleet.admit(clash)
    assert caught.value.code == "fleet.idempotency_conflict"
    other_key = admission(records()["child-command"], idempotency_key="idem-other")
    with pytest.raises(Conflict, match="another idempotency key"):
        await fleet.admit(other_key)
    running = admission(records()["child-agent"], child_id="c-run", idempotency_key="k-run")
    running["status"]["observed_state"] = "running"
    with pytest.raises(ValidationFailed, match="/status/observed_state"):
        await fleet.admit(running)
    with pytest.raises(ValidationFailed) as caught:
        await fleet.admit(fixture("invalid-credential-material"))
    assert caught.value.code == "fleet.credential_material"
    unknown = admission(records()["child-agent"], child_id="c-x", idempotency_key="k-x")
    unknown["extra"] = 1
    with pytest.raises(ValidationFailed, match="'extra' is not allowed"):
        await fleet.admit(unknown)


async def test_observations_advance_one_revision_and_bind_identities_once(store: Store) -> None:
    fleet = FleetService(store)
    await fleet.admit(admission(records()["child-collector"], task_id=None, command_id=None))
    bound = await fleet.observe("child-collector", observation(0, "scheduled", identity=RuntimeIdentity(task_id="t-1")))
    assert bound["lineage"]["task_id"] == "t-1" and bound["status"]["revision"] == 1
    with pytest.raises(Conflict) as stale:
        await fleet.observe("child-collector", observation(0, "running"))
    assert stale.value.code == "fleet.revision_conflict"
    with pytest.raises(ValidationFailed, match="must be 2"):
        await fleet.observe(
            "child-collector", Observation(expected_revision=1, status={**bound["status"], "revision": 3})
        )
    same = await fleet.observe("child-collector", observation(1, "running", identity=RuntimeIdentity(task_id="t-1")))
    assert same["status"]["revision"] == 2
    with pytest.raises(Conflict) as immutable:
        await fleet.observe("child-collector", observation(2, "running", identity=RuntimeIdentity(task_id="t-2")))
    assert immutable.value.code == "fleet.runtime_identity_immutable"
    assert (await fleet.get("child-collector"))["status"]["revision"] == 2  # nothing advanced
    with pytest.raises(NotFound):
        await fleet.observe("nope", observation(0, "running"))


async def test_concurrent_observers_one_wins_the_rest_are_stale(open_store: OpenStore) -> None:
    fleets = [FleetService(open_store()) for _ in range(3)]  # three controllers on one database
    await fleets[0].admit(admission(records()["child-agent"]))
    outcomes: list[str] = []

    async def observe(fleet: FleetService, n: int) -> None:
        try:
            await fleet.observe("child-agent", observation(0, "running", error_code=f"by-{n}"))
            outcomes.append("won")
        except Conflict as exc:
            outcomes.append(exc.code)

    async with trio.open_nursery() as nursery:
        for n in range(9):
            nursery.start_soon(observe, fleets[n % 3], n)
    assert sorted(outcomes) == ["fleet.revision_conflict"] * 8 + ["won"]
    assert (await fleets[2].get("child-agent"))["status"]["revision"] == 1


async def test_a_bound_task_is_projected_once_per_change(store: Store) -> None:
    fleet = FleetService(store)
    now = time.time()
    for tid in ("t-cmd", "t-daemon"):
        await store.tasks.create(task(tid, now, {"state": "TASK_STATE_WORKING"}, instance_id="i-1"), FIRST)
    await fleet.admit(admission(records()["child-command"], task_id="t-cmd"))
    await fleet.admit(admission(records()["child-daemon"], task_id="t-daemon"))
    running = await fleet.get("child-command")
    assert (running["status"]["observed_state"], running["status"]["revision"]) == ("running", 1)
    before = (await fleet.inventory())["inventory_revision"]
    assert (await fleet.get("child-command"))["status"]["revision"] == 1  # unchanged: no new revision
    assert (await fleet.inventory())["inventory_revision"] == before
    await end_task(store, "t-cmd", "TASK_STATE_COMPLETED")
    await end_task(store, "t-daemon", "TASK_STATE_FAILED")
    done = await fleet.get("child-command")
    assert done["status"]["observed_state"] == "succeeded" and done["status"]["exit_classification"] == "success"
    [result] = done["status"]["artifacts"]
    assert result["kind"] == "result" and result["uri"] == "/agents/i-1/v1/tasks/t-cmd" and len(result["sha256"]) == 64
    daemon = await fleet.get("child-daemon")
    assert daemon["status"]["observed_state"] == "operator-review-required" and daemon["status"]["health"] == "unknown"
    assert errors("inventory_snapshot", await fleet.inventory()) == []


@pytest.mark.parametrize(
    ("kind", "task_state", "observed", "exit_classification", "classification"),
    [
        ("one-shot-command", "TASK_STATE_SUBMITTED", "running", None, "re-adopted"),
        ("one-shot-command", "TASK_STATE_INPUT_REQUIRED", "blocked", None, "re-adopted"),
        ("one-shot-command", "TASK_STATE_AUTH_REQUIRED", "blocked", None, "re-adopted"),
        ("one-shot-command", "TASK_STATE_COMPLETED", "succeeded", "success", "terminal"),
        ("one-shot-command", "TASK_STATE_FAILED", "failed", "failure", "failed-or-aborted"),
        ("one-shot-command", "TASK_STATE_REJECTED", "failed", "failure", "failed-or-aborted"),
        ("one-shot-command", "TASK_STATE_CANCELED", "cancelled", "cancelled", "failed-or-aborted"),
        ("daemon", "TASK_STATE_WORKING", "healthy", None, "re-adopted"),
        ("daemon", "TASK_STATE_COMPLETED", "operator-review-required", None, "operator-review-required"),
        ("persistent-agent", "TASK_STATE_WORKING", "detached", None, "re-adopted"),
        ("persistent-agent", "TASK_STATE_FAILED", "failed", "failure", "failed-or-aborted"),
    ],
)
async def test_each_task_state_is_projected_and_classified(
    store: Store, kind: str, task_state: str, observed: str, exit_classification: str | None, classification: str
) -> None:
    """A record the orchestrator last saw live (running; a daemon healthy; an agent detached) whose
    bound task is now in ``task_state``."""
    fleet = FleetService(store)
    child = {"one-shot-command": "child-command", "daemon": "child-daemon", "persistent-agent": "child-agent"}[kind]
    await store.tasks.create(task("t-1", time.time(), {"state": "TASK_STATE_WORKING"}, instance_id="i-1"), FIRST)
    await fleet.admit(admission(records()[child], task_id="t-1"))
    live = {"daemon": "healthy", "persistent-agent": "detached"}.get(kind, "running")
    extra = {"health": "healthy"} if kind == "daemon" else {}
    log = {"kind": "log", "uri": "/logs/1", "sha256": "0" * 64}
    await fleet.observe(child, observation(0, live, artifacts=[log], **extra))
    if task_state != "TASK_STATE_WORKING":
        await end_task(store, "t-1", task_state)
    before = (await fleet.inventory())["inventory_revision"]
    status = (await fleet.get(child))["status"]
    assert (status["observed_state"], status.get("exit_classification")) == (observed, exit_classification)
    assert status["revision"] == (1 if observed == live else 2)
    if observed == "blocked":
        assert status["backpressure"] == {"reason": "approval", "retryable": True}
    if observed == "succeeded":
        assert [a["kind"] for a in status["artifacts"]] == ["log", "result"]  # the reported one stays
    report = await fleet.reconcile(ReconcileRequest(before_revision=before, child_ids=[child]))
    assert errors("reconciliation_report", report) == []
    [row] = report["rows"]
    assert (row["classification"], row["observed_state"], row["revision"]) == (
        classification,
        observed,
        status["revision"],
    )
    assert report["after_revision"] == before  # read, projected and reconciled again: no churn


async def test_a_daemon_observed_healthy_after_its_task_ended_stays_re_adopted(store: Store) -> None:
    fleet = FleetService(store)
    await store.tasks.create(task("t-d", time.time(), {"state": "TASK_STATE_WORKING"}), FIRST)
    await fleet.admit(admission(records()["child-daemon"], task_id="t-d"))
    await fleet.observe("child-daemon", observation(0, "healthy", health="healthy"))
    await end_task(store, "t-d", "TASK_STATE_COMPLETED")
    # Healthy before the task ended is no evidence: operator review.
    ended = (await fleet.get("child-daemon"))["status"]
    assert (ended["observed_state"], ended["health"], ended["revision"]) == ("operator-review-required", "unknown", 2)
    # An observation since it ended says it is healthy: that stands, reads do not undo it.
    await fleet.observe("child-daemon", observation(2, "healthy", health="healthy"))
    before = (await fleet.inventory())["inventory_revision"]
    assert (await fleet.get("child-daemon"))["status"]["observed_state"] == "healthy"
    report = await fleet.reconcile(ReconcileRequest(before_revision=before, child_ids=["child-daemon"]))
    assert [(r["classification"], r["revision"]) for r in report["rows"]] == [("re-adopted", 3)]
    assert report["after_revision"] == before


async def test_a_vanished_task_is_unknown_never_terminal_success(store: Store) -> None:
    fleet = FleetService(store)
    await fleet.admit(admission(records()["child-command"], task_id="t-vanished"))
    await fleet.observe("child-command", observation(0, "running"))
    await fleet.admit(admission(records()["child-agent"], task_id=None))
    await fleet.observe("child-agent", observation(0, "unknown"))
    report = await fleet.reconcile(ReconcileRequest(before_revision=0, child_ids=["child-command", "child-agent"]))
    assert errors("reconciliation_report", report) == []
    assert [(r["classification"], r["observed_state"]) for r in report["rows"]] == [
        ("unknown", "running"),
        ("unknown", "unknown"),
    ]
    assert all(r["reason"] for r in report["rows"])


async def test_reconcile_classifies_every_expected_child(store: Store) -> None:
    fleet = FleetService(store)
    now = time.time()
    await store.tasks.create(task("t-agent", now, {"state": "TASK_STATE_WORKING"}), FIRST)
    wanted = records()
    await fleet.admit(admission(wanted["child-agent"], task_id="t-agent"))
    await fleet.admit(admission(wanted["child-daemon"], task_id=None))
    await fleet.admit(admission(wanted["child-collector"], task_id=None))
    await fleet.admit(admission(wanted["child-command"], task_id="t-gone"))  # not in the task store
    await fleet.observe("child-daemon", observation(0, "healthy", health="healthy"))
    await fleet.observe("child-collector", observation(0, "missed"))
    await fleet.admit(admission(wanted["child-agent"], child_id="c-done", idempotency_key="k-done", task_id=None))
    await fleet.observe("c-done", observation(0, "succeeded", exit_classification="success"))
    await fleet.admit(admission(wanted["child-agent"], child_id="c-failed", idempotency_key="k-f", task_id=None))
    await fleet.observe("c-failed", observation(0, "failed", exit_classification="failure"))
    before = (await fleet.inventory())["inventory_revision"]
    children = ["child-agent", "child-daemon", "child-collector", "child-command", "c-done", "c-failed", "never"]
    report = await fleet.reconcile(ReconcileRequest(before_revision=before, child_ids=children))
    assert errors("reconciliation_report", report) == []
    assert {r["child_id"]: r["classification"] for r in report["rows"]} == {
        "child-agent": "re-adopted",
        "child-daemon": "re-adopted",
        "child-collector": "operator-review-required",
        "child-command": "unknown",
        "c-done": "terminal",
        "c-failed": "failed-or-aborted",
        "never": "unknown",
    }
    assert report["before_revision"] == before and report["after_revision"] >= before
    with pytest.raises(ValidationFailed, match="twice"):
        await fleet.reconcile(ReconcileRequest(before_revision=0, child_ids=["a", "a"]))


async def test_a_record_is_small(store: Store) -> None:
    fleet = FleetService(store)
    doc = admission(records()["child-agent"])
    doc["spec"]["orchestrator_metadata"] = {"notes": "x" * (300 * 1024)}
    with pytest.raises(TooLarge) as caught:
        await fleet.admit(doc)
    assert caught.value.code == "fleet.record_too_large"
    del doc["spec"]["orchestrator_metadata"]
    await fleet.admit(doc)
    big = observation(0, "running", error_code="e" * (300 * 1024))
    with pytest.raises(TooLarge):
        await fleet.observe("child-agent", big)
    assert (await fleet.get("child-agent"))["status"]["revision"] == 0
