"""Typing at tmux speed: keystroke echo through hostd alone and through the controller's WebSocket,
idle and next to four flooding neighbours, beside a direct PTY, a tmux client and terminado.

Every case runs ``sh -c 'stty raw -echo; echo READY; exec cat'`` on a PTY and times one keystroke
from the send until its echo is read back; the cases take turns keystroke by keystroke, so a change
of load on the host hits them alike, in an order shuffled every round (``--seed``): whichever case
comes first after a pause of a process pays for finding it cold (measured: 90 µs more for the first
hostd case after the tmux client), and none may always be that case.

* ``direct PTY``: the bench's own PTY, read blocking (the floor).
* ``tmux client``: the same command in a tmux session, typed into a ``tmux attach`` client on a PTY of
  the bench's (what a person using tmux feels).
* ``terminado``: the same command in terminado (bench/terminado_server.py, its own process: the
  Python WebSocket terminal behind Jupyter, one process owning the PTY), typed over its WebSocket.
* ``hostd post``: the write posted to hostd without awaiting its answer, the echo read on a
  subscription of the same connection (:class:`proto.HostdClient`).
* ``hostd, blocking client``: the same through a client as small as a tmux client's part of the
  path: a plain blocking socket, the frames encoded and decoded in the bench's thread, no event
  loop (:class:`BlockingHostd`, its own ``cat`` session). A diagnostic, not a target: set beside
  ``hostd post`` it parts hostd's own cost from that of the Python client.
* ``controller WS``: the controller's attach socket over ``pty-ws.v1.binary`` (a ``PW1I`` frame in,
  the ``PW1O`` echo out), through the controller's one hostd link.

Phases:

* idle;
* ``+ 4 floods``: every system gets four neighbours running ``yes`` at full speed, drained as fast
  as they come by another process (bench/flood_drain.py): hostd's through the controller's attach
  sockets (so across the controller's hostd link, and on connections other than ``hostd post``'s),
  terminado's over its own WebSockets, tmux's by its server (no client shows them);
* ``+ 4 floods shared``: the same, and hostd's floods drained on ``hostd post``'s own connection as
  well (the multiplexing the controller's link does).

Targets (issue 11): through hostd alone, idle, no slower than a tmux client's echo (p50); through the
controller over the binary subprotocol, idle, p50 at most 2x terminado's and under 0.9 ms; with four
flooding neighbours, the controller's p50 no worse than the tmux client's and p99 under 2x tmux's;
with the floods on the shared connection, the same for hostd alone.
"""

from __future__ import annotations

import fcntl
import gc
import json
import os
import random
import re
import shutil
import signal
import socket
import string
import struct
import subprocess
import sys
import tempfile
import termios
import time
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack, asynccontextmanager
from datetime import UTC, datetime
from typing import Any

import msgspec
import trio
from bench_admin import Controller, admin_client, admin_provision, wait_ready
from common import (
    ROOT,
    Report,
    Result,
    Target,
    compare,
    emit,
    latency_result,
    parser,
    print_versions,
    running_hostd,
)
from trio_websocket import WebSocketConnection, open_websocket_url

from agentic_sandbox.proto import HostdClient, HostdError, new_id, open_hostd
from agentic_sandbox.proto import messages as m
from agentic_sandbox.proto.framing import FrameBuffer, FrameEncoder

CAT = "stty raw -echo; echo READY; exec cat"
FLOOD = "yes"
NEIGHBOURS = 4
API = "/api/v2/admin"
PHASES = ("", " + 4 floods", " + 4 floods shared")


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


class BlockingHostd:
    """A hostd connection read blocking, on one session: a subscription and posted writes (their
    answers are read past, as the echo is looked for)."""

    def __init__(self, socket_path: str, session_id: str) -> None:
        self.sock = socket.socket(socket.AF_UNIX)
        self.sock.connect(socket_path)
        self.encoder, self.buffer = FrameEncoder(), FrameBuffer(m.DEFAULT_MAX_FRAME_BYTES)
        self.decoder = msgspec.msgpack.Decoder(m.ServerFrame)
        self.session_id, self.next_id = session_id, 1
        self._send(m.HelloRequest(id=0, protocol_version=m.PROTOCOL_VERSION, client_name="bench_typing blocking"))
        self._frame()
        self._send(m.SessionSubscribeRequest(id=0, session_id=session_id, from_seq=1))

    def _send(self, request: m.Request) -> None:
        request.id, self.next_id = self.next_id, self.next_id + 1
        self.sock.sendall(self.encoder.encode(request))

    def _frame(self) -> m.Frame:
        while (frame := self.buffer.next_message(self.decoder)) is None:
            data = self.sock.recv(65536)
            if not data:
                raise RuntimeError("hostd closed the blocking client's connection")
            self.buffer.feed(data)
        if isinstance(frame, m.ErrorResponse):
            raise RuntimeError(f"hostd refused the blocking client: {frame.code} {frame.message}")
        return frame

    def wait_for(self, wanted: bytes) -> None:
        seen = b""
        while wanted not in seen:
            frame = self._frame()
            if isinstance(frame, m.SessionOutput):
                seen = seen[-4096:] + frame.data

    def echo(self, key: bytes) -> int:
        t0 = time.perf_counter_ns()
        self._send(m.SessionWriteRequest(id=0, session_id=self.session_id, data=key))
        self.wait_for(key)
        return time.perf_counter_ns() - t0

    def close(self) -> None:
        self.sock.close()


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

    async def post(self, key: bytes) -> int:
        t0 = time.perf_counter_ns()
        await self.client.post(m.SessionWriteRequest(session_id=self.session_id, data=key), self.errors.append)
        await self.wait_for(key)
        return time.perf_counter_ns() - t0


class WsTyping:
    """A WebSocket terminal: ``send(key)`` frames the key, the echo is looked for in what comes back
    (``unwrap`` turns a message into output bytes, b"" for anything else)."""

    def __init__(self, ws: WebSocketConnection, frame: Callable[[bytes], Any], unwrap: Callable[[Any], bytes]) -> None:
        self.ws, self.frame, self.unwrap = ws, frame, unwrap

    async def wait_for(self, wanted: bytes) -> None:
        seen = b""
        while wanted not in seen:
            seen = seen[-4096:] + self.unwrap(await self.ws.get_message())

    async def echo(self, key: bytes) -> int:
        t0 = time.perf_counter_ns()
        await self.ws.send_message(self.frame(key))
        await self.wait_for(key)
        return time.perf_counter_ns() - t0


def _pw1o(message: str | bytes) -> bytes:
    return message[13:] if isinstance(message, bytes) and message.startswith(b"PW1O") else b""


def _terminado(message: str | bytes) -> bytes:
    if isinstance(message, str) and message.startswith('["stdout"'):
        return str(json.loads(message)[1]).encode()
    return b""


def _join(role: str) -> str:
    """A join frame that replays the session from its start (so its READY is seen)."""
    payload = {"role": role}
    return json.dumps({"op": "pty.join_session", "id": new_id(), "ts": now(), "replay_from": 0, "payload": payload})


def now() -> str:
    return datetime.now(UTC).isoformat().replace("+00:00", "Z")


@asynccontextmanager
async def subprocess_url(argv: list[str]) -> AsyncIterator[str]:
    """A child process that prints ``listening on URL`` or ``draining`` once it is up; the URL (or
    ""). Its stderr is kept aside and shown only if it fails to start; stopped on exit."""
    with tempfile.TemporaryFile() as errors:
        proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=errors, cwd=ROOT)
        try:
            assert proc.stdout is not None
            line = (await trio.to_thread.run_sync(proc.stdout.readline)).decode()
            if not line:
                errors.seek(0)
                raise RuntimeError(f"{argv[1]} did not start:\n{errors.read().decode(errors='replace')[-3000:]}")
            match = re.search(r"listening on (\S+)", line)
            yield match[1] if match else ""
        finally:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(10)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait(5)


async def drain(client: HostdClient, session_id: str) -> None:
    """A neighbour's subscriber on the shared connection: reads everything, as fast as it comes."""
    async with client.stream(m.SessionSubscribeRequest(session_id=session_id)) as events:
        async for _ in events:
            pass


async def measure(socket_path: str, controller: Controller, keys: list[bytes], warmup: int, seed: int) -> list[Result]:
    samples: dict[str, list[int]] = {}
    rng = random.Random(seed)

    async def phase(label: str, cases: dict[str, Callable[[bytes], Any]]) -> None:
        gc.collect()
        names = list(cases)
        for name in names:  # the report lists the cases in their order here, not the shuffled one
            samples.setdefault(f"{name}{label}", [])
        for i, key in enumerate(keys):
            # In a new order each round: a case that follows a long pause of hostd (or of the
            # controller) finds it cold and pays for that; no case may always be the one that does.
            rng.shuffle(names)
            for name in names:
                value = cases[name](key)
                if not isinstance(value, int):
                    value = await value
                if i >= warmup:
                    samples[f"{name}{label}"].append(value)

    admin = admin_client(controller.url, controller.token)
    await wait_ready(admin)
    iid = await admin_provision(admin, "typing", 0.02)

    async def new_session(argv: list[str]) -> str:
        response = await admin.post(f"{API}/instances/{iid}/sessions", json={"argv": argv})
        response.raise_for_status()
        return str(response.json()["id"])

    def attach_url(sid: str) -> str:
        return controller.url.replace("http", "ws", 1) + f"/agents/{iid}/sessions/{sid}/attach"

    direct, tmux = Pty(["sh", "-c", CAT]), Tmux()
    async with AsyncExitStack() as stack:
        stack.callback(direct.close)
        stack.callback(tmux.close)
        direct.wait_for(b"READY")
        terminado_url = await stack.enter_async_context(
            subprocess_url([sys.executable, str(ROOT / "bench" / "terminado_server.py")])
        )
        client = await stack.enter_async_context(open_hostd(socket_path, client_name="bench_typing"))

        cat = await new_session(["sh", "-c", CAT])
        events = await stack.enter_async_context(client.stream(m.SessionSubscribeRequest(session_id=cat, from_seq=1)))
        typing = HostdTyping(client, events, cat)
        await typing.wait_for(b"READY")

        blocking = BlockingHostd(socket_path, await new_session(["sh", "-c", CAT]))
        stack.callback(blocking.close)
        blocking.wait_for(b"READY")

        ws_cat = await new_session(["sh", "-c", CAT])
        auth = [(b"Authorization", f"Bearer {controller.token}".encode())]
        ws = await stack.enter_async_context(
            open_websocket_url(attach_url(ws_cat), subprotocols=["pty-ws.v1.binary"], extra_headers=auth)
        )
        await ws.send_message(_join("controller"))
        controller_ws = WsTyping(ws, lambda key: b"PW1I" + key, _pw1o)
        await controller_ws.wait_for(b"READY")

        term = await stack.enter_async_context(open_websocket_url(f"{terminado_url}/typing"))
        terminado = WsTyping(term, lambda key: json.dumps(["stdin", key.decode()]), _terminado)
        await terminado.echo(b"x")  # it is up once it echoes

        cases: dict[str, Callable[[bytes], Any]] = {
            "direct PTY": direct.echo,
            "tmux client": tmux.echo,
            "terminado": terminado.echo,
            "hostd post": typing.post,
            "hostd, blocking client": blocking.echo,
            "controller WS": controller_ws.echo,
        }
        await phase(PHASES[0], cases)

        floods = [await new_session([FLOOD]) for _ in range(NEIGHBOURS)]
        drain_urls = [attach_url(sid) + "#pty-ws" for sid in floods]
        drain_urls += [f"{terminado_url}/flood/f{i}" for i in range(NEIGHBOURS)]
        os.environ["AIWG_TOKEN"] = controller.token
        await stack.enter_async_context(
            subprocess_url([sys.executable, str(ROOT / "bench" / "flood_drain.py"), *drain_urls])
        )
        tmux.flood(NEIGHBOURS)
        await trio.sleep(1.0)  # let the floods reach full speed
        await phase(PHASES[1], cases)

        async with trio.open_nursery() as nursery:
            for sid in floods:
                nursery.start_soon(drain, client, sid)
            await trio.sleep(0.5)
            await phase(PHASES[2], cases)
            nursery.cancel_scope.cancel()
        if typing.errors:
            raise RuntimeError(f"posted writes failed: {typing.errors[:3]}")
    await admin.aclose()
    return [latency_result(case, values, unit="keys/s") for case, values in samples.items()]


def _targets(rows: dict[str, Result]) -> list[Target]:
    def p(case: str, which: str = "p50") -> float:
        return float(getattr(rows[case], f"{which}_us") or 0)

    def us(value: float) -> str:
        return f"{value / 1000:.2f} ms" if value >= 1000 else f"{value:.0f} µs"

    def under_load(description: str, ours: str, tmux: str) -> Target:
        return Target(
            description=f"{description}: p50 <= tmux's, p99 < 2x tmux's",
            measured=f"p50 {us(p(ours))} vs. {us(p(tmux))}; p99 {us(p(ours, 'p99'))} vs. {us(p(tmux, 'p99'))}",
            met=p(ours) <= p(tmux) and p(ours, "p99") < 2 * p(tmux, "p99"),
        )

    flood, shared = PHASES[1], PHASES[2]
    return [
        Target(
            description="hostd alone, idle: echo p50 no slower than a tmux client's",
            measured=f"{us(p('hostd post'))} vs. tmux {us(p('tmux client'))}",
            met=p("hostd post") <= p("tmux client"),
        ),
        Target(
            description="controller WS (binary), idle: p50 at most 2x terminado's",
            measured=f"{us(p('controller WS'))} vs. {us(p('terminado'))}, {p('controller WS') / p('terminado'):.2f}x",
            met=p("controller WS") <= 2 * p("terminado"),
        ),
        Target(
            description="controller WS (binary), idle: p50 under 0.9 ms",
            measured=us(p("controller WS")),
            met=p("controller WS") < 900,
        ),
        under_load("controller WS next to four floods", "controller WS" + flood, "tmux client" + flood),
        under_load(
            "hostd alone, floods drained on its own connection too", "hostd post" + shared, "tmux client" + shared
        ),
    ]


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
    try:
        import terminado  # noqa: F401
    except ImportError:
        raise SystemExit("bench_typing needs terminado for its baseline: .venv/bin/pip install -e '.[bench]'") from None
    keys = keystrokes(args.seed, args.warmup + args.keys)
    with running_hostd() as hostd:
        controller = Controller(hostd.state_dir.parent / "controller", hostd.socket_path)
        try:
            measured = trio.run(measure, str(hostd.socket_path), controller, keys, args.warmup, args.seed)
            rows = {r.case: r for r in measured}
        finally:
            controller.stop()
    for label in PHASES:
        for case in ("direct PTY", "terminado", "hostd post", "hostd, blocking client", "controller WS"):
            compare(rows[f"{case}{label}"], rows[f"tmux client{label}"], "p50")
    report = Report(
        bench="bench_typing",
        title="keystroke echo through hostd and the controller's WebSocket beside tmux and terminado",
        vs_of="p50",
        params={"keys": args.keys, "seed": args.seed, "neighbours": NEIGHBOURS},
        results=list(rows.values()),
        targets=_targets(rows),
    )
    emit(report, as_json=args.json)


if __name__ == "__main__":
    main()
