"""Typing through hostd beside a tmux client: keystroke echo idle and next to four flooding sessions.

Every case runs ``sh -c 'stty raw -echo; echo READY; exec cat'`` on a PTY and times one keystroke
from the write until its echo is read back; the cases take turns keystroke by keystroke, so a change
of load on the host hits them alike.

* ``direct PTY``: the bench's own PTY, read blocking (the floor).
* ``tmux client``: the same command in a tmux session, typed into a ``tmux attach`` client on a PTY of
  the bench's (what a person using tmux feels).
* ``hostd call``: ``SessionWriteRequest`` awaited, then the echo on a subscription (the old path).
* ``hostd post``: the write posted without awaiting its answer (:meth:`HostdClient.post`), then the
  echo: the keystroke path the WebSocket binding uses.

Then four neighbours start ``yes`` at full speed: four hostd sessions drained by subscriptions on the
*same* connection as the typing (what the controller's one multiplexed link does), and four tmux
sessions in the same tmux server; the cases run again under that flood.

Targets (issue 11): through hostd alone no slower than a tmux client's echo (p50, idle); with four
flooding neighbours, p50 no worse than tmux under the same flood and p99 under 2x tmux's.
"""

from __future__ import annotations

import fcntl
import gc
import os
import random
import shutil
import signal
import string
import struct
import subprocess
import termios
import time
from collections.abc import AsyncIterator

import trio
from common import (
    BENCH_INSTANCE,
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

from proto import HostdClient, HostdError, open_hostd
from proto import messages as m

CAT = "stty raw -echo; echo READY; exec cat"
FLOOD = "yes"
NEIGHBOURS = 4


def keystrokes(seed: int, count: int) -> list[bytes]:
    rng = random.Random(seed)
    alphabet = (string.ascii_letters + string.digits).encode()
    return [bytes([rng.choice(alphabet)]) for _ in range(count)]


class Pty:
    """``argv`` on a PTY of the bench's, 80x24, read blocking."""

    def __init__(self, argv: list[str], env: dict[str, str] | None = None) -> None:
        master, slave = os.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 80, 0, 0))
        self.proc = subprocess.Popen(
            argv, stdin=slave, stdout=slave, stderr=slave, start_new_session=True, close_fds=True, env=env
        )
        os.close(slave)
        self.master = master

    def wait_for(self, wanted: bytes, timeout_s: float = 10.0) -> None:
        seen = b""
        deadline = time.monotonic() + timeout_s
        while wanted not in seen:
            if time.monotonic() > deadline:
                raise RuntimeError(f"no {wanted!r} from {self.proc.args!r}; got {seen[-200:]!r}")
            seen = seen[-4096:] + os.read(self.master, 65536)

    def echo(self, key: bytes) -> int:
        t0 = time.perf_counter_ns()
        os.write(self.master, key)
        self.wait_for(key)
        return time.perf_counter_ns() - t0

    def close(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
        self.proc.wait(5)
        os.close(self.master)


class Tmux:
    """A private tmux server: one session running ``cat``, a client attached to it, flood sessions."""

    def __init__(self) -> None:
        self.socket = f"aiwg-bench-{os.getpid()}"
        self.env = {**os.environ, "TERM": "xterm-256color"}
        self._tmux("new-session", "-d", "-s", "typing", "-x", "80", "-y", "24", CAT)
        self.client = Pty(["tmux", "-L", self.socket, "-f", "/dev/null", "attach", "-t", "typing"], env=self.env)
        self.client.wait_for(b"READY")

    def _tmux(self, *args: str) -> None:
        subprocess.run(["tmux", "-L", self.socket, "-f", "/dev/null", *args], check=True, env=self.env)

    def flood(self, n: int) -> None:
        for i in range(n):
            self._tmux("new-session", "-d", "-s", f"flood{i}", "-x", "80", "-y", "24", FLOOD)

    def echo(self, key: bytes) -> int:
        return self.client.echo(key)

    def close(self) -> None:
        self.client.close()
        subprocess.run(["tmux", "-L", self.socket, "kill-server"], check=False, capture_output=True)


class HostdTyping:
    """The cat session in hostd, its subscription open on ``client``."""

    def __init__(self, client: HostdClient, events: AsyncIterator[m.Event], session_id: str) -> None:
        self.client = client
        self.events = events
        self.session_id = session_id
        self.errors: list[HostdError] = []

    async def wait_for(self, wanted: bytes) -> None:
        seen = b""
        while wanted not in seen:
            event = await anext(self.events)
            if isinstance(event, m.SessionOutput):
                seen = seen[-4096:] + event.data

    async def call(self, key: bytes) -> int:
        t0 = time.perf_counter_ns()
        await self.client.call(m.SessionWriteRequest(session_id=self.session_id, data=key))
        await self.wait_for(key)
        return time.perf_counter_ns() - t0

    async def post(self, key: bytes) -> int:
        t0 = time.perf_counter_ns()
        await self.client.post(m.SessionWriteRequest(session_id=self.session_id, data=key), self.errors.append)
        await self.wait_for(key)
        return time.perf_counter_ns() - t0


async def drain(client: HostdClient, session_id: str) -> None:
    """A neighbour's subscriber on the shared connection: reads everything, as fast as it comes."""
    async with client.stream(m.SessionSubscribeRequest(session_id=session_id)) as events:
        async for _ in events:
            pass


async def measure(socket_path: str, keys: list[bytes], warmup: int) -> list[Result]:
    samples: dict[str, list[int]] = {}

    def record(case: str, i: int, value: int) -> None:
        if i >= warmup:
            samples.setdefault(case, []).append(value)

    async def phase(label: str, typing: HostdTyping, direct: Pty, tmux: Tmux) -> None:
        gc.collect()
        for i, key in enumerate(keys):
            record(f"direct PTY{label}", i, direct.echo(key))
            record(f"tmux client{label}", i, tmux.echo(key))
            record(f"hostd call{label}", i, await typing.call(key))
            record(f"hostd post{label}", i, await typing.post(key))

    async with open_hostd(socket_path, client_name="bench_typing") as client:
        await provision_instance(client)
        direct, tmux = Pty(["sh", "-c", CAT]), Tmux()
        try:
            direct.wait_for(b"READY")
            sid = (
                await client.call(m.SessionCreateRequest(instance_id=BENCH_INSTANCE, argv=["sh", "-c", CAT]))
            ).session.session_id
            async with client.stream(m.SessionSubscribeRequest(session_id=sid, from_seq=1)) as events:
                typing = HostdTyping(client, events, sid)
                await typing.wait_for(b"READY")
                await phase("", typing, direct, tmux)
                async with trio.open_nursery() as nursery:
                    for _ in range(NEIGHBOURS):
                        flood = await client.call(m.SessionCreateRequest(instance_id=BENCH_INSTANCE, argv=[FLOOD]))
                        nursery.start_soon(drain, client, flood.session.session_id)
                    tmux.flood(NEIGHBOURS)
                    await trio.sleep(0.5)  # let the floods reach full speed
                    await phase(" + 4 floods", typing, direct, tmux)
                    nursery.cancel_scope.cancel()
            if typing.errors:
                raise RuntimeError(f"posted writes failed: {typing.errors[:3]}")
        finally:
            direct.close()
            tmux.close()
            await destroy_instance(client)
    return [latency_result(case, values, unit="keys/s") for case, values in samples.items()]


def main() -> None:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--keys", type=int, default=500, help="measured keystrokes per case and phase (default 500)")
    p.add_argument("--warmup", type=int, default=50, help="unmeasured keystrokes before each phase")
    args = p.parse_args()
    if args.versions:
        print_versions()
        return
    if shutil.which("tmux") is None:
        raise SystemExit("bench_typing needs tmux (apt-get install tmux) for its baseline")
    keys = keystrokes(args.seed, args.warmup + args.keys)
    with running_hostd() as hostd:
        rows = {r.case: r for r in trio.run(measure, str(hostd.socket_path), keys, args.warmup)}

    targets = []
    for label in ("", " + 4 floods"):
        tmux = rows[f"tmux client{label}"]
        for case in ("hostd call", "hostd post"):
            compare(rows[f"{case}{label}"], tmux, "p50")
        compare(rows[f"direct PTY{label}"], tmux, "p50")
    post, tmux = rows["hostd post"], rows["tmux client"]
    targets.append(
        Target(
            description="hostd alone, idle: echo p50 no slower than a tmux client's",
            measured=f"{post.p50_us:.0f} µs vs. tmux {tmux.p50_us:.0f} µs",
            met=(post.p50_us or 0) <= (tmux.p50_us or 0),
        )
    )
    post, tmux = rows["hostd post + 4 floods"], rows["tmux client + 4 floods"]
    targets.append(
        Target(
            description="four flooding neighbours on the same connection: p50 <= tmux's, p99 < 2x tmux's",
            measured=(
                f"p50 {post.p50_us:.0f} µs vs. {tmux.p50_us:.0f} µs; p99 {post.p99_us:.0f} µs vs. {tmux.p99_us:.0f} µs"
            ),
            met=(post.p50_us or 0) <= (tmux.p50_us or 0) and (post.p99_us or 0) < 2 * (tmux.p99_us or 0),
        )
    )
    report = Report(
        bench="bench_typing",
        title="keystroke echo through hostd beside a tmux client, idle and next to four floods",
        vs_of="p50",
        params={"keys": args.keys, "seed": args.seed, "neighbours": NEIGHBOURS},
        results=list(rows.values()),
        targets=targets,
    )
    emit(report, as_json=args.json)


if __name__ == "__main__":
    main()
