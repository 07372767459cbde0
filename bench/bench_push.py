"""A2A push delivery: latency from task event to webhook (p50/p99) and deliveries/s with 8 webhooks.

Starts its own hostd and ``python -m controller.main`` (``AIWG_PUSH_ALLOW_PRIVATE=1``) in a temp
dir, provisions a ``shell`` instance and runs small HTTP/1.1 webhook receivers in this process:

* Latency: a task prints ``date +%s%N`` ``--events`` times with an inline push config; each
  artifact update's arrival at the receiver minus the time the process printed it (so hostd,
  the controller's store and the push worker are all in it).
* Throughput: ``--webhooks`` such tasks at once, each with its own receiver: deliveries (status
  and artifact updates) per second from the first send to the last arrival.
* Delivery alone: the same arrivals minus the time the controller stored each event (the
  ``kagent.dev/a2a/timeline-position`` it stamps on every artifact, the ``timestamp`` of every
  status), so hostd, the agent and the controller's intake are out of it; with 8 tasks at once
  those dominate the rows above (the tasks' own processes share the cores with everything).
* Fan-out: ``--webhooks`` configs on one task (one producer, every event delivered that many
  times), deliveries/s and stored -> webhook latency.
* Baseline: a bare POST of the same kind of body from this process to the same kind of receivers
  (the controller's own sender code, a new connection per POST, as delivery made before it kept
  connections alive): POST -> arrival latency, and POSTs/s from as many concurrent posters. Also
  shown: the same over one kept-alive connection per poster (what delivery does now), the floor.

The receivers answer 204 and keep connections alive, as HTTP/1.1 servers do.
"""

from __future__ import annotations

import datetime
import os
import sys
import time
import uuid
from collections.abc import Sequence
from pathlib import Path

import h11
import httpx
import msgspec
import trio
from bench_a2a import admin_provision_loadout, agent_client
from bench_admin import Controller, admin_client, wait_ready
from common import Report, Result, compare, emit, latency_result, parser, print_versions, running_hostd, temp_dir

from agentic_sandbox.controller.push.sender import Sender, post
from agentic_sandbox.controller.push.target import Target, parse_url

END_STATES = ("TASK_STATE_COMPLETED", "TASK_STATE_FAILED", "TASK_STATE_CANCELED")


class Receiver:
    def __init__(self) -> None:
        self.port = 0
        self.arrivals: list[tuple[int, dict[str, object]]] = []
        self.done = trio.Event()

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        self.port = listeners[0].socket.getsockname()[1]
        task_status.started()
        await trio.serve_listeners(self._handle, listeners)

    async def _handle(self, stream: trio.SocketStream) -> None:
        conn = h11.Connection(h11.SERVER)
        try:
            while await self._answer(stream, conn):
                conn.start_next_cycle()
        except (trio.BrokenResourceError, h11.ProtocolError):
            pass
        finally:
            await stream.aclose()

    async def _answer(self, stream: trio.SocketStream, conn: h11.Connection) -> bool:
        body = b""
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                data = await stream.receive_some(65536)
                if not data:
                    return False
                conn.receive_data(data)
            elif isinstance(event, h11.Data):
                body += event.data
            elif isinstance(event, h11.EndOfMessage):
                break
        got = msgspec.json.decode(body)
        self.arrivals.append((time.time_ns(), got))
        state = got.get("statusUpdate", {}).get("status", {}).get("state")
        if state in END_STATES:
            self.done.set()
        with trio.move_on_after(5):
            await stream.send_all(conn.send(h11.Response(status_code=204, headers=[])) + conn.send(h11.EndOfMessage()))
        return True

    def stored_latencies(self) -> list[int]:
        """Arrival minus the time the controller stored the event (its timeline stamp)."""
        out = []
        for at, got in self.arrivals:
            update = got.get("artifactUpdate") or got.get("statusUpdate")
            if not isinstance(update, dict):
                continue
            if "artifact" in update:
                stamp = update["artifact"].get("metadata", {}).get("kagent.dev/a2a/timeline-position")
            else:
                stamp = update["status"].get("timestamp")
            if stamp:
                stored = datetime.datetime.fromisoformat(stamp.replace("Z", "+00:00"))
                out.append(at - int(stored.timestamp() * 1e6) * 1000)
        return out

    def printed_latencies(self) -> list[int]:
        out = []
        for at, got in self.arrivals:
            artifact = got.get("artifactUpdate")
            if not isinstance(artifact, dict) or artifact["artifact"]["artifactId"] != "stdout":
                continue
            for part in artifact["artifact"]["parts"]:
                out += [at - int(line) for line in part.get("text", "").split() if line.isdigit()]
        return out


def script(events: int, gate: Path | None = None) -> str:
    wait = f"while [ ! -e {gate} ]; do sleep 0.01; done; " if gate is not None else ""
    return f"{wait}for i in $(seq {events}); do date +%s%N; sleep 0.002; done"


async def push_task(
    client: httpx.AsyncClient,
    receiver: Receiver,
    events: int,
    *,
    more: Sequence[Receiver] = (),
    gate: Path | None = None,
) -> None:
    """A task with an inline config to ``receiver`` (and, before ``gate`` opens, configs to ``more``)."""
    config = {
        "taskPushNotificationConfig": {"url": f"http://127.0.0.1:{receiver.port}/hook"},
        "returnImmediately": True,
    }
    message = {"messageId": str(uuid.uuid4()), "role": "ROLE_USER", "parts": [{"text": script(events, gate)}]}
    response = await client.post("/message:send", json={"message": message, "configuration": config})
    if response.status_code != 200:
        raise RuntimeError(f"message:send: {response.status_code} {response.text[:300]}")
    task_id = response.json()["task"]["id"]
    for other in more:
        made = await client.post(
            f"/tasks/{task_id}/pushNotificationConfigs", json={"url": f"http://127.0.0.1:{other.port}/hook"}
        )
        if made.status_code != 200:
            raise RuntimeError(f"pushNotificationConfigs: {made.status_code} {made.text[:300]}")
    if gate is not None:
        gate.touch()
    with trio.fail_after(120):
        for r in (receiver, *more):
            await r.done.wait()


async def bare_posts(receiver: Receiver, count: int, *, keep_alive: bool) -> list[int]:
    """``count`` POSTs one after the other: a new connection each, or one kept-alive connection."""
    url = parse_url(f"http://127.0.0.1:{receiver.port}/hook")
    target = Target(url, "127.0.0.1")
    sender = Sender(allow_private=True, timeout=10)
    headers = [("Content-Type", "application/a2a+json")]
    samples = []
    for _ in range(count):
        before = len(receiver.arrivals)
        sent = time.time_ns()
        body = msgspec.json.encode({"statusUpdate": {"taskId": "t", "contextId": "c", "status": {"state": "x"}}})
        if keep_alive:
            await sender.post(url, body, headers)
        else:
            await post(target, body, headers, timeout=10)
        samples.append(receiver.arrivals[before][0] - sent)
    sender.close()
    return samples


async def bare_many(nursery: trio.Nursery, posters: int, events: int, *, keep_alive: bool, case: str) -> Result:
    receivers = [Receiver() for _ in range(posters)]
    for r in receivers:
        await nursery.start(r.serve)
    samples: list[int] = []

    async def one(r: Receiver) -> None:
        samples.extend(await bare_posts(r, events, keep_alive=keep_alive))

    start = time.monotonic()
    async with trio.open_nursery() as tasks:
        for r in receivers:
            tasks.start_soon(one, r)
    result = latency_result(case, samples, unit="POSTs/s")
    result.throughput = len(samples) / (time.monotonic() - start)
    return result


async def measure(ctl: Controller, events: int, webhooks: int, gate: Path) -> list[Result]:
    async with admin_client(ctl.url, ctl.token) as admin:
        await wait_ready(admin)
        shell_id = await admin_provision_loadout(admin, "bench-push", "shell")
    async with trio.open_nursery() as nursery, agent_client(ctl.url, shell_id, ctl.token) as client:
        one = Receiver()
        await nursery.start(one.serve)
        await push_task(client, one, events)
        push1 = latency_result("push: task output -> webhook, 1 webhook", one.printed_latencies(), unit="events/s")
        stored1 = latency_result("push: event stored -> webhook, 1 webhook", one.stored_latencies(), unit="events/s")
        base = Receiver()
        await nursery.start(base.serve)
        bare1 = latency_result(
            "bare POST from this process, 1 poster", await bare_posts(base, events, keep_alive=False), unit="POSTs/s"
        )
        kept1 = latency_result(
            "bare POST, kept-alive connection, 1 poster",
            await bare_posts(base, events, keep_alive=True),
            unit="POSTs/s",
        )

        many = [Receiver() for _ in range(webhooks)]
        for r in many:
            await nursery.start(r.serve)
        start = time.monotonic()
        async with trio.open_nursery() as tasks:
            for r in many:
                tasks.start_soon(push_task, client, r, events)
        wall = time.monotonic() - start
        samples = [s for r in many for s in r.printed_latencies()]
        deliveries = sum(len(r.arrivals) for r in many)
        pushN = latency_result(f"push: task output -> webhook, {webhooks} tasks", samples, unit="deliveries/s")
        pushN.throughput = deliveries / wall
        storedN = latency_result(
            f"push: event stored -> webhook, {webhooks} tasks",
            [s for r in many for s in r.stored_latencies()],
            unit="deliveries/s",
        )
        storedN.throughput = pushN.throughput

        fan = [Receiver() for _ in range(webhooks)]
        for r in fan:
            await nursery.start(r.serve)
        start = time.monotonic()
        await push_task(client, fan[0], events, more=fan[1:], gate=gate)
        fanN = latency_result(
            f"push: event stored -> webhook, {webhooks} webhooks on 1 task",
            [s for r in fan for s in r.stored_latencies()],
            unit="deliveries/s",
        )
        fanN.throughput = sum(len(r.arrivals) for r in fan) / (time.monotonic() - start)
        bareN = await bare_many(
            nursery, webhooks, events, keep_alive=False, case=f"bare POST from this process, {webhooks} posters"
        )
        keptN = await bare_many(
            nursery, webhooks, events, keep_alive=True, case=f"bare POST, kept-alive connections, {webhooks} posters"
        )
        nursery.cancel_scope.cancel()
    return [
        compare(push1, bare1, "p50"),
        compare(stored1, bare1, "p50"),
        bare1,
        compare(kept1, bare1, "p50"),
        compare(pushN, bareN, "throughput"),
        compare(storedN, bareN, "throughput"),
        compare(fanN, bareN, "throughput"),
        bareN,
        compare(keptN, bareN, "throughput"),
    ]


def main() -> None:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--events", type=int, default=200, help="outputs per task (default 200)")
    p.add_argument("--webhooks", type=int, default=8, help="concurrent webhooks (default 8)")
    args = p.parse_args()
    if args.versions:
        print_versions()
        return
    os.environ["AIWG_PUSH_ALLOW_PRIVATE"] = "1"  # the receivers are on loopback
    with running_hostd() as hostd, temp_dir("aiwg-bench-push-") as tmp:
        ctl = Controller(tmp / "state", hostd.socket_path)
        try:
            results = trio.run(measure, ctl, args.events, args.webhooks, tmp / "gate")
        except BaseException:
            print(ctl.log(), file=sys.stderr)
            raise
        finally:
            ctl.stop()
            from bench_admin import _destroy_leftovers

            trio.run(_destroy_leftovers, hostd.socket_path)
    report = Report(
        bench="push",
        title=__doc__.splitlines()[0],
        vs_of="p50",
        params={"events": args.events, "webhooks": args.webhooks},
        results=results,
        targets=[],
        notes=[
            "latency rows: vs. = p50 / the bare POST's p50; the 8-webhook rows: vs. = deliveries/s / bare POSTs/s",
            "each task's events are delivered in order, one at a time per webhook (the store is the queue)",
            "the kept-alive rows are the floor for delivery: the same POSTs without the task, the store or the worker",
        ],
    )
    emit(report, as_json=args.json)


if __name__ == "__main__":
    main()
