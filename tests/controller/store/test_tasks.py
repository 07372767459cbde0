"""A2A tasks in the store: first the pure parts (artifact folding, the prompt a task waits on,
timeline stamps), then the table on a real file: appends and their guards, snapshots, the event
timeline, history, pages, unfinished tasks and the purge."""

from __future__ import annotations

import time
from typing import Any

import pytest

from agentic_sandbox.controller.store import Append, Store
from agentic_sandbox.controller.store.tasks import (
    HITL_EXTENSION,
    TERMINAL,
    TIMELINE_POSITION,
    fold_artifact,
    rfc3339_us,
    stamp,
    waits_on,
)
from tests.controller.store.records import instance, task

FIRST = Append(kind="message", body={"messageId": "m", "parts": []})


def _status(state: str, **kw: Any) -> Append:
    status = {"state": state}
    return Append(kind="status", body={"status": status}, status=status, **kw)


def _message(message_id: str) -> Append:
    return Append(kind="message", body={"messageId": message_id, "role": "ROLE_USER", "parts": []})


# -- in memory -------------------------------------------------------------------------------------


def test_fold_artifact_replaces_or_appends_joining_text() -> None:
    first = {"artifactId": "a", "name": "out", "parts": [{"text": "ab"}]}
    assert fold_artifact(None, first, append=True) == first  # nothing stored: the chunk is the artifact
    joined = fold_artifact(first, {"artifactId": "a", "parts": [{"text": "c"}, {"data": 1}, {"text": "d"}]}, True)
    assert joined == {"artifactId": "a", "name": "out", "parts": [{"text": "abc"}, {"data": 1}, {"text": "d"}]}
    assert first["parts"] == [{"text": "ab"}]  # the stored artifact is not changed in place
    # Text with metadata is its own part; a chunk that does not append replaces.
    marked = fold_artifact(first, {"artifactId": "a", "parts": [{"text": "x", "metadata": {}}]}, True)
    assert marked["parts"] == [{"text": "ab"}, {"text": "x", "metadata": {}}]
    assert fold_artifact(first, {"artifactId": "a", "parts": [{"text": "new"}]}, False)["parts"] == [{"text": "new"}]


def test_waits_on_is_the_lowercase_prompt_id_of_a_task_waiting_for_input() -> None:
    def waiting(envelope: Any, state: str = "TASK_STATE_INPUT_REQUIRED") -> str | None:
        status = {"state": state, "message": {"metadata": {HITL_EXTENSION: envelope}}}
        return waits_on(task("t", 1.0, status))

    assert waiting({"prompt_id": "AbC-1"}) == "abc-1"
    assert waiting({"prompt_id": "AbC-1"}, state="TASK_STATE_WORKING") is None
    assert waiting({"prompt_id": 7}) is None
    assert waiting("not an envelope") is None
    assert waits_on(task("t", 1.0, {"state": "TASK_STATE_INPUT_REQUIRED", "message": "x"})) is None
    assert waits_on(task("t", 1.0, {"state": "TASK_STATE_INPUT_REQUIRED"})) is None


def test_stamp_sets_the_timeline_position_where_each_kind_keeps_it() -> None:
    at = 1_700_000_000.25
    assert rfc3339_us(at) == "2023-11-14T22:13:20.250000Z"
    message = {"messageId": "m", "metadata": {"k": "v"}}
    stamp("message", message, at)
    assert message["metadata"] == {"k": "v", TIMELINE_POSITION: rfc3339_us(at)}
    status: dict[str, Any] = {"status": {"state": "s", "message": {"messageId": "n"}}}
    stamp("status", status, at)
    assert status["status"]["timestamp"] == rfc3339_us(at)
    assert status["status"]["message"]["metadata"] == {TIMELINE_POSITION: rfc3339_us(at)}
    bare: dict[str, Any] = {"status": {"state": "s"}}
    stamp("status", bare, at)
    assert bare == {"status": {"state": "s", "timestamp": rfc3339_us(at)}}
    artifact: dict[str, Any] = {"artifact": {"artifactId": "a", "parts": []}}
    stamp("artifact", artifact, at)
    assert artifact["artifact"]["metadata"] == {TIMELINE_POSITION: rfc3339_us(at)}


# -- on a real file --------------------------------------------------------------------------------


async def test_one_answer_per_prompt_and_the_agent_outbox_goes_with_its_event(store: Store) -> None:
    """``if_prompt`` lets a change through only while the task waits on that prompt; ``outbox``
    rows are written with their event (or not at all) and go when the task is purged."""
    from agentic_sandbox.controller.tasks.prompts import HITL_EXTENSION

    now = time.time()
    prompt = {"prompt_id": "AB-1", "prompt": "?", "response_schema": {"type": "object"}}
    status = {"state": "TASK_STATE_INPUT_REQUIRED", "message": {"metadata": {HITL_EXTENSION: prompt}}}
    await store.tasks.create(
        task("t1", now, status, metadata={}),
        Append(kind="message", body={"messageId": "m", "role": "ROLE_USER", "parts": []}),
    )

    def answer(prompt_id: str) -> list[Append]:
        body = {"messageId": prompt_id, "role": "ROLE_USER", "parts": []}
        working = {"state": "TASK_STATE_WORKING"}
        return [
            Append(kind="message", body=body, outbox={"n": prompt_id}, if_prompt=prompt_id),
            Append(kind="status", body={"status": working}, status=working, if_prompt=prompt_id),
        ]

    events, rec = await store.tasks.append_many("t1", answer("other"), now)
    assert events == [None, None] and rec.state == "TASK_STATE_INPUT_REQUIRED"
    events, rec = await store.tasks.append_many("t1", answer("ab-1"), now)  # ids compare in lower case
    assert [e.seq for e in events if e is not None] == [2, 3] and rec.state == "TASK_STATE_WORKING"
    events, _ = await store.tasks.append_many("t1", answer("ab-1"), now)  # answered: no second one
    assert events == [None, None]
    [item] = await store.outbox.pending("t1")
    assert (item.seq, item.body) == (2, {"n": "ab-1"})
    assert await store.outbox.task_ids() == {"t1"}
    final = {"state": "TASK_STATE_COMPLETED"}
    await store.tasks.append("t1", Append(kind="status", body={"status": final}, status=final), now)
    assert len(await store.tasks.purge(ended_before=now + 60)) == 1
    assert await store.outbox.pending("t1") == [] and await store.outbox.task_ids() == set()


async def test_an_append_returns_the_row_as_stored_without_reading_it_again(store: Store) -> None:
    """append_many reads the row once and applies its changes in memory: what it returns is what
    a fresh read finds, field for field."""
    now = time.time()
    await store.tasks.create(task("t1", now), Append(kind="message", body={"messageId": "m", "parts": []}))
    working = {"state": "TASK_STATE_WORKING"}
    chunk = {"artifactId": "stdout", "name": "stdout", "parts": [{"text": "a"}]}
    events, rec = await store.tasks.append_many(
        "t1",
        [
            Append(kind="status", body={"status": working}, status=working, exec_id="x1", exec_seq=0),
            Append(kind="artifact", body={"artifact": chunk}, artifact=chunk, exec_seq=3, metadata={"k": "w"}),
        ],
        now,  # no later than the first event: times still go up by a tick
    )
    assert [e.seq for e in events if e is not None] == [2, 3]
    assert rec == await store.tasks.get("t1")
    assert rec.state == "TASK_STATE_WORKING" and rec.exec_id == "x1" and rec.exec_seq == 3 and rec.last_seq == 3
    assert rec.metadata == {"k": "w"} and rec.status["timestamp"]


async def test_a_snapshot_is_the_task_at_one_point_of_its_timeline(store: Store) -> None:
    now = time.time()
    await store.tasks.create(task("t1", now), Append(kind="message", body={"messageId": "m", "parts": []}))
    for text in "abc":
        chunk = {"artifactId": "stdout", "name": "stdout", "parts": [{"text": text}]}
        await store.tasks.append("t1", Append(kind="artifact", body={}, artifact=chunk, append=text != "a"), now)
    # A closing empty chunk changes nothing; a new artifact goes after the others, even an empty one.
    for artifact_id in ("stdout", "stderr"):
        chunk = {"artifactId": artifact_id, "name": artifact_id, "parts": [{"text": ""}]}
        await store.tasks.append("t1", Append(kind="artifact", body={}, artifact=chunk, append=True), now)
    snap = await store.tasks.snapshot("t1", 10)
    assert snap is not None
    assert snap.record.last_seq == 6 and snap.artifacts[0]["parts"] == [{"text": "abc"}]
    assert [(a["artifactId"], a["parts"]) for a in snap.artifacts[1:]] == [("stderr", [{"text": ""}])]
    assert [m["messageId"] for m in snap.history] == ["m"]
    bare = await store.tasks.snapshot("t1", 0, artifacts=False)
    assert bare is not None and bare.artifacts == [] and bare.history == []
    assert await store.tasks.snapshot("nope", 10) is None


async def test_an_ended_task_takes_no_second_end_and_times_always_go_up(store: Store) -> None:
    now = time.time()
    first = await store.tasks.create(task("t1", now), FIRST)
    assert (first.seq, first.at) == (1, now)
    done, rec = await store.tasks.append("t1", _status("TASK_STATE_COMPLETED", unless_terminal=True), now - 100)
    assert done is not None and done.at > first.at  # a clock that went back still orders after
    assert rec.status_at == done.at and rec.terminal
    again, rec = await store.tasks.append("t1", _status("TASK_STATE_CANCELED", unless_terminal=True), now)
    assert again is None and rec.state == "TASK_STATE_COMPLETED" and rec.last_seq == 2
    assert (await store.tasks.get("t1")) == rec
    # Without the guard a change still goes in (what the guard is for).
    forced, rec = await store.tasks.append("t1", _status("TASK_STATE_FAILED"), now)
    assert forced is not None and rec.state == "TASK_STATE_FAILED" and rec.last_seq == 3


async def test_the_timeline_and_the_history(store: Store) -> None:
    now = time.time()
    await store.tasks.create(task("t1", now), _message("m1"))
    for change in (_status("TASK_STATE_WORKING"), _message("m2"), _message("m3"), _status("TASK_STATE_COMPLETED")):
        await store.tasks.append("t1", change, now)
    events = await store.tasks.events_after("t1", 0)
    assert [(e.seq, e.kind) for e in events] == [
        (1, "message"), (2, "status"), (3, "message"), (4, "message"), (5, "status"),
    ]  # fmt: skip
    assert [e.at for e in events] == sorted(e.at for e in events) and len({e.at for e in events}) == 5
    assert events[1].body["status"]["timestamp"] == rfc3339_us(events[1].at)
    assert [e.seq for e in await store.tasks.events_after("t1", 2, limit=2)] == [3, 4]
    assert await store.tasks.events_after("t1", 5) == [] and await store.tasks.events_after("nope", 0) == []
    assert [m["messageId"] for m in await store.tasks.history("t1", None)] == ["m1", "m2", "m3"]
    assert [m["messageId"] for m in await store.tasks.history("t1", 2)] == ["m2", "m3"]
    assert await store.tasks.history("t1", 0) == []
    [stored] = await store.tasks.history("t1", 1)
    assert stored["metadata"][TIMELINE_POSITION] == rfc3339_us(events[3].at)


async def test_artifacts_keep_their_first_order(store: Store) -> None:
    now = time.time()
    await store.tasks.create(task("t1", now), FIRST)
    for artifact_id, text, append in (("b", "1", False), ("a", "2", False), ("b", "3", True), ("a", "4", False)):
        chunk = {"artifactId": artifact_id, "parts": [{"text": text}]}
        await store.tasks.append("t1", Append(kind="artifact", body={}, artifact=chunk, append=append), now)
    found = await store.tasks.artifacts("t1")
    assert [(a["artifactId"], a["parts"]) for a in found] == [("b", [{"text": "13"}]), ("a", [{"text": "4"}])]


async def test_pages_newest_status_first_with_filters_and_a_cursor(store: Store) -> None:
    for i, (context, state) in enumerate(
        [("c1", "TASK_STATE_WORKING"), ("c1", "TASK_STATE_COMPLETED"), ("c2", "TASK_STATE_WORKING")] * 2
    ):
        status = {"state": state}
        await store.tasks.create(task(f"t{i}", 100.0 + i, status, context_id=context), FIRST)
    await store.tasks.create(task("elsewhere", 200.0, instance_id="i2"), FIRST)
    # Two tasks at the same status time: ties go by id, descending.
    await store.tasks.create(task("t6", 105.0), FIRST)

    async def page(**kw: Any) -> tuple[list[str], int]:
        args: dict[str, Any] = {"context_id": None, "state": None, "status_after": None, "after": None, "limit": 100}
        args.update(kw)
        records, total = await store.tasks.page("i1", **args)
        return [r.id for r in records], total

    assert await page() == (["t6", "t5", "t4", "t3", "t2", "t1", "t0"], 7)
    assert await page(limit=3) == (["t6", "t5", "t4"], 7)
    assert await page(limit=3, after=(105.0, "t5")) == (["t4", "t3", "t2"], 7)  # total: of the filters, not the page
    assert await page(after=(105.0, "t6")) == (["t5", "t4", "t3", "t2", "t1", "t0"], 7)
    assert await page(context_id="c2") == (["t5", "t2"], 2)
    assert await page(state="TASK_STATE_WORKING") == (["t5", "t3", "t2", "t0"], 4)
    assert await page(status_after=104.0, context_id="c1") == (["t6", "t4"], 2)


async def test_unfinished_tasks_oldest_first_and_the_purge_takes_only_old_ended_ones(store: Store) -> None:
    for i, state in enumerate(["TASK_STATE_WORKING", *TERMINAL, "TASK_STATE_INPUT_REQUIRED"]):
        await store.tasks.create(task(f"t{i}", 100.0 - i, {"state": state}), FIRST)
    assert [r.id for r in await store.tasks.unfinished()] == ["t5", "t0"]
    assert sorted(await store.tasks.purge(ended_before=97.5)) == ["t3", "t4"]  # t3 (97), t4 (96); t1, t2 ended later
    assert {r.id for r in await store.tasks.unfinished()} == {"t0", "t5"}
    assert await store.tasks.get("t3") is None and await store.tasks.events_after("t3", 0) == []
    assert len(await store.tasks.purge(ended_before=1000.0)) == 2
    assert sorted([r.id for r in await store.tasks.unfinished()]) == ["t0", "t5"]
    assert await store.tasks.get("t0") is not None


@pytest.mark.parametrize("limit", [None, 1])
async def test_a_snapshot_history_is_its_last_messages(store: Store, limit: int | None) -> None:
    now = time.time()
    await store.tasks.create(task("t1", now), _message("m1"))
    await store.tasks.append("t1", _message("m2"), now)
    snap = await store.tasks.snapshot("t1", limit)
    assert snap is not None
    assert [m["messageId"] for m in snap.history] == (["m1", "m2"] if limit is None else ["m2"])


async def _totals(store: Store, instance_id: str | None) -> dict[str | None, int]:
    """The total a page reports for no state filter and for each state, as counted."""
    totals: dict[str | None, int] = {}
    for state in (None, "TASK_STATE_SUBMITTED", "TASK_STATE_WORKING", *TERMINAL):
        _records, total = await store.tasks.page(
            instance_id, context_id=None, state=state, status_after=None, after=None, limit=1
        )
        totals[state] = total
    return totals


async def _scanned(store: Store, instance_id: str | None) -> dict[str | None, int]:
    """The same totals counted from the rows (what the kept counts must always equal)."""
    records, _total = await store.tasks.page(
        instance_id, context_id=None, state=None, status_after=0.0, after=None, limit=10_000
    )
    totals: dict[str | None, int] = {None: len(records)}
    for state in ("TASK_STATE_SUBMITTED", "TASK_STATE_WORKING", *TERMINAL):
        totals[state] = sum(1 for r in records if r.state == state)
    return totals


async def test_totals_are_kept_exact_across_creates_state_changes_and_pruning(store: Store) -> None:
    now = time.time()
    for i in range(6):
        await store.tasks.create(task(f"a{i}", now - 100 + i, instance_id="i1"), FIRST)
    for i in range(3):
        await store.tasks.create(task(f"b{i}", now - 100 + i, instance_id="i2"), FIRST)
    await store.tasks.append("a0", _status("TASK_STATE_WORKING"), now - 50)
    await store.tasks.append("a0", _status("TASK_STATE_COMPLETED"), now - 50)
    await store.tasks.append("a1", _status("TASK_STATE_CANCELED"), now - 40)
    await store.tasks.append("a2", _status("TASK_STATE_FAILED"), now - 1)
    await store.tasks.append("b0", _status("TASK_STATE_COMPLETED"), now - 30)
    # A skipped change (the task ended already) moves no count.
    await store.tasks.append("a0", _status("TASK_STATE_CANCELED", unless_terminal=True), now)
    for instance_id in ("i1", "i2", None):
        assert await _totals(store, instance_id) == await _scanned(store, instance_id), instance_id
    assert (await _totals(store, "i1"))[None] == 6 and (await _totals(store, None))[None] == 9
    assert (await _totals(store, "i1"))["TASK_STATE_COMPLETED"] == 1

    assert sorted(await store.tasks.purge(ended_before=now - 20)) == ["a0", "a1", "b0"]
    assert sorted(await store.tasks.purge(ended_before=now - 20)) == []  # gone once: counted down once
    for instance_id in ("i1", "i2", None):
        assert await _totals(store, instance_id) == await _scanned(store, instance_id), instance_id
    assert (await _totals(store, None))[None] == 6


async def test_the_purge_goes_in_batches_oldest_first_and_steps_over_unfinished_tasks(store: Store) -> None:
    for i in range(7):
        state = "TASK_STATE_WORKING" if i == 0 else "TASK_STATE_COMPLETED"
        await store.tasks.create(task(f"t{i}", 100.0 + i, {"state": state}), FIRST)
    assert await store.tasks.purge(ended_before=1000.0, limit=2) == ["t1", "t2"]
    assert await store.tasks.purge(ended_before=1000.0, limit=2) == ["t3", "t4"]
    assert await store.tasks.purge(ended_before=1000.0, limit=5) == ["t5", "t6"]
    assert await store.tasks.purge(ended_before=1000.0, limit=5) == []
    assert await store.tasks.get("t0") is not None


async def test_trim_keeps_the_newest_ended_tasks_of_each_instance(store: Store) -> None:
    states = ["TASK_STATE_COMPLETED", "TASK_STATE_FAILED", "TASK_STATE_CANCELED", "TASK_STATE_WORKING"]
    for i in range(8):
        await store.tasks.create(task(f"a{i}", 100.0 + i, {"state": states[i % 4]}, instance_id="i1"), FIRST)
    for i in range(2):
        await store.tasks.create(task(f"b{i}", 100.0 + i, {"state": "TASK_STATE_COMPLETED"}, instance_id="i2"), FIRST)
    # i1 has 6 ended tasks (a0 a1 a2 a4 a5 a6) and 2 running; keep 3: its 3 oldest ended go, in
    # batches; i2 (2 ended) keeps all.
    assert await store.tasks.trim(keep=3, limit=2) == ["a0", "a1"]
    assert await store.tasks.trim(keep=3, limit=2) == ["a2"]
    assert await store.tasks.trim(keep=3, limit=2) == []
    left, total = await store.tasks.page("i1", context_id=None, state=None, status_after=None, after=None, limit=100)
    assert sorted(r.id for r in left) == ["a3", "a4", "a5", "a6", "a7"] and total == 5
    assert (await _totals(store, "i2"))[None] == 2
    assert await _totals(store, None) == await _scanned(store, None)


async def test_events_are_stored_compact_and_read_back_whole(store: Store) -> None:
    now = 1_700_000_000.5
    first = Append(
        kind="message",
        body={"messageId": "m1", "role": "ROLE_USER", "parts": [{"text": "hi"}], "taskId": "t1", "contextId": "c1"},
    )
    await store.tasks.create(task("t1", now), first)
    status = {"state": "TASK_STATE_WORKING", "message": {"messageId": "s", "parts": [], "metadata": {"k": 1}}}
    await store.tasks.append(
        "t1", Append(kind="status", body={"taskId": "t1", "contextId": "c1", "status": status}, status=status), now
    )
    chunk = {"artifactId": "a", "parts": [{"text": "out"}]}
    body = {"taskId": "t1", "contextId": "c1", "artifact": chunk, "append": False}
    await store.tasks.append("t1", Append(kind="artifact", body=body, artifact=chunk), now)
    # Another writer's body (an older controller's rows were whole): read back as it was.
    foreign = {"taskId": "t1", "contextId": "other", "status": {"state": "TASK_STATE_WORKING"}}
    await store.tasks.append("t1", Append(kind="status", body=foreign, status={"state": "TASK_STATE_WORKING"}), now)

    rows = await store.db.run(
        lambda db: db.execute("SELECT body FROM task_events WHERE task_id = ? ORDER BY seq", ("t1",)).fetchall()
    )
    raw = [r["body"].decode() if isinstance(r["body"], bytes) else r["body"] for r in rows]
    assert all('"taskId"' not in b and TIMELINE_POSITION not in b and "timestamp" not in b for b in raw[:3]), raw
    assert '"contextId":"other"' in raw[3].replace(" ", "")  # not the task's: kept

    events = await store.tasks.events_after("t1", 0)
    message, working, artifact, other = (e.body for e in events)
    assert message["taskId"] == "t1" and message["contextId"] == "c1"
    assert message["metadata"] == {TIMELINE_POSITION: rfc3339_us(events[0].at)}
    assert working["status"]["timestamp"] == rfc3339_us(events[1].at)
    assert working["status"]["message"]["metadata"] == {"k": 1, TIMELINE_POSITION: rfc3339_us(events[1].at)}
    assert artifact["artifact"]["metadata"] == {TIMELINE_POSITION: rfc3339_us(events[2].at)}
    assert (artifact["taskId"], artifact["contextId"], artifact["append"]) == ("t1", "c1", False)
    assert other["contextId"] == "other"
    history = await store.tasks.history("t1", None)
    assert history == [message]


async def test_orphans_of_a_host_leave_out_the_tasks_of_instances_placed_elsewhere(store: Store) -> None:
    await store.instances.insert(instance("i-h1", "on-h1", host_id="h1"))
    await store.instances.insert(instance("i-h2", "on-h2", host_id="h2"))
    await store.instances.insert(instance("i-old", "unplaced"))
    for n, instance_id in enumerate(["i-h1", "i-h2", "i-old", "i-gone"]):  # i-gone: no longer in the catalog
        await store.tasks.create(
            task(f"t-{instance_id}", 100.0 + n, instance_id=instance_id), FIRST, owner="x", until=150.0
        )
    await store.tasks.create(task("t-held", 110.0, instance_id="i-h1"), FIRST, owner="y", until=500.0)
    ended = {"state": "TASK_STATE_COMPLETED"}
    await store.tasks.create(task("t-ended", 111.0, ended, instance_id="i-h1"), FIRST, owner="x", until=150.0)
    everything = ["t-i-h1", "t-i-h2", "t-i-old", "t-i-gone"]
    assert [r.id for r in await store.tasks.orphans(200.0)] == everything
    assert [r.id for r in await store.tasks.orphans(200.0, host_id="h1")] == ["t-i-h1", "t-i-old", "t-i-gone"]
    assert [r.id for r in await store.tasks.orphans(200.0, host_id="h2")] == ["t-i-h2", "t-i-old", "t-i-gone"]
    assert [r.id for r in await store.tasks.orphans(200.0, 1, host_id="h2")] == ["t-i-h2"]
    assert await store.tasks.orphans(120.0, host_id="h1") == []  # every claim still runs


async def test_the_instance_of_a_task(store: Store) -> None:
    await store.tasks.create(task("t1", 100.0, instance_id="i7"), FIRST)
    assert await store.tasks.instance_of("t1") == "i7"
    assert await store.tasks.instance_of("t2") is None


async def test_many_tasks_are_read_at_once_by_id(store: Store) -> None:
    now = time.time()
    for n in range(3):
        await store.tasks.create(task(f"t{n}", now), Append(kind="message", body={"messageId": f"m{n}", "parts": []}))
    found = await store.tasks.get_many(["t0", "t2", "missing", "t0"])
    assert sorted(found) == ["t0", "t2"] and found["t2"].id == "t2"
    assert await store.tasks.get_many([]) == {}
