"""A2A push delivery: latency from task event to webhook (p50/p99) and deliveries/s with 8 webhooks.

Starts its own hostd and ``python -m controller.main`` (``AIWG_PUSH_ALLOW_PRIVATE=1``) in a temp
dir, provisions a ``shell`` instance and runs small HTTP/1.1 webhook receivers in this process:

* Latency: a task prints ``date +%s%N`` ``--events`` times with an inline push config; each
  artifact update's arrival at the receiver minus the time the process printed it (so hostd,
  the controller's store and the push worker are all in it).
* Throughput: ``--webhooks`` such tasks at once, each with its own receiver: deliveries (status
  and artifact updates) per second from the first send to the last arrival.
* Baseline: a bare POST of the same kind of body from this process to the same receivers (the
  controller's own sender, a new connection per POST as delivery makes): POST -> arrival latency,
  and POSTs/s from as many concurrent posters.
"""

from __future__ import annotations

import os
import sys
import time
import uuid

import h11
import httpx
import msgspec
import trio
from bench_a2a import admin_provision_loadout, agent_client
from bench_admin import Controller, admin_client, wait_ready
from common import Report, Result, compare, emit, latency_result, parser, print_versions, running_hostd, temp_dir

from controller.push.sender import post
from controller.push.target import Target, parse_url

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
        body = b""
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                data = await stream.receive_some(65536)
                if not data:
                    return
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
        await stream.aclose()

    def printed_latencies(self) -> list[int]:
        out = []
        for at, got in self.arrivals:
            artifact = got.get("artifactUpdate")
            if not isinstance(artifact, dict) or artifact["artifact"]["artifactId"] != "stdout":
                continue
            for part in artifact["artifact"]["parts"]:
                out += [at - int(line) for line in part.get("text", "").split() if line.isdigit()]
        return out


def script(events: int) -> str:
    return f"for i in $(seq {events}); do date +%s%N; sleep 0.002; done"


async def push_task(client: httpx.AsyncClient, receiver: Receiver, events: int) -> None:
    config = {
        "taskPushNotificationConfig": {"url": f"http://127.0.0.1:{receiver.port}/hook"},
        "returnImmediately": True,
    }
    message = {"messageId": str(uuid.uuid4()), "role": "ROLE_USER", "parts": [{"text": script(events)}]}
    response = await client.post("/message:send", json={"message": message, "configuration": config})
    if response.status_code != 200:
        raise RuntimeError(f"message:send: {response.status_code} {response.text[:300]}")
    with trio.fail_after(120):
        await receiver.done.wait()


async def bare_posts(receiver: Receiver, count: int) -> list[int]:
    target = Target(parse_url(f"http://127.0.0.1:{receiver.port}/hook"), "127.0.0.1")
    headers = [("Content-Type", "application/a2a+json")]
    samples = []
    for _ in range(count):
        before = len(receiver.arrivals)
        sent = time.time_ns()
        body = msgspec.json.encode({"statusUpdate": {"taskId": "t", "contextId": "c", "status": {"state": "x"}}})
        await post(target, body, headers, timeout=10)
        samples.append(receiver.arrivals[before][0] - sent)
    return samples


async def measure(ctl: Controller, events: int, webhooks: int) -> list[Result]:
    async with admin_client(ctl.url, ctl.token) as admin:
        await wait_ready(admin)
        shell_id = await admin_provision_loadout(admin, "bench-push", "shell")
    async with trio.open_nursery() as nursery, agent_client(ctl.url, shell_id, ctl.token) as client:
        one = Receiver()
        await nursery.start(one.serve)
        await push_task(client, one, events)
        push1 = latency_result("push: task output -> webhook, 1 webhook", one.printed_latencies(), unit="events/s")
        base = Receiver()
        await nursery.start(base.serve)
        bare1 = latency_result("bare POST from this process, 1 poster", await bare_posts(base, events), unit="POSTs/s")

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
        pushN = latency_result(f"push: task output -> webhook, {webhooks} webhooks", samples, unit="deliveries/s")
        pushN.throughput = deliveries / wall
        posters = [Receiver() for _ in range(webhooks)]
        for r in posters:
            await nursery.start(r.serve)
        bare: list[int] = []
        start = time.monotonic()
        async with trio.open_nursery() as tasks:
            for r in posters:
                tasks.start_soon(lambda r=r: _collect(bare, r, events))
        bareN = latency_result(f"bare POST from this process, {webhooks} posters", bare, unit="POSTs/s")
        bareN.throughput = len(bare) / (time.monotonic() - start)
        nursery.cancel_scope.cancel()
    return [
        compare(push1, bare1, "p50"),
        bare1,
        compare(pushN, bareN, "throughput"),
        bareN,
    ]


async def _collect(into: list[int], receiver: Receiver, count: int) -> None:
    into += await bare_posts(receiver, count)


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
            results = trio.run(measure, ctl, args.events, args.webhooks)
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
            "latency rows: vs. = p50 / the bare POST's p50; the webhooks row: vs. = deliveries/s / bare POSTs/s",
            "each task's events are delivered in order, one at a time per webhook (the store is the queue)",
        ],
    )
    emit(report, as_json=args.json)


if __name__ == "__main__":
    main()
