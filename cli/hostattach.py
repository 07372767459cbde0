"""``agentic-hostctl attach``: this terminal on a hostd PTY session, like ``tmux attach``.

The terminal is in raw mode for as long as attach runs; :class:`_Terminal` dups fds 0 and 1,
closes the dups on exit and puts back the tty attributes and blocking modes it found, also after
an error or SIGTERM/SIGHUP. Keys go to the session (minus the detach keys, see
:class:`DetachKeys`); output is written here; SIGWINCH resizes the session.

Each connection is opened with :func:`proto.open_hostd` and closed by its ``async with`` when
its nursery ends: on detach, on session exit, or on a failure. Only the failures a new
connection may cure (:data:`RECOVERABLE`: hostd unreachable or restarting, a timeout, output
fallen behind) are retried, up to ``--retries`` times in a row with the delays of
:data:`RECONNECT_DELAYS_S`; the count restarts once a connection has read the session again.
Nothing is retried if the first connection fails, and a remote error (e.g. the session is
gone) ends attach at once. A new connection resumes after the last sequence written here. Keys
typed while disconnected are queued and sent first; keys in flight when a connection drops are
lost, never sent twice.

The last sequence seen is kept in a state file per user, hostd host id and session
(:func:`_cursor_file`): written on detach or failure, read by the next attach, removed when
the session has exited.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import stat
import sys
import termios
import tty
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import trio

from proto import (
    HostdClient,
    HostdConnectionLost,
    HostdRemoteError,
    HostdStreamOverflow,
    HostdTimeout,
    HostdUnavailable,
    open_hostd,
)
from proto import messages as m

from .output import PROG, exit_text, leaf_error

#: The description in ``agentic-hostctl attach --help``.
ATTACH_HELP = """\
Attach this terminal to a session, like `tmux attach`: raw keyboard input goes to the session,
its output comes here, and the window size follows this terminal.

Detach with Ctrl-] or with Ctrl-B then d (Ctrl-B Ctrl-B sends one Ctrl-B). On detach the last
sequence number seen is remembered (under $XDG_STATE_HOME/agentic-hostctl) and the next attach
resumes right after it; the first attach replays what hostd's ring still holds. If the session
exits, attach prints its exit code and exits with it. A lost connection to hostd is retried a
few times with backoff and resumes from the next sequence.
"""

DETACH_KEY = 0x1D  # Ctrl-]
PREFIX_KEY = 0x02  # Ctrl-B, then d
RECONNECT_DELAYS_S = (0.1, 0.25, 0.5, 1.0, 2.0, 4.0)
#: Failures a new connection may cure; anything else (an explicit error from hostd) ends attach.
RECOVERABLE = (HostdUnavailable, HostdTimeout, HostdStreamOverflow)


class DetachKeys:
    """Finds the detach keys in typed input: Ctrl-] alone, or Ctrl-B then d (tmux's prefix)."""

    def __init__(self) -> None:
        self._prefixed = False

    def feed(self, data: bytes) -> tuple[bytes, bool]:
        """Bytes to forward, and whether to detach (input after the detach key is dropped)."""
        if not self._prefixed and DETACH_KEY not in data and PREFIX_KEY not in data:
            return data, False
        out = bytearray()
        for byte in data:
            if self._prefixed:
                self._prefixed = False
                if byte == ord("d"):
                    return bytes(out), True
                out.append(PREFIX_KEY)  # Ctrl-B Ctrl-B sends one Ctrl-B; Ctrl-B x sends both
                if byte != PREFIX_KEY:
                    out.append(byte)
            elif byte == DETACH_KEY:
                return bytes(out), True
            elif byte == PREFIX_KEY:
                self._prefixed = True  # held until the next byte says what it was
            else:
                out.append(byte)
        return bytes(out), False


def _pollable(fd: int) -> bool:
    mode = os.fstat(fd).st_mode
    return stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode) or os.isatty(fd)


class _Terminal:
    """The user's terminal while attached: raw mode, and async I/O on dups of fds 0 and 1.

    FdStream makes the open file description non-blocking, and fds 0/1 share it with the shell
    that started us, so the original blocking modes and tty attributes are put back on exit.
    Files and /dev/null cannot be polled: those are read in a thread and written directly.
    """

    def __init__(self) -> None:
        self.is_tty = os.isatty(0)
        self._saved: list[Any] | None = None
        self._blocking = {fd: os.get_blocking(fd) for fd in (0, 1)}
        self._in: trio.lowlevel.FdStream | None = None
        self._out: trio.lowlevel.FdStream | None = None

    def __enter__(self) -> _Terminal:
        if self.is_tty:
            self._saved = termios.tcgetattr(0)
            tty.setraw(0)
        self._in = trio.lowlevel.FdStream(os.dup(0)) if _pollable(0) else None
        self._out = trio.lowlevel.FdStream(os.dup(1)) if _pollable(1) else None
        return self

    def __exit__(self, *exc_info: object) -> None:
        for stream in (self._in, self._out):
            if stream is not None:
                stream.close()
        if self._saved is not None:
            termios.tcsetattr(0, termios.TCSADRAIN, self._saved)
        for fd, blocking in self._blocking.items():
            os.set_blocking(fd, blocking)

    async def read(self, max_bytes: int = 65536) -> bytes:
        if self._in is not None:
            return await self._in.receive_some(max_bytes)
        return await trio.to_thread.run_sync(os.read, 0, max_bytes)

    async def write(self, data: bytes) -> None:
        if self._out is not None:
            await self._out.send_all(data)
            return
        view = memoryview(data)
        while view:
            view = view[os.write(1, view) :]

    def size(self) -> tuple[int, int] | None:
        if not self.is_tty:
            return None
        try:
            cols, rows = os.get_terminal_size(0)
        except OSError:
            return None
        return max(1, min(cols, m.MAX_TERMINAL_DIM)), max(1, min(rows, m.MAX_TERMINAL_DIM))


def _cursor_file(host_id: str, session_id: str) -> Path:
    """Where the last sequence seen is kept between attaches (per user, per hostd host id)."""
    base = os.environ.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
    return Path(base) / "agentic-hostctl" / "attach" / host_id / session_id


class _Attach:
    """What one attach keeps across connections."""

    def __init__(self, session_id: str) -> None:
        self.session_id = session_id
        self.cursor: int | None = None  # last sequence written to the terminal
        self.exited: m.SessionExited | None = None
        self.detached = False
        self.failures = 0
        self.keys = DetachKeys()
        #: Typed but not sent yet (e.g. while reconnecting); sent first on the next connection.
        self.pending = bytearray()

    def take_keys(self, data: bytes) -> bool:
        """Queue typed bytes; True once the user asked to detach."""
        forward, detach = self.keys.feed(data)
        self.pending += forward[: m.MAX_INPUT_BYTES - len(self.pending)]
        self.detached = self.detached or detach
        return detach


async def _ignore_exited(call: Awaitable[Any]) -> None:
    # Input or a resize racing the session's exit: the output stream reports the exit.
    try:
        await call
    except HostdRemoteError as exc:
        if exc.code != "session.exited":
            raise


async def _keyboard(
    st: _Attach, term: _Terminal, scope: trio.CancelScope, flush: Callable[[], Awaitable[None]] | None
) -> None:
    """Read keys until detach (which cancels ``scope``); ``flush`` sends them when connected."""
    if flush is not None:
        await flush()
    while data := await term.read():
        detach = st.take_keys(data)
        if flush is not None:
            await flush()
        if detach:
            scope.cancel()
            return
    # End of input (a pipe or file): keep showing output until the session exits.


async def _signals(
    st: _Attach, signals: Any, scope: trio.CancelScope, resize: Callable[[], Awaitable[None]] | None
) -> None:
    async for signum in signals:
        if signum != signal.SIGWINCH:  # SIGTERM, SIGHUP: leave like a detach, terminal restored
            st.detached = True
            scope.cancel()
            return
        if resize is not None:
            await resize()


async def _backoff(st: _Attach, term: _Terminal, signals: Any, delay_s: float) -> None:
    """Wait before reconnecting, still honouring the detach keys and signals."""
    with trio.move_on_after(delay_s):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_keyboard, st, term, nursery.cancel_scope, None)
            nursery.start_soon(_signals, st, signals, nursery.cancel_scope, None)


async def _attach_connection(client: HostdClient, st: _Attach, term: _Terminal, signals: Any) -> None:
    """Serve one connection until detach or session exit; raises if the connection fails."""
    info = (await client.call(m.SessionGetRequest(session_id=st.session_id))).session
    st.failures = 0
    start = info.first_seq if st.cursor is None else max(st.cursor + 1, info.first_seq)
    if start > info.next_seq:  # a position from some other ring (hostd restarted): replay
        start = info.first_seq
    st.cursor = start - 1

    async def resize() -> None:
        size = term.size()
        if size is not None:
            request = m.SessionResizeRequest(session_id=st.session_id, cols=size[0], rows=size[1])
            await _ignore_exited(client.call(request))

    async def flush() -> None:
        # Taken before the call: input in flight when the connection drops is lost, never sent twice.
        while st.pending:
            data = bytes(st.pending)
            st.pending.clear()
            await _ignore_exited(client.call(m.SessionWriteRequest(session_id=st.session_id, data=data)))

    async def output() -> None:
        cursor = st.cursor
        async with client.stream(m.SessionSubscribeRequest(session_id=st.session_id, from_seq=start)) as events:
            async for event in events:
                if isinstance(event, m.SessionOutput) and event.seq > cursor:
                    await term.write(event.data)
                    st.cursor = cursor = event.seq
                elif isinstance(event, m.SessionLagged):
                    st.cursor = cursor = event.resume_seq - 1
                elif isinstance(event, m.SessionExited):
                    st.exited = event
        if st.exited is None:
            # Ended without an exit: hostd is shutting down or the session was deleted;
            # a new connection tells which.
            raise HostdConnectionLost("hostd ended the output stream")
        nursery.cancel_scope.cancel()

    await resize()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(output)
        nursery.start_soon(_keyboard, st, term, nursery.cancel_scope, flush)
        nursery.start_soon(_signals, st, signals, nursery.cancel_scope, resize)


def _start_cursor(args: argparse.Namespace, cursor_file: Path) -> int | None:
    if args.from_seq is not None:
        return int(args.from_seq) - 1
    if args.replay:
        return None
    try:
        return int(cursor_file.read_text())
    except (OSError, ValueError):
        return None  # first attach: replay what the ring holds


async def cmd_attach(_client: None, args: argparse.Namespace) -> int:
    st = _Attach(args.session_id)
    cursor_file: Path | None = None
    try:
        with _Terminal() as term, trio.open_signal_receiver(signal.SIGWINCH, signal.SIGTERM, signal.SIGHUP) as sigs:
            while not st.detached:
                try:
                    async with open_hostd(args.socket, client_name=f"{PROG} attach") as client:
                        if cursor_file is None:
                            assert client.hello is not None
                            cursor_file = _cursor_file(client.hello.host_id, st.session_id)
                            st.cursor = _start_cursor(args, cursor_file)
                        await _attach_connection(client, st, term, sigs)
                    break
                except* RECOVERABLE as group:
                    if cursor_file is None:
                        raise  # never connected: hostd is not there at all
                    st.failures += 1
                    if st.failures > args.retries:
                        raise HostdConnectionLost(
                            f"gave up after {args.retries} attempts to reconnect: {leaf_error(group)}"
                        ) from None
                    if st.failures == 1:
                        sys.stderr.write(
                            f"\r\n[{PROG}: connection to hostd lost ({leaf_error(group)}); reconnecting]\r\n"
                        )
                        sys.stderr.flush()
                await _backoff(st, term, sigs, RECONNECT_DELAYS_S[min(st.failures, len(RECONNECT_DELAYS_S)) - 1])
    finally:
        if cursor_file is not None and st.exited is None and st.cursor is not None:
            with contextlib.suppress(OSError):
                cursor_file.parent.mkdir(parents=True, exist_ok=True)
                cursor_file.write_text(f"{st.cursor}\n")
    if st.exited is not None:
        if cursor_file is not None:
            cursor_file.unlink(missing_ok=True)
        exited = st.exited
        _say(f"\n[session {st.session_id} {exit_text(exited.exit_code, exited.signal)}]")
        if exited.exit_code is not None:
            return exited.exit_code
        return 128 + exited.signal if exited.signal else 1
    _say(f"\n[detached from {st.session_id} at seq {st.cursor}]")
    return 0


def _say(line: str) -> None:
    # After SIGHUP the terminal may be gone; the exit status still tells what happened.
    with contextlib.suppress(OSError):
        print(line, file=sys.stderr)
