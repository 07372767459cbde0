"""Push notification configs on a real file: a per-task limit, a delivery cursor that never moves
back, paging, and which configs still have something to deliver; they go with their task."""

from __future__ import annotations

import time

import msgspec

from agentic_sandbox.controller.store import Append, PushConfigRecord, Store
from tests.controller.store.records import task

FIRST = Append(kind="message", body={"messageId": "m", "role": "ROLE_USER", "parts": []})


def _config(config_id: str, task_id: str = "t1", **kw: object) -> PushConfigRecord:
    return PushConfigRecord(id=config_id, task_id=task_id, instance_id="i1", url="http://h/", created_at=1.0, **kw)  # type: ignore[arg-type]


async def test_push_configs_keep_a_cursor_and_go_with_their_task(store: Store) -> None:
    now = time.time()
    status = {"state": "TASK_STATE_COMPLETED"}
    await store.tasks.create(task("t1", now, status, metadata={}, status_at=now - 10), FIRST)
    config = PushConfigRecord(id="p1", task_id="t1", instance_id="i1", url="http://h/", created_at=now)
    assert await store.push.create(config, limit=1)
    assert not await store.push.create(msgspec.structs.replace(config, id="p2"), limit=1)
    assert await store.push.create(msgspec.structs.replace(config, url="http://h/new"), limit=1)  # replaced
    await store.push.advance("t1", "p1", 1)
    await store.push.advance("t1", "p1", 0)  # a cursor never moves back
    [got] = await store.push.list("t1")
    assert (got.url, got.delivered_seq) == ("http://h/new", 1)
    assert await store.push.pending() == []  # ended, and everything done
    assert len(await store.tasks.purge(ended_before=now)) == 1
    assert await store.push.list("t1") == [] and await store.push.get("t1", "p1") is None


async def test_every_field_round_trips_and_configs_page_by_id(store: Store) -> None:
    now = time.time()
    await store.tasks.create(task("t1", now), FIRST)
    full = _config("p0", token="tok", auth_scheme="Bearer", auth_credentials="secret", extensions=["https://x/ext/v1"])
    assert await store.push.create(full, limit=10)
    assert await store.push.get("t1", "p0") == full
    for config_id in ("p3", "p1", "p2"):
        assert await store.push.create(_config(config_id), limit=10)
    assert [c.id for c in await store.push.list("t1")] == ["p0", "p1", "p2", "p3"]
    assert [c.id for c in await store.push.list("t1", limit=2)] == ["p0", "p1"]
    assert [c.id for c in await store.push.list("t1", after="p1", limit=2)] == ["p2", "p3"]
    assert await store.push.list("other") == []
    await store.push.delete("t1", "p2")
    await store.push.delete("t1", "nope")  # nothing to delete: no error
    assert [c.id for c in await store.push.list("t1")] == ["p0", "p1", "p3"]


async def test_the_limit_is_per_task(store: Store) -> None:
    now = time.time()
    for task_id in ("t1", "t2"):
        await store.tasks.create(task(task_id, now), FIRST)
        assert await store.push.create(_config("p1", task_id), limit=1)
    assert not await store.push.create(_config("p2", "t1"), limit=1)
    assert sorted(c.task_id for c in await store.push.pending()) == ["t1", "t2"]


async def test_pending_is_a_live_task_or_an_ended_one_with_events_left(store: Store) -> None:
    now = time.time()
    await store.tasks.create(task("live", now), FIRST)
    await store.push.create(_config("p", "live"), limit=5)
    await store.push.advance("live", "p", 1)  # everything so far delivered, but the task goes on
    await store.tasks.create(task("ended", now), FIRST)
    await store.push.create(_config("p", "ended"), limit=5)
    done = {"state": "TASK_STATE_FAILED"}
    await store.tasks.append("ended", Append(kind="status", body={"status": done}, status=done), now)
    assert sorted(c.task_id for c in await store.push.pending()) == ["ended", "live"]
    await store.push.advance("ended", "p", 1)
    # The live task's config stays (more may come); the ended one's final status (seq 2) is left.
    assert sorted(c.task_id for c in await store.push.pending()) == ["ended", "live"]
    await store.push.advance("ended", "p", 2)
    assert [c.task_id for c in await store.push.pending()] == ["live"]
