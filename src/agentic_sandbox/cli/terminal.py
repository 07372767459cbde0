"""The user's terminal while an attach command runs: raw mode, keys, output, size, signals, cursor.

Both attach commands use it: ``agentic-hostctl attach`` over hostd's socket
(:mod:`cli.hostattach`) and ``agentic attach`` over the controller's WebSocket. It knows no
transport and no protocol: keys come out as bytes (minus the detach keys, :class:`DetachKeys`),
output goes in as bytes, the window size is a pair of ints and a session's position is an int.

Resource handling: :class:`Terminal` is a context manager. On entry it starts catching SIGWINCH,
SIGTERM and SIGHUP (before raw mode, so a signal can never kill us with the terminal raw), then
puts the input tty in raw mode and dups the fds it was given. On exit, whatever ended the body (a
detach, an error, Cancelled, KeyboardInterrupt), it closes the dups, puts back the tty attributes
and the blocking modes it found, and only then stops catching the signals. SIGTERM and SIGHUP do
not end the process: :meth:`Terminal.watch_signals` returns, and the caller leaves like a detach.

:class:`CursorFile` keeps the last sequence seen of one session between runs (0600, in 0700
directories under ``$XDG_STATE_HOME``), so the next attach resumes right after it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import stat
import termios
import tty
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from types import TracebackType
from typing import Any
from urllib.parse import quote

import trio

DETACH_KEY = 0x1D  # Ctrl-]
PREFIX_KEY = 0x02  # Ctrl-B, then d
#: How the detach keys are named in help texts.
DETACH_KEYS_HELP = "Ctrl-] or Ctrl-B then d (Ctrl-B Ctrl-B sends one Ctrl-B)"
#: Signals that end an attach like a detach: the terminal is restored and the position kept.
LEAVE_SIGNALS = (signal.SIGTERM, signal.SIGHUP)
#: The largest window dimension a tty reports (struct winsize holds unsigned shorts).
MAX_WINDOW_DIM = 65535


class DetachKeys:
    """Finds the detach keys in typed input: Ctrl-] alone, or Ctrl-B then d (tmux's prefix).

    Keeps state between calls, so a prefix at the end of one read and its key at the start of
    the next still detach.
    """

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


class KeyQueue:
    """Typed keys not sent yet (e.g. while reconnecting), at most ``limit`` bytes; the rest is dropped."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.detached = False
        self._keys = DetachKeys()
        self._pending = bytearray()

    def take(self, data: bytes) -> bool:
        """Queue typed bytes; True once the user asked to detach."""
        forward, detach = self._keys.feed(data)
        self._pending += forward[: self.limit - len(self._pending)]
        self.detached = self.detached or detach
        return detach

    def drain(self) -> bytes:
        """Everything queued, removed from the queue: keys in flight when a send fails are lost, never sent twice."""
        data = bytes(self._pending)
        self._pending.clear()
        return data


def _pollable(fd: int) -> bool:
    mode = os.fstat(fd).st_mode
    return stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode) or os.isatty(fd)


class Terminal:
    """The user's terminal while attached: raw mode, async I/O on dups of ``stdin``/``stdout``, signals.

    FdStream makes the open file description non-blocking, and the fds share it with the shell
    that started us, so the original blocking modes and tty attributes are put back on exit.
    Files and /dev/null cannot be polled: those are read in a thread and written directly.
    Enter and leave it inside ``trio.run`` (the signal receiver and the streams need the run).
    """

    def __init__(self, stdin: int = 0, stdout: int = 1) -> None:
        self.stdin, self.stdout = stdin, stdout
        self.is_tty = os.isatty(stdin)
        self._blocking = {fd: os.get_blocking(fd) for fd in (stdin, stdout)}
        self._exits = contextlib.ExitStack()
        self._signals: Any = None
        self._in: trio.lowlevel.FdStream | None = None
        self._out: trio.lowlevel.FdStream | None = None

    def __enter__(self) -> Terminal:
        with contextlib.ExitStack() as exits:
            self._signals = exits.enter_context(trio.open_signal_receiver(signal.SIGWINCH, *LEAVE_SIGNALS))
            exits.callback(self._restore_blocking)
            if self.is_tty:
                saved = termios.tcgetattr(self.stdin)
                exits.callback(termios.tcsetattr, self.stdin, termios.TCSADRAIN, saved)
                tty.setraw(self.stdin)
            if _pollable(self.stdin):
                self._in = exits.enter_context(contextlib.closing(trio.lowlevel.FdStream(os.dup(self.stdin))))
            if _pollable(self.stdout):
                self._out = exits.enter_context(contextlib.closing(trio.lowlevel.FdStream(os.dup(self.stdout))))
            self._exits = exits.pop_all()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._exits.close()

    def _restore_blocking(self) -> None:
        for fd, blocking in self._blocking.items():
            os.set_blocking(fd, blocking)

    async def read(self, max_bytes: int = 65536) -> bytes:
        """The next keys typed; b"" at the end of input (a pipe or file)."""
        if self._in is not None:
            return await self._in.receive_some(max_bytes)
        return await trio.to_thread.run_sync(os.read, self.stdin, max_bytes)

    async def write(self, data: bytes) -> None:
        if self._out is not None:
            await self._out.send_all(data)
            return
        view = memoryview(data)
        while view:
            view = view[os.write(self.stdout, view) :]

    def size(self) -> tuple[int, int] | None:
        """(cols, rows) of the window, each at least 1; None when input is not a terminal."""
        if not self.is_tty:
            return None
        try:
            cols, rows = os.get_terminal_size(self.stdin)
        except OSError:
            return None
        return max(1, min(cols, MAX_WINDOW_DIM)), max(1, min(rows, MAX_WINDOW_DIM))

    async def watch_signals(self, on_resize: Callable[[], Awaitable[None]] | None) -> int:
        """Call ``on_resize`` on each SIGWINCH; return the number of the first SIGTERM or SIGHUP.

        Signals that arrive while nobody watches are kept and seen by the next call.
        """
        async for signum in self._signals:
            if signum in LEAVE_SIGNALS:
                return int(signum)
            if on_resize is not None:
                await on_resize()
        raise AssertionError("trio's signal receiver never ends")


async def read_keys(term: Terminal, queue: KeyQueue, send: Callable[[], Awaitable[None]] | None) -> bool:
    """Read keys into ``queue`` until a detach key (True) or the end of input (False).

    ``send`` (when connected) is awaited first, for keys queued before, and after every read.
    """
    if send is not None:
        await send()
    while data := await term.read():
        detach = queue.take(data)
        if send is not None:
            await send()
        if detach:
            return True
    return False


def _component(part: str) -> str:
    """One path component made of an untrusted id: no separators, no ``.``/``..``, never empty."""
    if not part:
        raise ValueError("an empty id cannot name a cursor file")
    quoted = quote(part, safe="")
    return "%2E" + quoted[1:] if quoted.startswith(".") else quoted


class CursorFile:
    """The last sequence seen of one session, kept between attaches so the next one resumes after it."""

    def __init__(self, path: Path) -> None:
        self.path = path

    @classmethod
    def for_session(cls, prog: str, *ids: str, env: Mapping[str, str] | None = None) -> CursorFile:
        """``$XDG_STATE_HOME/<prog>/attach/<id>/.../<id>`` (default ``~/.local/state``), per user.

        ``ids`` name the session (e.g. hostd's host id, then the session id); each becomes one
        path component, quoted so that no id can reach outside the directory.
        """
        env = os.environ if env is None else env
        base = env.get("XDG_STATE_HOME") or os.path.join(os.path.expanduser("~"), ".local", "state")
        return cls(Path(base, _component(prog), "attach", *(_component(i) for i in ids)))

    def load(self) -> int | None:
        """The position saved, or None if there is none (first attach) or it cannot be read."""
        try:
            return int(self.path.read_text())
        except (OSError, ValueError):
            return None

    def save(self, seq: int) -> None:
        """Replace the saved position at once (a crash leaves the old or the new one); raises OSError."""
        missing = [p for p in (self.path.parent, *self.path.parent.parents) if not p.exists()]
        for directory in reversed(missing):
            directory.mkdir(mode=0o700, exist_ok=True)
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}.tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        try:
            os.fchmod(fd, 0o600)  # also if a stale temporary file was left with another mode
            with os.fdopen(fd, "w") as f:
                f.write(f"{seq}\n")
            os.replace(tmp, self.path)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise

    def remove(self) -> None:
        self.path.unlink(missing_ok=True)
