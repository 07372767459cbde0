"""Operations: ids, the state machine, errors as envelopes, keys, recovery, retention; then over HTTP."""

from __future__ import annotations

import re
import time
from collections.abc import AsyncIterator
from datetime import datetime
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import pytest
import trio

from agentic_sandbox.controller.admin.views import operation_path
from agentic_sandbox.controller.errors import InvalidState, ValidationFailed
from agentic_sandbox.controller.events.bus import EventBus
from agentic_sandbox.controller.hostlink import hostd_failure
from agentic_sandbox.controller.http.problems import error_body
from agentic_sandbox.controller.metrics import Metrics
from agentic_sandbox.controller.operations import OperationService, new_operation_id, new_ulid
from agentic_sandbox.controller.store import OperationRecord, Store
from agentic_sandbox.proto import HostdConnectionLost
from tests.contracts import validate_problem

from .conftest import LiveController, provision, wait_operation
from .http.test_problems import ENVELOPE, assert_problem

OP_ID = re.compile(r"^op_[0-9A-HJKMNP-TV-Z]{26}$")


def test_ids_are_prefixed_ulids_in_time_order() -> None:
    ids = [new_operation_id() for _ in range(50)]
    assert all(OP_ID.match(i) for i in ids)
    assert len(set(ids)) == 50
    first = new_ulid()
    time.sleep(0.002)  # ULIDs order by millisecond; this is the one wait that needs wall time
    assert new_ulid()[:10] > first[:10]


def _service(store: Store, retention_s: float) -> OperationService:
    """The service as the app builds it: errors stored as admin envelopes."""
    return OperationService(
        store,
        Metrics(),
        EventBus(),
        retention_s=retention_s,
        error_body=lambda exc, op_id: error_body(exc, operation_path(op_id)),
    )


@pytest.fixture
async def service(tmp_path: Path) -> AsyncIterator[OperationService]:
    store = Store.open(tmp_path / "c.db")
    svc = _service(store, 3600)
    async with trio.open_nursery() as nursery:
        svc.attach(nursery)
        yield svc
        nursery.cancel_scope.cancel()
    store.close()


async def _finish(svc: OperationService, op: OperationRecord) -> OperationRecord:
    with trio.fail_after(5):
        await svc.wait(op.id)
    done = await svc.get(op.id)
    assert done is not None
    return done


async def test_state_machine_to_succeeded(service: OperationService) -> None:
    gate, working = trio.Event(), trio.Event()
    seen: list[str] = []

    async def work(op: OperationRecord) -> dict[str, Any]:
        seen.append((await service.get(op.id)).state)  # type: ignore[union-attr]
        working.set()
        await gate.wait()
        return {"instance_id": "x"}

    op = await service.submit("instance.start", work, keys=("instance:x",), instance_id="x")
    assert op.state == "pending" and op.started_at is None
    assert service.in_flight("instance:x") == op.id
    with pytest.raises(RuntimeError, match="already held"):
        await service.submit("instance.stop", work, keys=("instance:x",))
    with trio.fail_after(5):
        await working.wait()
    assert seen == ["running"]
    gate.set()
    done = await _finish(service, op)
    assert done.state == "succeeded"
    assert done.result == {"instance_id": "x"}
    assert done.created_at <= done.started_at <= done.completed_at  # type: ignore[operator]
    assert service.in_flight("instance:x") is None


@pytest.mark.parametrize(
    ("raised", "status", "code"),
    [
        (InvalidState("instance.invalid_state", "busy"), 409, "instance.invalid_state"),
        (hostd_failure(HostdConnectionLost("hostd went away")), 503, "internal.unavailable"),
        (ValueError("bug"), 500, "internal.error"),
    ],
)
async def test_failures_become_error_envelopes(
    service: OperationService, raised: Exception, status: int, code: str
) -> None:
    async def work(op: OperationRecord) -> dict[str, Any]:
        raise raised

    done = await _finish(service, await service.submit("instance.stop", work, keys=("k",)))
    assert done.state == "failed"
    assert done.result is None
    assert done.error is not None
    validate_problem(done.error)
    jsonschema.validate(done.error, ENVELOPE)
    assert (done.error["status"], done.error["code"]) == (status, code)
    assert done.error["instance"] == f"/api/v2/admin/operations/{done.id}"
    assert service.in_flight("k") is None


async def test_restart_marks_unfinished_operations_interrupted(tmp_path: Path) -> None:
    store = Store.open(tmp_path / "c.db")
    await store.operations.save(OperationRecord(id="op_A", kind="instance.provision", state="running", created_at=1))
    await store.operations.save(OperationRecord(id="op_B", kind="instance.stop", state="pending", created_at=1))
    await store.operations.save(
        OperationRecord(id="op_C", kind="instance.stop", state="succeeded", created_at=1, completed_at=time.time())
    )
    svc = _service(store, 3600)
    assert await svc.recover() == 2
    for op_id in ("op_A", "op_B"):
        op = await svc.get(op_id)
        assert op is not None and op.state == "failed"
        assert op.error is not None and op.error["code"] == "operation.interrupted"
        validate_problem(op.error)
        jsonschema.validate(op.error, ENVELOPE)
    assert (await svc.get("op_C")).state == "succeeded"  # type: ignore[union-attr]
    assert await svc.recover() == 0
    store.close()


async def test_ended_operations_are_purged_after_retention(tmp_path: Path) -> None:
    store = Store.open(tmp_path / "c.db")
    svc = _service(store, 0.2)

    async def work(op: OperationRecord) -> dict[str, Any]:
        return {}

    async with trio.open_nursery() as nursery:
        svc.attach(nursery)
        op = await svc.submit("instance.start", work)
        await svc.wait(op.id)
        assert await svc.get(op.id) is not None
        await nursery.start(svc.run_purger)
        with trio.fail_after(5):
            while await store.operations.get(op.id) is not None:  # the timer deletes the row
                await trio.sleep(0.05)
        nursery.cancel_scope.cancel()
    store.close()


async def test_a_page_leaves_out_what_get_leaves_out_and_refuses_an_unknown_state(tmp_path: Path) -> None:
    store = Store.open(tmp_path / "c.db")
    svc = _service(store, 60)
    now = time.time()
    kept = OperationRecord(id="op_kept", kind="k", state="failed", created_at=now - 90, completed_at=now - 30)
    gone = OperationRecord(id="op_gone", kind="k", state="succeeded", created_at=now - 200, completed_at=now - 100)
    live = OperationRecord(id="op_live", kind="k", state="running", created_at=now - 500)  # never expires
    for op in (kept, gone, live):
        await store.operations.save(op)
    assert await svc.get("op_gone") is None
    page, more = await svc.page(limit=10)
    assert [op.id for op in page] == ["op_kept", "op_live"] and not more
    assert await svc.page(state="failed", limit=1) == ([kept], False)
    with pytest.raises(ValidationFailed) as exc:
        await svc.page(state="done", limit=1)
    assert exc.value.fields[0]["field"] == "state"
    store.close()


# -- over HTTP -------------------------------------------------------------------------------


def _iso(value: str) -> datetime:
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


async def test_operation_status_over_http(admin: httpx.AsyncClient) -> None:
    response = await admin.post("/api/v2/admin/instances", json={"name": "ops-http", "runtime": "host"})
    assert response.status_code == 202
    accepted = response.json()
    assert OP_ID.match(accepted["id"])
    assert accepted["kind"] == "instance.provision"
    assert accepted["state"] == "pending"
    assert response.headers["Location"] == f"/api/v2/admin/operations/{accepted['id']}"
    done = await wait_operation(admin, accepted["id"])
    assert done["state"] == "succeeded"
    assert set(done) >= {"id", "kind", "state", "created_at", "started_at", "completed_at", "result"}
    assert "error" not in done
    assert _iso(done["created_at"]) <= _iso(done["started_at"]) <= _iso(done["completed_at"])
    assert done["created_at"] == accepted["created_at"]


async def test_unknown_operation_is_404(admin: httpx.AsyncClient) -> None:
    assert_problem(
        await admin.get("/api/v2/admin/operations/op_01HZK4XQ5G8XGE0000000000AA"), 404, "operation.not_found"
    )


async def test_failed_operation_carries_its_error(admin: httpx.AsyncClient, controller: LiveController) -> None:
    response = await admin.post(
        "/api/v2/admin/instances", json={"name": "ops-bad-dir", "runtime": "host", "working_dir": "/nonexistent/dir"}
    )
    done = await wait_operation(admin, response.json()["id"])
    assert done["state"] == "failed"
    assert "result" not in done
    assert done["error"]["code"] == "validation.failed"
    assert done["error"]["errors"][0]["field"] == "working_dir"
    validate_problem(done["error"])
    jsonschema.validate(done["error"], ENVELOPE)
    # hostd refused, so nothing was made and the name is free again.
    await provision(admin, "ops-bad-dir")
