"""The operations table on a real file: a record round-trips field for field and survives a reopen;
``unfinished`` lists what has not ended; ``purge`` drops ended operations only."""

from __future__ import annotations

from agentic_sandbox.controller.store import TERMINAL_STATES, OperationRecord, Store
from tests.controller.store.conftest import OpenStore


async def test_operations_round_trip_and_survive_reopen(open_store: OpenStore) -> None:
    store = open_store()
    op = OperationRecord(id="op_1", kind="instance.provision", state="pending", instance_id="i1", created_at=1.0)
    await store.operations.save(op)
    op.state, op.started_at = "running", 2.0
    await store.operations.save(op)
    done = OperationRecord(
        id="op_2",
        kind="instance.stop",
        state="failed",
        created_at=1.0,
        completed_at=3.0,
        error={"code": "x.y", "status": 503},
        result=None,
    )
    await store.operations.save(done)
    assert [o.id for o in await store.operations.unfinished()] == ["op_1"]
    store.close()

    store = open_store()
    assert await store.operations.get("op_1") == op
    assert (await store.operations.get("op_2")) == done
    assert await store.operations.get("op_nope") is None
    assert await store.operations.purge(completed_before=2.5) == 0
    assert await store.operations.purge(completed_before=3.5) == 1
    assert await store.operations.get("op_2") is None
    assert await store.operations.get("op_1") is not None  # never purged while unfinished
    store.close()


async def test_unfinished_is_every_state_but_the_terminal_ones_oldest_first(store: Store) -> None:
    states = ["pending", "running", *sorted(TERMINAL_STATES)]
    for i, state in enumerate(states):
        # Created newest first: the listing orders by created_at, not by insertion.
        await store.operations.save(OperationRecord(id=f"op_{i}", kind="k", state=state, created_at=100.0 - i))
    assert [o.state for o in await store.operations.unfinished()] == ["running", "pending"]


async def test_a_result_keeps_its_json(store: Store) -> None:
    op = OperationRecord(
        id="op_r", kind="instance.provision", state="succeeded", created_at=1.0, completed_at=2.0,
        result={"instance": {"id": "i1", "labels": {"a": "b"}}, "n": [1, 2.5, None]},
    )  # fmt: skip
    await store.operations.save(op)
    assert await store.operations.get("op_r") == op
