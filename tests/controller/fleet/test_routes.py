"""``/api/v2/fleet`` over HTTP against a real controller and hostd: status codes, Location, roles,
problem+json for every refusal, and documents that validate against upstream's schema."""

from __future__ import annotations

import copy

import httpx

from agentic_sandbox.controller.fleet.documents import errors
from tests.controller.fleet.workloads import admission, fixture, records
from tests.controller.http.test_problems import assert_problem

FLEET = "/api/v2/fleet"


async def test_admission_replay_and_clash(admin: httpx.AsyncClient) -> None:
    doc = admission(records()["child-agent"])
    created = await admin.post(f"{FLEET}/workloads", json=doc)
    assert created.status_code == 202, created.text
    assert created.headers["location"] == f"{FLEET}/workloads/child-agent" and created.json() == doc
    retry = copy.deepcopy(doc)
    retry["status"]["last_seen"] = "2026-08-02T15:30:00Z"  # a retry's new transport timestamp
    replay = await admin.post(f"{FLEET}/workloads", json=retry)
    assert replay.status_code == 200 and replay.json() == doc
    retry["spec"]["desired_state"] = "detached"
    assert_problem(await admin.post(f"{FLEET}/workloads", json=retry), 422, "fleet.idempotency_conflict")
    other = admission(records()["child-agent"], idempotency_key="idem-2")
    assert_problem(await admin.post(f"{FLEET}/workloads", json=other), 409, "fleet.child_exists")
    refused = await admin.post(f"{FLEET}/workloads", json=fixture("invalid-credential-material"))
    assert_problem(refused, 422, "fleet.credential_material")
    assert_problem(await admin.post(f"{FLEET}/workloads", content=b"{not json"), 400, "validation.failed")
    assert_problem(await admin.post(f"{FLEET}/workloads", json=[1]), 422, "validation.failed")


async def test_inventory_get_and_observations(admin: httpx.AsyncClient, operator: httpx.AsyncClient) -> None:
    empty = (await admin.get(f"{FLEET}/workloads")).json()
    assert empty["records"] == [] and empty["document_type"] == "inventory"
    for record in records().values():
        assert (await admin.post(f"{FLEET}/workloads", json=admission(record))).status_code == 202
    body = {
        "expected_revision": 0,
        "runtime_identity": {"session_id": "session-agent-1"},
        "status": {"observed_state": "running", "revision": 1, "last_seen": "2026-08-02T15:00:00Z", "artifacts": []},
    }
    observed = await admin.post(f"{FLEET}/workloads/child-agent/observations", json=body)
    assert observed.status_code == 200, observed.text
    assert observed.json()["status"]["revision"] == 1
    assert_problem(
        await admin.post(f"{FLEET}/workloads/child-agent/observations", json=body), 409, "fleet.revision_conflict"
    )
    rebind = {**body, "expected_revision": 1, "runtime_identity": {"session_id": "session-other"}}
    rebind["status"] = {**body["status"], "revision": 2}
    assert_problem(
        await admin.post(f"{FLEET}/workloads/child-agent/observations", json=rebind),
        409,
        "fleet.runtime_identity_immutable",
    )
    unknown = {**body, "expected_revision": 1, "surprise": True}
    assert_problem(
        await admin.post(f"{FLEET}/workloads/child-agent/observations", json=unknown), 422, "validation.failed"
    )
    assert_problem(await admin.post(f"{FLEET}/workloads/nope/observations", json=body), 404, "fleet.workload_not_found")
    # Reads are the operator's too; writes are the admin's.
    inventory = (await operator.get(f"{FLEET}/workloads")).json()
    assert errors("inventory_snapshot", inventory) == [] and len(inventory["records"]) == 4
    assert (await operator.get(f"{FLEET}/workloads/child-agent")).json()["status"]["observed_state"] == "running"
    assert_problem(
        await operator.post(f"{FLEET}/workloads", json=admission(records()["child-agent"])), 403, "auth.forbidden"
    )
    assert_problem(await admin.get(f"{FLEET}/workloads/nope"), 404, "fleet.workload_not_found")
    report = await admin.post(f"{FLEET}/reconcile", json={"before_revision": 0, "child_ids": ["child-agent", "gone"]})
    assert report.status_code == 200 and errors("reconciliation_report", report.json()) == []
    # The fixture's agent is bound to task-agent-1, which this executor never ran: not re-adopted.
    agent, gone = report.json()["rows"]
    assert (agent["classification"], gone["classification"]) == ("unknown", "unknown")
    assert "not in the task store" in agent["reason"] and agent["observed_state"] == "running"
    assert_problem(
        await admin.post(f"{FLEET}/reconcile", json={"before_revision": 0, "child_ids": []}), 422, "validation.failed"
    )


async def test_every_route_needs_a_token(anon: httpx.AsyncClient) -> None:
    for method, path in (
        ("GET", "/workloads"),
        ("POST", "/workloads"),
        ("GET", "/workloads/x"),
        ("POST", "/workloads/x/observations"),
        ("POST", "/reconcile"),
    ):
        response = await anon.request(method, FLEET + path, json={})
        assert_problem(response, 401, "auth.unauthorized")


async def test_each_change_is_an_event(admin: httpx.AsyncClient) -> None:
    doc = admission(records()["child-daemon"])
    assert (await admin.post(f"{FLEET}/workloads", json=doc)).status_code == 202
    assert (await admin.post(f"{FLEET}/workloads", json=doc)).status_code == 200  # a replay: no event
    body = {"expected_revision": 0, "status": {**doc["status"], "observed_state": "healthy", "revision": 1}}
    assert (await admin.post(f"{FLEET}/workloads/child-daemon/observations", json=body)).status_code == 200
    events = (await admin.get("/api/v2/admin/events", params={"kind": "fleet.*"})).json()["items"]
    assert {e["subject"] for e in events} == {"fleet/child-daemon"}
    assert [(e["kind"], e["data"]["revision"], e["data"]["observed_state"]) for e in events] == [
        ("fleet.workload_admitted", 0, "pending"),
        ("fleet.workload_observed", 1, "healthy"),
    ]
