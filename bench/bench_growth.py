"""Growth: what a request, a restart and a task on disk cost as the history grows (issue 30).

Starts one hostd and, size by size, the controller on its default store (SQLite in its state dir)
and a2a-sdk's own server (``bench/peer_a2a_server.py``: its Starlette REST routes on uvicorn, an
executor running ``/bin/echo`` per task) on the SDK's ``DatabaseTaskStore`` in SQLite (WAL,
``synchronous=NORMAL``, as the controller's store), and measures in one run:

* Tasks, at each of ``--sizes`` tasks in the store (default 0 / 10k / 100k / 1M; ``--quick`` 0 /
  1k / 10k): the server stopped, its store is filled up to the size through the store's own write
  path (``growth_fill.py`` says how: the controller's ``TaskTable.create`` and ``append_many`` with
  the changes a one-line echo task makes, many tasks per transaction; the SDK's
  ``DatabaseTaskStore`` with the tasks its own echo send leaves), then started: start to ready
  (spawn to ``/readyz`` 200; for the peer to its first answer), ``--starts`` times; blocking
  ``message:send`` of a one-line echo task; GetTask of tasks picked at random from the fill;
  ListTasks' first page (``pageSize`` 50, REST binding), alone, with a ``contextId`` filter (the
  context of a task just sent) and with a ``status`` filter (``TASK_STATE_COMPLETED``): p50/p99
  over ``--requests`` each, one keep-alive client, and the server's on-CPU time per request
  (``/proc/PID/task/*/schedstat``: what a loaded host hardly moves). Below the table: bytes per task
  in the database file (with and without its ``-wal``), the WAL's size and the server's RSS after
  the requests. The counts include the bench's own sends (``--requests`` + ``--warmup`` per size).
* Instances, at each of ``--instances`` host instances (default 1 / 100 / 1,000; a fresh controller
  and state dir, hostd emptied of the task cases' instance first; grown ``--clients`` provisions at
  a time, untimed): ``POST /api/v2/admin/instances`` (host runtime, ``start: true``) until the
  instance runs, ``--provisions`` times with that many present (each decommissioned outside the
  clock), and the first page of ``GET /api/v2/admin/instances?limit=50`` (without ``limit`` if the
  controller answers it 400): p50/p99 and the body's size.
* SSE fan-out, at each of ``--watchers`` watchers of one task: ``bench/fanout.py``'s ``measure``
  (last-watcher latency p50/p99, controller CPU per delivered event; its own hostd and controller)
  and, below the table, its ``measure_bare`` floor (a bare ASGI app writing the same frames) if it
  has one; if that module cannot be imported, a note says why.

``vs.`` compares each row with the same measure of the same server at the smallest size: the
issue's targets are about growth (each per-request figure at the largest size at most 1.5x the
smallest, judged on p50, p99 and on-CPU shown beside it; start to ready at most 1.2x; at most 1 KB
per one-line echo task, file and WAL, at the largest size; fan-out at most 60 µs of controller CPU
per delivery at the most watchers, and 1,000 watchers at p99 under 100 ms). A2A requests carry
``A2A-Version: 1.0`` (and ours the runtime extension, as bench_a2a.py's do).

Child processes get the bench's ``PYTHONPATH`` in front of the repository, so
``PYTHONPATH=/path/to/other/src`` measures another tree's code (for example a ``git archive`` of a
commit) with this bench. Everything started is stopped, and the temp dirs removed, on the way out.
"""

from __future__ import annotations

import argparse
import random
import signal
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from contextlib import ExitStack
from functools import partial
from pathlib import Path

import httpx
import trio
from bench_a2a import on_cpu_ns
from bench_admin import API, Controller, _destroy_leftovers, admin_client, admin_decommission, admin_provision
from common import (
    MIB,
    Report,
    Result,
    Target,
    compare,
    emit,
    latency_result,
    parser,
    print_versions,
    running_hostd,
    temp_dir,
)
from growth_servers import OURS, PEER, START_TIMEOUT_S, Ours, Peer, Server, child_env, rss_mib

PAGE = 50
TASK_MEASURES = ("send", "GetTask", "ListTasks", "ListTasks contextId", "ListTasks status")


async def send(client: httpx.AsyncClient) -> tuple[str, str]:
    """A blocking send of a one-line echo task; its task and context ids."""
    body = {"message": {"messageId": str(uuid.uuid4()), "role": "ROLE_USER", "parts": [{"text": "ping"}]}}
    response = await client.post("/message:send", json=body)
    task = response.json().get("task", {}) if response.status_code == 200 else {}
    if task.get("status", {}).get("state") != "TASK_STATE_COMPLETED":
        raise RuntimeError(f"message:send: {response.status_code} {response.text[:300]}")
    return task["id"], task["contextId"]


async def timed(n: int, one: Callable[[], Awaitable[object]]) -> list[int]:
    samples = []
    for _ in range(n):
        t0 = time.perf_counter_ns()
        await one()
        samples.append(time.perf_counter_ns() - t0)
    return samples


async def get_ok(client: httpx.AsyncClient, path: str, **params: str) -> httpx.Response:
    response = await client.get(path, params=params)
    if response.status_code != 200:
        raise RuntimeError(f"GET {path} {params}: {response.status_code} {response.text[:300]}")
    return response


class Totals:
    """What the task cases found, by (server, measure, size); footprints by (server, size)."""

    def __init__(self) -> None:
        self.rows: dict[tuple[str, str, int], Result] = {}
        self.footprint: dict[tuple[str, int], dict[str, float]] = {}
        self.fills: dict[tuple[str, int], tuple[int, float]] = {}


async def task_case(
    server: Server, size: int, tasks: int, sample: list[str], args: argparse.Namespace, out: Totals
) -> int:
    """Start ``server`` on its filled store and measure it; the tasks its store holds after."""
    starts = []
    for i in range(args.starts):
        if i:
            server.stop()
        starts.append(await server.start())
    n, rng = args.requests, random.Random(args.seed + size)
    async with httpx.AsyncClient(base_url=server.agent_url, headers=server.headers, timeout=60) as client:
        for _ in range(args.warmup):
            await send(client)
        sent: list[tuple[str, str]] = []

        async def one_send() -> None:
            sent.append(await send(client))

        found: dict[str, list[int]] = {}
        cpu: dict[str, float] = {}

        async def case(measure: str, one: Callable[[], Awaitable[object]]) -> None:
            before = on_cpu_ns(server.pid)
            found[measure] = await timed(n, one)
            cpu[measure] = (on_cpu_ns(server.pid) - before) / n / 1e3

        await case("send", one_send)
        tasks += n + args.warmup
        pool = sample or [task_id for task_id, _ in sent]
        await case("GetTask", lambda: get_ok(client, f"/tasks/{rng.choice(pool)}"))
        last: dict[str, httpx.Response] = {}

        async def listing(key: str, **params: str) -> None:
            last[key] = await get_ok(client, "/tasks", pageSize=str(PAGE), **params)

        context = sent[-1][1]
        await case("ListTasks", lambda: listing("ListTasks"))
        await case("ListTasks contextId", lambda: listing("ListTasks contextId", contextId=context))
        await case("ListTasks status", lambda: listing("ListTasks status", status="TASK_STATE_COMPLETED"))
    for measure, samples in found.items():
        row = latency_result(f"{server.name}: {measure}, {size:,} tasks", samples, unit="req/s")
        row.extra = {"server_cpu_us": round(cpu[measure])}
        if measure in last:
            row.extra |= {"totalSize": last[measure].json().get("totalSize"), "body_bytes": len(last[measure].content)}
        out.rows[(server.name, measure, size)] = row
    db = server.db_file.stat().st_size
    wal_file = server.db_file.with_name(server.db_file.name + "-wal")
    wal = wal_file.stat().st_size if wal_file.exists() else 0
    out.footprint[(server.name, size)] = {"tasks": tasks, "file": db, "wal": wal, "rss_mib": rss_mib(server.pid)}
    start = latency_result(f"{server.name}: start -> ready, {size:,} tasks", starts, unit="starts/s")
    start.throughput = None
    start.extra = {
        "bytes_per_task": round(db / max(1, tasks)),
        "bytes_per_task_with_wal": round((db + wal) / max(1, tasks)),
        "wal_mib": round(wal / MIB, 1),
        "rss_mib": round(out.footprint[(server.name, size)]["rss_mib"], 1),
        "tasks": tasks,
    }
    out.rows[(server.name, "start -> ready", size)] = start
    server.stop()
    return tasks


async def tasks_cases(servers: list[Server], args: argparse.Namespace, out: Totals) -> None:
    filled = {s.name: 0 for s in servers}
    held = {s.name: 0 for s in servers}
    for size in args.sizes:
        for server in servers:
            more = size - filled[server.name]
            sample: list[str] = []
            if more > 0:
                print(f"bench_growth: filling {server.name} with {more:,} tasks", file=sys.stderr, flush=True)
                answer = await trio.to_thread.run_sync(server.fill, more)
                out.fills[(server.name, size)] = (more, answer["seconds"])
                sample = list(answer["sample"])
                filled[server.name] = size
                held[server.name] += more
            print(f"bench_growth: measuring {server.name} at {size:,} tasks", file=sys.stderr, flush=True)
            held[server.name] = await task_case(server, size, held[server.name], sample, args, out)


POLL_S = 0.005


def instances(n: int) -> str:
    return f"{n:,} instance" if n == 1 else f"{n:,} instances"


async def list_row(admin: httpx.AsyncClient, size: int, limit: dict[str, str], args: argparse.Namespace) -> Result:
    """The first page of the admin instance list (``limit``: its query, or none), ``--requests`` times."""
    answers: list[httpx.Response] = []

    async def first_page() -> None:
        answers.append(await get_ok(admin, f"{API}/instances", **limit))

    for _ in range(args.warmup):
        await first_page()
    samples = await timed(args.requests, first_page)
    body = answers[-1].json()
    items = body.get("items", [])
    query = f"?limit={PAGE}" if limit else ""
    row = latency_result(
        f"admin GET /instances{query}, {size:,} instance{'' if size == 1 else 's'}", samples, unit="req/s"
    )
    row.extra = {"body_bytes": len(answers[-1].content), "items": len(items)}
    if limit and len(items) > PAGE:
        row.extra["limit"] = "ignored (the whole list)"
    if "next_page_token" in body:
        row.extra["next_page_token"] = "yes" if body["next_page_token"] else "empty"
    return row


async def provision_row(admin: httpx.AsyncClient, size: int, args: argparse.Namespace) -> Result:
    """``--provisions`` provisions to running with ``size`` instances present."""
    took: list[int] = []
    for i in range(args.provisions):
        t0 = time.perf_counter_ns()
        instance_id = await admin_provision(admin, f"bench-growth-timed-{size}-{i}", POLL_S)
        took.append(time.perf_counter_ns() - t0)
        await admin_decommission(admin, instance_id, POLL_S)  # outside the clock
    row = latency_result(
        f"admin POST /instances -> running, {size:,} instance{'' if size == 1 else 's'}", took, unit="provisions/s"
    )
    row.extra = {"poll_ms": POLL_S * 1000}
    return row


async def instances_cases(
    state_dir: Path, hostd_socket: Path, args: argparse.Namespace
) -> tuple[list[Result], list[str]]:
    """Provision and the list's first page at each of ``--instances`` host instances (a controller
    of its own; the instances grown ``--clients`` provisions at a time, untimed)."""
    rows: list[Result] = []
    notes: list[str] = []
    ctl = await trio.to_thread.run_sync(partial(Controller, state_dir, hostd_socket, child_env()))
    try:
        async with admin_client(ctl.url, ctl.token) as admin:
            with trio.fail_after(START_TIMEOUT_S):
                while (await admin.get("/readyz")).status_code != 200:
                    await trio.sleep(0.02)
            present = 0
            limit: dict[str, str] = {"limit": str(PAGE)}
            for size in args.instances:
                print(f"bench_growth: provisioning up to {size:,} instances", file=sys.stderr, flush=True)
                while present < size:
                    batch = min(args.clients, size - present)
                    async with trio.open_nursery() as nursery:
                        for i in range(batch):
                            nursery.start_soon(admin_provision, admin, f"bench-growth-{present + i}", POLL_S)
                    present += batch
                if limit and (await admin.get(f"{API}/instances", params=limit)).status_code == 400:
                    notes.append(f"GET {API}/instances answered 400 to ?limit={PAGE}: measured without it")
                    limit = {}
                rows += [await provision_row(admin, size, args), await list_row(admin, size, limit, args)]
    finally:
        await trio.to_thread.run_sync(ctl.stop)
    return rows, notes


def fanout_cases(args: argparse.Namespace) -> tuple[list[Result], list[str], dict[int, dict[str, float]]]:
    """``bench/fanout.py``'s :func:`measure` at each of ``--watchers`` (it starts its own hostd and
    controller); skipped, with a note, if that module cannot be imported."""
    # ---- SSE fan-out: bench/fanout.py (another bench's module, imported as it stands) -----------
    try:
        import fanout
    except ImportError as exc:
        note = f"SSE fan-out not measured: bench/fanout.py's measure() cannot be imported ({exc})"
        print(f"bench_growth: {note}", file=sys.stderr)
        return [], [note], {}
    # Its hostd and controller get PYTHONPATH=<repo> only: given the bench's too, fan-out runs the
    # same tree as the other cases (see the module docstring).
    setattr(fanout, "running_hostd", partial(running_hostd, child_env()))  # noqa: B010
    setattr(fanout, "Controller", partial(Controller, env=child_env()))  # noqa: B010
    bare = getattr(fanout, "measure_bare", None)  # its floor: a bare ASGI app writing the same frames
    rows: list[Result] = []
    figures: dict[int, dict[str, float]] = {}
    for watchers in args.watchers:
        print(f"bench_growth: fan-out to {watchers:,} watchers", file=sys.stderr, flush=True)
        try:
            result = trio.run(partial(fanout.measure, watchers, args.events))
            floor = None if bare is None else trio.run(partial(bare, watchers, args.events))
        except Exception as exc:  # another bench's code: its failure is reported, the run goes on
            return rows, [f"SSE fan-out to {watchers:,} watchers failed: {exc!r}"], figures
        got = figures[watchers] = fanout_figures(result)
        row = Result(
            case=f"SSE fan-out: event stored -> last of {watchers:,} watcher{'' if watchers == 1 else 's'}",
            n=int(got.get("n", args.events)),
            p50_us=got.get("p50_us"),
            p99_us=got.get("p99_us"),
        )
        row.extra = {"cpu_us_per_delivery": round(got["cpu_us"], 1) if "cpu_us" in got else "-"}
        row.extra |= {k: getattr(result, k) for k in ("delivered", "lost", "misordered") if hasattr(result, k)}
        if floor is not None:
            low = fanout_figures(floor)
            row.extra |= {f"bare_ASGI_{k[:3]}_ms": round(v / 1e3, 2) for k, v in low.items() if k[:3] in ("p50", "p99")}
        rows.append(row)
    for row in rows[1:]:
        compare(row, rows[0], "p50")
    return rows, [], figures


def fanout_figures(result: object) -> dict[str, float]:
    """p50/p99 in µs and controller CPU µs per delivery, from a FanoutResult's fields."""
    got: dict[str, float] = {}
    for field, key, scale in (("p50_s", "p50_us", 1e6), ("p99_s", "p99_us", 1e6), ("cpu_us_per_event", "cpu_us", 1)):
        value = getattr(result, field, None)
        if isinstance(value, int | float):
            got[key] = value * scale
    if isinstance(events := getattr(result, "events", None), int):
        got["n"] = events
    return got


def sizes(text: str) -> list[int]:
    values = sorted({int(v.replace("_", "")) for v in text.split(",") if v.strip()})
    if not values or values[0] < 0:
        raise argparse.ArgumentTypeError("a comma-separated list of counts, e.g. 0,10000,100000")
    return values


def growth(rows: dict[tuple[str, str, int], Result], server: str, measure: str) -> tuple[Result, Result] | None:
    """(the smallest size's row, the largest's) of one measure of one server."""
    found = sorted((size, row) for (s, m, size), row in rows.items() if s == server and m == measure)
    return (found[0][1], found[-1][1]) if len(found) > 1 else None


def ratio_target(description: str, pair: tuple[Result, Result] | None, limit: float) -> Target | None:
    if pair is None or not pair[0].p50_us or not pair[1].p50_us:
        return None
    small, large = pair
    r50 = large.p50_us / small.p50_us  # type: ignore[operator]
    r99 = (large.p99_us or 0) / (small.p99_us or 1)
    measured = f"p50 {small.p50_us / 1e3:.2f} -> {large.p50_us / 1e3:.2f} ms ({r50:.2f}x; p99 {r99:.2f}x)"  # type: ignore[operator]
    cpu = small.extra.get("server_cpu_us"), large.extra.get("server_cpu_us")
    if isinstance(cpu[0], int | float) and isinstance(cpu[1], int | float) and cpu[0]:
        measured += f"; server on-CPU {cpu[0]:,.0f} -> {cpu[1]:,.0f} µs ({cpu[1] / cpu[0]:.2f}x)"
    return Target(description=description, measured=measured, met=r50 <= limit)


def task_targets(out: Totals, sizes_: list[int]) -> list[Target]:
    small, large = f"{sizes_[0]:,}", f"{sizes_[-1]:,}"
    targets = []
    for measure in TASK_MEASURES:
        target = ratio_target(
            f"{measure} at {large} tasks at most 1.5x at {small}", growth(out.rows, OURS, measure), 1.5
        )
        if target is not None:
            targets.append(target)
    target = ratio_target(
        f"start -> ready at {large} tasks at most 1.2x at {small}", growth(out.rows, OURS, "start -> ready"), 1.2
    )
    if target is not None:
        targets.append(target)
    largest = out.footprint.get((OURS, sizes_[-1]))
    if largest is not None and sizes_[-1] > 0:
        per_task = (largest["file"] + largest["wal"]) / largest["tasks"]
        targets.append(
            Target(
                description=f"at most 1 KB per one-line echo task on disk (file and -wal, {large} tasks)",
                measured=f"{per_task:,.0f} B/task (WAL {largest['wal'] / MIB:,.1f} MiB)",
                met=per_task <= 1024,
            )
        )
    return targets


def fanout_targets(figures: dict[int, dict[str, float]]) -> list[Target]:
    targets = []
    cpu = {w: f["cpu_us"] for w, f in figures.items() if "cpu_us" in f}
    if cpu:
        most = max(cpu)  # with few watchers the task's own run and storage dominate (fanout.py)
        targets.append(
            Target(
                description=f"fan-out: at most 60 µs of controller CPU per delivered event ({most:,} watchers)",
                measured=", ".join(f"{w:,} watchers {us:,.0f} µs" for w, us in sorted(cpu.items())),
                met=cpu[most] <= 60,
            )
        )
    thousand = figures.get(1000, {})
    if "p99_us" in thousand:
        targets.append(
            Target(
                description="fan-out: 1,000 watchers of one task at p99 under 100 ms",
                measured=f"p99 {thousand['p99_us'] / 1e3:,.1f} ms",
                met=thousand["p99_us"] < 100e3,
            )
        )
    return targets


def task_notes(out: Totals, sizes_: list[int], via: str) -> list[str]:
    notes = [
        "filled with the server stopped, through the store's own write path (bench/growth_fill.py): the "
        "controller's TaskTable.create + append_many x2 per task (the message, working with its exec, the stdout "
        "artifact + closing chunk + completed), 2,000 tasks per transaction; a2a-sdk's DatabaseTaskStore "
        + (
            "save() per task, 2,000 saves per session"
            if via == "save"
            else "own ORM rows (_to_orm, what save() merges) added 2,000 per session"
        )
        + " (completed, one text artifact, no history: what its echo send leaves); all tasks on one instance"
    ]
    for (server, size), (count, seconds) in sorted(out.fills.items()):
        notes.append(
            f"fill, {server} up to {size:,}: {count:,} tasks in {seconds:,.1f} s ({seconds / count * 1e6:,.0f} µs/task)"
        )
    for size in sizes_:
        parts = []
        for measure in ("start -> ready", *TASK_MEASURES):
            ours, peer = out.rows.get((OURS, measure, size)), out.rows.get((PEER, measure, size))
            if ours and peer and ours.p50_us and peer.p50_us:
                parts.append(f"{measure} {ours.p50_us / peer.p50_us:.2f}x")
        if parts:
            notes.append(f"controller p50 / a2a-sdk p50 at {size:,} tasks: " + ", ".join(parts))
    return notes


def peer_missing() -> str | None:
    try:
        import a2a.server.routes  # noqa: F401
        import aiosqlite  # noqa: F401
        import sqlalchemy  # noqa: F401
        import uvicorn  # noqa: F401
    except ImportError as exc:
        return f"needs a2a-sdk[http-server,sqlite] and uvicorn (pip install -e '.[bench]'): {exc}"
    return None


async def measure(
    tmp: Path, hostd_socket: Path, servers: list[Server], args: argparse.Namespace, out: Totals
) -> tuple[list[Result], list[str]]:
    if "tasks" in args.cases:
        ours = servers[0]
        assert isinstance(ours, Ours)
        await ours.provision()
        await tasks_cases(servers, args, out)
    if "instances" in args.cases:
        await _destroy_leftovers(hostd_socket)  # the task cases' echo instance: the counts start at 0
        return await instances_cases(tmp / "instances" / "state", hostd_socket, args)
    return [], []


def ordered(out: Totals, servers: list[Server]) -> list[Result]:
    """Rows by measure, server and size; each compared with its smallest size."""
    results = []
    for measure in ("start -> ready", *TASK_MEASURES):
        for server in servers:
            found = sorted((size, row) for (s, m, size), row in out.rows.items() if s == server.name and m == measure)
            for _, row in found[1:]:
                compare(row, found[0][1], "p50")
            results += [row for _, row in found]
    return results


def main() -> None:
    p = parser(__doc__.splitlines()[0])
    p.add_argument(
        "--sizes", type=sizes, help="tasks in the store (default 0,10000,100000,1000000; --quick 0,1000,10000)"
    )
    p.add_argument("--instances", type=sizes, help="host instances (default 1,100,1000; --quick 1,10,50)")
    p.add_argument("--watchers", type=sizes, help="SSE watchers of one task (default 1,500,1000,2000; --quick 1,100)")
    p.add_argument("--requests", type=int, help="measured requests per row (default 50; --quick 20)")
    p.add_argument("--warmup", type=int, help="unmeasured sends (and list GETs) first (default 5; --quick 2)")
    p.add_argument("--starts", type=int, help="starts timed per size (default 3; --quick 2)")
    p.add_argument("--provisions", type=int, help="provisions timed per instance count (default 10; --quick 3)")
    p.add_argument("--clients", type=int, default=8, help="concurrent provisions while growing the instances")
    p.add_argument("--events", type=int, default=200, help="events per fan-out case (default 200)")
    p.add_argument(
        "--peer-fill",
        choices=("mapping", "save"),
        default="mapping",
        help="fill a2a-sdk's store with its ORM rows (default) or save() per task (about 4x slower)",
    )
    p.add_argument("--cases", default="tasks,instances,fanout", help="which cases (default tasks,instances,fanout)")
    p.add_argument("--quick", action="store_true", help="a smoke run: small sizes, few requests")
    args = p.parse_args()
    if args.versions:
        print_versions()
        return
    defaults = {
        "sizes": ([0, 10_000, 100_000, 1_000_000], [0, 1_000, 10_000]),
        "instances": ([1, 100, 1_000], [1, 10, 50]),
        "watchers": ([1, 500, 1_000, 2_000], [1, 100]),
        "requests": (50, 20),
        "warmup": (5, 2),
        "starts": (3, 2),
        "provisions": (10, 3),
    }
    for name, (full, quick) in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, quick if args.quick else full)
    args.cases = {c.strip() for c in args.cases.split(",")}
    # A kill of the bench cleans up as a Ctrl-C does.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    out = Totals()
    notes: list[str] = []
    extra_rows: list[Result] = []
    servers: list[Server] = []
    with ExitStack() as stack:
        tmp = stack.enter_context(temp_dir("aiwg-bench-growth-"))
        hostd = stack.enter_context(running_hostd(child_env(), new_session=True))
        stack.callback(_leave_no_instance, hostd.socket_path)
        servers.append(Ours(tmp / "ours" / "state", hostd.socket_path, f"bench-{uuid.uuid4().hex}"))
        if (why := peer_missing()) is not None:
            notes.append(f"{PEER} not measured: {why}")
        else:
            (tmp / "peer").mkdir()
            servers.append(Peer(tmp / "peer" / "tasks.sqlite", args.peer_fill))
        for server in servers:
            stack.callback(server.stop)
        try:
            extra_rows, more = trio.run(measure, tmp, hostd.socket_path, servers, args, out)
        except Exception:
            log = tmp / "ours" / "controller.log"
            print(log.read_text(errors="replace")[-4000:] if log.exists() else "", file=sys.stderr)
            raise
        notes += more
    fan_rows: list[Result] = []
    figures: dict[int, dict[str, float]] = {}
    if "fanout" in args.cases:
        fan_rows, more, figures = fanout_cases(args)
        notes += more
    results = [*ordered(out, servers), *instance_order(extra_rows), *fan_rows]
    targets = task_targets(out, args.sizes) if "tasks" in args.cases else []
    if extra_rows:
        targets += instance_targets(extra_rows)
    targets += fanout_targets(figures)
    if "tasks" in args.cases:
        notes = task_notes(out, args.sizes, args.peer_fill) + notes
    report = Report(
        bench="bench_growth",
        title="requests, restarts and disk as tasks, instances and watchers grow (controller beside a2a-sdk's server)",
        vs_of="p50",
        params={
            "sizes": ",".join(f"{s:,}" for s in args.sizes),
            "instances": ",".join(f"{s:,}" for s in args.instances),
            "watchers": ",".join(f"{s:,}" for s in args.watchers),
            "requests": args.requests,
            "starts": args.starts,
            "provisions": args.provisions,
            "vs.": "the same row at the smallest size",
        },
        results=results,
        targets=targets,
        notes=notes,
    )
    emit(report, as_json=args.json)


def instance_order(rows: list[Result]) -> list[Result]:
    """Provision rows, then list rows, each compared with its first (the fewest instances)."""
    out = []
    for prefix in ("admin POST", "admin GET"):
        group = [r for r in rows if r.case.startswith(prefix)]
        for row in group[1:]:
            compare(row, group[0], "p50")
        out += group
    return out


def instance_targets(rows: list[Result]) -> list[Target]:
    targets = []
    for prefix, what in (("admin POST", "provision"), ("admin GET", "first page of GET /instances")):
        group = [r for r in rows if r.case.startswith(prefix)]
        if len(group) > 1:
            first, last = group[0].case.rsplit(", ", 1)[1], group[-1].case.rsplit(", ", 1)[1]
            target = ratio_target(f"{what} at {last} at most 1.5x at {first}", (group[0], group[-1]), 1.5)
            if target is not None:
                targets.append(target)
    return targets


def _leave_no_instance(socket_path: Path) -> None:
    try:
        trio.run(_destroy_leftovers, socket_path)
    except Exception as exc:  # hostd is gone: its stop kills what is left of its tree
        print(f"bench_growth: could not destroy leftover instances: {exc!r}", file=sys.stderr)


if __name__ == "__main__":
    main()
