"""Replay retention in bounded memory: hostd's RSS with many busy sessions, and a reattach from
hours back.

* **memory**: ``--sessions`` sessions (default 256, hostd's limit) each write ``--mib`` MiB (6) of
  generated text and stay open; hostd's RSS is read before and after, and every session's replay
  window (oldest sequence still held) is checked. Run twice, each with its own hostd: with hostd's
  defaults (one in-memory budget for every session, older output spilled to per-session segment
  files), and as hostd kept output before (``AIWG_RING_MEMORY_BYTES`` above what all rings can
  hold, no spool: 4 MiB in memory per session) as the baseline.
* **reattach**: one session writes what a busy shell prints in ``--hours`` hours (12) at
  ``--rate-kib-s`` KiB/s (1: 42 MiB), at full speed; then a subscription from sequence 1 (the
  oldest output, ``--hours`` back, on disk) to its first byte, and to the end of the replay
  (byte-exact against what was written); the baseline is a subscription from the newest sequence
  (in memory) to its first byte.

Targets (issue 11): RSS bounded by the memory budget whatever the number of busy sessions (the
baseline grows with them), every byte retained either way; a reattach from ``--hours`` back gets
its first byte quickly and the whole replay byte-exact.
"""

from __future__ import annotations

import gc
import time
from pathlib import Path

import psutil
import trio
from common import (
    BENCH_INSTANCE,
    MIB,
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

from agentic_sandbox.proto import HostdClient, open_hostd
from agentic_sandbox.proto import messages as m

BLOCK = (b"retention bench: the quick brown fox jumps over the lazy dog 0123456789\n" * 14563)[: 1024 * 1024]


def writer(path: Path, mib: int) -> list[str]:
    """A raw-mode session that writes ``mib`` MiB of ``path`` (a 1 MiB block) and stays open."""
    return ["sh", "-c", f"stty raw -echo; for i in $(seq {mib}); do cat {path}; done; echo DONE; exec cat"]


async def wait_done(client: HostdClient, session_id: str) -> int:
    """Follow a session from now until it printed DONE; its next sequence then."""
    info = (await client.call(m.SessionGetRequest(session_id=session_id))).session
    start = max(info.first_seq, info.next_seq - 4)  # DONE may already be in the last entries
    async with client.stream(m.SessionSubscribeRequest(session_id=session_id, from_seq=start)) as ev:
        tail = b""
        async for event in ev:
            if isinstance(event, m.SessionOutput):
                tail = (tail + event.data)[-64:]
                if b"DONE" in tail:
                    break
    return int((await client.call(m.SessionGetRequest(session_id=session_id))).session.next_seq)


def rss_mib(pid: int) -> float:
    return psutil.Process(pid).memory_info().rss / MIB


async def memory_case(socket_path: str, pid: int, sessions: int, mib: int, block: Path) -> tuple[float, float, int]:
    """(RSS before, RSS after, sessions whose whole output is still held)."""
    async with open_hostd(socket_path, client_name="bench_retention") as client:
        await provision_instance(client)
        before = rss_mib(pid)
        sids = []
        for _ in range(sessions):
            created = await client.call(m.SessionCreateRequest(instance_id=BENCH_INSTANCE, argv=writer(block, mib)))
            sids.append(created.session.session_id)
        with trio.fail_after(600):
            for sid in sids:
                await wait_done(client, sid)
        gc.collect()
        after = rss_mib(pid)
        whole = 0
        for sid in sids:
            info = (await client.call(m.SessionGetRequest(session_id=sid))).session
            whole += info.first_seq == 1
        await destroy_instance(client)
    return before, after, whole


async def reattach_case(socket_path: str, mib: int, block: Path) -> dict[str, float]:
    async with open_hostd(socket_path, client_name="bench_retention") as client:
        await provision_instance(client)
        sid = (
            await client.call(m.SessionCreateRequest(instance_id=BENCH_INSTANCE, argv=writer(block, mib)))
        ).session.session_id
        with trio.fail_after(600):
            next_seq = await wait_done(client, sid)
        info = (await client.call(m.SessionGetRequest(session_id=sid))).session
        out: dict[str, float] = {"first_seq": info.first_seq, "next_seq": next_seq}

        t0 = time.perf_counter()
        async with client.stream(m.SessionSubscribeRequest(session_id=sid, from_seq=next_seq - 1)) as ev:
            async for event in ev:
                if isinstance(event, m.SessionOutput):
                    out["newest_first_byte_ms"] = (time.perf_counter() - t0) * 1e3
                    break

        expected = BLOCK * mib + b"DONE"
        got = bytearray()
        t0 = time.perf_counter()
        async with client.stream(m.SessionSubscribeRequest(session_id=sid, from_seq=1)) as ev:
            async for event in ev:
                if isinstance(event, m.SessionOutput):
                    if not got:
                        out["oldest_first_byte_ms"] = (time.perf_counter() - t0) * 1e3
                    got += event.data
                    if len(got) >= len(expected):
                        break
                elif isinstance(event, m.SessionLagged):
                    raise RuntimeError(f"replay lagged: {event}")
        out["replay_s"] = time.perf_counter() - t0
        out["exact"] = float(bytes(got).startswith(expected))
        await destroy_instance(client)
    return out


def main() -> None:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--sessions", type=int, default=256, help="busy sessions (default 256, hostd's limit)")
    p.add_argument("--mib", type=int, default=6, help="MiB each busy session writes (default 6)")
    p.add_argument("--hours", type=float, default=12.0, help="how far back the reattach reaches (default 12)")
    p.add_argument("--rate-kib-s", type=float, default=1.0, help="output rate of the shell it stands for (1 KiB/s)")
    args = p.parse_args()
    if args.versions:
        print_versions()
        return
    reattach_mib = max(1, round(args.hours * 3600 * args.rate_kib_s / 1024))
    rows: list[Result] = []
    extra: dict[str, tuple[float, float, int]] = {}
    with temp_dir("aiwg-bench-retention-") as tmp:
        block = tmp / "block"
        block.write_bytes(BLOCK)
        cases = {
            "default budget": {"AIWG_MAX_SESSIONS": str(args.sessions)},
            "memory only (baseline)": {
                "AIWG_MAX_SESSIONS": str(args.sessions),
                "AIWG_RING_MEMORY_BYTES": str(args.sessions * 8 * MIB),
                "AIWG_SPOOL_SESSION_BYTES": "0",
            },
        }
        for case, env in cases.items():
            with running_hostd(env) as hostd:
                assert hostd.proc is not None
                socket_path, pid = str(hostd.socket_path), hostd.proc.pid
                extra[case] = trio.run(memory_case, socket_path, pid, args.sessions, args.mib, block)
            before, after, whole = extra[case]
            rows.append(
                Result(
                    case=f"RSS, {args.sessions} x {args.mib} MiB: {case}",
                    n=args.sessions,
                    throughput=after,
                    unit="MiB RSS",
                    extra={"rss_before_mib": round(before, 1), "sessions_holding_everything": whole},
                )
            )
        compare(rows[0], rows[1], "throughput")
        with running_hostd() as hostd:
            reattach = trio.run(reattach_case, str(hostd.socket_path), reattach_mib, block)
    newest = Result(case="reattach at the newest output", n=1, p50_us=reattach["newest_first_byte_ms"] * 1e3)
    oldest = Result(
        case=f"reattach {args.hours:g} h back ({reattach_mib} MiB)",
        n=1,
        p50_us=reattach["oldest_first_byte_ms"] * 1e3,
        extra={"replay_s": round(reattach["replay_s"], 2), "exact": bool(reattach["exact"])},
    )
    compare(oldest, newest, "p50")
    rows += [newest, oldest]
    default, baseline = extra["default budget"], extra["memory only (baseline)"]
    targets = [
        Target(
            description=f"RSS with {args.sessions} busy sessions bounded by the budget, not by the sessions",
            measured=f"{default[1]:.0f} MiB vs. {baseline[1]:.0f} MiB memory only (started at {default[0]:.0f})",
            met=default[1] < baseline[1] / 2,
        ),
        Target(
            description="every session's whole output still held",
            measured=f"{default[2]} of {args.sessions} (memory only: {baseline[2]})",
            met=default[2] == args.sessions,
        ),
        Target(
            description=f"reattach {args.hours:g} h back: first byte, then the whole replay byte-exact",
            measured=(
                f"{reattach['oldest_first_byte_ms']:.1f} ms to the first byte (newest: "
                f"{reattach['newest_first_byte_ms']:.1f} ms), {reattach_mib} MiB in {reattach['replay_s']:.2f} s"
            ),
            met=bool(reattach["exact"]) and reattach["oldest_first_byte_ms"] < 100,
        ),
    ]
    report = Report(
        bench="bench_retention",
        title="replay retention: hostd RSS with busy sessions, reattach from hours back",
        vs_of="p50",
        params={"sessions": args.sessions, "mib": args.mib, "hours": args.hours, "rate_kib_s": args.rate_kib_s},
        results=rows,
        targets=targets,
        notes=["RSS rows: vs. = default / memory-only RSS (lower is better here)"],
    )
    emit(report, as_json=args.json)


if __name__ == "__main__":
    main()
