"""One task's SSE stream to many watchers: last-watcher latency and controller CPU per delivery.

``measure(watchers)`` starts a hostd and a controller (``python -m agentic_sandbox.controller.main``,
its own process) in a temp dir, provisions a host instance on the ``shell`` loadout and starts one
A2A task (JSON-RPC ``SendMessage``, ``returnImmediately``) whose script waits for a go file, then
prints ``fanout-<i>.`` every ``interval_s`` ``events`` times. ``watchers`` SSE streams follow the
task (JSON-RPC ``SubscribeToTask`` by default, or the REST ``/v1/tasks/<id>/subscribe``), opened
before the go file appears, each a raw socket read by a lean selector loop in one of ``clients``
child processes (so their CPU is not the controller's, and they are not the bottleneck). Figures:

* latency of an event: from the time the controller stored it (``task_events.at``, read from the
  SQLite file after the run) to its arrival at the LAST watcher; p50 and p99 over the events;
* controller CPU per delivered event: the controller's on-CPU time (``/proc/PID/task/*/schedstat``)
  from the go file to the last watcher's end, over the artifact updates delivered (all watchers);
  with one watcher it is mostly the cost of running the task and storing its events;
* delivered and lost updates (``watchers * events`` minus those delivered), updates delivered twice
  or out of order (``misordered``; both must be 0).

``bench/bench_growth.py`` imports :func:`measure`; keep its signature.
"""

from __future__ import annotations

import json
import os
import re
import selectors
import socket
import sqlite3
import subprocess
import sys
import textwrap
import time
import uuid
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any, Literal

import httpx
import msgspec
import trio
from bench_a2a import on_cpu_ns
from bench_admin import Controller, admin_client, admin_provision_by_op, wait_ready
from common import (
    ROOT,
    Report,
    Result,
    Target,
    compare,
    emit,
    parser,
    percentile,
    print_versions,
    running_hostd,
    temp_dir,
)

Binding = Literal["jsonrpc", "rest", "bare"]
RUNTIME_EXTENSION = "https://agentic-sandbox.aiwg.io/extensions/runtime/v1"
MARK = re.compile(rb"fanout-(\d+)\.")
END = b"TASK_STATE_COMPLETED"
#: Watchers connected at once while the streams open (hypercorn's listen backlog is 100).
CONNECT_WAVE = 50


class FanoutResult(msgspec.Struct, kw_only=True):
    watchers: int
    events: int
    #: From the event's store time to its arrival at the last watcher, seconds.
    p50_s: float
    p99_s: float
    max_s: float
    #: Controller on-CPU time per delivered artifact update, microseconds.
    cpu_us_per_event: float
    delivered: int
    lost: int
    misordered: int
    #: From the go file to the last watcher's end.
    wall_s: float
    #: The watcher processes' CPU over the same time, seconds (all of them).
    client_cpu_s: float = 0.0
    binding: str = "jsonrpc"


# ---------------------------------------------------------------------------------------------
# The client side: a child process holding a share of the watchers


def _request(binding: Binding, host: str, instance_id: str, task_id: str, token: str) -> bytes:
    head = (
        f"Host: {host}\r\nAuthorization: Bearer {token}\r\nA2A-Version: 1.0\r\n"
        f"A2A-Extensions: {RUNTIME_EXTENSION}\r\nAccept: text/event-stream\r\n"
    )
    if binding == "bare":
        return f"GET /sse HTTP/1.1\r\n{head}\r\n".encode()
    if binding == "rest":
        return f"GET /agents/{instance_id}/v1/tasks/{task_id}/subscribe HTTP/1.1\r\n{head}\r\n".encode()
    body = json.dumps(
        {"jsonrpc": "2.0", "id": str(uuid.uuid4()), "method": "SubscribeToTask", "params": {"id": task_id}}
    ).encode()
    return (
        f"POST /agents/{instance_id} HTTP/1.1\r\n{head}Content-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode() + body


class _Watcher:
    __slots__ = ("buf", "done", "last", "misordered", "opened", "seen", "sock")

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buf = b""
        self.opened = False  # the Task (the stream's first item) arrived
        self.done = False
        self.last = 0
        self.seen = 0
        self.misordered = 0


def worker(
    url: str, instance_id: str, task_id: str, token: str, count: int, binding: Binding, timeout_s: float
) -> None:
    """Open ``count`` streams, say ``ready`` once each has its Task, then read until every one has
    the terminal status; print one JSON line: per update, how many got it and the latest arrival."""
    host = url.removeprefix("http://")
    addr, port = host.rsplit(":", 1)
    request = _request(binding, host, instance_id, task_id, token)
    sel = selectors.DefaultSelector()
    watchers: list[_Watcher] = []
    arrivals: dict[int, list[float]] = {}  # update -> [count, last arrival]

    def feed(w: _Watcher, data: bytes) -> None:
        now = time.time()
        buf = w.buf + data
        cut = buf.rfind(b"\n\n")
        if cut < 0:
            w.buf = buf
            return
        whole, w.buf = buf[: cut + 2], buf[cut + 2 :]
        if not w.opened and b"data: " in whole:
            w.opened = True
        for match in MARK.finditer(whole):
            i = int(match.group(1))
            if i <= w.last:
                w.misordered += 1
                continue
            w.last = i
            w.seen += 1
            slot = arrivals.get(i)
            if slot is None:
                arrivals[i] = [1, now]
            else:
                slot[0] += 1
                slot[1] = now
        if END in whole:
            w.done = True

    def pump(deadline: float, until: str) -> None:
        while time.monotonic() < deadline:
            if until == "open" and all(w.opened for w in watchers):
                return
            if until == "done" and all(w.done for w in watchers):
                return
            for key, _ in sel.select(0.5):
                w: _Watcher = key.data
                try:
                    data = w.sock.recv(262144)
                except BlockingIOError:
                    continue
                except OSError:
                    data = b""
                if not data:
                    sel.unregister(w.sock)
                    w.done = True
                    continue
                feed(w, data)

    start = time.monotonic()
    while len(watchers) < count:
        for _ in range(min(CONNECT_WAVE, count - len(watchers))):
            sock = socket.create_connection((addr, int(port)))
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            sock.sendall(request)
            sock.setblocking(False)
            w = _Watcher(sock)
            watchers.append(w)
            sel.register(sock, selectors.EVENT_READ, w)
        pump(start + timeout_s, "open")
    print("ready", flush=True)
    sys.stdin.readline()  # "go"
    cpu0 = time.process_time()
    pump(time.monotonic() + timeout_s, "done")
    out = {
        "arrivals": arrivals,
        "seen": sum(w.seen for w in watchers),
        "misordered": sum(w.misordered for w in watchers),
        "unfinished": sum(not w.done for w in watchers),
        "cpu_s": time.process_time() - cpu0,
    }
    print(json.dumps(out), flush=True)
    for w in watchers:
        w.sock.close()


# ---------------------------------------------------------------------------------------------
# The controller side


def _script(go: Path, events: int, interval_s: float) -> str:
    return (
        f"while [ ! -e {go} ]; do sleep 0.01; done; "
        f"i=0; while [ $i -lt {events} ]; do i=$((i+1)); sleep {interval_s}; echo fanout-$i.; done"
    )


async def _start_task(url: str, instance_id: str, token: str, script: str) -> str:
    body = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "SendMessage",
        "params": {
            "message": {"messageId": str(uuid.uuid4()), "role": "ROLE_USER", "parts": [{"text": script}]},
            "configuration": {"returnImmediately": True},
        },
    }
    headers = {"Authorization": f"Bearer {token}", "A2A-Version": "1.0", "A2A-Extensions": RUNTIME_EXTENSION}
    async with httpx.AsyncClient(timeout=30, headers=headers) as client:
        reply = (await client.post(f"{url}/agents/{instance_id}", json=body)).json()
    if "result" not in reply:
        raise RuntimeError(f"SendMessage: {reply}")
    return str(reply["result"]["task"]["id"])


def _store_times(db: Path, task_id: str) -> dict[int, float]:
    """``fanout-<i>.`` -> the time the controller stored the update that first carried it."""
    out: dict[int, float] = {}
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
        rows = conn.execute(
            "SELECT body, at FROM task_events WHERE task_id = ? AND kind = 'artifact' ORDER BY seq", (task_id,)
        )
        for body, at in rows:
            raw = body.encode() if isinstance(body, str) else bytes(body)
            for match in MARK.finditer(raw):
                out.setdefault(int(match.group(1)), at)
    return out


async def _provision(url: str, token: str) -> str:
    async with admin_client(url, token) as admin:
        await wait_ready(admin)
        reply = await admin.post(
            "/api/v2/admin/instances", json={"name": "fanout", "runtime": "host", "start": True, "loadout": "shell"}
        )
        if reply.status_code != 202:
            raise RuntimeError(f"provision: {reply.status_code} {reply.text}")
        return await admin_provision_by_op(admin, reply.json()["id"], 0.02)


def _split(total: int, parts: int) -> list[int]:
    return [total // parts + (1 if i < total % parts else 0) for i in range(parts) if total // parts or i < total]


async def _follow(
    url: str,
    path: tuple[str, str, str],
    watchers: int,
    binding: str,
    clients: int,
    timeout_s: float,
    pid: int,
    go: Callable[[], None],
) -> tuple[list[dict[str, Any]], int, float]:
    """``watchers`` streams in ``clients`` child processes; once all have their first item,
    ``go()``; the processes' reports, the on-CPU ns of ``pid`` meanwhile and the wall time."""
    instance_id, task_id, token = path
    procs: list[subprocess.Popen[str]] = []
    try:
        for share in _split(watchers, clients):
            argv = [sys.executable, __file__, "--worker", url, instance_id, task_id, token, str(share)]
            argv += [binding, str(timeout_s)]
            procs.append(subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=ROOT))
        for proc in procs:
            assert proc.stdout is not None
            line = await trio.to_thread.run_sync(proc.stdout.readline)
            if line.strip() != "ready":
                raise RuntimeError(f"a watcher process did not get ready: {line!r}")
        await trio.sleep(0.2)
        cpu0, t0 = on_cpu_ns(pid), time.monotonic()
        go()
        for proc in procs:
            assert proc.stdin is not None
            proc.stdin.write("go\n")
            proc.stdin.flush()
        reports = []
        for proc in procs:
            assert proc.stdout is not None
            line = await trio.to_thread.run_sync(proc.stdout.readline)
            reports.append(json.loads(line))
        return reports, on_cpu_ns(pid) - cpu0, time.monotonic() - t0
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait(10)


def _result(
    watchers: int,
    events: int,
    binding: str,
    stored: dict[int, float],
    reports: list[dict[str, Any]],
    cpu_ns: int,
    wall_s: float,
) -> FanoutResult:
    merged: dict[int, list[float]] = {}
    for report in reports:
        for key, (count, last) in report["arrivals"].items():
            slot = merged.setdefault(int(key), [0, 0.0])
            slot[0] += count
            slot[1] = max(slot[1], last)
    lat = sorted(max(0.0, merged[i][1] - at) for i, at in stored.items() if i in merged)
    delivered = sum(r["seen"] for r in reports)
    return FanoutResult(
        watchers=watchers,
        events=events,
        p50_s=percentile(lat, 50) if lat else float("nan"),
        p99_s=percentile(lat, 99) if lat else float("nan"),
        max_s=lat[-1] if lat else float("nan"),
        cpu_us_per_event=cpu_ns / 1e3 / max(delivered, 1),
        delivered=delivered,
        lost=watchers * events - delivered,
        misordered=sum(r["misordered"] for r in reports),
        wall_s=wall_s,
        client_cpu_s=sum(r["cpu_s"] for r in reports),
        binding=binding,
    )


async def measure(
    watchers: int,
    events: int = 200,
    *,
    interval_s: float = 0.03,
    binding: Binding = "jsonrpc",
    clients: int | None = None,
    timeout_s: float = 120.0,
) -> FanoutResult:
    """``watchers`` SSE streams of one task printing ``events`` lines, one every ``interval_s``
    (see the module docstring). ``clients``: the child processes holding the watchers (default:
    one per 500, at least 1)."""
    clients = clients or max(1, min(8, (watchers + 499) // 500))
    with running_hostd() as hostd, temp_dir("aiwg-bench-fanout-") as tmp:
        state = tmp / "state"
        ctl = Controller(state, hostd.socket_path)
        try:
            instance_id = await _provision(ctl.url, ctl.token)
            go = tmp / "go"
            task_id = await _start_task(ctl.url, instance_id, ctl.token, _script(go, events, interval_s))
            reports, cpu_ns, wall_s = await _follow(
                ctl.url,
                (instance_id, task_id, ctl.token),
                watchers,
                binding,
                clients,
                timeout_s,
                ctl.proc.pid,
                go.touch,
            )
        except BaseException:
            print(ctl.log(), file=sys.stderr)
            raise
        finally:
            ctl.stop()
        stored = _store_times(state / "controller.db", task_id)
    return _result(watchers, events, binding, stored, reports, cpu_ns, wall_s)


# ---------------------------------------------------------------------------------------------
# The baseline: a bare ASGI app on hypercorn's trio worker writing the same frames


BARE_SSE = textwrap.dedent(
    """
    import json, sys, time, trio
    from hypercorn.config import Config
    from hypercorn.trio import serve

    EVENTS, INTERVAL = int(sys.argv[1]), float(sys.argv[2])
    PAD = "x" * 240  # about the size of a task's artifact update
    frames, stamps, news = [], [], [trio.Event()]

    async def app(scope, receive, send):
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                await send({"type": message["type"] + ".complete"})
                if message["type"] == "lifespan.shutdown":
                    return
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"text/event-stream")]})
        await send({"type": "http.response.body", "body": b'data: {"task":{}}\\n\\n', "more_body": True})
        sent = 0
        while True:
            changed = news[0]
            if sent == len(frames):
                await changed.wait()
                continue
            chunk, sent = b"".join(frames[sent:]), len(frames)
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
            if sent == EVENTS + 1:
                await send({"type": "http.response.body", "body": b"", "more_body": False})
                return

    def tell(frame):
        frames.append(frame)
        news[0].set()
        news[0] = trio.Event()

    async def main():
        config = Config()
        config.bind = ["127.0.0.1:0"]
        config.accesslog = None
        async with trio.open_nursery() as nursery:
            binds = await nursery.start(serve, app, config)
            print(binds[0], flush=True)
            await trio.to_thread.run_sync(sys.stdin.readline)  # go
            for i in range(1, EVENTS + 1):
                await trio.sleep(INTERVAL)
                stamps.append(time.time())
                tell(f'data: {{"artifactUpdate":{{"text":"fanout-{i}.","pad":"{PAD}"}}}}\\n\\n'.encode())
            tell(b'data: {"statusUpdate":"TASK_STATE_COMPLETED"}\\n\\n')
            print(json.dumps(stamps), flush=True)
            await trio.sleep(3600)

    trio.run(main)
    """
)


async def measure_bare(
    watchers: int, events: int = 200, *, interval_s: float = 0.03, clients: int | None = None, timeout_s: float = 120.0
) -> FanoutResult:
    """The floor: the same frames, each written once to every watcher by a bare ASGI app on
    hypercorn's trio worker (no store, no encoding; the time an event is "stored" is when the app
    tells its streams)."""
    clients = clients or max(1, min(8, (watchers + 499) // 500))
    argv = [sys.executable, "-c", BARE_SSE, str(events), str(interval_s)]
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        assert proc.stdout is not None and proc.stdin is not None
        url = proc.stdout.readline().strip()

        def go() -> None:
            assert proc.stdin is not None
            proc.stdin.write("go\n")
            proc.stdin.flush()

        reports, cpu_ns, wall_s = await _follow(
            url, ("-", "-", "-"), watchers, "bare", clients, timeout_s, proc.pid, go
        )
        stamps = json.loads(proc.stdout.readline())
    finally:
        proc.kill()
        proc.wait(10)
    stored = {i: at for i, at in enumerate(stamps, 1)}
    return _result(watchers, events, "bare hypercorn", stored, reports, cpu_ns, wall_s)


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        url, instance_id, task_id, token, count, binding, timeout_s = sys.argv[2:9]
        worker(url, instance_id, task_id, token, int(count), binding, float(timeout_s))  # type: ignore[arg-type]
        return
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--watchers", default="1,500,1000,2000", help="watcher counts (default 1,500,1000,2000)")
    p.add_argument("--events", type=int, default=200, help="updates the task prints (default 200)")
    p.add_argument("--interval-s", type=float, default=0.03, help="between two updates (default 0.03)")
    p.add_argument("--binding", choices=["jsonrpc", "rest"], default="jsonrpc")
    p.add_argument("--no-baseline", action="store_true", help="skip the bare hypercorn rows")
    args = p.parse_args()
    if args.versions:
        print_versions()
        return
    rows: list[FanoutResult] = []
    bare: list[FanoutResult] = []
    for n in (int(x) for x in args.watchers.split(",")):
        rows.append(trio.run(partial(measure, n, args.events, interval_s=args.interval_s, binding=args.binding)))
        if not args.no_baseline:
            bare.append(trio.run(partial(measure_bare, n, args.events, interval_s=args.interval_s)))
    results = [
        Result(
            case=f"SSE {r.binding}, {r.watchers} watcher{'s' if r.watchers != 1 else ''}",
            n=r.events,
            p50_us=r.p50_s * 1e6,
            p99_us=r.p99_s * 1e6,
            throughput=r.delivered / r.wall_s if r.wall_s else None,
            unit="deliveries/s",
            extra={
                "cpu_us_per_delivery": round(r.cpu_us_per_event, 1),
                "delivered": r.delivered,
                "lost": r.lost,
                "misordered": r.misordered,
                "max_ms": round(r.max_s * 1e3, 1),
                "wall_s": round(r.wall_s, 2),
                "client_cpu_s": round(r.client_cpu_s, 2),
            },
        )
        for r in [*rows, *bare]
    ]
    for row, base in zip(results, results[len(rows) :], strict=False):
        compare(row, base, "p50")
    targets = [
        Target(
            description=f"controller CPU per delivered event <= 60 µs ({r.watchers} watchers)",
            measured=f"{r.cpu_us_per_event:.1f} µs",
            met=r.cpu_us_per_event <= 60,
        )
        for r in rows
        if r.watchers >= 500
    ]
    targets += [
        Target(
            description="1,000 watchers of one task: last-watcher p99 < 100 ms",
            measured=f"{r.p99_s * 1e3:.1f} ms",
            met=r.p99_s < 0.1,
        )
        for r in rows
        if r.watchers == 1000
    ]
    report = Report(
        bench="fanout",
        title="one task's SSE stream to N watchers: store -> last watcher, controller CPU per delivery",
        vs_of="p50",
        params={"events": args.events, "interval_s": args.interval_s, "binding": args.binding, "cpus": os.cpu_count()},
        results=results,
        targets=targets,
        notes=[
            "latency: from the event's store time (task_events.at) to its arrival at the last watcher",
            "baseline (bare hypercorn): a bare ASGI app on hypercorn's trio worker writing frames of the same"
            " size to as many streams, once per stream per wake (everything new in one write): the floor of"
            " the HTTP stack",
        ],
    )
    emit(report, as_json=args.json)


if __name__ == "__main__":
    main()
