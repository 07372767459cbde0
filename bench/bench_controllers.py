"""Several controllers on one PostgreSQL: sends, tasks/s and on-CPU per task with 1, 2 and 3
controllers; the takeover time after the SIGKILL of the controller following a task.

Starts one hostd, a private PostgreSQL cluster (``scripts/pgcluster.py``: ``initdb`` and ``pg_ctl``
in a temp dir; as root the server runs as ``postgres``) and, case by case, controllers as child
processes (``python -m agentic_sandbox.controller.main``), and measures in one run:

* Blocking ``message:send`` on the ``echo`` loadout (HTTP+JSON, keep-alive ``httpx``): p50/p99 from
  one client (at the first controller), tasks/s from ``--clients`` clients spread round-robin over
  the controllers; with 1, 2 and 3 controllers sharing one database of the cluster
  (``AIWG_DATABASE_URL``, one state dir; a fresh database per count). Baselines, same run: one
  controller on its default store (SQLite in its state dir); and a2a-sdk's own server
  (``bench/peer_a2a_server.py --database-url``: its Starlette REST routes on uvicorn, ``/bin/echo``
  per task) on its ``DatabaseTaskStore`` in a database of its own on the same server (needs
  ``a2a-sdk[http-server,postgresql]`` and uvicorn, the ``bench`` extra; else the report says so).
* On-CPU time per task over each ``--clients`` case (``/proc/PID/task/*/schedstat``): the
  controllers summed, hostd, and the PostgreSQL server (the postmaster and its backends).
* Takeover: two controllers, A and B. A task started at A (so A follows its exec; the bench checks
  in the database that A holds its claim) prints a counter and the time every 20 ms; B's SSE
  subscriber (``:subscribe``) reads it; A gets SIGKILL. Measured: the kill to the arrival at B's
  subscriber of the first line printed after it. A fresh A each round (``--kills``); the lines B
  showed are checked for a gap or a duplicate. Baseline: a fresh controller's start to ``/readyz``
  200 (what a restart would take before serving anything again).

Everything it starts (controllers, the peer, hostd and its instances, the cluster, temp dirs) is
stopped and removed on the way out, also on Ctrl-C (hostd runs in a session of its own so that
it is still there to destroy its instances) and on SIGTERM (handled as Ctrl-C).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import random
import re
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Sequence
from contextlib import AsyncExitStack, ExitStack
from pathlib import Path
from types import ModuleType
from typing import Any

import httpx
import psutil
import trio
from bench_a2a import RUNTIME_EXTENSION, admin_provision_loadout, agent_client, free_port, on_cpu_ns, send_one
from bench_admin import (
    Controller,
    _destroy_leftovers,
    admin_client,
    admin_decommission,
    run_concurrent,
    wait_ready,
)
from common import (
    ROOT,
    Hostd,
    Report,
    Result,
    Target,
    compare,
    emit,
    latency_result,
    parser,
    plural,
    print_versions,
    running_hostd,
    temp_dir,
)

COUNTS = (1, 2, 3)
DEFAULT_TTL_S = 2.0
TICK_S = 0.02
LINE = re.compile(r"tick (\d+) (\d+)[.,](\d+)")
SQLITE, PEER = "1 controller, SQLite (default store)", "a2a-sdk server, DatabaseTaskStore on PostgreSQL"


def pg_case(k: int) -> str:
    return f"{plural(k, 'controller')} on PostgreSQL"


def load_pgcluster() -> ModuleType:
    """``scripts/pgcluster.py`` (a script, not a package: loaded from its file)."""
    spec = importlib.util.spec_from_file_location("pgcluster", ROOT / "scripts" / "pgcluster.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class Fleet:
    """Every server process this run starts (controllers, the peer); :meth:`stop_all` stops what
    still runs, whichever way the run ends."""

    def __init__(self, hostd: Hostd, logs: Path, token: str) -> None:
        assert hostd.proc is not None
        self.hostd, self.hostd_socket, self.hostd_pid = hostd, hostd.socket_path, hostd.proc.pid
        self.logs, self.token = logs, token
        self.controllers: list[Controller] = []
        self.others: list[subprocess.Popen[bytes]] = []
        logs.mkdir(parents=True, exist_ok=True)

    def start(self, state_dir: Path, env: dict[str, str]) -> Controller:
        """A controller (blocks until it listens: call it on a worker thread)."""
        log = self.logs / f"controller-{len(self.controllers) + 1}.log"
        ctl = Controller(state_dir, self.hostd_socket, env, token=self.token, log_path=log)
        self.controllers.append(ctl)
        return ctl

    def start_peer(self, database_url: str) -> tuple[int, str] | None:
        """a2a-sdk's server on ``database_url``: its pid and URL (None if it did not start)."""
        port = free_port()
        argv = [sys.executable, str(ROOT / "bench" / "peer_a2a_server.py"), str(port), "--database-url", database_url]
        with open(self.logs / "peer.log", "ab") as log:
            proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=log, cwd=ROOT)
        self.others.append(proc)
        assert proc.stdout is not None
        if proc.stdout.readline().strip() != b"ready":
            return None
        return proc.pid, f"http://127.0.0.1:{port}/agents/peer"

    def stop_all(self) -> None:
        for ctl in self.controllers:
            if ctl.proc.poll() is None:
                ctl.proc.send_signal(signal.SIGTERM)  # all at once: each releases its claims
        for ctl in self.controllers:
            ctl.stop()
        self.stop_peers()

    def stop_peers(self) -> None:
        for proc in self.others:
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(5)
            if proc.stdout is not None:
                proc.stdout.close()

    def tails(self) -> str:
        """The ends of the newest controllers' logs (for a failed run)."""
        return "\n".join(f"== {c.log_path.name}\n{c.log()[-2000:]}" for c in self.controllers[-4:])

    def hostd_log_tail(self) -> str:
        return self.hostd.log()[-4000:]


def tree_pids(pid: int) -> list[int]:
    """``pid`` and its children (the PostgreSQL server: the postmaster and its backends)."""
    try:
        return [pid, *(p.pid for p in psutil.Process(pid).children(recursive=True))]
    except psutil.Error:
        return [pid]


def cpu_snapshot(groups: dict[str, Callable[[], list[int]]]) -> dict[str, dict[int, int]]:
    return {name: {pid: on_cpu_ns(pid) for pid in pids()} for name, pids in groups.items()}


def cpu_per_task(before: dict[str, dict[int, int]], after: dict[str, dict[int, int]], ops: int) -> dict[str, float]:
    """µs per task of each group (a process that started meanwhile counts from 0; one that ended
    meanwhile, as a PostgreSQL backend may, is lost)."""
    return {
        name: sum(ns - before[name].get(pid, 0) for pid, ns in now.items()) / ops / 1e3 for name, now in after.items()
    }


class Figures:
    """What goes below the table: on-CPU per task of each case's processes over its ``--clients``
    run, and per second while idle (no task) before it, in µs."""

    def __init__(self) -> None:
        self.busy: dict[str, dict[str, float]] = {}
        self.idle: dict[str, dict[str, float]] = {}

    def notes(self, clients: int, idle_s: float) -> list[str]:
        out = []
        for case, used in self.busy.items():
            parts = [f"{name} {us:,.0f} µs" for name, us in used.items()]
            if "controllers" in used:
                parts.append(f"controllers + hostd {used['controllers'] + used['hostd']:,.0f} µs")
            out.append(f"on-CPU per task, {case}, {plural(clients, 'client')}: " + ", ".join(parts))
        for case, used in self.idle.items():
            parts = [f"{name} {us / 1000:,.1f} ms/s" for name, us in used.items()]
            out.append(f"on-CPU while idle ({idle_s:g} s, no task), {case}: " + ", ".join(parts))
        return out


async def send_case(
    name: str, bases: Sequence[str], headers: dict[str, str], args: argparse.Namespace, groups: dict[str, Any]
) -> tuple[Result, Result, dict[str, float]]:
    """Blocking sends at ``bases`` (agent URLs): from one client at the first, and from
    ``--clients`` clients round-robin over all; the on-CPU per task of ``groups`` over the latter."""
    n, total = args.clients, args.requests
    async with AsyncExitStack() as stack:

        async def client(base: str) -> httpx.AsyncClient:
            return await stack.enter_async_context(httpx.AsyncClient(base_url=base, headers=headers, timeout=60))

        one = [await client(bases[0])]
        many = [await client(bases[i % len(bases)]) for i in range(n)]
        for c in [*one, *many]:
            for _ in range(args.warmup):
                await send_one(c)
        samples, wall = await run_concurrent(one, total, send_one)
        row1 = latency_result(f"{name}, 1 client", samples, wall_s=wall, unit="tasks/s")
        before = cpu_snapshot(groups)
        samples, wall = await run_concurrent(many, total, send_one)
        cpu = cpu_per_task(before, cpu_snapshot(groups), total)
    rowN = latency_result(f"{name}, {plural(n, 'client')}", samples, wall_s=wall, unit="tasks/s")
    return row1, rowN, cpu


async def start_controllers(fleet: Fleet, count: int, state_dir: Path, env: dict[str, str]) -> list[Controller]:
    started = [await trio.to_thread.run_sync(fleet.start, state_dir, env) for _ in range(count)]
    for ctl in started:
        async with admin_client(ctl.url, ctl.token) as probe:
            await wait_ready(probe)
    return started


async def controllers_case(
    fleet: Fleet,
    name: str,
    count: int,
    state_dir: Path,
    env: dict[str, str],
    args: argparse.Namespace,
    pg: Any,
    figures: Figures,
) -> tuple[Result, Result]:
    """``count`` controllers on one store: the echo instance provisioned at the first, their idle
    on-CPU, the sends, the instance decommissioned and the controllers stopped."""
    started = await start_controllers(fleet, count, state_dir, env)
    async with admin_client(started[0].url, fleet.token) as admin:
        instance_id = await admin_provision_loadout(admin, f"bench-echo-{state_dir.parent.name}", "echo")
        bases = [f"{ctl.url}/agents/{instance_id}" for ctl in started]
        a2a = {"Authorization": f"Bearer {fleet.token}", "A2A-Version": "1.0", "A2A-Extensions": RUNTIME_EXTENSION}
        groups: dict[str, Callable[[], list[int]]] = {"controllers": lambda: [c.proc.pid for c in started]}
        groups["hostd"] = lambda: [fleet.hostd_pid]
        if pg is not None:
            groups["PostgreSQL"] = lambda: tree_pids(pg.postmaster)
        await trio.sleep(0.5)  # past the start's own work
        before = cpu_snapshot(groups)
        await trio.sleep(args.idle_s)
        figures.idle[name] = {g: us / args.idle_s for g, us in cpu_per_task(before, cpu_snapshot(groups), 1).items()}
        row1, rowN, figures.busy[name] = await send_case(name, bases, a2a, args, groups)
        await admin_decommission(admin, instance_id, 0.01)
    for ctl in started:
        await trio.to_thread.run_sync(ctl.stop)
    return row1, rowN


class Follower:
    """B's SSE subscriber: each ``tick`` line of the task's stdout, with when it arrived."""

    def __init__(self) -> None:
        self.lines: list[tuple[int, int, int]] = []  # (counter, printed at ns, arrived perf ns)
        self.text = ""
        self.ended = trio.Event()

    async def run(self, client: httpx.AsyncClient, task_id: str) -> None:
        try:
            async with client.stream("POST", f"/tasks/{task_id}:subscribe") as response:
                if response.status_code != 200:
                    raise RuntimeError(f":subscribe: {response.status_code} {(await response.aread())[:300]!r}")
                async for line in response.aiter_lines():
                    if line.startswith("data: "):
                        self.take(json.loads(line[6:]), time.perf_counter_ns())
        finally:
            self.ended.set()

    def take(self, event: dict[str, Any], arrived: int) -> None:
        if "task" in event:
            artifacts = event["task"].get("artifacts", [])
        elif "artifactUpdate" in event:
            artifacts = [event["artifactUpdate"]["artifact"]]
        else:
            return
        stdout = [a for a in artifacts if a.get("artifactId") == "stdout"]
        self.text += "".join(p.get("text", "") for a in stdout for p in a["parts"])
        *complete, self.text = self.text.split("\n")
        for line in complete:
            if match := LINE.fullmatch(line.strip()):
                counter, secs, frac = match.groups()
                self.lines.append((int(counter), int(secs) * 10**9 + int(frac.ljust(9, "0")[:9]), arrived))

    def first_after(self, wall_ns: int) -> int | None:
        return next((arrived for _, printed, arrived in self.lines if printed > wall_ns), None)

    def intact(self) -> bool:
        """Each line once, none missing (from the first the subscriber showed)."""
        counters = [c for c, _, _ in self.lines]
        return counters == list(range(1, len(counters) + 1))


async def cancel(client: httpx.AsyncClient, task_id: str, failures: list[str]) -> int:
    """Cancel the round's task (it would print on for a minute); the answers refused on the way
    (tried up to 5 times: each refusal is reported, not fatal to the run)."""
    for attempt in range(5):
        answer = await client.post(f"/tasks/{task_id}:cancel", json={"id": task_id})
        if answer.status_code == 200:
            return attempt
        if attempt and answer.status_code == 400 and "TASK_NOT_CANCELABLE" in answer.text:
            return attempt  # an earlier try got through after all (its answer was the refusal)
        failures.append(f"{answer.status_code} {answer.text[:300]}")
        print(f"cancel at B refused: {failures[-1]}", file=sys.stderr)
        await trio.sleep(0.2)
    raise RuntimeError(f"cancel at B: {failures[-1]}")


def controller_id(ctl: Controller) -> str | None:
    match = re.search(r"controller (\S+): store is", ctl.log())
    return match.group(1) if match else None


async def takeover_rounds(
    fleet: Fleet, state_dir: Path, env: dict[str, str], args: argparse.Namespace, pg: Any, db: str
) -> tuple[list[int], list[int], dict[str, str]]:
    """Kill to first newer line at B, per round whose task A held; start to ready of each fresh A;
    what the rounds checked."""
    ttl = args.lease_ttl_s or DEFAULT_TTL_S
    lines = int((5 * ttl + 40) / TICK_S)  # outlives a takeover that fails, ends by itself
    script = f'i=0; while [ $i -lt {lines} ]; do i=$((i+1)); echo "tick $i ${{EPOCHREALTIME:-$(date +%s.%N)}}"; '
    script += f"sleep {TICK_S}; done"
    rng = random.Random(args.seed)
    [b] = await start_controllers(fleet, 1, state_dir, env)
    async with admin_client(b.url, fleet.token) as admin:
        instance_id = await admin_provision_loadout(admin, "bench-takeover", "shell")
    takeovers: list[int] = []
    starts: list[int] = []
    owned = intact = refused = 0
    failures: list[str] = []
    for _ in range(args.kills):
        t0 = time.perf_counter_ns()
        [a] = await start_controllers(fleet, 1, state_dir, env)
        starts.append(time.perf_counter_ns() - t0)
        async with agent_client(a.url, instance_id, fleet.token) as at_a:
            body = {"message": {"messageId": str(uuid.uuid4()), "role": "ROLE_USER", "parts": [{"text": script}]}}
            sent = await at_a.post("/message:send", json={**body, "configuration": {"returnImmediately": True}})
            if sent.status_code != 200:
                raise RuntimeError(f"message:send at A: {sent.status_code} {sent.text[:300]}")
            task_id = sent.json()["task"]["id"]
        follower = Follower()
        async with agent_client(b.url, instance_id, fleet.token) as at_b, trio.open_nursery() as nursery:
            nursery.start_soon(follower.run, at_b, task_id)
            with trio.fail_after(30):
                while len(follower.lines) < 5:  # B shows the task's lines as A stores them
                    await trio.sleep(0.005)
            await trio.sleep(rng.uniform(0, ttl / 4))  # anywhere in A's lease renewal cycle
            owner = await trio.to_thread.run_sync(pg.psql, db, f"SELECT owner FROM tasks WHERE id = '{task_id}'")
            held = owner.strip() == controller_id(a)  # else killing A interrupts nothing: not a sample
            owned += held
            kill_wall, kill_ns = time.time_ns(), time.perf_counter_ns()
            a.proc.kill()
            with trio.fail_after(5 * ttl + 30):
                while (arrived := follower.first_after(kill_wall)) is None:
                    if follower.ended.is_set():
                        raise RuntimeError(f"B's stream of {task_id} ended before a line after the kill")
                    await trio.sleep(0.005)
            if held:
                takeovers.append(arrived - kill_ns)
            refused += await cancel(at_b, task_id, failures)
            with trio.move_on_after(10):
                await follower.ended.wait()
            nursery.cancel_scope.cancel()
        intact += follower.intact()
        await trio.to_thread.run_sync(a.stop)  # reaps it
    async with admin_client(b.url, fleet.token) as admin:
        await admin_decommission(admin, instance_id, 0.01)
    await trio.to_thread.run_sync(b.stop)
    if not takeovers:
        raise RuntimeError("no round's task was held by the controller killed (see the controllers' logs)")
    checks = {"killed_A_held_the_task": f"{owned}/{args.kills}", "B_lines_intact": f"{intact}/{args.kills}"}
    if refused:
        checks["cancels_refused"] = str(refused)
        print(f"bench_controllers: a cancel at B failed {refused} time(s), first: {failures[0]}", file=sys.stderr)
        print(f"hostd's log ends:\n{fleet.hostd_log_tail()}", file=sys.stderr)
    return takeovers, starts, checks


def peer_missing() -> str | None:
    try:
        import a2a.server.routes  # noqa: F401
        import sqlalchemy  # noqa: F401
        import starlette  # noqa: F401
        import uvicorn  # noqa: F401

        if importlib.util.find_spec("asyncpg") is None:  # the driver the SDK's store uses (untyped)
            raise ImportError("no module named 'asyncpg'")
    except ImportError as exc:
        return f"needs a2a-sdk[http-server,postgresql] and uvicorn (pip install -e '.[bench]'): {exc}"
    return None


async def measure(
    fleet: Fleet, tmp: Path, args: argparse.Namespace, pg: Any, figures: Figures, notes: list[str]
) -> list[Result]:
    ones: list[Result] = []
    manys: list[Result] = []
    ttl_env = {"AIWG_LEASE_TTL_S": str(args.lease_ttl_s)} if args.lease_ttl_s else {}

    def add(rows: tuple[Result, Result]) -> None:
        ones.append(rows[0])
        manys.append(rows[1])

    add(await controllers_case(fleet, SQLITE, 1, tmp / "sqlite" / "state", {}, args, None, figures))
    if pg is None:
        return [*ones, *manys]
    for k in COUNTS:
        env = {"AIWG_DATABASE_URL": pg.create_database(f"ctl{k}"), **ttl_env}
        state = tmp / f"pg{k}" / "state"
        add(await controllers_case(fleet, pg_case(k), k, state, env, args, pg, figures))
    if (why := peer_missing()) is not None:
        notes.append(f"{PEER} not measured: {why}")
    elif (peer := await trio.to_thread.run_sync(fleet.start_peer, pg.create_database("peer"))) is None:
        notes.append(f"{PEER} not measured: it did not start (see its log)")
    else:
        groups = {"peer": lambda: [peer[0]], "PostgreSQL": lambda: tree_pids(pg.postmaster)}
        row1, rowN, figures.busy[PEER] = await send_case(PEER, [peer[1]], {"A2A-Version": "1.0"}, args, groups)
        add((row1, rowN))
        await trio.to_thread.run_sync(fleet.stop_peers)
    for row in ones[1:]:
        compare(row, ones[0], "p50")
    for row in manys[1:]:
        compare(row, manys[0], "p50")
    env = {"AIWG_DATABASE_URL": pg.create_database("takeover"), **ttl_env}
    takeovers, starts, checks = await takeover_rounds(fleet, tmp / "takeover" / "state", env, args, pg, "takeover")
    ttl = args.lease_ttl_s or DEFAULT_TTL_S
    kill = latency_result(
        f"takeover: SIGKILL of A -> next line at B's subscriber (2 controllers, lease TTL {ttl:g} s)",
        takeovers,
        unit="kills/s",
        max_ms=round(max(takeovers) / 1e6),
        min_ms=round(min(takeovers) / 1e6),
    )
    kill.extra.update(checks)
    kill.throughput = None
    start = latency_result("a fresh controller: start -> /readyz 200", starts, unit="starts/s")
    start.throughput = None
    return [*ones, *manys, compare(kill, start, "p50"), start]


async def until_terminated(
    fleet: Fleet, tmp: Path, args: argparse.Namespace, pg: Any, figures: Figures, notes: list[str]
) -> list[Result]:
    """:func:`measure`, ended by a SIGTERM as by a Ctrl-C (KeyboardInterrupt from the main task,
    where trio delivers it cleanly; a Python handler raising it could land inside trio's loop)."""
    terminated = False
    async with trio.open_nursery() as nursery:

        async def watch() -> None:
            nonlocal terminated
            with trio.open_signal_receiver(signal.SIGTERM) as signals:
                async for _ in signals:
                    terminated = True
                    nursery.cancel_scope.cancel()

        nursery.start_soon(watch)
        results = await measure(fleet, tmp, args, pg, figures, notes)
        nursery.cancel_scope.cancel()
    if terminated:
        raise KeyboardInterrupt
    return results


def targets(results: list[Result], cpu: dict[str, dict[str, float]], args: argparse.Namespace) -> list[Target]:
    by = {r.case: r for r in results}
    n = plural(args.clients, "client")
    out: list[Target] = []
    one, three = cpu.get(pg_case(1)), cpu.get(pg_case(3))
    if one and three:
        total1, total3 = one["controllers"] + one["hostd"], three["controllers"] + three["hostd"]
        alone = three["controllers"] / one["controllers"]
        out.append(
            Target(
                description="on-CPU per task (controllers summed + hostd) with 3 controllers within 1.25x of 1's",
                measured=f"{total3:,.0f} µs vs {total1:,.0f} µs ({total3 / total1:.2f}x; controllers alone "
                f"{alone:.2f}x)",
                met=total3 <= 1.25 * total1,
            )
        )
    kill = next((r for r in results if r.case.startswith("takeover")), None)
    if kill is not None and kill.p50_us is not None:
        ttl = args.lease_ttl_s or DEFAULT_TTL_S
        out.append(
            Target(
                description=f"takeover p50 under 3 s (lease TTL {ttl:g} s)",
                measured=f"{kill.p50_us / 1e6:.2f} s (max {kill.extra['max_ms']} ms)",
                met=kill.p50_us < 3e6,
            )
        )
    sqlite1, pg1 = by.get(f"{SQLITE}, 1 client"), by.get(f"{pg_case(1)}, 1 client")
    if sqlite1 and pg1 and sqlite1.p50_us and pg1.p50_us:
        ratio = pg1.p50_us / sqlite1.p50_us
        out.append(
            Target(
                description="PostgreSQL single-controller send p50 within 1.5x of SQLite's",
                measured=f"{pg1.p50_us / 1e3:.2f} ms vs {sqlite1.p50_us / 1e3:.2f} ms ({ratio:.2f}x)",
                met=ratio <= 1.5,
            )
        )
    peer1, peerN, pgN = by.get(f"{PEER}, 1 client"), by.get(f"{PEER}, {n}"), by.get(f"{pg_case(1)}, {n}")
    if pg1 and peer1 and pg1.p50_us and peer1.p50_us:
        out.append(
            Target(
                description="1 controller on PostgreSQL: send p50 below a2a-sdk's server on the same database",
                measured=f"{pg1.p50_us / 1e3:.2f} ms vs {peer1.p50_us / 1e3:.2f} ms",
                met=pg1.p50_us < peer1.p50_us,
            )
        )
    if pgN and peerN:
        out.append(
            Target(
                description=f"1 controller on PostgreSQL: tasks/s with {n} above a2a-sdk's server's",
                measured=f"{pgN.throughput or 0:,.0f} vs {peerN.throughput or 0:,.0f} tasks/s",
                met=(pgN.throughput or 0) > (peerN.throughput or 0),
            )
        )
    return out


def main() -> None:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--requests", type=int, help="measured sends per case (default 300; --quick 30)")
    p.add_argument("--warmup", type=int, help="unmeasured sends per client first (default 5; --quick 2)")
    p.add_argument("--clients", type=int, default=8, help="concurrent clients (default 8)")
    p.add_argument("--kills", type=int, help="controllers killed in the takeover case (default 20; --quick 3)")
    p.add_argument("--idle-s", type=float, help="idle on-CPU measured over this long (default 2; --quick 1)")
    p.add_argument("--lease-ttl-s", type=float, help=f"AIWG_LEASE_TTL_S (default: unset, the {DEFAULT_TTL_S:g} s)")
    p.add_argument("--quick", action="store_true", help="a smoke run: few sends and kills")
    args = p.parse_args()
    if args.versions:
        print_versions()
        return
    for name, full, quick in (("requests", 300, 30), ("warmup", 5, 2), ("kills", 20, 3), ("idle_s", 2.0, 1.0)):
        if getattr(args, name) is None:
            setattr(args, name, quick if args.quick else full)
    # A kill of the bench cleans up as a Ctrl-C does: outside trio.run here, inside it in until_terminated.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    pgcluster = load_pgcluster()
    notes: list[str] = []
    # Unwound in reverse: the servers, then the database server, the instances, hostd, the files.
    with ExitStack() as stack:
        tmp = stack.enter_context(temp_dir("aiwg-bench-controllers-"))
        hostd = stack.enter_context(running_hostd(new_session=True))
        stack.callback(_leave_no_instance, hostd.socket_path)
        pg = None
        if (why := pgcluster.missing()) is not None:
            notes.append(f"PostgreSQL cases not measured: {why}")
        else:
            pg = pgcluster.PgCluster()
            stack.callback(pg.remove)
            pg.start()
            pg.postmaster = int((pg.data / "postmaster.pid").read_text().split()[0])
        fleet = Fleet(hostd, tmp / "logs", token=f"bench-{uuid.uuid4().hex}")
        stack.callback(fleet.stop_all)
        figures = Figures()
        try:
            results = trio.run(until_terminated, fleet, tmp, args, pg, figures, notes)
        except Exception:  # a failure (not a Ctrl-C): what the servers said
            print(f"{fleet.tails()}\n== hostd.log\n{fleet.hostd_log_tail()}", file=sys.stderr)
            raise
    ttl = args.lease_ttl_s or DEFAULT_TTL_S
    report = Report(
        bench="bench_controllers",
        title="controllers sharing PostgreSQL vs. one on SQLite and a2a-sdk's server on the same database",
        vs_of="p50",
        params={
            "requests": args.requests,
            "warmup": args.warmup,
            "clients": args.clients,
            "kills": args.kills,
            "idle_s": args.idle_s,
            "lease_ttl_s": f"{ttl:g}" + ("" if args.lease_ttl_s else " (default)"),
        },
        results=results,
        targets=targets(results, figures.busy, args),
        notes=[*notes, *figures.notes(args.clients, args.idle_s)],
    )
    emit(report, as_json=args.json)


def _leave_no_instance(socket_path: Path) -> None:
    try:
        trio.run(_destroy_leftovers, socket_path)
    except Exception as exc:  # hostd is gone: its stop below kills what is left of its tree
        print(f"bench_controllers: could not destroy leftover instances: {exc!r}", file=sys.stderr)


if __name__ == "__main__":
    main()
