"""Push delivery by several controllers on one real PostgreSQL database, with real webhook receivers.

Each controller here is the part of one that push delivery lives among, in this process: its own
pool on the database (``Store.connect``), its task service (its hub, and its lease loop renewing
every claim in the controller's id), the other controllers' news (:class:`Cluster`: the
database's notifications and polls) and its push service, started the way the app starts them. No
hostd: the task's events are written by a third connection, as the controller running the task
would. A controller is killed by closing its pool and cancelling its nursery in one step: it writes
nothing more and releases no claim, as after SIGKILL.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import trio
from prometheus_client import CollectorRegistry

from agentic_sandbox.controller.auth.credentials import InstanceCredentials
from agentic_sandbox.controller.auth.tokens import Authenticator
from agentic_sandbox.controller.cluster import Cluster
from agentic_sandbox.controller.config import ControllerConfig, load_config
from agentic_sandbox.controller.events.bus import EventBus
from agentic_sandbox.controller.hostlink import HostdLink
from agentic_sandbox.controller.loadouts.service import LoadoutService
from agentic_sandbox.controller.push import PushConfigIn, PushService
from agentic_sandbox.controller.push.delivery import FLUSH_EVENTS
from agentic_sandbox.controller.store import Append, Store
from agentic_sandbox.controller.tasks import TaskService
from agentic_sandbox.controller.tasks.agentlogs import TaskLogs
from agentic_sandbox.controller.tasks.files import TaskFiles
from agentic_sandbox.proto import new_id
from tests.controller.conftest import controller_env
from tests.controller.store.records import task
from tests.controller.store.test_push import claim_of

from .conftest import PUSH_ENV
from .receiver import Receiver

#: Short claims: a takeover within a test's patience (the default is 2 s).
TTL_S = 0.3
END = "TASK_STATE_COMPLETED"


@dataclass
class Node:
    """One controller (see the module docstring)."""

    store: Store
    push: PushService
    registry: CollectorRegistry
    scope: trio.CancelScope
    done: trio.Event = field(default_factory=trio.Event)

    @property
    def owner(self) -> str:
        return self.push.delivery.owner

    def delivered(self, instance_id: str) -> float:
        return self.registry.get_sample_value("aiwg_push_deliveries_total", {"instance": instance_id}) or 0.0

    async def kill(self) -> None:
        """As SIGKILL: no write after this step, no claim released."""
        self.store.close()
        self.scope.cancel()
        await self.done.wait()


async def serve_node(
    config: ControllerConfig, state_dir: Path, *, task_status: trio.TaskStatus[Node] = trio.TASK_STATUS_IGNORED
) -> None:
    assert config.database_url is not None
    store = Store.connect(config.database_url)
    events = EventBus(store=store)
    # Never run: no task here starts an agent.
    link = HostdLink(config.hostd_socket, call_timeout_s=1, connect_timeout_s=1, ping_interval_s=1, reconnect_max_s=1)
    tasks = TaskService(
        store,
        link,
        LoadoutService(state_dir / "loadouts"),
        events,
        files=TaskFiles(state_dir / "files"),
        logs=TaskLogs(state_dir / "logs", 1024),
        owner=new_id(),
        lease_ttl_s=config.lease_ttl_s,
    )
    credentials = InstanceCredentials(store, Authenticator([]))
    cluster = Cluster(
        config.database_url,
        tasks=tasks,
        events=events,
        credentials=credentials,
        poll_s=config.notify_poll_s,
        connect_timeout_s=5,
    )
    registry = CollectorRegistry()
    push = PushService(store, tasks.hub, config, registry, owner=tasks.owner, lease_ttl_s=config.lease_ttl_s)
    node = Node(store, push, registry, trio.CancelScope())
    try:
        with node.scope:
            async with trio.open_nursery() as nursery:
                await nursery.start(cluster.run)
                await nursery.start(tasks.run_leases)
                push.delivery.attach(nursery)
                await push.delivery.recover()
                await nursery.start(push.delivery.run_sweeps)
                task_status.started(node)
                await trio.sleep_forever()
    finally:
        push.delivery.close()
        store.close()
        node.done.set()


@asynccontextmanager
async def controllers(pg_url: str, tmp_path: Path, count: int) -> AsyncIterator[list[Node]]:
    env = controller_env(
        tmp_path / "state",
        str(tmp_path / "no-hostd.sock"),
        **PUSH_ENV,
        AIWG_DATABASE_URL=pg_url,
        AIWG_LEASE_TTL_S=str(TTL_S),
        AIWG_NOTIFY_POLL_S="0.5",
    )
    config = load_config(env=env)
    async with trio.open_nursery() as nursery:
        nodes: list[Node] = []
        for i in range(count):
            nodes.append(await nursery.start(serve_node, config, tmp_path / f"c{i}"))
        try:
            yield nodes
        finally:
            for node in nodes:
                node.scope.cancel()  # a clean stop: the lease loop releases the claims


@asynccontextmanager
async def writer_of(pg_url: str) -> AsyncIterator[Store]:
    """The connection of the controller that runs the tasks: it writes their events."""
    store = Store.connect(pg_url)
    try:
        yield store
    finally:
        store.close()


async def new_task(writer: Store, task_id: str, instance_id: str) -> None:
    """A running task, claimed for an hour by a controller that is not among the nodes (so none of
    their lease loops adopts it)."""
    now = time.time()
    first = Append(kind="message", body={"messageId": new_id(), "role": "ROLE_USER", "parts": [{"text": "go"}]})
    rec = task(task_id, now, {"state": "TASK_STATE_WORKING"}, instance_id=instance_id)
    await writer.tasks.create(rec, first, owner="runner", until=now + 3600)


async def output(writer: Store, task_id: str, n: int) -> None:
    """Artifact update number ``n`` (the task's event ``n + 1``: its first is the message)."""
    body: dict[str, Any] = {
        "taskId": task_id,
        "contextId": "c1",
        "artifact": {"artifactId": "out", "parts": [{"text": str(n)}]},
        "append": n > 1,
    }
    await writer.tasks.append(task_id, Append(kind="artifact", body=body), time.time())


async def finish(writer: Store, task_id: str) -> None:
    status = {"state": END}
    body = {"taskId": task_id, "contextId": "c1", "status": dict(status)}
    await writer.tasks.append(task_id, Append(kind="status", body=body, status=status), time.time())


async def counted(nodes: list[Node], instance_id: str, total: int) -> list[float]:
    """Each node's deliveries counted for the instance, once they add up to ``total`` (a delivery
    is counted when its answer is read, after the receiver recorded it)."""
    with trio.fail_after(10):
        while sum(counts := [node.delivered(instance_id) for node in nodes]) < total:
            await trio.sleep(0.01)
    return counts


def numbers(receiver: Receiver) -> list[int]:
    """The artifact updates the receiver got, by number, in the order they came."""
    return [
        int(r.body["artifactUpdate"]["artifact"]["parts"][0]["text"])
        for r in receiver.received
        if "artifactUpdate" in r.body
    ]


async def make_config(node: Node, task_id: str, instance_id: str, receiver: Receiver, config_id: str = "p1") -> None:
    cfg = PushConfigIn(url=receiver.url, id=config_id)
    await node.push.create(instance_id, task_id, cfg, from_seq=1, extensions=[])


async def owner_of(nodes: list[Node], writer: Store, task_id: str, config_id: str = "p1") -> tuple[Node, Node]:
    """The node holding the config's claim now, and the other one."""
    owner, _ = await claim_of(writer, task_id, config_id)
    [holder] = [node for node in nodes if node.owner == owner]
    [other] = [node for node in nodes if node is not holder]
    return holder, other


async def delivering_a_backlog(nodes: list[Node], writer: Store, receiver: Receiver) -> tuple[Node, Node]:
    """Task t1 with config p1 (made at the first node) and 40 events to deliver, 5 delivered:
    (the node delivering it, the other)."""
    await new_task(writer, "t1", "i1")
    await make_config(nodes[0], "t1", "i1", receiver)
    for n in range(1, 41):
        await output(writer, "t1", n)
    await receiver.wait_for(lambda: len(receiver.received) >= 5)
    return await owner_of(nodes, writer, "t1")


async def test_each_config_is_delivered_by_one_controller_exactly_once_in_order(pg_url: str, tmp_path: Path) -> None:
    """Four configs, two made at each controller, both sweeping: every event reaches each receiver
    once, in order, one request at a time, all of a config's from one controller, an idle spell
    four claims long included (the task service's lease loop renews the push claims too)."""
    count = 30
    receivers = [Receiver(delay_s=0.005, keep_alive=True) for _ in range(4)]
    async with trio.open_nursery() as nursery, writer_of(pg_url) as writer:
        for receiver in receivers:
            await nursery.start(receiver.serve)
        async with controllers(pg_url, tmp_path, 2) as nodes:
            for i, receiver in enumerate(receivers):
                await new_task(writer, f"t{i}", f"i{i}")
                await make_config(nodes[i % 2], f"t{i}", f"i{i}", receiver)
            for n in range(1, count + 1):
                for i in range(len(receivers)):
                    await output(writer, f"t{i}", n)
                await trio.sleep(4 * TTL_S if n == count // 2 else 0.01)
            for i in range(len(receivers)):
                await finish(writer, f"t{i}")
            for receiver in receivers:
                await receiver.wait_for(lambda r=receiver: END in r.states())
            for i, receiver in enumerate(receivers):
                assert numbers(receiver) == list(range(1, count + 1)), i
                assert receiver.states() == [END]
                assert receiver.most_in_flight == 1
                assert sorted(await counted(nodes, f"i{i}", count + 1)) == [0, count + 1], i
        nursery.cancel_scope.cancel()


async def test_a_killed_controllers_config_is_resumed_by_another_in_order(pg_url: str, tmp_path: Path) -> None:
    """The controller delivering a backlog is killed: within about a claim's TTL the other one
    delivers the rest from the stored cursor. What the receiver gets is the killed one's
    deliveries 1..k (k: the last it POSTed, answered or in flight), then the survivor's m+1..end,
    where m is the cursor the killed one wrote last: nothing is lost (m <= k) and the only events
    sent twice are m+1..k, those the killed one POSTed after its last cursor write (fewer than
    FLUSH_EVENTS, plus the one in flight). Never both at once."""
    count = 80
    receiver = Receiver(delay_s=0.02, keep_alive=True)
    async with trio.open_nursery() as nursery, writer_of(pg_url) as writer:
        await nursery.start(receiver.serve)
        async with controllers(pg_url, tmp_path, 2) as nodes:
            await new_task(writer, "t1", "i1")
            await make_config(nodes[0], "t1", "i1", receiver)
            for n in range(1, count + 1):
                await output(writer, "t1", n)
            await finish(writer, "t1")
            # Past the first cursor write (every FLUSH_EVENTS events while a backlog is worked off).
            await receiver.wait_for(lambda: len(receiver.received) >= FLUSH_EVENTS + 8)
            victim, survivor = await owner_of(nodes, writer, "t1")
            await victim.kill()
            killed_at = trio.current_time()
            posted = numbers(receiver)
            k = len(posted)
            stored = await writer.push.get("t1", "p1")
            assert stored is not None
            m = stored.delivered_seq - 1
            await receiver.wait_for(lambda: len(receiver.received) > k)
            assert trio.current_time() - killed_at < TTL_S + 1.5  # the takeover
            await receiver.wait_for(lambda: END in receiver.states())
            got = numbers(receiver)
            assert got[:k] == list(range(1, k + 1))
            assert FLUSH_EVENTS <= m <= k and k - m <= FLUSH_EVENTS, (m, k)
            assert got[k:] == list(range(m + 1, count + 1))
            assert receiver.states() == [END]
            assert receiver.most_in_flight == 1
            assert await counted([survivor], "i1", count - m + 1) == [count - m + 1]
        nursery.cancel_scope.cancel()


async def test_a_config_deleted_at_one_controller_is_no_longer_delivered_by_the_other(
    pg_url: str, tmp_path: Path
) -> None:
    """Deleted at the controller that does not deliver it, mid-backlog: the one delivering stops at
    its next check (at most the attempt it had started gets through), and no sweep brings it back."""
    receiver = Receiver(delay_s=0.02, keep_alive=True)
    async with trio.open_nursery() as nursery, writer_of(pg_url) as writer:
        await nursery.start(receiver.serve)
        async with controllers(pg_url, tmp_path, 2) as nodes:
            deliverer, other = await delivering_a_backlog(nodes, writer, receiver)
            await other.push.delete("t1", "p1")
            seen = len(receiver.received)
            for n in range(41, 51):
                await output(writer, "t1", n)
            await finish(writer, "t1")
            with trio.fail_after(5):
                while deliverer.push.delivery.delivering():
                    await trio.sleep(0.01)
            await trio.sleep(4 * TTL_S)  # sweeps on both meanwhile
            assert len(receiver.received) <= seen + 1
            assert numbers(receiver) == list(range(1, len(receiver.received) + 1))
            assert deliverer.push.delivery.delivering() == other.push.delivery.delivering() == []
        nursery.cancel_scope.cancel()


async def test_a_config_replaced_at_another_controller_goes_to_its_new_url(pg_url: str, tmp_path: Path) -> None:
    """Replaced (same id, a new URL) at the controller that does not deliver it: the old one stops
    at its next check, and the new config gets every event after the one it was made at, once."""
    old, new = Receiver(delay_s=0.02, keep_alive=True), Receiver(keep_alive=True)
    async with trio.open_nursery() as nursery, writer_of(pg_url) as writer:
        await nursery.start(old.serve)
        await nursery.start(new.serve)
        async with controllers(pg_url, tmp_path, 2) as nodes:
            _, other = await delivering_a_backlog(nodes, writer, old)
            task_row = await writer.tasks.get("t1")
            assert task_row is not None
            cfg = PushConfigIn(url=new.url, id="p1")
            await other.push.create("i1", "t1", cfg, from_seq=task_row.last_seq, extensions=[])
            seen = len(old.received)
            for n in range(41, 51):
                await output(writer, "t1", n)
            await finish(writer, "t1")
            await new.wait_for(lambda: END in new.states())
            assert numbers(new) == list(range(41, 51)) and new.states() == [END]
            assert len(old.received) <= seen + 1
            assert numbers(old) == list(range(1, len(old.received) + 1))
        nursery.cancel_scope.cancel()
