"""Session start: ``SessionCreateRequest`` + ``SessionSubscribeRequest`` until the first output byte.

Each iteration creates a session running ``--command`` (default ``/bin/echo x``) in the bench
instance, subscribes from seq 1 and stops the clock at the first ``SessionOutput``; then the
session is deleted (outside the clock). The "create reply" column in the extras is the time
until ``SessionCreateResponse`` alone.

Baseline, in the same run: ``os.openpty`` + ``subprocess.Popen`` (new session, slave as
stdio) straight from the bench, clocked from before ``openpty`` to the first byte read from the
master; the child is reaped outside the clock. The two cases alternate iteration by iteration.

Target (issue 2): hostd p50 under 10 ms.
"""

from __future__ import annotations

import gc
import shlex
import time
from pathlib import Path

import trio
from common import (
    BENCH_INSTANCE,
    DirectPty,
    Report,
    Result,
    Target,
    compare,
    destroy_instance,
    emit,
    latency_result,
    parser,
    print_versions,
    provision_instance,
    running_hostd,
)

from agentic_sandbox.proto import HostdClient, open_hostd
from agentic_sandbox.proto import messages as m

TARGET_P50_MS = 10.0


async def hostd_start_once(client: HostdClient, argv: list[str], session_id: str) -> tuple[int, int]:
    """(ns to the first output byte, ns to the create reply) for one new session."""
    t0 = time.perf_counter_ns()
    await client.call(m.SessionCreateRequest(instance_id=BENCH_INSTANCE, argv=argv, session_id=session_id))
    t_created = time.perf_counter_ns()
    t_first = None
    async with client.stream(m.SessionSubscribeRequest(session_id=session_id, from_seq=1)) as events:
        async for event in events:
            if isinstance(event, m.SessionOutput) and event.data:
                t_first = time.perf_counter_ns()
                break
            if isinstance(event, m.SessionExited):
                break
    if t_first is None:
        raise RuntimeError(f"session {session_id} ({argv}) exited without output")
    return t_first - t0, t_created - t0


def direct_start_once(argv: list[str]) -> int:
    """ns from before ``openpty`` to the first byte read from the master."""
    t0 = time.perf_counter_ns()
    with DirectPty(argv) as child:
        data = child.read(1)
        elapsed = time.perf_counter_ns() - t0
    if not data:
        raise RuntimeError(f"{argv} exited without output")
    return elapsed


async def measure(socket_path: Path, argv: list[str], iterations: int, warmup: int) -> tuple[Result, Result]:
    """Both cases, iteration by iteration (so a load change on the host hits both alike)."""
    first_byte: list[int] = []
    created: list[int] = []
    direct: list[int] = []
    async with open_hostd(socket_path, client_name="bench_session_start") as client:
        await provision_instance(client)
        try:
            gc.collect()
            for i in range(warmup + iterations):
                direct_ns = direct_start_once(argv)
                session_id = f"bench-start-{i}"
                try:
                    total, create = await hostd_start_once(client, argv, session_id)
                finally:
                    await client.call(m.SessionDeleteRequest(session_id=session_id))
                if i >= warmup:
                    first_byte.append(total)
                    created.append(create)
                    direct.append(direct_ns)
        finally:
            await destroy_instance(client)
    create_row = latency_result("create", created)
    through_hostd = latency_result(
        "hostd create+subscribe -> first byte",
        first_byte,
        unit="starts/s",
        create_reply_p50_ms=round((create_row.p50_us or 0) / 1000, 2),
        create_reply_p99_ms=round((create_row.p99_us or 0) / 1000, 2),
    )
    return through_hostd, latency_result("direct openpty+Popen -> first byte", direct, unit="starts/s")


def main() -> None:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--iterations", type=int, default=100, help="measured starts per case (default 100)")
    p.add_argument("--warmup", type=int, default=5, help="unmeasured starts before each case")
    p.add_argument("--command", default="/bin/echo x", help="what each session runs (shell words)")
    p.add_argument(
        "--no-cgroups",
        action="store_true",
        help="run hostd with AIWG_CGROUP_ROOT=off (shows what joining a cgroup costs)",
    )
    args = p.parse_args()
    if args.versions:
        print_versions()
        return
    argv = shlex.split(args.command)

    with running_hostd({"AIWG_CGROUP_ROOT": "off"} if args.no_cgroups else None) as hostd:
        through_hostd, direct = trio.run(measure, hostd.socket_path, argv, args.iterations, args.warmup)
    compare(through_hostd, direct, "p50")

    p50_ms = (through_hostd.p50_us or 0) / 1000
    report = Report(
        bench="bench_session_start",
        title="session start to first output byte, through hostd vs. openpty + exec in the bench",
        vs_of="p50",
        params={"iterations": args.iterations, "command": args.command, "cgroups": not args.no_cgroups},
        results=[through_hostd, direct],
        targets=[
            Target(
                description=f"hostd session start p50 under {TARGET_P50_MS:.0f} ms",
                measured=f"{p50_ms:.2f} ms",
                met=p50_ms < TARGET_P50_MS,
            )
        ],
    )
    emit(report, as_json=args.json)


if __name__ == "__main__":
    main()
