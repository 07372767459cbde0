"""hostd upgraded in place (same pid, execve) under live sessions: the gap its clients see, losing nothing.

Starts its own hostd and ``python -m controller.main`` (bench_admin's Controller), provisions a host
instance through the admin API and, for each of ``--sessions`` live sessions (default 10 and 100,
the issue's numbers; one in ten floods, the rest are idle ``cat``), upgrades hostd ``--rounds`` times
(``UpgradeRequest``, or ``SIGHUP`` with ``--trigger sighup``) while measuring, in the same run:

* **the gap an attached client sees**: one flooding session (a python loop printing a numbered line
  every ``--flood-ms``) attached through the controller over the attach socket (binary pty-ws/v1,
  joined with ``replay_from=0``), and followed directly on hostd's socket by a ``proto`` subscriber
  that reconnects after ``HostdRestarting`` and subscribes again from its next sequence. A round's
  gap is the longest silence between two output frames that client received from the round's
  start (the upgrade asked for) to its end (output again after the new image answered): the last
  byte before the handover to the first after it. p50 and max over the rounds;
* **nothing lost**: every flood line either client received, over every round, must be the one
  after the last (no gap, no repeat) and every output sequence the one after the last; violations
  are counted and printed, and so is any attach socket that closed or lagged;
* **how much of it is Python start-up**: ``python -c "import agentic_sandbox.hostd.main"`` (the new
  image's import) and ``python -c pass``, timed ``--imports`` times before any session exists; and
  hostd's own figures from its log, per upgrade: quiesce (``quiesced in N ms``: the clients told
  and drained, I/O frozen, the document written) and document to serving (``N ms since the old
  image wrote its document``: the execve, the import and the take-over);
* **what a controller request waits**: ``GET /api/v2/admin/instances/{id}`` (which asks hostd) in a
  loop through every round: the answered requests' latencies (against the same GET with no upgrade
  under way), and the requests that failed, by status and code (503 ``hostd.restarting``, it needed
  hostd at the handover, counted apart from any other failure), the slowest of them and how long
  requests kept failing per upgrade (first failed request sent to last answered).

hostd's pid (and process start time) is printed before and after: one process throughout.
Targets (issue 26): gap under 1 s p50 with 100 sessions; 0 bytes lost. Everything started is
stopped and removed on the way out, also on Ctrl-C (hostd runs in a session of its own, so a
Ctrl-C at the terminal reaches the bench only and hostd is still there to destroy its instances).
"""

from __future__ import annotations

import bisect
import itertools
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx
import psutil
import trio
from bench_admin import API, Controller, admin_client, admin_provision, wait_ready
from bench_controllers import _leave_no_instance
from bench_pty_ws import OUTPUT, Api, frame, ws_open
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
    percentile,
    print_versions,
    running_hostd,
)
from trio_websocket import ConnectionClosed, HandshakeError, WebSocketConnection

from agentic_sandbox.proto import HostdError, HostdRestarting, open_hostd
from agentic_sandbox.proto import messages as m

#: A numbered line every ``{tick}`` s; the PTY shows each newline as CR LF.
FLOOD = (
    "import sys, time\n"
    "i = 0\n"
    "while True:\n"
    "    sys.stdout.write('line %07d\\n' % i)\n"
    "    sys.stdout.flush()\n"
    "    i += 1\n"
    "    time.sleep({tick})\n"
)
LINE = re.compile(rb"line (\d{7})")
#: How long a client may wait for output after the new image answered before the round is written off.
RESUME_TIMEOUT_S = 20.0
IMPORT = "import agentic_sandbox.hostd.main"
QUIESCED = re.compile(r"upgrade: handing over (\d+) sessions .* \(quiesced in (\d+) ms\)")
SERVING = re.compile(r"upgrade (\d+) in place done: (\d+) ms since the old image wrote its document")


def say(stage: str) -> None:
    print(f"bench_upgrade: {stage}...", file=sys.stderr, flush=True)


class Receiver:
    """What one client received of the flood: arrival times, sequences and lines checked."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.arrivals: list[int] = []
        self.next_seq = 1
        self.tail = b""
        self.last_line = -1
        self.lines = 0
        self.bytes = 0
        self.problems: list[str] = []
        #: Frames other than output and pings (lags, errors, goodbyes), by op and kind.
        self.other: Counter[str] = Counter()
        self.closed: str | None = None
        self.reconnects: Counter[str] = Counter()

    def output(self, seq: int, data: bytes) -> None:
        self.arrivals.append(time.perf_counter_ns())
        if seq != self.next_seq:
            self.problems.append(f"seq {seq} where {self.next_seq} was next")
        self.next_seq = seq + 1
        self.bytes += len(data)
        *lines, self.tail = (self.tail + data).split(b"\r\n")
        for line in lines:
            match = LINE.fullmatch(line)
            if match is None:
                self.problems.append(f"unexpected line {line[:40]!r}")
                continue
            n = int(match[1])
            if n != self.last_line + 1:
                what = "repeat" if n <= self.last_line else "gap"
                self.problems.append(f"{what}: line {n} after line {self.last_line}")
            self.last_line = n
            self.lines += 1

    def after(self, t_ns: int) -> bool:
        return bool(self.arrivals) and self.arrivals[-1] > t_ns

    def gap_ns(self, t0: int, t1: int) -> int:
        """The longest silence between two arrivals from ``t0`` to ``t1`` (the one before ``t0``
        included: the silence may have begun before the upgrade was asked for)."""
        lo = max(bisect.bisect_right(self.arrivals, t0) - 1, 0)
        hi = bisect.bisect_right(self.arrivals, t1)
        window = self.arrivals[lo:hi]
        return max((b - a for a, b in itertools.pairwise(window)), default=0)


async def follow_ws(api: Api, sid: str, rx: Receiver, *, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
    """The attach socket (binary pty-ws/v1), joined from sequence 1, read until it closes."""
    try:
        async with ws_open(api, sid) as ws:
            await ws.send_message(frame("pty.join_session", {"role": "observer"}, replay_from=0))
            task_status.started()
            while True:
                await _ws_frame(ws, rx)
    except ConnectionClosed as exc:
        reason = exc.reason
        rx.closed = f"closed {reason.code} {reason.reason or ''}".strip() if reason else "closed"
    except (HandshakeError, OSError) as exc:
        rx.closed = f"failed: {exc!r}"


async def _ws_frame(ws: WebSocketConnection, rx: Receiver) -> None:
    message = await ws.get_message()
    if isinstance(message, bytes):
        magic, seq, _ = OUTPUT.unpack_from(message)
        if magic == b"PW1O":
            rx.output(seq, message[OUTPUT.size :])
        else:
            rx.other[f"binary {magic!r}"] += 1
        return
    parsed = json.loads(message)
    op = parsed.get("op")
    if op == "ping":
        await ws.send_message(frame("pong", {"client_ts": parsed["payload"]["client_ts"]}))
    elif op == "pty.session_frame":
        kind = parsed["payload"].get("kind")
        if kind not in ("Keyframe", "RoleAssigned", "MembershipChanged", "Resize"):
            rx.other[f"{op} {kind}"] += 1
    elif op != "binding_hello":
        rx.other[str(op)] += 1
        if op == "pty.error":
            rx.problems.append(f"attach socket error: {parsed.get('payload')}")


async def follow_direct(
    socket_path: Path, sid: str, rx: Receiver, *, task_status: Any = trio.TASK_STATUS_IGNORED
) -> None:
    """A ``proto`` subscriber following the session by sequence, reconnecting after each handover."""
    started = False
    while True:
        try:
            async with open_hostd(socket_path, client_name="bench_upgrade", connect_timeout=RESUME_TIMEOUT_S) as client:
                request = m.SessionSubscribeRequest(session_id=sid, from_seq=rx.next_seq)
                async with client.stream(request) as events:
                    if not started:
                        started = True
                        task_status.started()
                    async for event in events:
                        if isinstance(event, m.SessionOutput):
                            rx.output(event.seq, event.data)
                        elif isinstance(event, m.SessionLagged):
                            rx.problems.append(f"lagged: {event}")
                            rx.next_seq = event.resume_seq
                        elif isinstance(event, m.SessionExited):
                            rx.closed = "session exited"
                            return
            rx.closed = "stream ended"
            return
        except HostdRestarting:
            rx.reconnects["hostd.restarting"] += 1
        except HostdError as exc:  # not what an upgrade does: counted, and the client goes on
            rx.reconnects[type(exc).__name__] += 1
            rx.problems.append(f"connection failed: {exc!r}")
            await trio.sleep(0.05)


class Gets:
    """``GET /instances/{id}`` in a loop while ``running``: each request's latency and outcome."""

    def __init__(self) -> None:
        self.latencies_ns: list[int] = []
        self.outcomes: Counter[str] = Counter()
        #: The first ``detail`` each failure came with.
        self.details: dict[str, str] = {}
        #: (sent, answered) of each failed request, perf_counter ns (not in ``latencies_ns``).
        self.failures: list[tuple[int, int]] = []

    async def loop(self, client: httpx.AsyncClient, path: str, stop: trio.Event) -> None:
        while not stop.is_set():
            await self.one(client, path)

    async def one(self, client: httpx.AsyncClient, path: str) -> None:
        t0 = time.perf_counter_ns()
        try:
            response = await client.get(path)
        except httpx.HTTPError as exc:
            key, detail = f"transport error {type(exc).__name__}", str(exc)
        else:
            if response.status_code == 200:
                self.latencies_ns.append(time.perf_counter_ns() - t0)
                self.outcomes["200"] += 1
                return
            try:
                body = response.json()
            except ValueError:
                body = {}
            key, detail = f"{response.status_code} {body.get('code', '')}".strip(), str(body.get("detail", ""))
        t1 = time.perf_counter_ns()
        self.outcomes[key] += 1
        self.details.setdefault(key, detail)
        self.failures.append((t0, t1))

    def failed(self) -> Counter[str]:
        return Counter({k: v for k, v in self.outcomes.items() if k != "200"})

    def slowest_failure_ns(self) -> int:
        return max((t1 - t0 for t0, t1 in self.failures), default=0)

    def failing_ns(self, t0: int, t1: int) -> int:
        """From the first failed request sent after ``t0`` to the last one answered before ``t1``."""
        inside = [f for f in self.failures if t0 <= f[0] and f[1] <= t1]
        return inside[-1][1] - inside[0][0] if inside else 0


async def status(socket_path: Path) -> m.StatusResponse:
    async with open_hostd(socket_path, client_name="bench_upgrade", connect_timeout=RESUME_TIMEOUT_S) as client:
        response: m.StatusResponse = await client.call(m.StatusRequest())
        return response


async def upgrade(hostd: Hostd, trigger: str) -> None:
    """Ask for one upgrade: the RPC (answered before the handover) or SIGHUP."""
    if trigger == "sighup":
        assert hostd.proc is not None
        os.kill(hostd.proc.pid, signal.SIGHUP)
        return
    async with open_hostd(hostd.socket_path, client_name="bench_upgrade", connect_timeout=RESUME_TIMEOUT_S) as c:
        await c.call(m.UpgradeRequest(), timeout=120)


async def wait_upgrades(socket_path: Path, count: int) -> m.StatusResponse:
    """Once hostd reports ``count`` upgrades (a connect waits in the socket's backlog meanwhile)."""
    with trio.fail_after(120):
        while True:
            try:
                answer = await status(socket_path)
                if answer.upgrades >= count:
                    return answer
            except HostdError:
                pass  # cut by the handover: ask the new image
            await trio.sleep(0.02)


class Phase:
    """One session count's rounds."""

    def __init__(self, sessions: int) -> None:
        self.sessions = sessions
        self.ws = Receiver("attach socket")
        self.direct = Receiver("proto subscriber")
        self.ws_gaps: list[int] = []
        self.direct_gaps: list[int] = []
        self.gets = Gets()
        #: Per round: how long admin GETs failed (first failure sent to last answered).
        self.failing: list[int] = []
        self.timeouts: list[str] = []


async def run_phase(hostd: Hostd, api: Api, args: Any, sessions: int, upgrades_before: int) -> Phase:
    phase = Phase(sessions)
    floods = max(1, sessions // 10)
    flood = [sys.executable, "-c", FLOOD.format(tick=args.flood_ms / 1000)]
    say(f"{sessions} sessions ({floods} flooding)")
    sids = [(await api.session(flood))["id"] for _ in range(floods)]
    sids += [(await api.session(["cat"]))["id"] for _ in range(sessions - floods)]
    path = f"{API}/instances/{api.iid}"
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(follow_ws, api, sids[0], phase.ws)
            await nursery.start(follow_direct, hostd.socket_path, sids[0], phase.direct)
            with trio.fail_after(RESUME_TIMEOUT_S):
                while not (phase.ws.arrivals and phase.direct.arrivals):
                    await trio.sleep(0.01)
            await trio.sleep(args.settle_s)
            for round_ in range(args.rounds):
                say(f"{sessions} sessions: upgrade {round_ + 1}/{args.rounds}")
                stop = trio.Event()
                nursery.start_soon(phase.gets.loop, api.client, path, stop)
                t0 = time.perf_counter_ns()
                await upgrade(hostd, args.trigger)
                await wait_upgrades(hostd.socket_path, upgrades_before + round_ + 1)
                served = time.perf_counter_ns()
                with trio.move_on_after(RESUME_TIMEOUT_S) as scope:
                    while not (phase.ws.after(served) and phase.direct.after(served)):
                        await trio.sleep(0.005)
                if scope.cancelled_caught:
                    phase.timeouts.append(
                        f"round {round_ + 1}: no output within {RESUME_TIMEOUT_S:g} s after the new image answered"
                        f" (attach socket {'ok' if phase.ws.after(served) else 'silent'},"
                        f" proto subscriber {'ok' if phase.direct.after(served) else 'silent'})"
                    )
                t1 = time.perf_counter_ns()
                stop.set()
                phase.ws_gaps.append(phase.ws.gap_ns(t0, t1))
                phase.direct_gaps.append(phase.direct.gap_ns(t0, t1))
                phase.failing.append(phase.gets.failing_ns(t0, t1))
                await trio.sleep(args.settle_s)
            nursery.cancel_scope.cancel()
    finally:
        with trio.CancelScope(shield=True), trio.move_on_after(30):
            await delete_sessions(hostd.socket_path, sids)
    return phase


async def delete_sessions(socket_path: Path, sids: list[str]) -> None:
    """Delete the phase's sessions (kills them), again on a new connection if an upgrade cuts it (a
    Ctrl-C may come mid-upgrade); what is left then goes with the instance on the way out."""
    left = list(sids)
    for _attempt in range(3):
        try:
            async with open_hostd(socket_path, client_name="bench_upgrade", connect_timeout=20) as client:
                while left:
                    await client.call(m.SessionDeleteRequest(session_id=left[0]))
                    left.pop(0)
            return
        except HostdRestarting:
            continue
        except HostdError as exc:
            print(f"bench_upgrade: could not delete the sessions: {exc!r}", file=sys.stderr)
            return


def time_imports(count: int) -> tuple[list[int], list[int]]:
    """``python -c pass`` and ``python -c 'import agentic_sandbox.hostd.main'``, taking turns (one
    unmeasured first: the page cache and the bytecode are warm for the new image too)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out: tuple[list[int], list[int]] = ([], [])
    for i in range(count + 1):
        for samples, code in zip(out, ("pass", IMPORT), strict=True):
            t0 = time.perf_counter_ns()
            subprocess.run([sys.executable, "-c", code], env=env, cwd=ROOT, check=True)
            if i:
                samples.append(time.perf_counter_ns() - t0)
    return out


def hostd_figures(log_path: Path) -> tuple[dict[int, int], dict[int, int]]:
    """Per upgrade (1, 2, ...): quiesce ms and document-to-serving ms, from hostd's log."""
    text = log_path.read_text(errors="replace")
    quiesced = {i + 1: int(match[2]) for i, match in enumerate(QUIESCED.finditer(text))}
    serving = {int(match[1]): int(match[2]) for match in SERVING.finditer(text)}
    return quiesced, serving


def _p50(values: list[int]) -> float:
    """The p50 the table prints (nearest rank), for the notes and targets."""
    return percentile(sorted(values), 50)


def _ms(ns: float) -> str:
    return f"{ns / 1e6:,.0f} ms"


def _gap_row(case: str, samples: list[int], baseline: Result) -> Result:
    row = latency_result(case, samples, unit="upgrades/s", max=_ms(max(samples)))
    row.throughput = None  # rounds are paced by --settle-s: no rate to speak of
    return compare(row, baseline, "p50")


async def measure(hostd: Hostd, ctl: Controller, args: Any) -> Report:
    assert hostd.proc is not None
    say("python start-up")
    bare_ns, import_ns = time_imports(args.imports)
    bare = latency_result("python -c pass", bare_ns, unit="starts/s")
    imported = latency_result(f'python -c "{IMPORT}"', import_ns, unit="starts/s")
    compare(bare, imported, "p50")

    client = admin_client(ctl.url, ctl.token)
    try:
        await wait_ready(client)
        before = await status(hostd.socket_path)
        proc_started = psutil.Process(hostd.proc.pid).create_time()
        iid = await admin_provision(client, "upgrade", 0.02)
        api = Api(ctl, client, iid)

        say("admin GET, no upgrade under way")
        idle = Gets()
        for _ in range(args.gets):
            await idle.one(client, f"{API}/instances/{iid}")

        phases: list[Phase] = []
        upgrades = before.upgrades
        for sessions in args.sessions:
            phases.append(await run_phase(hostd, api, args, sessions, upgrades))
            upgrades += args.rounds
        after = await status(hostd.socket_path)
        proc_after = psutil.Process(hostd.proc.pid).create_time()
    finally:
        await client.aclose()

    quiesced, serving = hostd_figures(hostd.log_path)
    idle_row = latency_result("admin GET, no upgrade under way", idle.latencies_ns, unit="req/s")
    results = [imported, bare]
    notes: list[str] = []
    first = before.upgrades + 1
    for phase in phases:
        n = phase.sessions
        ws_row = _gap_row(f"gap at the attach socket, {n} sessions", phase.ws_gaps, imported)
        direct_row = _gap_row(f"gap at a proto subscriber, {n} sessions", phase.direct_gaps, imported)
        numbers = range(first, first + args.rounds)
        first += args.rounds
        hostd_rows = []
        for label, figures in (("quiesce", quiesced), ("document to serving", serving)):
            samples = [figures[i] * 1_000_000 for i in numbers if i in figures]
            if samples:
                row = latency_result(f"hostd's log: {label}, {n} sessions", samples, max=_ms(max(samples)))
                row.throughput = None
                hostd_rows.append(compare(row, imported, "p50"))
        gets_case = f"admin GET answered across upgrades, {n} sessions"
        gets_extra: dict[str, object] = {
            "failed": dict(phase.gets.failed()) or 0,
            "slowest_failure": _ms(phase.gets.slowest_failure_ns()),
            "failing_per_upgrade": f"p50 {_ms(_p50(phase.failing))}, max {_ms(max(phase.failing))}",
        }
        if phase.gets.latencies_ns:
            gets_row = latency_result(gets_case, phase.gets.latencies_ns)
            gets_row.extra = {"max": _ms(max(phase.gets.latencies_ns)), **gets_extra}
            gets_row.throughput = None
        else:
            gets_row = Result(case=gets_case, n=0, extra=gets_extra)
        results += [ws_row, direct_row, *hostd_rows, compare(gets_row, idle_row, "p50")]
        parts = [quiesced.get(i, 0) + serving.get(i, 0) for i in numbers]
        notes.append(
            f"{n} sessions: attach socket gap p50 {_ms(_p50(phase.ws_gaps))}, of which hostd's own"
            f" quiesce + document to serving p50 {_p50(parts):.0f} ms, and in that the new image's"
            f" import alone p50 {_ms((imported.p50_us or 0) * 1e3)}"
        )
        notes += phase.timeouts
    results.append(idle_row)

    receivers = [(p.sessions, p.ws) for p in phases] + [(p.sessions, p.direct) for p in phases]
    for n, rx in receivers:
        if rx.other:
            notes.append(f"{rx.name}, {n} sessions: other frames {dict(rx.other)}")
        if rx.problems:
            shown = "; ".join(rx.problems[:5]) + (f" (+{len(rx.problems) - 5} more)" if len(rx.problems) > 5 else "")
            notes.append(f"{rx.name}, {n} sessions: {shown}")
    for phase in phases:
        notes.append(
            f"proto subscriber, {phase.sessions} sessions: reconnected {dict(phase.direct.reconnects)}"
            f" over {args.rounds} upgrades"
        )
    all_gets = Gets()
    for phase in phases:
        all_gets.outcomes.update(phase.gets.outcomes)
    for phase in phases:
        all_gets.details.update(phase.gets.details)
    restarting = sum(v for k, v in all_gets.outcomes.items() if k.startswith("503") and "hostd.restarting" in k)
    other_failures = {k: v for k, v in all_gets.failed().items() if "hostd.restarting" not in k}
    notes.append(
        f"admin GETs across upgrades: {sum(all_gets.outcomes.values())} requests,"
        f" {all_gets.outcomes['200']} answered 200,"
        f" {restarting} 503 hostd.restarting, other failures {other_failures or 'none'}"
    )
    for key, detail in all_gets.details.items():
        notes.append(f"admin GET failure {key!r}, first detail: {detail}")
    notes.append(
        f"hostd pid {before.pid} (process started {proc_started:.2f}) before, pid {after.pid} (started"
        f" {proc_after:.2f}) after; upgrades {before.upgrades} -> {after.upgrades}"
    )
    notes.append(
        "a round's gap: the longest silence between two output frames the client received from the upgrade"
        " asked for until output again after the new image answered (the flood prints a line every"
        f" {args.flood_ms:g} ms)"
    )

    largest = max(phases, key=lambda p: p.sessions)
    targets = []
    for label, gaps in (("an attached WebSocket client", largest.ws_gaps), ("a proto subscriber", largest.direct_gaps)):
        p50 = _p50(gaps)
        targets.append(
            Target(
                description=f"gap {label} sees, p50 < 1 s with {largest.sessions} sessions",
                measured=f"p50 {_ms(p50)}, max {_ms(max(gaps))}",
                met=p50 < 1e9,
            )
        )
    for name, rxs in (("attach socket", [p.ws for p in phases]), ("proto subscriber", [p.direct for p in phases])):
        problems = sum(len(rx.problems) for rx in rxs)
        lines = sum(rx.lines for rx in rxs)
        targets.append(
            Target(
                description=f"0 bytes lost at the {name}: flood lines and sequences consecutive across every upgrade",
                measured=f"{lines:,} lines ({sum(rx.bytes for rx in rxs):,} bytes) checked, {problems} violations",
                met=problems == 0 and lines > 0,
            )
        )
    closed = [f"{p.sessions} sessions: {p.ws.closed}" for p in phases if p.ws.closed]
    targets.append(
        Target(
            description="the attach socket stayed open across every upgrade",
            measured="; ".join(closed) or f"open through {args.rounds * len(phases)} upgrades",
            met=not closed and not any(p.timeouts for p in phases),
        )
    )
    targets.append(
        Target(
            description="admin GETs: none failed but 503 hostd.restarting",
            measured=f"{restarting} hostd.restarting, other failures {other_failures or 'none'}",
            met=not other_failures,
        )
    )
    same = (before.pid, proc_started) == (after.pid, proc_after) == (hostd.proc.pid, proc_started)
    targets.append(
        Target(
            description="one hostd process throughout",
            measured=f"pid {before.pid} -> {after.pid}, {after.upgrades - before.upgrades} upgrades in place",
            met=same and after.upgrades - before.upgrades == args.rounds * len(phases),
        )
    )
    return Report(
        bench="bench_upgrade",
        title="hostd upgraded in place under live sessions: client gap, lost bytes, requests waiting",
        vs_of="p50",
        params={
            "sessions": ",".join(map(str, args.sessions)),
            "rounds": args.rounds,
            "trigger": args.trigger,
            "flood_ms": args.flood_ms,
            "imports": args.imports,
        },
        results=results,
        targets=targets,
        notes=notes,
    )


def main() -> None:
    p = parser(__doc__.splitlines()[0])
    p.add_argument(
        "--sessions",
        type=lambda s: [int(x) for x in s.split(",")],
        default=[10, 100],
        help="live sessions per phase, one in ten flooding (default 10,100)",
    )
    p.add_argument("--rounds", type=int, help="upgrades per session count (default 10; --quick 3)")
    p.add_argument("--imports", type=int, help="python start-ups timed (default 10; --quick 3)")
    p.add_argument("--gets", type=int, help="admin GETs timed with no upgrade under way (default 200; --quick 50)")
    p.add_argument("--trigger", choices=("rpc", "sighup"), default="rpc", help="UpgradeRequest (default) or SIGHUP")
    p.add_argument("--flood-ms", type=float, default=5.0, help="a flood line every this many ms (default 5)")
    p.add_argument("--settle-s", type=float, default=0.5, help="live output between upgrades (default 0.5)")
    p.add_argument("--quick", action="store_true", help="a smoke run: 3 upgrades per session count")
    args = p.parse_args()
    if args.versions:
        print_versions()
        return
    for name, full, quick in (("rounds", 10, 3), ("imports", 10, 3), ("gets", 200, 50)):
        if getattr(args, name) is None:
            setattr(args, name, quick if args.quick else full)
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    with ExitStack() as stack:
        # hostd in a session of its own: a Ctrl-C at the terminal leaves it serving for the cleanup
        # to destroy the instance (and its sessions) before it is stopped.
        hostd = stack.enter_context(running_hostd({"AIWG_MAX_SESSIONS": "512"}, new_session=True))
        stack.callback(_leave_no_instance, hostd.socket_path)
        ctl = Controller(hostd.state_dir.parent / "controller", hostd.socket_path)
        stack.callback(ctl.stop)
        report = trio.run(measure, hostd, ctl, args)
    emit(report, as_json=args.json)


if __name__ == "__main__":
    main()
