"""RPC round trip: ``PingRequest`` through ``proto.open_hostd`` to a real hostd.

Baseline, in the same run: a trio server in a subprocess that echoes every length-prefixed
frame back without decoding it, called by a client with the same shape as ``HostdClient``
(reader task, one ``trio.Event`` per call, ``FrameEncoder``/``FrameBuffer`` + msgspec decode).
The difference is what hostd's server adds (decode, dispatch, encode a response) plus the
client's response checks. A third row, a bare send/receive loop on the echo socket, shows the
floor of a Unix-socket round trip from trio.

Target (issue 2): hostd p50 under 200 µs with one caller.
"""

from __future__ import annotations

import argparse
import gc
import math
import random
import socket
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import msgspec
import trio
from common import (
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

from agentic_sandbox.proto import FrameBuffer, FrameEncoder, open_hostd
from agentic_sandbox.proto import messages as m

TARGET_P50_US = 200.0
READ_CHUNK = 256 * 1024
_CLIENT_DECODER = msgspec.msgpack.Decoder(m.ClientFrame)


# ---------------------------------------------------------------------------------------------
# The echo server (runs in a subprocess: ``bench_rpc.py --echo-server PATH``)


async def _echo_connection(stream: trio.SocketStream) -> None:
    buf = bytearray()
    async with stream:
        while data := await stream.receive_some(READ_CHUNK):
            buf += data
            end = 0
            while len(buf) - end >= 4:
                size = int.from_bytes(buf[end : end + 4], "big")
                if len(buf) - end - 4 < size:
                    break
                end += 4 + size
            if end:
                await stream.send_all(bytes(buf[:end]))
                del buf[:end]


async def echo_server(path: str) -> None:
    sock = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    await sock.bind(path)
    sock.listen(128)
    print("ready", flush=True)
    await trio.serve_listeners(_echo_connection, [trio.SocketListener(sock)])


class EchoServer:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.proc = subprocess.Popen(
            [sys.executable, __file__, "--echo-server", str(path)], stdout=subprocess.PIPE, text=True
        )
        assert self.proc.stdout is not None
        if self.proc.stdout.readline().strip() != "ready":
            self.stop()
            raise RuntimeError("echo server did not start")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(5)


# ---------------------------------------------------------------------------------------------
# Clients


class _Pending:
    __slots__ = ("done", "reply")

    def __init__(self) -> None:
        self.done = trio.Event()
        self.reply: m.Frame | None = None


class EchoClient:
    """The call path of ``HostdClient`` minus hostd: id, event, framed send, reader delivers."""

    def __init__(self, stream: trio.SocketStream) -> None:
        self._stream = stream
        self._encoder = FrameEncoder()
        self._send_lock = trio.Lock()
        self._next_id = 1
        self._calls: dict[int, _Pending] = {}

    async def call(self, request: m.Request, timeout: float = 30.0) -> m.Frame | None:
        call_id = self._next_id
        self._next_id += 1
        request.id = call_id
        pending = self._calls[call_id] = _Pending()
        try:
            with trio.fail_after(timeout):
                data = self._encoder.encode(request)
                async with self._send_lock:
                    await self._stream.send_all(data)
                await pending.done.wait()
        finally:
            self._calls.pop(call_id, None)
        return pending.reply

    async def read_loop(self) -> None:
        buffer = FrameBuffer()
        while data := await self._stream.receive_some(READ_CHUNK):
            buffer.feed(data)
            while (frame := buffer.next_message(_CLIENT_DECODER)) is not None:
                pending = self._calls.get(frame.id)
                if pending is not None:
                    pending.reply = frame
                    pending.done.set()


async def _connect(path: Path) -> trio.SocketStream:
    sock = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    await sock.connect(str(path))
    return trio.SocketStream(sock)


async def run_callers(
    call: Callable[[m.PingRequest], Awaitable[object]], payload: bytes, calls: int, callers: int, warmup: int
) -> tuple[list[int], float]:
    """``calls`` pings split over ``callers`` concurrent tasks; per-call ns and wall seconds."""
    samples: list[int] = []

    async def caller(count: int) -> None:
        for _ in range(count):
            t0 = time.perf_counter_ns()
            await call(m.PingRequest(payload=payload))
            samples.append(time.perf_counter_ns() - t0)

    for _ in range(warmup):
        await call(m.PingRequest(payload=payload))
    samples.clear()
    gc.collect()
    share = math.ceil(calls / callers)
    t0 = time.perf_counter()
    async with trio.open_nursery() as nursery:
        for i in range(callers):
            nursery.start_soon(caller, min(share, calls - i * share))
    return samples, time.perf_counter() - t0


async def raw_loop(path: Path, payload: bytes, calls: int, warmup: int) -> tuple[list[int], float]:
    """One task: send a frame, read until the same number of bytes came back."""
    frame = bytes(FrameEncoder().encode(m.PingRequest(id=1, payload=payload)))
    samples: list[int] = []
    stream = await _connect(path)
    async with stream:
        for i in range(warmup + calls):
            t0 = time.perf_counter_ns()
            await stream.send_all(frame)
            got = 0
            while got < len(frame):
                got += len(await stream.receive_some(READ_CHUNK))
            if i >= warmup:
                samples.append(time.perf_counter_ns() - t0)
    return samples, sum(samples) / 1e9


# ---------------------------------------------------------------------------------------------


async def measure(socket_path: Path, echo_path: Path, args: argparse.Namespace) -> list[Result]:
    payload = random.Random(args.seed).randbytes(args.payload)
    calls, warmup = args.calls, args.warmup
    levels = [1, *(c for c in args.concurrency if c != 1)]
    results: list[Result] = []

    hostd_rows: list[Result] = []
    async with open_hostd(socket_path, client_name="bench_rpc") as client:
        for callers in levels:
            samples, wall = await run_callers(client.call, payload, calls, callers, warmup)
            hostd_rows.append(
                latency_result(f"hostd ping, {plural(callers, 'caller')}", samples, wall_s=wall, unit="calls/s")
            )

    echo_rows: list[Result] = []
    stream = await _connect(echo_path)
    async with stream, trio.open_nursery() as nursery:
        echo = EchoClient(stream)
        nursery.start_soon(echo.read_loop)
        for callers in levels:
            samples, wall = await run_callers(echo.call, payload, calls, callers, warmup)
            echo_rows.append(
                latency_result(f"echo framed, {plural(callers, 'caller')}", samples, wall_s=wall, unit="calls/s")
            )
        nursery.cancel_scope.cancel()

    samples, wall = await raw_loop(echo_path, payload, calls, warmup)
    raw = latency_result("echo raw socket, 1 caller", samples, wall_s=wall, unit="calls/s")

    for hostd_row, echo_row in zip(hostd_rows, echo_rows, strict=True):
        results.append(compare(hostd_row, echo_row, "p50"))
        results.append(echo_row)
    results.append(raw)
    return results


def main() -> None:
    if len(sys.argv) == 3 and sys.argv[1] == "--echo-server":
        trio.run(echo_server, sys.argv[2])
        return
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--calls", type=int, default=5000, help="measured calls per case (default 5000)")
    p.add_argument("--warmup", type=int, default=300, help="unmeasured calls before each case")
    p.add_argument("--payload", type=int, default=16, help="ping payload bytes (default 16)")
    p.add_argument(
        "--concurrency", type=int, nargs="+", default=[8], help="concurrent callers on one connection (default 8)"
    )
    args = p.parse_args()
    if args.versions:
        print_versions()
        return

    with running_hostd() as hostd, temp_dir("aiwg-bench-echo-") as tmp:
        echo = EchoServer(tmp / "echo.sock")
        try:
            results = trio.run(measure, hostd.socket_path, echo.path, args)
        finally:
            echo.stop()

    first = results[0]
    report = Report(
        bench="bench_rpc",
        title="RPC round trip (PingRequest) through hostd vs. a framed Unix-socket echo",
        vs_of="p50",
        params={"calls": args.calls, "payload": args.payload, "concurrency": args.concurrency, "seed": args.seed},
        results=results,
        targets=[
            Target(
                description=f"hostd ping p50 (1 caller) under {TARGET_P50_US:.0f} µs",
                measured=f"{first.p50_us:.1f} µs",
                met=first.p50_us is not None and first.p50_us < TARGET_P50_US,
            )
        ],
    )
    emit(report, as_json=args.json)


if __name__ == "__main__":
    main()
