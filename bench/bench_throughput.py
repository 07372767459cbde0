"""Output throughput of one session to one subscriber, through hostd vs. reading the PTY directly.

The producer is ``sh -c 'stty raw -echo; sleep 0.2; exec cat FILE'`` where FILE is ``--size``
MiB of generated, repeatable printable text (seeded). Raw mode turns output processing off so
the bytes on the PTY are exactly the file's. The ``sleep`` lets the subscription start (from
seq 1) before the first byte, so nothing is missed for lack of a subscriber.

hostd: ``SessionSubscribeRequest(from_seq=1)`` read until ``SessionExited``; MiB/s is the bytes
received over the time from the first to the last ``SessionOutput``. A subscriber that falls
out of hostd's ring (default 4 MiB / 1000 frames) gets ``SessionLagged``: lag events, frames and
bytes missed are counted and reported (received bytes only count toward MiB/s). A client-side
overflow (``HostdStreamOverflow``) is counted too, and the bench resubscribes where it was.

Baseline, in the same run: the same command on an ``os.openpty`` PTY spawned by the bench,
the master read in a blocking loop (64 KiB reads) until EIO, timed the same way. Direct and
hostd runs alternate.

Target (issue 2): hostd at least half of direct.
"""

from __future__ import annotations

import gc
import random
import shlex
import statistics
import string
import time
from pathlib import Path

import trio
from common import (
    BENCH_INSTANCE,
    MIB,
    DirectPty,
    Report,
    Result,
    Target,
    compare,
    destroy_instance,
    emit,
    parser,
    print_versions,
    provision_instance,
    running_hostd,
    temp_dir,
)

from agentic_sandbox.proto import ErrorCode, HostdClient, HostdRemoteError, HostdStreamOverflow, open_hostd
from agentic_sandbox.proto import messages as m

TARGET_RATIO = 0.5
START_DELAY_S = 0.2
READ_CHUNK = 64 * 1024


def write_data(path: Path, size_mib: int, seed: int) -> int:
    """``size_mib`` MiB of printable lines: a seeded 1 MiB block, repeated."""
    rng = random.Random(seed)
    alphabet = string.ascii_letters + string.digits + string.punctuation + " "
    lines = []
    total = 0
    while total < MIB:
        line = "".join(rng.choices(alphabet, k=rng.randint(20, 120))) + "\n"
        lines.append(line)
        total += len(line)
    block = "".join(lines).encode()[:MIB]
    with open(path, "wb") as f:
        for _ in range(size_mib):
            f.write(block)
    return size_mib * MIB


def producer(path: Path) -> list[str]:
    return ["sh", "-c", f"stty raw -echo; sleep {START_DELAY_S}; exec cat {shlex.quote(str(path))}"]


class Run:
    """One producer run as seen by the consumer."""

    def __init__(self) -> None:
        self.received = 0
        self.frames = 0
        self.first: int | None = None
        self.last: int | None = None
        self.lag_events = 0
        self.frames_missed = 0
        self.overflows = 0
        self.exit_ns: int | None = None

    def got(self, data: bytes) -> None:
        now = time.perf_counter_ns()
        if self.first is None:
            self.first = now
        self.last = now
        self.received += len(data)
        self.frames += 1

    @property
    def mib_s(self) -> float:
        if self.first is None or self.last is None or self.last == self.first:
            return 0.0
        return self.received / MIB / ((self.last - self.first) / 1e9)


async def hostd_run(client: HostdClient, argv: list[str], session_id: str) -> Run:
    run = Run()
    await client.call(m.SessionCreateRequest(instance_id=BENCH_INSTANCE, argv=argv, session_id=session_id))
    try:
        cursor = 1
        while run.exit_ns is None:
            try:
                async with client.stream(m.SessionSubscribeRequest(session_id=session_id, from_seq=cursor)) as events:
                    async for event in events:
                        if isinstance(event, m.SessionOutput):
                            run.got(event.data)
                            cursor = event.seq + 1
                        elif isinstance(event, m.SessionLagged):
                            run.lag_events += 1
                            run.frames_missed += event.resume_seq - event.missed_from
                            cursor = event.resume_seq
                        elif isinstance(event, m.SessionExited):
                            run.exit_ns = time.perf_counter_ns()
            except HostdStreamOverflow:
                run.overflows += 1  # the client's buffer overflowed: resubscribe where we were
            except HostdRemoteError as exc:
                if exc.code != ErrorCode.SEQ_OUT_OF_RANGE.value:
                    raise
                first = int(exc.details["first_seq"])
                run.lag_events += 1
                run.frames_missed += first - cursor
                cursor = first
    finally:
        await client.call(m.SessionDeleteRequest(session_id=session_id))
    return run


def direct_run(argv: list[str]) -> Run:
    run = Run()
    with DirectPty(argv) as child:
        while data := child.read(READ_CHUNK):
            run.got(data)
        run.exit_ns = time.perf_counter_ns()
    return run


async def measure(socket_path: Path, argv: list[str], repeats: int) -> tuple[list[Run], list[Run]]:
    """(hostd runs, direct runs), alternating run by run (a load change hits both alike)."""
    hostd_runs, direct_runs = [], []
    async with open_hostd(socket_path, client_name="bench_throughput") as client:
        await provision_instance(client)
        try:
            for i in range(repeats):
                gc.collect()
                direct_runs.append(direct_run(argv))
                gc.collect()
                hostd_runs.append(await hostd_run(client, argv, f"bench-throughput-{i}"))
        finally:
            await destroy_instance(client)
    return hostd_runs, direct_runs


def summarize(case: str, runs: list[Run], expected: int) -> Result:
    rates = [r.mib_s for r in runs]
    extra: dict[str, object] = {
        "runs_mib_s": [round(x, 1) for x in rates],
        "bytes_per_frame": round(sum(r.received for r in runs) / max(1, sum(r.frames for r in runs))),
    }
    missed = sum(expected - r.received for r in runs)
    lag = sum(r.lag_events for r in runs)
    if lag or missed or any(r.overflows for r in runs):
        extra.update(
            lag_events=lag,
            frames_missed=sum(r.frames_missed for r in runs),
            bytes_missed=missed,
            client_overflows=sum(r.overflows for r in runs),
        )
    return Result(case=case, n=len(runs), throughput=statistics.median(rates), unit="MiB/s", extra=extra)


def main() -> None:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--size", type=int, default=50, help="MiB produced per run (default 50)")
    p.add_argument("--repeats", type=int, default=3, help="runs per case; the median is reported (default 3)")
    p.add_argument("--ring-frames", type=int, default=None, help="hostd AIWG_RING_FRAMES (default: hostd's)")
    p.add_argument("--ring-bytes", type=int, default=None, help="hostd AIWG_RING_BYTES (default: hostd's)")
    args = p.parse_args()
    if args.versions:
        print_versions()
        return
    env = {}
    if args.ring_frames is not None:
        env["AIWG_RING_FRAMES"] = str(args.ring_frames)
    if args.ring_bytes is not None:
        env["AIWG_RING_BYTES"] = str(args.ring_bytes)

    with temp_dir("aiwg-bench-data-") as tmp:
        path = tmp / "data.txt"
        expected = write_data(path, args.size, args.seed)
        argv = producer(path)
        with running_hostd(env) as hostd:
            hostd_runs, direct_runs = trio.run(measure, hostd.socket_path, argv, args.repeats)

    direct = summarize("direct PTY read", direct_runs, expected)
    through_hostd = compare(summarize("hostd subscription", hostd_runs, expected), direct, "throughput")
    ratio = through_hostd.vs or 0.0
    notes = []
    if through_hostd.extra.get("bytes_missed"):
        notes.append("hostd MiB/s counts received bytes only; the subscriber lagged out of the ring")
    report = Report(
        bench="bench_throughput",
        title="output throughput of one session to one subscriber, through hostd vs. the PTY read directly",
        vs_of="throughput",
        params={
            "size_mib": args.size,
            "repeats": args.repeats,
            "ring_frames": args.ring_frames or "default",
            "ring_bytes": args.ring_bytes or "default",
            "seed": args.seed,
        },
        results=[through_hostd, direct],
        targets=[
            Target(
                description=f"hostd throughput at least {TARGET_RATIO:.1f}x direct",
                measured=f"{ratio:.2f}x ({through_hostd.throughput:.0f} vs. {direct.throughput:.0f} MiB/s)",
                met=ratio >= TARGET_RATIO,
            )
        ],
        notes=notes,
    )
    emit(report, as_json=args.json)


if __name__ == "__main__":
    main()
