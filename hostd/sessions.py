"""PTY sessions: processes on a PTY inside an instance, owned by hostd, outliving every client.

Each session has one task in the registry's nursery (never a connection's): it reads the PTY
master into the session's :class:`~hostd.ring.OutputRing` whether or not anyone is attached
(a PTY nobody reads blocks its writer), reaps the leader, and records how it ended. Exited
sessions keep their ring and exit status until deleted.

Subscribers keep a cursor into the ring and send from it at their own pace; the PTY reader
never waits for them. One ring entry becomes one ``SessionOutput`` (seq == the entry's seq).
A subscriber whose cursor fell out of the ring gets ``SessionLagged`` and resumes at the
oldest entry still held.

Trees: every session runs with ``AIWG_TREE=<namespace>:session:<id>`` (``HostdConfig.tree_id``)
in a new process group, in its own cgroup ``<instance cgroup>/s-<session id>`` when the instance
has one; kill and delete end the whole tree by every mark (:func:`hostd.proctree.terminate_tree`).
"""

from __future__ import annotations

import logging
import os
import signal as signals
import time
from collections.abc import Awaitable, Callable, Mapping
from contextlib import aclosing
from pathlib import Path
from typing import Protocol

import trio

from hostd.config import HostdConfig
from hostd.errors import RpcError
from hostd.instancedir import validate_child_env
from hostd.proctree import TREE_ENV, Cgroups, remove_cgroup, terminate_tree
from hostd.ptyspawn import ExitStatus, PtyChild, spawn_pty
from hostd.ring import Lag, OutputRing, follow, start_seq
from proto import ErrorCode, bind_log_ids, new_id
from proto import messages as m

log = logging.getLogger(__name__)

#: Largest chunk read from a PTY master in one go (one ring entry).
READ_CHUNK = 64 * 1024
#: Input a session may hold for a child that is not reading its terminal.
INPUT_BACKLOG_BYTES = 4 * 1024 * 1024
#: Ring entries a subscriber takes per read.
_BATCH = 32  # entries per write to a subscriber: at most 32 x 64 KiB
#: After the leader exits, how long output may still arrive before the session counts as
#: exited (a background process may hold the slave open; the master is closed after this).
_DRAIN_AFTER_EXIT_S = 0.5
_FINAL_READS = 16
#: How long kill/delete wait for the session task to record the end after the tree is dead.
_SETTLE_S = 5.0
_SHUTDOWN_GRACE_S = 0.5
DEFAULT_TERM = "xterm-256color"


class InstanceContextLike(Protocol):
    """What a session needs from its instance (``hostd.instances.InstanceContext``)."""

    @property
    def instance_id(self) -> str: ...
    @property
    def working_dir(self) -> str: ...
    @property
    def env(self) -> Mapping[str, str]: ...
    @property
    def cgroup(self) -> Path | None: ...


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


class _Session:
    def __init__(
        self, sid: str, req: m.SessionCreateRequest, cwd: str, child: PtyChild, cgroup: Path | None, ring: OutputRing
    ) -> None:
        self.id = sid
        self.instance_id = req.instance_id
        self.argv = list(req.argv)
        self.cwd = cwd
        self.cols = req.cols
        self.rows = req.rows
        self.child = child
        self.cgroup = cgroup
        self.ring = ring
        self.created_at = time.time()
        self.exited_at: float | None = None
        self.status: ExitStatus | None = None
        self.end_reason: str | None = None
        self.killed = False
        self.deleted = False
        self.subscribers = 0
        #: Set once the end is recorded and the ring closed.
        self.done = trio.Event()
        #: Held while the tree is signalled, so the leader is not reaped (and its pid freed
        #: for reuse) in the middle of it.
        self.reap_lock = trio.Lock()
        #: Cancel scopes of subscribers parked in ``wait_beyond``; delete cancels them.
        self.parked: set[trio.CancelScope] = set()
        #: Input the PTY did not take at once, in arrival order; drained by ``_feed``.
        self.pending_input = bytearray()
        self.input_waiting = trio.Event()

    @property
    def running(self) -> bool:
        return not self.done.is_set()

    def info(self) -> m.SessionInfo:
        return m.SessionInfo(
            session_id=self.id,
            instance_id=self.instance_id,
            argv=self.argv,
            cwd=self.cwd,
            pid=self.child.pid,
            cols=self.cols,
            rows=self.rows,
            state="running" if self.running else "exited",
            created_at=self.created_at,
            exited_at=self.exited_at,
            exit_code=self.status.exit_code if self.status else None,
            signal=self.status.signal if self.status else None,
            end_reason=self.end_reason,
            first_seq=self.ring.first_seq,
            next_seq=self.ring.next_seq,
            subscribers=self.subscribers,
        )


class SessionRegistry:
    """Every PTY session of this hostd. See the module docstring for ownership.

    At most ``config.max_sessions`` sessions run at once (execs have their own, equal limit).
    """

    def __init__(
        self,
        config: HostdConfig,
        cgroups: Cgroups,
        nursery: trio.Nursery,
        resolve: Callable[[str], InstanceContextLike],
    ) -> None:
        self._config = config
        self._cgroups = cgroups
        self._nursery = nursery
        self._resolve = resolve
        self._sessions: dict[str, _Session] = {}
        self._starting: set[str] = set()
        self._closing = False

    # -- lookups --------------------------------------------------------------------------

    def _tree(self, session_id: str) -> str:
        """The ``AIWG_TREE`` mark of this session's process tree."""
        return self._config.tree_id("session", session_id)

    def _get(self, session_id: str) -> _Session:
        s = self._sessions.get(session_id)
        if s is None or s.deleted:
            raise RpcError(ErrorCode.SESSION_NOT_FOUND, f"no session {session_id!r}", session_id=session_id)
        return s

    def _running(self, session_id: str) -> _Session:
        s = self._get(session_id)
        if not s.running or s.child.reaped:
            raise RpcError(ErrorCode.SESSION_EXITED, f"session {session_id!r} has exited", session_id=session_id)
        return s

    def get(self, session_id: str) -> m.SessionInfo:
        return self._get(session_id).info()

    def list(self, instance_id: str | None = None) -> list[m.SessionInfo]:
        return [
            s.info()
            for s in self._sessions.values()
            if not s.deleted and (instance_id is None or s.instance_id == instance_id)
        ]

    def counts(self) -> tuple[int, int]:
        """(sessions, running sessions)."""
        live = [s for s in self._sessions.values() if not s.deleted]
        return len(live), sum(1 for s in live if s.running)

    def _live(self) -> int:
        return sum(1 for s in self._sessions.values() if s.running) + len(self._starting)

    # -- create ---------------------------------------------------------------------------

    async def create(self, req: m.SessionCreateRequest) -> m.SessionInfo:
        if self._closing:
            raise RpcError(ErrorCode.SHUTTING_DOWN)
        ctx = self._resolve(req.instance_id)
        sid = req.session_id or new_id()
        bind_log_ids(session_id=sid)  # this request's lines and the session's tasks name it
        if sid in self._sessions or sid in self._starting:
            raise RpcError(ErrorCode.REQUEST_INVALID, f"session {sid!r} already exists", session_id=sid)
        if self._live() >= self._config.max_sessions:
            raise RpcError(
                ErrorCode.LIMIT_REACHED,
                f"at most {self._config.max_sessions} sessions and execs may run at once",
                limit=self._config.max_sessions,
            )
        # Exited sessions keep their ring until deleted (the contract); bound how many may
        # pile up rather than ever dropping one behind the caller's back.
        retained = len(self._sessions) - sum(1 for s in self._sessions.values() if s.running)
        if retained >= self._config.max_retained:
            raise RpcError(
                ErrorCode.LIMIT_REACHED,
                f"{retained} exited sessions are kept; delete some before creating more",
                retained=retained,
            )
        # A relative cwd is taken inside the instance's working dir.
        cwd = os.path.normpath(os.path.join(ctx.working_dir, req.cwd or ""))
        if not os.path.isdir(cwd):
            raise RpcError(ErrorCode.WORKING_DIR_NOT_FOUND, f"working directory {cwd!r} does not exist", cwd=cwd)
        validate_child_env(req.env)
        env = {**ctx.env, **req.env}
        env.setdefault("TERM", DEFAULT_TERM)
        env[TREE_ENV] = self._tree(sid)
        cgroup = None
        if ctx.cgroup is not None and self._cgroups.available:
            cgroup = Cgroups(ctx.cgroup).create(f"s-{sid}")
        # Reserved across the spawn (which awaits a thread) against a duplicate id and the limit.
        self._starting.add(sid)
        try:
            child = await spawn_pty(req.argv, cwd=cwd, env=env, cols=req.cols, rows=req.rows, cgroup=cgroup)
        except BaseException:
            Cgroups.remove(cgroup)
            raise
        finally:
            self._starting.discard(sid)
        ring = OutputRing(max_frames=self._config.ring_frames, max_bytes=self._config.ring_bytes)
        s = _Session(sid, req, cwd, child, cgroup, ring)
        self._sessions[sid] = s
        self._nursery.start_soon(self._run, s, name=f"session {sid}")
        try:
            # Stopped or destroyed while we spawned? Its kill_instance did not see this session.
            self._resolve(s.instance_id)
        except RpcError:
            s.deleted = True
            await self._kill(s, 0)
            if self._sessions.get(sid) is s:
                del self._sessions[sid]
            Cgroups.remove(cgroup)
            raise
        log.info("session %s started: pid %d, instance %s, argv %r", sid, child.pid, s.instance_id, s.argv)
        return s.info()

    # -- the session task -------------------------------------------------------------------

    async def _run(self, s: _Session) -> None:
        """Read output into the ring, reap the leader, record the end. Owns ``s.child``."""
        output_done = trio.Event()
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._pump, s, output_done)
                nursery.start_soon(self._feed, s)
                await s.child.wait_exited()
                async with s.reap_lock:
                    s.status = s.child.reap()
                # Output written just before the exit is still buffered, and a background
                # process may hold the slave: read on until EIO, for a moment at most.
                with trio.move_on_after(_DRAIN_AFTER_EXIT_S):
                    await output_done.wait()
                nursery.cancel_scope.cancel()
            # What arrived since the reader stopped; bounded, since a leftover process may
            # still be writing flat out.
            for _ in range(_FINAL_READS):
                if not (data := s.child.read_nowait(READ_CHUNK)):
                    break
                s.ring.append(data)
        except Exception:
            log.exception("session %s: reader failed", s.id)
        finally:
            s.child.close()
            s.exited_at = time.time()
            status = s.status
            if s.killed:
                s.end_reason = "killed"
            elif status is None:
                s.end_reason = "lost"
            else:
                s.end_reason = "signaled" if status.signal is not None else "exited"
            s.ring.close()
            s.done.set()
            log.info("session %s ended: %s %s", s.id, s.end_reason, status)

    async def _pump(self, s: _Session, output_done: trio.Event) -> None:
        try:
            while data := await s.child.read_some(READ_CHUNK):
                # A PTY read gives at most a few KiB. Take what is already buffered too, so a
                # fast producer makes a few large ring entries, not thousands of small ones
                # (each entry is a frame for every subscriber).
                if len(data) < READ_CHUNK:
                    parts = [data]
                    size = len(data)
                    while size < READ_CHUNK and (more := s.child.read_nowait(READ_CHUNK - size)):
                        parts.append(more)
                        size += len(more)
                    if len(parts) > 1:
                        data = b"".join(parts)
                s.ring.append(data)
        except OSError as exc:
            log.warning("session %s: reading the pty failed: %s", s.id, exc)
        finally:
            output_done.set()

    # -- input and control ----------------------------------------------------------------

    async def write(self, session_id: str, data: bytes) -> int:
        """Accept input for the session without ever waiting on the PTY.

        What the PTY takes at once is written now (a keystroke costs one syscall); the rest
        joins the session's input backlog, which ``_feed`` drains in order. A backlog past
        ``INPUT_BACKLOG_BYTES`` is refused whole with ``limit.reached``: a child that stopped
        reading its terminal is told, not buffered for. Returns the bytes accepted.
        """
        if len(data) > m.MAX_INPUT_BYTES:
            raise RpcError(ErrorCode.INPUT_TOO_LARGE, f"input over {m.MAX_INPUT_BYTES} bytes", limit=m.MAX_INPUT_BYTES)
        s = self._running(session_id)
        if len(s.pending_input) + len(data) > INPUT_BACKLOG_BYTES:
            raise RpcError(
                ErrorCode.LIMIT_REACHED,
                f"session {session_id!r} is not reading its input; {len(s.pending_input)} bytes already wait",
                backlog=len(s.pending_input),
                limit=INPUT_BACKLOG_BYTES,
            )
        written = 0
        if not s.pending_input:
            try:
                written = s.child.write_nowait(data)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                raise RpcError(
                    ErrorCode.SESSION_EXITED, f"session {session_id!r} has exited", session_id=session_id
                ) from None
        if written < len(data):
            s.pending_input += memoryview(data)[written:]
            s.input_waiting.set()
        return len(data)

    async def _feed(self, s: _Session) -> None:
        """Drain the session's input backlog into the PTY, in order, for as long as it runs."""
        while True:
            await s.input_waiting.wait()
            s.input_waiting = trio.Event()
            while s.pending_input:
                chunk = bytes(s.pending_input[:READ_CHUNK])
                try:
                    await s.child.write_all(chunk)
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    s.pending_input.clear()  # the child is gone: nobody will read it
                    return
                del s.pending_input[: len(chunk)]

    def resize(self, session_id: str, cols: int, rows: int) -> None:
        if not (1 <= cols <= m.MAX_TERMINAL_DIM and 1 <= rows <= m.MAX_TERMINAL_DIM):
            raise RpcError(ErrorCode.REQUEST_INVALID, f"terminal size {cols}x{rows} out of range", cols=cols, rows=rows)
        s = self._running(session_id)
        try:
            s.child.resize(cols, rows)
        except (OSError, trio.ClosedResourceError):
            raise RpcError(
                ErrorCode.SESSION_EXITED, f"session {session_id!r} has exited", session_id=session_id
            ) from None
        s.cols, s.rows = cols, rows

    def signal(self, session_id: str, sig: str | int) -> None:
        """Send ``sig`` to the session's process group (the foreground job and the leader)."""
        signum = parse_signal(sig)
        s = self._running(session_id)
        # Not reaped yet (checked above, no await since): the pgid is still ours.
        try:
            os.killpg(s.child.pid, signum)
        except ProcessLookupError:
            pass

    async def _terminate(self, s: _Session, grace_s: float) -> None:
        """End the session's tree; a session already ended still gets a sweep for escapees."""
        async with s.reap_lock:
            leader = None if s.child.reaped else s.child.pid
            await terminate_tree(leader=leader, pgid=leader, cgroup=s.cgroup, tree_id=self._tree(s.id), grace_s=grace_s)

    async def _kill(self, s: _Session, grace_s: float) -> None:
        with trio.CancelScope(shield=True):
            if s.running and not s.child.reaped:  # a leader that exited on its own keeps its reason
                s.killed = True
            await self._terminate(s, grace_s)
            with trio.move_on_after(_SETTLE_S):
                await s.done.wait()

    async def kill(self, session_id: str, grace_s: float | None) -> m.SessionInfo:
        s = self._get(session_id)
        await self._kill(s, self._config.stop_grace_s if grace_s is None else grace_s)
        return s.info()

    async def kill_instance(self, instance_id: str, grace_s: float) -> None:
        """Kill every running session of an instance (it is stopping)."""
        victims = [s for s in self._sessions.values() if s.instance_id == instance_id and s.running]
        async with trio.open_nursery() as nursery:
            for s in victims:
                nursery.start_soon(self._kill, s, grace_s)

    async def delete(self, session_id: str) -> None:
        """Kill the tree if it runs, end subscribers (``StreamEnd(deleted)``), forget the session."""
        s = self._get(session_id)
        s.deleted = True
        for scope in list(s.parked):
            scope.cancel()
        with trio.CancelScope(shield=True):
            await self._kill(s, self._config.stop_grace_s)
            if self._sessions.get(session_id) is s:
                del self._sessions[session_id]
            await remove_cgroup(s.cgroup)
        log.info("session %s deleted", session_id)

    async def shutdown(self) -> None:
        """hostd is going away: kill every running tree (short grace). PTYs cannot be re-adopted."""
        self._closing = True
        running = [s for s in self._sessions.values() if s.running]
        with trio.CancelScope(shield=True):
            async with trio.open_nursery() as nursery:
                for s in running:
                    nursery.start_soon(self._kill, s, _SHUTDOWN_GRACE_S)

    # -- subscribers ------------------------------------------------------------------------

    async def subscribe(
        self,
        stream_id: int,
        session_id: str,
        from_seq: int | None,
        send: Callable[[m.Frame | list[m.Frame]], Awaitable[None]],
    ) -> None:
        """Replay from ``from_seq`` (None: only new output), then live, until exit or delete.

        Errors (unknown session, sequence out of range) are raised before anything is sent.
        """
        s = self._get(session_id)
        ring = s.ring
        start = start_seq(ring, from_seq)

        async def park(seq: int) -> None:
            # Registered so that delete can wake it without cancelling a send in progress.
            with trio.CancelScope() as parked:
                s.parked.add(parked)
                try:
                    await ring.wait_beyond(seq)
                finally:
                    s.parked.discard(parked)

        s.subscribers += 1
        try:
            await send(m.StreamOpened(id=stream_id, first_seq=ring.first_seq, next_seq=ring.next_seq))
            entries = follow(ring, start, max_items=_BATCH, stop=lambda: s.deleted, wait=park)
            async with aclosing(entries):
                async for item in entries:
                    if isinstance(item, Lag):
                        await send(
                            m.SessionLagged(id=stream_id, missed_from=item.missed_from, resume_seq=item.resume_seq)
                        )
                    else:  # one write for the whole batch
                        await send([m.SessionOutput(id=stream_id, seq=seq, data=data) for seq, _kind, data in item])
            if s.deleted:
                await send(m.StreamEnd(id=stream_id, reason="deleted"))
                return
            status = s.status
            await send(
                m.SessionExited(
                    id=stream_id,
                    exit_code=status.exit_code if status else None,
                    signal=status.signal if status else None,
                    reason=s.end_reason or "lost",
                    last_seq=ring.next_seq - 1,
                )
            )
            await send(m.StreamEnd(id=stream_id, reason="exited"))
        finally:
            s.subscribers -= 1
