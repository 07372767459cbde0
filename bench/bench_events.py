"""Event bus: publish cost, and SSE fan-out from publish to every follower over real HTTP.

Rows:

* ``publish (ring)``: ``EventBus.publish`` of a small event (encode once, append to the bounded
  ring, wake the readers), with ``--followers`` readers attached; baseline ``publish (queue per
  follower)``: the design the bus avoids, encoding once then ``send_nowait`` into one bounded trio
  memory channel per follower, for the same event (the cost grows with the followers; the ring's
  does not).
* ``SSE to N followers``: from ``publish`` until all ``--followers`` httpx clients following
  ``/api/v2/admin/events?follow=true`` have parsed the event (the controller served by hypercorn in
  this process, a real hostd behind it); baseline ``SSE to 1 follower``.

The controller and hostd are started for the run and stopped after it.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from functools import partial
from pathlib import Path

import httpx
import msgspec
import trio
from common import (
    Report,
    Result,
    compare,
    emit,
    latency_result,
    parser,
    print_versions,
    running_hostd,
    temp_dir,
)
from hypercorn.trio import serve

from agentic_sandbox.controller.app import create_app
from agentic_sandbox.controller.config import load_config
from agentic_sandbox.controller.events.bus import Event, EventBus
from agentic_sandbox.controller.main import hypercorn_config
from agentic_sandbox.controller.models import iso
from agentic_sandbox.controller.ulid import new_ulid

TOKEN = "bench-admin-token-" + "b" * 20


def measure_publish(n: int, followers: int) -> tuple[Result, Result]:
    bus = EventBus(4096)
    samples = []
    for i in range(n):
        start = time.perf_counter_ns()
        bus.publish("bench.tick", "bench/1", {"n": i})
        samples.append(time.perf_counter_ns() - start)
    ring = latency_result("publish (ring)", samples, followers=followers)

    channels = [trio.open_memory_channel[bytes](1024) for _ in range(followers)]
    samples = []
    for i in range(n):
        start = time.perf_counter_ns()
        # The same event as publish() makes (id, timestamp), so only the fan-out design differs.
        event = Event(
            id="ev_" + new_ulid(), kind="bench.tick", timestamp=iso(time.time()), subject="bench/1", data={"n": i}
        )
        frame = msgspec.json.encode(event)
        for send, _receive in channels:
            try:
                send.send_nowait(frame)
            except trio.WouldBlock:
                pass  # a full queue drops, as a bounded broker must
        samples.append(time.perf_counter_ns() - start)
        if i % 1000 == 999:
            for _send, receive in channels:  # drained out of the clock, like readers would
                while True:
                    try:
                        receive.receive_nowait()
                    except trio.WouldBlock:
                        break
    queue = latency_result("publish (queue per follower)", samples, followers=followers)
    return compare(ring, queue, "p50"), queue


async def _fan_out(url: str, bus: EventBus, followers: int, n: int, warmup: int) -> Result:
    got = [0] * (n + warmup)
    done = [trio.Event() for _ in range(n + warmup)]
    connected = trio.Semaphore(0)

    async def follow(client: httpx.AsyncClient) -> None:
        async with client.stream("GET", "/api/v2/admin/events", params={"follow": "true", "kind": "bench.*"}) as r:
            connected.release()
            async for line in r.aiter_lines():
                if line.startswith("data: "):
                    i = json.loads(line[6:])["data"]["n"]
                    got[i] += 1
                    if got[i] == followers:
                        done[i].set()

    samples = []
    headers = {"Authorization": f"Bearer {TOKEN}"}
    clients = [httpx.AsyncClient(base_url=url, headers=headers, timeout=30) for _ in range(followers)]
    try:
        async with trio.open_nursery() as nursery:
            for client in clients:
                nursery.start_soon(follow, client)
            for _ in clients:
                await connected.acquire()
            await trio.sleep(0.2)  # every generator started (the route answers before its first read)
            for i in range(n + warmup):
                start = time.perf_counter_ns()
                bus.publish("bench.tick", "bench/1", {"n": i})
                with trio.fail_after(30):
                    await done[i].wait()
                if i >= warmup:
                    samples.append(time.perf_counter_ns() - start)
            nursery.cancel_scope.cancel()
    finally:
        for client in clients:
            await client.aclose()
    return latency_result(f"SSE to {followers} follower{'s' if followers != 1 else ''}", samples, unit="events/s")


async def measure_sse(state_dir: Path, hostd_socket: Path, args: argparse.Namespace) -> list[Result]:
    env = {
        "AIWG_STATE_DIR": str(state_dir),
        "AIWG_HOSTD_SOCKET": str(hostd_socket),
        "AIWG_LISTEN": "127.0.0.1:0",
        "AIWG_ADMIN_TOKEN": TOKEN,
        "AIWG_MAX_STREAM_FOLLOWERS": str(max(args.followers, 1) + 1),
        "AIWG_WATCH_INTERVAL_S": "60",
    }
    config = load_config(env=env)
    app = create_app(config)
    stop = trio.Event()
    async with trio.open_nursery() as nursery:
        binds = await nursery.start(
            partial(serve, app, hypercorn_config(config, graceful_timeout_s=1), shutdown_trigger=stop.wait)
        )
        bus: EventBus = app.extensions["aiwg"].events
        one = await _fan_out(binds[0], bus, 1, args.events, args.warmup)
        many = await _fan_out(binds[0], bus, args.followers, args.events, args.warmup)
        stop.set()
    return [compare(many, one, "p50"), one]


def main() -> None:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--publishes", type=int, default=20000, help="measured publishes per publish row (default 20000)")
    p.add_argument("--events", type=int, default=300, help="measured events per SSE row (default 300)")
    p.add_argument("--warmup", type=int, default=20, help="unmeasured events before each SSE row")
    p.add_argument("--followers", type=int, default=16, help="followers (default 16)")
    args = p.parse_args()
    if args.versions:
        print_versions()
        return
    results = list(measure_publish(args.publishes, args.followers))
    with running_hostd() as hostd, temp_dir("aiwg-bench-events-") as tmp:
        results += trio.run(measure_sse, tmp / "state", hostd.socket_path, args)
    report = Report(
        bench="bench_events",
        title="event bus publish and SSE fan-out",
        vs_of="p50",
        params={
            "publishes": args.publishes,
            "events": args.events,
            "followers": args.followers,
            "cpus": os.cpu_count(),
        },
        results=results,
        targets=[],
        notes=["issue 7 sets no figure: no target verdict"],
    )
    emit(report, as_json=args.json)


if __name__ == "__main__":
    main()
