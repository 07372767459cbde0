"""One PTY session's record (:class:`Session`): its process on a PTY, output ring, input backlog and
end; and :func:`parse_signal`. The registry of sessions, their lifecycle and subscribers are
:mod:`hostd.sessions`'.
"""

from __future__ import annotations

import signal as signals
from pathlib import Path

import trio

from agentic_sandbox.hostd.children import Child
from agentic_sandbox.hostd.errors import QUEUE_RETRY_S, RpcError, limit_reached
from agentic_sandbox.hostd.ptyspawn import ExitStatus, PtyChild
from agentic_sandbox.hostd.ring import OutputRing
from agentic_sandbox.proto import ErrorCode, Limit
from agentic_sandbox.proto import messages as m

#: Largest chunk read from or written to a PTY master in one go (one ring entry).
READ_CHUNK = 64 * 1024
#: Input a session may hold for a child that is not reading its terminal.
INPUT_BACKLOG_BYTES = 4 * 1024 * 1024


def parse_signal(sig: str | int) -> signals.Signals:
    """``"SIGINT"``, ``"INT"``, ``"int"``, ``2`` or ``"2"`` -> ``Signals.SIGINT``."""
    if isinstance(sig, str):
        name = sig.strip().upper()
        if name.isdigit():
            sig = int(name)
        else:
            member = signals.Signals.__members__.get(name if name.startswith("SIG") else f"SIG{name}")
            if member is None:
                raise RpcError(ErrorCode.SIGNAL_UNKNOWN, f"unknown signal {sig!r}", signal=sig)
            return member
    try:
        return signals.Signals(sig)
    except ValueError:
        raise RpcError(ErrorCode.SIGNAL_UNKNOWN, f"unknown signal {sig!r}", signal=sig) from None


class Session(Child):
    """One PTY session: its process (none while pending), output ring, input backlog, and how it
    ended. Made and owned by :class:`hostd.sessions.SessionRegistry`."""

    def __init__(
        self,
        sid: str,
        req: m.SessionCreateRequest,
        cwd: str,
        child: PtyChild | None,
        cgroup: Path | None,
        ring: OutputRing,
    ) -> None:
        super().__init__(sid, req.instance_id, list(req.argv), cwd, cgroup)
        self.cols = req.cols
        self.rows = req.rows
        #: None while the session is pending (created ``deferred``, not started yet).
        self.child = child
        #: What a pending session was created with (the start's fields replace it).
        self.launch = req
        #: Set while a start spawns a pending session's process; other starts and kills wait for it.
        self.starting: trio.Event | None = None
        self.ring = ring
        self.status: ExitStatus | None = None
        self.subscribers = 0
        #: Held while the tree is signalled, so the leader is not reaped (and its pid freed
        #: for reuse) in the middle of it.
        self.reap_lock = trio.Lock()
        #: Input the PTY did not take at once, in arrival order; drained by :meth:`feed_input`.
        self.pending_input = bytearray()
        self.input_waiting = trio.Event()
        #: The leader is a client for the real process (:attr:`hostd.providers.SpawnSpec.proxied`).
        self.proxied = False

    @property
    def pending(self) -> bool:
        return self.child is None and not self.done.is_set()

    @property
    def running(self) -> bool:
        return self.child is not None and not self.done.is_set()

    @property
    def pty(self) -> PtyChild:
        """The PTY child of a started session (every caller has checked it is not pending)."""
        if self.child is None:
            raise RpcError(ErrorCode.SESSION_PENDING, f"session {self.id!r} has not been started yet")
        return self.child

    @property
    def leader_alive(self) -> bool:
        return self.running and not self.pty.reaped

    def info(self) -> m.SessionInfo:
        return m.SessionInfo(
            session_id=self.id,
            instance_id=self.instance_id,
            argv=self.argv,
            cwd=self.cwd,
            pid=None if self.child is None else self.child.pid,
            cols=self.cols,
            rows=self.rows,
            state="exited" if self.done.is_set() else "running",
            created_at=self.created_at,
            exited_at=self.exited_at,
            exit_code=self.status.exit_code if self.status else None,
            signal=self.status.signal if self.status else None,
            end_reason=self.end_reason,
            first_seq=self.ring.first_seq,
            next_seq=self.ring.next_seq,
            subscribers=self.subscribers,
            pending=self.pending,
        )

    def take_input(self, data: bytes) -> int:
        """Accept ``data`` for the PTY without waiting on it.

        What the PTY takes at once is written now (a keystroke costs one syscall); the rest joins
        the input backlog, which :meth:`feed_input` drains in order. A backlog past
        :data:`INPUT_BACKLOG_BYTES` is refused whole with ``limit.reached``: a child that stopped
        reading its terminal is told, not buffered for.
        """
        if len(self.pending_input) + len(data) > INPUT_BACKLOG_BYTES:
            # Fixed, and worth retrying: a child that reads again drains it.
            raise limit_reached(
                f"session {self.id!r} is not reading its input; {len(self.pending_input)} bytes already wait",
                Limit(name="input_backlog", limit=INPUT_BACKLOG_BYTES, retry_after_s=QUEUE_RETRY_S),
                backlog=len(self.pending_input),
            )
        written = 0
        if not self.pending_input:
            try:
                written = self.pty.write_nowait(data)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                raise RpcError(
                    ErrorCode.SESSION_EXITED, f"session {self.id!r} has exited", session_id=self.id
                ) from None
        if written < len(data):
            self.pending_input += memoryview(data)[written:]
            self.input_waiting.set()
        return len(data)

    async def feed_input(self) -> None:
        """Drain the input backlog into the PTY, in order, for as long as the session runs.

        What the PTY took leaves the backlog at once, so a cancellation (a handover freezing the
        session, :mod:`hostd.freezer`) leaves exactly what is still to be written in it."""
        pty = self.pty
        while True:
            await self.input_waiting.wait()
            self.input_waiting = trio.Event()
            while self.pending_input:
                try:
                    written = pty.write_nowait(bytes(self.pending_input[:READ_CHUNK]))
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    self.pending_input.clear()  # the child is gone: nobody will read it
                    return
                if written:
                    del self.pending_input[:written]
                    await trio.lowlevel.checkpoint()
                else:
                    await pty.wait_writable()
