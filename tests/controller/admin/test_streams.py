"""GET /events and /logs as upstream's clients see them: JSON snapshots, SSE with monotonic ids,
Last-Event-ID resume that says what the ring lost, keep-alive comments, lagging followers told so,
bounds and roles. A real hostd, the controller on hypercorn, an httpx SSE client."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest
import trio

from agentic_sandbox.controller.config import ControllerConfig, load_config
from tests.contracts import component, response_schema, validate
from tests.controller.a2a.helpers import new_agent

from ..conftest import (
    ADMIN_TOKEN,
    OPERATOR_TOKEN,
    LiveController,
    LiveHostd,
    controller_env,
    provision,
    serve_controller,
    wait_operation,
)
from ..http.test_problems import assert_problem
from ..sse import SseReader

EVENTS = "/api/v2/admin/events"
LOGS = "/api/v2/admin/logs"


@pytest.fixture
async def small(hostd: LiveHostd, tmp_path: Path) -> AsyncIterator[LiveController]:
    """A controller with a 64-event ring, 0.2 s keep-alives and at most 2 followers per stream."""
    env = controller_env(
        tmp_path / "controller",
        hostd.socket_path,
        AIWG_EVENT_RING_SIZE="64",
        AIWG_SSE_KEEPALIVE_S="0.2",
        AIWG_MAX_STREAM_FOLLOWERS="2",
    )
    async with serve_controller(load_config(env=env)) as live:
        yield live


async def test_snapshot_holds_what_provisioning_did_in_upstreams_shape(admin: httpx.AsyncClient) -> None:
    op = await provision(admin, "streamed")
    iid = op["result"]["instance_id"]
    r = await admin.get(EVENTS)
    assert r.status_code == 200, r.text
    body = r.json()
    validate(body, response_schema("/events"))
    for item in body["items"]:
        validate(item, component("Event"))
    mine = [
        (e["kind"], e["data"]) for e in body["items"] if e["subject"] in (f"instance/{iid}", f"operation/{op['id']}")
    ]
    kinds = [kind for kind, _ in mine]
    assert kinds.index("operation.created") < kinds.index("operation.started") < kinds.index("operation.completed")
    states = [(d["from"], d["to"], d["cause"]) for k, d in mine if k == "instance.state_changed"]
    assert states == [(None, "provisioning", "operation"), ("provisioning", "stopped", "operation")]
    completed = next(d for k, d in mine if k == "operation.completed")
    assert completed == {"kind": "instance.provision", "state": "succeeded", "instance_id": iid}
    assert body["last_id"] >= len(body["items"])

    only = (await admin.get(EVENTS, params={"kind": "operation.*", "limit": "2"})).json()["items"]
    assert [e["kind"] for e in only] == ["operation.started", "operation.completed"]

    gone = await admin.delete(f"/api/v2/admin/instances/{iid}")
    assert (await wait_operation(admin, gone.json()["id"]))["state"] == "succeeded"
    last = (await admin.get(EVENTS, params={"kind": "instance.*", "limit": "1"})).json()["items"][0]
    assert (last["kind"], last["subject"]) == ("instance.removed", f"instance/{iid}")
    assert last["data"] == {"name": "streamed", "operation_id": gone.json()["id"], "reason": "decommissioned"}


async def test_follow_streams_new_events_with_monotonic_ids(admin: httpx.AsyncClient) -> None:
    iid = (await provision(admin, "follower"))["result"]["instance_id"]
    async with admin.stream("GET", EVENTS, params={"follow": "true", "kind": "storage.*"}) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        reader = SseReader(response)
        for name in ("a.txt", "b.txt"):
            r = await admin.put(
                f"/api/v2/admin/storage/outbox/{iid}/{name}", content=b"x", headers={"Content-Type": "text/plain"}
            )
            assert r.status_code == 201, r.text
        assert (await admin.delete(f"/api/v2/admin/storage/outbox/{iid}/a.txt")).status_code == 204
        got = [await reader.next() for _ in range(3)]
    assert [e.event for e in got] == ["storage.object_written", "storage.object_written", "storage.object_deleted"]
    assert got[0].id is not None and got[0].id < got[1].id < got[2].id  # type: ignore[operator]
    for event in got:
        validate(event.data, component("Event"))
        assert event.data["kind"] == event.event
    assert got[0].data["subject"] == f"storage/outbox/{iid}/a.txt"
    assert got[0].data["data"]["created"] is True and got[0].data["data"]["size_bytes"] == 1


async def test_last_event_id_resumes_and_says_what_the_ring_lost(small: LiveController) -> None:
    bus = small.state.events
    first = bus.publish("test.marker", None, {"n": 0})
    for n in range(1, 100):
        bus.publish("test.marker", None, {"n": n})
    oldest = bus.ring.first_seq
    assert oldest > first + 1  # the 64-event ring dropped the oldest
    async with small.client() as client:
        headers = {"Last-Event-ID": str(first)}
        async with client.stream("GET", EVENTS, params={"follow": "true"}, headers=headers) as response:
            reader = SseReader(response)
            notice = await reader.next()
            resumed = await reader.next()
        assert notice.event == "stream.lagged" and notice.id is None
        validate(notice.data, component("Event"))
        assert notice.data["data"] == {
            "reason": "dropped",
            "first_missed": first + 1,
            "last_missed": oldest - 1,
            "missed": oldest - 1 - first,
            "resumed_at": oldest,
        }
        assert resumed.id == oldest

        # An id this controller never issued is from an earlier process: said, then the oldest held.
        headers = {"Last-Event-ID": str(bus.ring.last_seq + 1000)}
        async with client.stream("GET", EVENTS, params={"follow": "true"}, headers=headers) as response:
            reader = SseReader(response)
            notice = await reader.next()
            resumed = await reader.next()
        assert notice.data["data"]["reason"] == "restarted" and notice.data["data"]["missed"] is None
        assert resumed.id == bus.ring.first_seq

        # Resuming from an id still held: nothing lost, no notice.
        last = bus.ring.last_seq
        headers = {"Last-Event-ID": str(last - 1)}
        async with client.stream("GET", EVENTS, params={"follow": "true"}, headers=headers) as response:
            got = await SseReader(response).next()
        assert (got.event, got.id) == ("test.marker", last)


async def test_a_stalled_follower_lags_and_slows_no_one(small: LiveController) -> None:
    bus = small.state.events
    blob = "x" * 8000
    count = 600  # ~5 MB: more than the loopback socket buffers hold for a reader that reads nothing
    async with (
        small.client() as stalled,
        small.client() as brisk,
        stalled.stream("GET", EVENTS, params={"follow": "true"}) as stuck,
    ):
        async with brisk.stream("GET", EVENTS, params={"follow": "true", "kind": "test.*"}) as live:
            reader = SseReader(live)
            seen: list[int] = []

            async def read_all() -> None:
                while True:
                    event = await reader.next()
                    if event.event == "test.blob":
                        seen.append(event.data["data"]["n"])
                        if event.data["data"]["n"] == count - 1:
                            return

            async with trio.open_nursery() as nursery:
                nursery.start_soon(read_all)
                for n in range(count):
                    bus.publish("test.blob", None, {"n": n, "blob": blob})  # never awaits
                    await trio.sleep(0)
            assert seen[-1] == count - 1 and seen == sorted(seen)
        # The stalled one reads at last: what fell out of the ring while it stalled is said.
        stalled_reader = SseReader(stuck)
        event = await stalled_reader.until(lambda e: e.event == "stream.lagged")
        assert event.data["data"]["reason"] == "dropped" and event.data["data"]["missed"] > 0


async def test_keepalive_comments_and_follower_bound(small: LiveController) -> None:
    # (Each reader is kept: a dropped one would close its response when collected.)
    async with (
        small.client() as one,
        small.client() as two,
        small.client() as three,
        one.stream("GET", EVENTS, params={"follow": "true"}) as first,
    ):
        first_reader = SseReader(first)
        comment = await first_reader.next(comments=True)
        assert comment.comments == ["keepalive"]
        async with two.stream("GET", EVENTS, params={"follow": "true"}) as second:
            second_reader = SseReader(second)
            await second_reader.next(comments=True)  # surely counted by now
            r = await three.get(EVENTS, params={"follow": "true"})
            problem = assert_problem(r, 429, "rate_limit.exceeded")
            assert r.headers["Retry-After"] == "1"
            assert "(limit 2, set by AIWG_MAX_STREAM_FOLLOWERS)" in problem["detail"]
            assert (await three.get(EVENTS)).status_code == 200  # snapshots are not bounded
            assert (await first_reader.next(comments=True)).comments == ["keepalive"]


async def test_a_follower_that_leaves_frees_its_place(small: LiveController) -> None:
    for _ in range(5):  # more than the bound of 2, one after another
        async with small.client() as client, client.stream("GET", EVENTS, params={"follow": "true"}) as response:
            assert response.status_code == 200
            await SseReader(response).next(comments=True)
    with trio.fail_after(10):  # the server notices each close at its next write
        while small.state.followers.get("events", 0) > 0:
            await trio.sleep(0.05)


async def test_bad_parameters_are_422_naming_them(admin: httpx.AsyncClient) -> None:
    for path, params, field in (
        (EVENTS, {"follow": "maybe"}, "follow"),
        (EVENTS, {"limit": "0"}, "limit"),
        (EVENTS, {"limit": "5001"}, "limit"),
        (EVENTS, {"limit": "ten"}, "limit"),
        (EVENTS, {"kind": ""}, "kind"),
        (LOGS, {"level": "loud"}, "level"),
        (LOGS, {"target": "x" * 300}, "target"),
    ):
        r = await admin.get(path, params=params)
        assert_problem(r, 422, "validation.failed")
        assert r.json()["errors"][0]["field"] == field
    r = await admin.get(EVENTS, params={"follow": "true"}, headers={"Last-Event-ID": "abc"})
    assert_problem(r, 422, "validation.failed")
    assert r.json()["errors"][0]["field"] == "Last-Event-ID"


async def test_roles(controller: LiveController) -> None:
    async with controller.client(OPERATOR_TOKEN) as operator, controller.client(None) as anon:
        assert (await operator.get(EVENTS)).status_code == 200
        assert_problem(await operator.get(LOGS), 403, "auth.forbidden")
        assert_problem(await anon.get(EVENTS), 401, "auth.unauthorized")
        assert_problem(await anon.get(LOGS, params={"follow": "true"}), 401, "auth.unauthorized")


async def test_logs_snapshot_and_follow(controller: LiveController, admin: httpx.AsyncClient) -> None:
    logging.getLogger("controller.test_streams").warning("before the follow")
    r = await admin.get(LOGS, params={"level": "warn", "target": "controller::test_streams"})
    assert r.status_code == 200
    validate(r.json(), response_schema("/logs"))
    entries = r.json()["items"]
    assert [e["message"] for e in entries] == ["before the follow"]
    validate(entries[0], component("LogEntry"))
    assert entries[0]["level"] == "warn" and entries[0]["fields"]["logger_level"] == "WARNING"
    async with admin.stream("GET", LOGS, params={"follow": "true", "target": "controller.test_streams"}) as response:
        reader = SseReader(response)
        logging.getLogger("controller.test_streams.child").error("during the follow")
        got = await reader.next()
    assert got.event == "log" and got.id is not None
    validate(got.data, component("LogEntry"))
    assert (got.data["message"], got.data["level"], got.data["target"]) == (
        "during the follow",
        "error",
        "controller.test_streams.child",
    )
    assert ADMIN_TOKEN not in r.text


async def test_a2a_tasks_are_events_too(controller: LiveController, admin: httpx.AsyncClient) -> None:
    agent = await new_agent(admin, controller, "evented", loadout="echo")
    async with agent.client(controller) as client:
        message = {"messageId": "m-evented-1", "role": "ROLE_USER", "parts": [{"text": "hello"}]}
        task = (await client.post("/message:send", json={"message": message})).json()["task"]
    assert task["status"]["state"] == "TASK_STATE_COMPLETED", task
    items = (await admin.get(EVENTS, params={"kind": "task.*"})).json()["items"]
    mine = [(e["kind"], e["data"]["state"]) for e in items if e["subject"] == f"task/{task['id']}"]
    assert mine[0] == ("task.created", "TASK_STATE_SUBMITTED")
    assert mine[-1] == ("task.status_changed", "TASK_STATE_COMPLETED")
    assert all(e["data"]["instance_id"] == agent.instance_id for e in items if e["subject"] == f"task/{task['id']}")
    for item in items:
        validate(item, component("Event"))


async def test_instance_filter_keeps_the_events_about_one_instance(
    controller: LiveController, admin: httpx.AsyncClient
) -> None:
    """``instance_id`` keeps an instance's own events and those whose data names it (operations,
    sessions, tasks): what the console's instance page follows."""
    first = (await provision(admin, "feed-a", start=True))["result"]["instance_id"]
    second = (await provision(admin, "feed-b", start=True))["result"]["instance_id"]

    def about(event: dict, iid: str) -> bool:
        return event["subject"] == f"instance/{iid}" or event["data"].get("instance_id") == iid

    with trio.fail_after(10):
        while controller.state.watch.polls < 1:  # sessions made before the watch's baseline are not news
            await trio.sleep(0.05)
    async with admin.stream("GET", EVENTS, params={"follow": "true", "instance_id": second}) as response:
        reader = SseReader(response)
        for iid in (first, second):
            created = await admin.post(f"/api/v2/admin/instances/{iid}/sessions", json={"argv": ["/bin/cat"]})
            assert created.status_code == 201, created.text
        with trio.fail_after(10):  # the hostd watch reports sessions within a poll
            got = await reader.until(lambda e: e.event == "session.created")
    assert got.data["data"]["instance_id"] == second

    snapshot = (await admin.get(EVENTS, params={"instance_id": first, "limit": "5000"})).json()["items"]
    kinds = {event["kind"] for event in snapshot}
    assert {"instance.state_changed", "operation.completed", "session.created"} <= kinds, kinds
    assert all(about(event, first) for event in snapshot)
    everything = (await admin.get(EVENTS, params={"limit": "5000"})).json()["items"]
    assert [e["id"] for e in everything if about(e, first)] == [e["id"] for e in snapshot]

    both = (await admin.get(EVENTS, params={"instance_id": first, "kind": "session.*"})).json()["items"]
    assert [e["kind"] for e in both] == ["session.created"] and both[0]["data"]["instance_id"] == first
    assert (await admin.get(EVENTS, params={"instance_id": "nobody"})).json()["items"] == []
    assert_problem(await admin.get(EVENTS, params={"instance_id": ""}), 422, "validation.failed")


async def test_controllers_on_one_database_share_event_ids(hostd: LiveHostd, tmp_path: Path, pg_url: str) -> None:
    """Two controllers on one PostgreSQL database: an event published at either reaches the
    followers of both under one id, and Last-Event-ID from one resumes at the other."""

    def config(name: str) -> ControllerConfig:
        return load_config(
            env=controller_env(tmp_path / name, hostd.socket_path, AIWG_DATABASE_URL=pg_url, AIWG_NOTIFY_POLL_S="0.5")
        )

    async with (
        serve_controller(config("a")) as one,
        serve_controller(config("b")) as two,
        one.client() as a,
        two.client() as b,
    ):
        params = {"follow": "true", "kind": "test.*"}
        async with a.stream("GET", EVENTS, params=params) as response:
            reader = SseReader(response)
            for n in range(3):
                two.state.events.publish("test.shared", None, {"n": n})
            at_one = [await reader.next() for _ in range(3)]
        assert [e.data["data"]["n"] for e in at_one] == [0, 1, 2]
        ids = [e.id or 0 for e in at_one]
        assert ids == list(range(ids[0], ids[0] + 3))

        # Resumed at the other controller: the same events under the same ids.
        headers = {"Last-Event-ID": str(ids[0])}
        async with b.stream("GET", EVENTS, params=params, headers=headers) as response:
            reader = SseReader(response)
            at_two = [await reader.next() for _ in range(2)]
        assert [(e.id, e.data) for e in at_two] == [(e.id, e.data) for e in at_one[1:]]

        # An id handed out at one a moment ago resumes at the other.
        one.state.events.publish("test.shared", None, {"n": 3})
        with trio.fail_after(10):
            while one.state.events.ring.last_seq <= ids[-1]:
                await trio.sleep(0.01)
        newest = one.state.events.ring.last_seq
        one.state.events.publish("test.shared", None, {"n": 4})
        headers = {"Last-Event-ID": str(newest)}
        async with b.stream("GET", EVENTS, params=params, headers=headers) as response:
            got = await SseReader(response).next()
        assert got.data["data"]["n"] == 4 and got.id == newest + 1
        snapshot = (await b.get(EVENTS, params={"kind": "test.*"})).json()
        assert [item["data"]["n"] for item in snapshot["items"]] == [0, 1, 2, 3, 4]
