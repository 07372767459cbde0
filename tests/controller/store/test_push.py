"""Push notification configs on each real store: a per-task limit, a delivery cursor that never
moves back, paging, and which configs still have something to deliver; they go with their task.
Claims (several controllers on one store): one controller at a time, taken once they ran out,
renewed and released with the controller's other claims; the cursor written only by the holder of
this very config (not one that replaced it)."""

from __future__ import annotations

import time
from typing import Any

import msgspec
import trio

from agentic_sandbox.controller.store import Append, PushConfigRecord, Store
from tests.controller.store.conftest import OpenStore
from tests.controller.store.records import task

FIRST = Append(kind="message", body={"messageId": "m", "role": "ROLE_USER", "parts": []})


def _config(config_id: str, task_id: str = "t1", **kw: object) -> PushConfigRecord:
    fields: dict[str, Any] = {"instance_id": "i1", "url": "http://h/", "created_at": 1.0, **kw}
    return PushConfigRecord(id=config_id, task_id=task_id, **fields)


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


async def claim_of(store: Store, task_id: str, config_id: str) -> tuple[Any, float]:
    """The config's (owner, owner_until) as stored."""
    row = await store.db.run(
        lambda db: db.execute(
            "SELECT owner, owner_until FROM push_configs WHERE task_id = ? AND id = ?", (task_id, config_id)
        ).fetchone()
    )
    return row[0], float(row[1])


async def test_a_config_is_claimed_by_one_controller_until_its_claim_runs_out(store: Store) -> None:
    now = time.time()
    await store.tasks.create(task("t1", now), FIRST)
    assert await store.push.create(_config("p"), limit=5)
    assert await claim_of(store, "t1", "p") == (None, 0.0)  # made unowned: the first claim wins
    assert await store.push.claim("t1", "p", "A", now + 2, now)
    assert not await store.push.claim("t1", "p", "B", now + 2, now)  # A's, and A's claim lasts
    assert await store.push.claim("t1", "p", "A", now + 3, now)  # A's own: renewed
    assert await claim_of(store, "t1", "p") == ("A", now + 3)
    assert await store.push.claim("t1", "p", "B", now + 9, now + 4)  # ran out: B takes it
    assert await store.push.claim("t1", "p", "C", now + 1, now, steal=True)  # the embedded store's restart
    assert await claim_of(store, "t1", "p") == ("C", now + 1)
    assert not await store.push.claim("t1", "gone", "A", now + 2, now)


async def test_orphans_are_configs_left_to_deliver_whose_claim_ran_out(store: Store) -> None:
    now = time.time()
    await store.tasks.create(task("live", now), FIRST)
    await store.tasks.create(task("ended", now), FIRST)
    done = {"state": "TASK_STATE_COMPLETED"}
    await store.tasks.append("ended", Append(kind="status", body={"status": done}, status=done), now)
    for config_id, created in (("unowned", 1.0), ("held", 2.0), ("ran-out", 3.0)):
        assert await store.push.create(_config(config_id, "live", created_at=created), limit=10)
    assert await store.push.create(_config("done", "ended"), limit=10)
    assert await store.push.advance("ended", "done", 2)  # everything of an ended task: nothing to do
    assert await store.push.create(_config("left", "ended", created_at=4.0), limit=10)  # one event left
    assert await store.push.claim("live", "held", "A", now + 60, now)
    assert await store.push.claim("live", "ran-out", "A", now - 1, now - 2)
    assert [c.id for c in await store.push.orphans(now)] == ["unowned", "ran-out", "left"]  # oldest first
    assert [c.id for c in await store.push.orphans(now, limit=1)] == ["unowned"]
    assert [c.id for c in await store.push.orphans(now + 61)] == ["unowned", "held", "ran-out", "left"]


async def test_only_the_holder_of_this_very_config_moves_its_cursor(store: Store) -> None:
    now = time.time()
    await store.tasks.create(task("t1", now), FIRST)
    first = _config("p", created_at=1.0)
    assert await store.push.create(first, limit=5)
    assert await store.push.claim("t1", "p", "A", now + 1, now)
    assert await store.push.advance("t1", "p", 3, owner="A", created_at=1.0)
    assert await store.push.advance("t1", "p", 2, owner="A", created_at=1.0)  # ours; a cursor never moves back
    assert not await store.push.advance("t1", "p", 4, owner="B", created_at=1.0)  # not B's
    assert await store.push.claim("t1", "p", "B", now + 9, now + 2)  # A's claim ran out: B took it
    assert not await store.push.advance("t1", "p", 5, owner="A", created_at=1.0)  # A is fenced out
    assert (await store.push.get("t1", "p")).delivered_seq == 3  # type: ignore[union-attr]
    # Replaced (even by a controller that claims it again at once): the old one's writes go nowhere.
    assert await store.push.create(msgspec.structs.replace(first, created_at=2.0), limit=5)
    assert await claim_of(store, "t1", "p") == (None, 0.0)
    assert await store.push.claim("t1", "p", "B", now + 9, now)
    assert not await store.push.advance("t1", "p", 5, owner="B", created_at=1.0)
    assert await store.push.advance("t1", "p", 5, owner="B", created_at=2.0)
    await store.push.delete("t1", "p")
    assert not await store.push.advance("t1", "p", 6, owner="B", created_at=2.0)
    assert not await store.push.advance("t1", "p", 6)


async def test_hold_reads_a_live_claim_and_extends_one_running_out_unless_taken(store: Store) -> None:
    now = time.time()
    await store.tasks.create(task("t1", now), FIRST)
    assert await store.push.create(_config("p", created_at=1.0), limit=5)
    assert await store.push.claim("t1", "p", "A", now + 10, now)
    mine: dict[str, Any] = {"owner": "A", "created_at": 1.0}
    assert await store.push.hold("t1", "p", **mine, need=now + 5, until=now + 20)
    assert await claim_of(store, "t1", "p") == ("A", now + 10)  # lasts long enough: only read
    assert await store.push.hold("t1", "p", **mine, need=now + 15, until=now + 20)
    assert await claim_of(store, "t1", "p") == ("A", now + 20)  # would run out before: extended
    assert not await store.push.hold("t1", "p", owner="B", created_at=1.0, need=now, until=now + 1)
    assert not await store.push.hold("t1", "p", owner="A", created_at=2.0, need=now, until=now + 1)  # another config
    assert await store.push.claim("t1", "p", "B", now + 30, now + 21)  # A's ran out and B took it
    assert not await store.push.hold("t1", "p", **mine, need=now, until=now + 40)
    assert await claim_of(store, "t1", "p") == ("B", now + 30)
    await store.push.delete("t1", "p")
    assert not await store.push.hold("t1", "p", owner="B", created_at=1.0, need=now, until=now + 1)


async def test_claims_are_renewed_and_released_with_the_controllers_others(store: Store) -> None:
    now = time.time()
    await store.tasks.create(task("t1", now), FIRST)
    for config_id in ("p1", "p2"):
        assert await store.push.create(_config(config_id), limit=5)
        assert await store.push.claim("t1", config_id, "A", now + 1, now)
    await store.renew("A", now + 50)  # the controller's lease loop: every claim of A at once
    assert await claim_of(store, "t1", "p2") == ("A", now + 50)
    assert not await store.push.claim("t1", "p1", "B", now + 60, now + 49)
    await store.push.release("t1", "p1", "A")  # done with it: no longer renewed
    await store.push.release("t1", "p2", "B")  # not B's to release
    assert await claim_of(store, "t1", "p1") == (None, 0.0)
    assert await claim_of(store, "t1", "p2") == ("A", now + 50)
    await store.release("A")  # a clean stop: another controller takes it at once
    assert await store.push.claim("t1", "p2", "B", now + 60, now)


async def test_of_two_controllers_claiming_at_once_exactly_one_wins(open_store: OpenStore) -> None:
    first, second = open_store(), open_store()
    now = time.time()
    await first.tasks.create(task("t1", now), FIRST)

    async def claim(store: Store, owner: str, config_id: str, won: list[str]) -> None:
        if await store.push.claim("t1", config_id, owner, now + 60, time.time()):
            won.append(owner)

    for round_ in range(20):
        config_id = f"p{round_}"
        assert await first.push.create(_config(config_id), limit=100)
        won: list[str] = []
        async with trio.open_nursery() as nursery:
            nursery.start_soon(claim, first, "A", config_id, won)
            nursery.start_soon(claim, second, "B", config_id, won)
        assert len(won) == 1, won
        assert (await claim_of(second, "t1", config_id))[0] == won[0]
