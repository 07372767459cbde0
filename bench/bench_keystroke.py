"""Keystroke echo through hostd: write one byte, time until its echo arrives on a subscription.

The session runs ``sh -c 'stty raw -echo; echo READY; exec cat'``: the terminal does not echo,
``cat`` does, so every echo is a real round trip through a process on the PTY (what a shell in
raw mode does). Each iteration sends one byte with ``SessionWriteRequest`` and stops the clock
when a ``SessionOutput`` holding that byte arrives on the subscription opened beforehand. The
bytes cycle through a seeded, repeatable sequence of printable characters.

Baseline, in the same run: the same command on an ``os.openpty`` PTY spawned by the bench;
write the byte to the master, block reading the master until the echo is back. An info row
does the same from trio (non-blocking master, ``wait_readable``): the floor for anything that,
like hostd, serves many PTYs from one event loop. The cases alternate keystroke by keystroke.

Target (issue 2): hostd p50 under 3x direct.
"""

from __future__ import annotations

import gc
import os
import random
import string
import time
from collections.abc import AsyncIterator
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

TARGET_RATIO = 3.0
ARGV = ["sh", "-c", "stty raw -echo; echo READY; exec cat"]
READY = b"READY"
SESSION_ID = "bench-keystroke"


def keystrokes(seed: int, count: int) -> list[bytes]:
    rng = random.Random(seed)
    alphabet = (string.ascii_letters + string.digits).encode()
    return [bytes([rng.choice(alphabet)]) for _ in range(count)]


class HostdEcho:
    """The cat session in hostd with its subscription open; ``echo`` times one keystroke."""

    def __init__(self, client: HostdClient, events: AsyncIterator[m.Event]) -> None:
        self.client = client
        self.events = events

    async def wait_for(self, wanted: bytes) -> None:
        seen = b""
        while wanted not in seen:
            event = await anext(self.events)
            if isinstance(event, m.SessionOutput):
                seen += event.data
            elif isinstance(event, m.SessionExited):
                raise RuntimeError("the cat session exited")

    async def echo(self, key: bytes) -> tuple[int, int]:
        """(ns until the echo arrived, ns until the write was answered)."""
        t0 = time.perf_counter_ns()
        await self.client.call(m.SessionWriteRequest(session_id=SESSION_ID, data=key))
        t_reply = time.perf_counter_ns()
        await self.wait_for(key)
        return time.perf_counter_ns() - t0, t_reply - t0


class DirectEcho:
    """The same command on a PTY of our own, read blocking (or from trio with ``nonblocking``)."""

    def __init__(self, child: DirectPty, *, nonblocking: bool = False) -> None:
        self.child = child
        if nonblocking:
            os.set_blocking(child.master, False)

    def read(self) -> bytes:
        data = self.child.read()
        if not data:
            raise RuntimeError("the cat child exited")
        return data

    async def read_async(self) -> bytes:
        while True:
            try:
                data = os.read(self.child.master, 65536)
            except BlockingIOError:
                await trio.lowlevel.wait_readable(self.child.master)
                continue
            except OSError:
                data = b""
            if not data:
                raise RuntimeError("the cat child exited")
            return data

    def wait_for(self, wanted: bytes) -> None:
        seen = b""
        while wanted not in seen:
            seen += self.read()

    async def wait_for_async(self, wanted: bytes) -> None:
        seen = b""
        while wanted not in seen:
            seen += await self.read_async()

    def echo(self, key: bytes) -> int:
        t0 = time.perf_counter_ns()
        os.write(self.child.master, key)
        self.wait_for(key)
        return time.perf_counter_ns() - t0

    async def echo_async(self, key: bytes) -> int:
        t0 = time.perf_counter_ns()
        os.write(self.child.master, key)
        await self.wait_for_async(key)
        return time.perf_counter_ns() - t0


async def measure(socket_path: Path, keys: list[bytes], warmup: int) -> tuple[Result, Result, Result]:
    """All three cases, keystroke by keystroke (so a load change on the host hits them alike)."""
    through_hostd: list[int] = []
    write_replies: list[int] = []
    direct: list[int] = []
    direct_trio: list[int] = []
    async with open_hostd(socket_path, client_name="bench_keystroke") as client:
        await provision_instance(client)
        try:
            await client.call(m.SessionCreateRequest(instance_id=BENCH_INSTANCE, argv=ARGV, session_id=SESSION_ID))
            try:
                async with client.stream(m.SessionSubscribeRequest(session_id=SESSION_ID, from_seq=1)) as events:
                    with DirectPty(ARGV) as plain, DirectPty(ARGV) as evented:
                        hostd_echo = HostdEcho(client, events)
                        blocking = DirectEcho(plain)
                        from_trio = DirectEcho(evented, nonblocking=True)
                        await hostd_echo.wait_for(READY)
                        blocking.wait_for(READY)
                        await from_trio.wait_for_async(READY)
                        gc.collect()
                        for i, key in enumerate(keys):
                            d = blocking.echo(key)
                            t = await from_trio.echo_async(key)
                            h, reply = await hostd_echo.echo(key)
                            if i >= warmup:
                                direct.append(d)
                                direct_trio.append(t)
                                through_hostd.append(h)
                                write_replies.append(reply)
            finally:
                await client.call(m.SessionDeleteRequest(session_id=SESSION_ID))
        finally:
            await destroy_instance(client)
    replies = latency_result("write reply", write_replies)
    hostd_row = latency_result(
        "hostd write -> echo on subscription",
        through_hostd,
        unit="keys/s",
        write_reply_p50_us=round(replies.p50_us or 0, 1),
        write_reply_p99_us=round(replies.p99_us or 0, 1),
    )
    return (
        hostd_row,
        latency_result("direct PTY write -> echo", direct, unit="keys/s"),
        latency_result("direct PTY from trio (info)", direct_trio, unit="keys/s"),
    )


def main() -> None:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--keys", type=int, default=2000, help="measured keystrokes per case (default 2000)")
    p.add_argument("--warmup", type=int, default=100, help="unmeasured keystrokes before each case")
    args = p.parse_args()
    if args.versions:
        print_versions()
        return
    keys = keystrokes(args.seed, args.warmup + args.keys)

    with running_hostd() as hostd:
        through_hostd, direct, direct_trio = trio.run(measure, hostd.socket_path, keys, args.warmup)
    compare(through_hostd, direct, "p50")

    ratio = through_hostd.vs or float("inf")
    report = Report(
        bench="bench_keystroke",
        title="keystroke echo (raw-mode cat), through hostd vs. a PTY read directly",
        vs_of="p50",
        params={"keys": args.keys, "seed": args.seed},
        results=[through_hostd, direct, compare(direct_trio, direct, "p50")],
        targets=[
            Target(
                description=f"hostd echo p50 under {TARGET_RATIO:.0f}x direct",
                measured=f"{ratio:.2f}x ({through_hostd.p50_us:.1f} µs vs. {direct.p50_us:.1f} µs)",
                met=ratio < TARGET_RATIO,
            )
        ],
    )
    emit(report, as_json=args.json)


if __name__ == "__main__":
    main()
