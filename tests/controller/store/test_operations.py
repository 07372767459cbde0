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


async def test_pages_newest_first_with_filters_and_retention(store: Store) -> None:
    ops = [
        OperationRecord(id="op_1", kind="instance.provision", state="succeeded", instance_id="i1", created_at=1.0,
                        completed_at=1.5),
        OperationRecord(id="op_2", kind="instance.start", state="running", instance_id="i1", created_at=2.0),
        OperationRecord(id="op_3", kind="instance.start", state="failed", instance_id="i2", created_at=2.0,
                        completed_at=9.0),
        OperationRecord(id="op_4", kind="instance.stop", state="pending", created_at=4.0),
    ]  # fmt: skip
    for op in ops:
        await store.operations.save(op)

    async def walk(limit: int, **filters: object) -> list[str]:
        seen: list[str] = []
        after = None
        while True:
            page, more = await store.operations.page(after=after, limit=limit, **filters)  # type: ignore[arg-type]
            seen += [op.id for op in page]
            if not more:
                return seen
            assert len(page) == limit
            after = (page[-1].created_at, page[-1].id)

    for limit in (1, 2, 3, 4, 10):
        assert await walk(limit) == ["op_4", "op_3", "op_2", "op_1"]
    assert await walk(1, kind="instance.start") == ["op_3", "op_2"]
    assert await walk(1, state="running") == ["op_2"]
    assert await walk(1, instance_id="i1") == ["op_2", "op_1"]
    assert await walk(1, instance_id="i1", state="failed") == []
    # Ended before the retention's start: left out, as GET leaves it out.
    assert await walk(2, completed_since=2.0) == ["op_4", "op_3", "op_2"]
    assert (await store.operations.get("op_1")) == ops[0]
