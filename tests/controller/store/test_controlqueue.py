"""The agent outbox on a real file: rows come with their task event, oldest first, until removed;
they survive a reopen (what a restarted controller hands over)."""

from __future__ import annotations

import time

from agentic_sandbox.controller.store import Append, OutboxItem, Store
from tests.controller.store.conftest import OpenStore
from tests.controller.store.records import task


def _message(message_id: str, outbox: dict[str, str] | None) -> Append:
    return Append(kind="message", body={"messageId": message_id, "parts": []}, outbox=outbox)


async def test_items_are_pending_in_event_order_until_removed_and_survive_a_reopen(open_store: OpenStore) -> None:
    store = open_store()
    now = time.time()
    await store.tasks.create(task("t1", now), _message("m1", {"n": "first"}))
    await store.tasks.create(task("t2", now), _message("m1", None))  # nothing for its agent
    await store.tasks.append("t1", _message("m2", None), now)
    await store.tasks.append("t1", _message("m3", {"n": "third"}), now)
    assert await store.outbox.task_ids() == {"t1"}
    assert await store.outbox.pending("t2") == []
    store.close()

    store = open_store()
    try:
        assert await store.outbox.pending("t1") == [
            OutboxItem(task_id="t1", seq=1, body={"n": "first"}),
            OutboxItem(task_id="t1", seq=3, body={"n": "third"}),
        ]
        await store.outbox.remove("t1", 1)
        await store.outbox.remove("t1", 2)  # no such item: nothing happens
        assert [i.seq for i in await store.outbox.pending("t1")] == [3]
        await store.outbox.remove("t1", 3)
        assert await store.outbox.pending("t1") == [] and await store.outbox.task_ids() == set()
    finally:
        store.close()


async def test_a_skipped_event_queues_nothing(store: Store) -> None:
    now = time.time()
    await store.tasks.create(task("t1", now, {"state": "TASK_STATE_COMPLETED"}), _message("m1", None))
    skipped = Append(kind="message", body={"messageId": "m2", "parts": []}, outbox={"n": 1}, unless_terminal=True)
    event, _ = await store.tasks.append("t1", skipped, now)
    assert event is None
    assert await store.outbox.task_ids() == set()
