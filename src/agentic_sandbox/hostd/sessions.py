"""PTY sessions: processes on a PTY inside an instance, owned by hostd, outliving every client.

Each session has one task in the registry's nursery (never a connection's): it reads the PTY
master into the session's :class:`~hostd.ring.OutputRing` whether or not anyone is attached
(a PTY nobody reads blocks its writer), reaps the leader, and records how it ended. Exited
sessions keep their ring and exit status until deleted.

Pending sessions: a create with ``deferred`` holds the session (id, instance, the launch it asked
for, an empty ring that subscribers may already follow) without starting anything; a
``SessionStartRequest`` starts it, each field it gives replacing the creation's (the first start
wins; a later one, or one on a session that is not pending, changes nothing). A pending session
counts toward no running limit (pending ones are bounded by ``max_sessions`` of their own); writes,
resizes and signals to it are ``session.pending``; a kill, its instance stopping or hostd shutting
down ends it as ``killed`` with no exit code; a delete forgets it. Like every session it dies with
hostd.

Subscribers keep a cursor into the ring and send from it at their own pace; the PTY reader
never waits for them. One ring entry becomes one ``SessionOutput`` (seq == the entry's seq).
A subscriber whose cursor fell out of the ring gets ``SessionLagged`` and resumes at the
oldest entry still held.

Trees: every session runs with ``AIWG_TREE=<namespace>:session:<id>`` (``HostdConfig.tree_id``)
in a new process group, in its own cgroup ``<cgroup parent>/s-<session id>`` when its instance's
provider names a parent; kill and delete end the whole tree by every mark
(:func:`hostd.proctree.terminate_tree`). The start path, limits, kill and the failure policy are
shared with execs (:mod:`hostd.children`); what runs and where is the instance provider's call.
"""

from __future__ import annotations

import builtins
import logging
import os
import time
from collections.abc import Awaitable, Callable
from contextlib import aclosing
from functools import partial
from pathlib import Path

import trio

from agentic_sandbox.hostd import proctree
from agentic_sandbox.hostd.children import ChildRegistry
from agentic_sandbox.hostd.config import HostdConfig
from agentic_sandbox.hostd.errors import SLOT_RETRY_S, RpcError, limit_reached
from agentic_sandbox.hostd.fdstore import FdStore, Recovered
from agentic_sandbox.hostd.freezer import Freezer
from agentic_sandbox.hostd.handover import SessionRecord, SessionState
from agentic_sandbox.hostd.instances import Placement
from agentic_sandbox.hostd.proctree import (
    TREE_ENV,
    Cgroups,
    kill_tree_now,
    remove_cgroup,
    signal_marked,
    terminate_tree,
)
from agentic_sandbox.hostd.providers.base import SpawnSpec
from agentic_sandbox.hostd.ptysession import READ_CHUNK, Session, parse_signal
from agentic_sandbox.hostd.ptyspawn import ExitStatus, PtyChild, spawn_pty
from agentic_sandbox.hostd.ring import Lag, MemoryBudget, OutputRing, follow, start_seq
from agentic_sandbox.hostd.spool import Spool
from agentic_sandbox.proto import ErrorCode, Limit
from agentic_sandbox.proto import messages as m

log = logging.getLogger(__name__)

#: Ring entries a subscriber takes per read.
_BATCH = 32  # entries per write to a subscriber...
#: ... and bytes: a busy session's subscriber yields the connection's write lock after this much, so
#: a keystroke echo of another session on the same connection waits behind a bounded amount.
_BATCH_BYTES = 64 * 1024
#: After the leader exits, how long output may still arrive before the session counts as
#: exited (a background process may hold the slave open; the master is closed after this).
_DRAIN_AFTER_EXIT_S = 0.5
_FINAL_READS = 16
DEFAULT_TERM = "xterm-256color"


class SessionRegistry(ChildRegistry[Session]):
    """Every PTY session of this hostd. See the module docstring for ownership.

    At most ``config.max_sessions`` sessions run at once (execs have their own limit).
    """

    kind = "session"
    cgroup_prefix = "s"
    not_found = ErrorCode.SESSION_NOT_FOUND
    exited = ErrorCode.SESSION_EXITED
    setting = "AIWG_MAX_SESSIONS"

    def __init__(
        self,
        config: HostdConfig,
        cgroups: Cgroups,
        nursery: trio.Nursery,
        resolve: Callable[[str], Placement],
        *,
        resuming: bool = False,
        fdstore: FdStore | None = None,
    ) -> None:
        super().__init__(config, cgroups, nursery, resolve, max_live=config.max_sessions)
        #: Where running sessions' terminals are kept so that they outlive a crash (:mod:`hostd.fdstore`).
        self.fdstore = fdstore if fdstore is not None and fdstore.enabled else None
        #: Parks the PTY readers and input feeders for an upgrade in place (:mod:`hostd.upgrade`).
        self.freezer = Freezer()
        self._budget = MemoryBudget(
            limit=config.ring_memory_bytes, share=config.ring_memory_bytes // config.max_sessions
        )
        #: Worker threads reading bulk PTY output: one per session at most, never waiting on
        #: the threads other work takes.
        self._bulk_readers = trio.CapacityLimiter(config.max_sessions)
        self._spool: Spool | None = None
        if config.spool_session_bytes > 0 and config.spool_total_bytes > 0:
            self._spool = Spool(
                config.spool_dir,
                session_bytes=config.spool_session_bytes,
                total_bytes=config.spool_total_bytes,
                segment_bytes=config.spool_segment_bytes,
            )
            if resuming:  # an upgrade in place or a crash: the sessions and their spooled output go on
                self._spool.make_root()
            else:  # sessions outlive no hostd but through a handover: what an old one spooled is moot
                self._spool.clear()

    async def shutdown(self) -> None:
        """Kill every session (they cannot outlive hostd), then drop their spooled output."""
        for s in self._pending():
            self._end_pending(s, "killed")
        await super().shutdown()
        for s in self._children.values():
            s.ring.discard()

    def _running(self, session_id: str) -> Session:
        if self._find(session_id).pending:
            raise RpcError(
                ErrorCode.SESSION_PENDING, f"session {session_id!r} has not been started yet", session_id=session_id
            )
        s = super()._running(session_id)
        if s.pty.reaped:
            raise RpcError(ErrorCode.SESSION_EXITED, f"session {session_id!r} has exited", session_id=session_id)
        return s

    def get(self, session_id: str) -> m.SessionInfo:
        return self._find(session_id).info()

    def list(self, instance_id: str | None = None) -> list[m.SessionInfo]:
        return [s.info() for s in self._held(instance_id)]

    # -- create ---------------------------------------------------------------------------

    async def create(self, req: m.SessionCreateRequest) -> m.SessionInfo:
        if req.deferred:
            return self._hold(req)
        env = dict(req.env)
        sid, placement = self._admit(req.session_id, req.instance_id, env)
        try:
            child, cgroup, spec = await self._spawn(sid, placement, req.argv, req.cwd, env, req.cols, req.rows)
        finally:
            self._release(sid)
        s = Session(sid, req, spec.shown_cwd, child, cgroup, self._ring(sid))
        s.proxied = spec.proxied
        await self._adopt(s)
        self._keep(s)
        log.info("session %s started: pid %d, instance %s, argv %r", sid, child.pid, s.instance_id, s.argv)
        return s.info()

    def _hold(self, req: m.SessionCreateRequest) -> m.SessionInfo:
        """A deferred create: the checks of a start (instance, id, env, cwd), nothing spawned."""
        waiting = len(self._pending())
        if waiting >= self.max_live:
            # A pending session that starts or is deleted frees a place.
            raise limit_reached(
                f"at most {self.max_live} sessions may wait to start",
                Limit(name="pending_sessions", limit=self.max_live, setting=self.setting, retry_after_s=SLOT_RETRY_S),
            )
        env = dict(req.env)
        sid, placement = self._admit(req.session_id, req.instance_id, env, live=False)
        try:
            cwd = placement.spawn_spec(req.argv, req.cwd, env, tty=True).shown_cwd
        finally:
            self._release(sid)
        s = Session(sid, req, cwd, None, None, self._ring(sid))
        self._children[sid] = s  # no await since the checks: nothing can have taken the id
        log.info("session %s pending: instance %s, argv %r", sid, s.instance_id, s.argv)
        return s.info()

    async def start(self, req: m.SessionStartRequest) -> tuple[m.SessionInfo, bool]:
        """Start a pending session with the request's fields over its creation's; (info, started)."""
        s = self._find(req.session_id)
        while s.starting is not None:  # another start is spawning it: see how that ends
            await s.starting.wait()
            s = self._find(req.session_id)
        if not s.pending:
            return s.info(), False
        launch = s.launch
        argv = launch.argv if req.argv is None else req.argv
        cwd = launch.cwd if req.cwd is None else req.cwd
        env = dict(launch.env if req.env is None else req.env)
        cols, rows = req.cols or launch.cols, req.rows or launch.rows
        sid, placement = self._admit(s.id, s.instance_id, env, held=True)
        s.starting = trio.Event()
        try:
            child, cgroup, spec = await self._spawn(sid, placement, argv, cwd, env, cols, rows)
        finally:
            self._release(sid)
            s.starting.set()
            s.starting = None
        s.child, s.cgroup, s.proxied = child, cgroup, spec.proxied
        s.argv, s.cwd, s.cols, s.rows = list(argv), spec.shown_cwd, cols, rows
        await self._adopt(s)
        self._keep(s)
        log.info("session %s started: pid %d, instance %s, argv %r", sid, child.pid, s.instance_id, s.argv)
        return s.info(), True

    async def _spawn(
        self,
        sid: str,
        placement: Placement,
        argv: builtins.list[str],
        cwd: str | None,
        env: dict[str, str],
        cols: int,
        rows: int,
    ) -> tuple[PtyChild, Path | None, SpawnSpec]:
        env.setdefault("TERM", DEFAULT_TERM)
        spec = placement.spawn_spec(argv, cwd, env, tty=True)
        cgroup = self._make_cgroup(spec.cgroup_parent, sid)
        try:
            child = await spawn_pty(
                spec.argv,
                cwd=spec.cwd,
                env={**spec.env, TREE_ENV: self._tree(sid)},
                cols=cols,
                rows=rows,
                cgroup=cgroup,
            )
        except BaseException:
            Cgroups.remove(cgroup)
            raise
        return child, cgroup, spec

    def _ring(self, sid: str) -> OutputRing:
        return OutputRing(
            max_frames=self._config.ring_frames,
            max_bytes=self._config.ring_bytes,
            budget=self._budget,
            spool=self._spool.open(sid) if self._spool is not None else None,
            write_through=self.fdstore is not None,
        )

    # -- pending sessions -------------------------------------------------------------------

    def _pending(self, instance_id: str | None = None) -> builtins.list[Session]:
        return [s for s in self._held(instance_id) if s.pending]

    @staticmethod
    async def _settle(s: Session) -> None:
        """Wait until no start is spawning ``s``'s process (it then runs, or is pending again)."""
        while s.starting is not None:
            await s.starting.wait()

    def _end_pending(self, s: Session, reason: str) -> None:
        """End a session that never started: no exit code, ``reason`` as its end; followers told."""
        s.kill_reason = reason
        self._finish(s)

    async def kill_instance(self, instance_id: str, grace_s: float) -> None:
        for s in self._pending(instance_id):
            if s.starting is None:  # a start under way fails by itself: the instance is not running
                self._end_pending(s, "killed")
        await super().kill_instance(instance_id, grace_s)

    # -- the session task -------------------------------------------------------------------

    async def _run(self, s: Session) -> None:
        """Read output into the ring, reap the leader. Owns ``s.child``.

        Also what a session handed over by an earlier image of hostd runs: one it had reaped
        already (``s.status``) goes straight on to the drain.
        """
        output_done = trio.Event()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self.freezer.run, partial(self._pump, s, output_done))
            nursery.start_soon(self.freezer.run, s.feed_input)
            if s.status is None:
                await s.pty.wait_exited()
                await self.freezer.thawed()  # a handover under way leaves the zombie to the next image
                async with s.reap_lock:
                    s.status = s.pty.reap()
                if s.proxied:
                    # No hangup reaches what it ran inside the instance: it goes with its client.
                    await kill_tree_now(leader=None, pgid=None, cgroup=None, tree_id=self._tree(s.id))
            # Output written just before the exit is still buffered, and a background
            # process may hold the slave: read on until EIO, for a moment at most.
            with trio.move_on_after(_DRAIN_AFTER_EXIT_S):
                await output_done.wait()
            await self.freezer.thawed()
            nursery.cancel_scope.cancel()
        # What arrived since the reader stopped; bounded, since a leftover process may
        # still be writing flat out.
        for _ in range(_FINAL_READS):
            if not (data := s.pty.read_nowait(READ_CHUNK)):
                break
            s.ring.append(data)

    def _finish(self, s: Session) -> None:
        if s.child is not None:
            s.child.close()
            if self.fdstore is not None:
                self.fdstore.drop(s.id, [kept for kept in self.stored() if kept.id != s.id])
        s.exited_at = time.time()
        status = s.status
        s.end_reason = self.end_reason(s, status.exit_code if status else None, status.signal if status else None)
        s.ring.close()
        s.done.set()
        log.info("session %s ended: %s %s", s.id, s.end_reason, status)

    async def _pump(self, s: Session, output_done: trio.Event) -> None:
        """Read the PTY into the ring until its end. Restartable (:mod:`hostd.freezer`): a chunk read
        is in the ring before the next checkpoint."""
        try:
            # Bulk output comes gathered into large chunks, so a fast producer makes a few large
            # ring entries, not thousands of small ones (each entry is a frame for every subscriber).
            while data := await s.pty.read_chunk(READ_CHUNK, self._bulk_readers):
                s.ring.append(data)
        except OSError as exc:
            log.warning("session %s: reading the pty failed: %s", s.id, exc)
        output_done.set()

    # -- the fd store: sessions that outlive a crash ---------------------------------------

    def stored(self) -> builtins.list[SessionRecord]:
        """The running sessions as the fd store's state describes them."""
        return [
            self._record(s)
            for s in self._children.values()
            if s.child is not None and not s.done.is_set() and not s.deleted
        ]

    @staticmethod
    def _record(s: Session) -> SessionRecord:
        return SessionRecord(
            id=s.id,
            instance_id=s.instance_id,
            argv=s.argv,
            cwd=s.cwd,
            cols=s.cols,
            rows=s.rows,
            created_at=s.created_at,
            launch=s.launch,
            pid=s.child.pid if s.child is not None else None,
            cgroup=str(s.cgroup) if s.cgroup is not None else None,
            proxied=s.proxied,
        )

    def _rebuild(self, record: SessionRecord, child: PtyChild | None) -> Session:
        """A session of an earlier hostd (image), from its record, with a new ring; registered."""
        cgroup = Path(record.cgroup) if record.cgroup else None
        s = Session(record.id, record.launch, record.cwd, child, cgroup, self._ring(record.id))
        s.argv, s.cols, s.rows, s.created_at, s.proxied = (
            record.argv,
            record.cols,
            record.rows,
            record.created_at,
            record.proxied,
        )
        self._children[s.id] = s
        return s

    def _keep(self, s: Session) -> None:
        if self.fdstore is not None and s.child is not None and not s.done.is_set():
            self.fdstore.keep(s.id, s.child.fd, self.stored())

    def recover(self, recovered: Recovered) -> None:
        """Take back the sessions a crashed hostd left in the fd store (:mod:`hostd.fdstore`): one
        whose leader still runs and carries its mark goes on, its output replayed from the spool;
        one that ended meanwhile is held as ended (``lost``: its exit code went with that hostd),
        with its output up to the crash."""
        masters = dict(recovered.masters)
        for stored in recovered.sessions:
            master = masters.pop(stored.id, None)
            child = None
            if (
                master is not None
                and stored.pid is not None
                and proctree.carries_mark(stored.pid, self._tree(stored.id))
            ):
                child = PtyChild.adopt(stored.pid, master, None)
            s = self._rebuild(stored, child)
            s.ring.recover()
            if child is not None:
                self._nursery.start_soon(self._supervise, s, name=f"session {s.id}")
                log.info(
                    "session %s taken back after a crash: pid %d, output from %d", s.id, child.pid, s.ring.next_seq
                )
                continue
            if master is not None:
                os.close(master)
                if self.fdstore is not None:
                    self.fdstore.drop(stored.id, [])
            s.kill_reason = "lost"
            s.exited_at = time.time()
            s.end_reason = "lost"
            s.ring.close()
            s.done.set()
            log.warning("session %s ended while hostd was down: its exit code is lost", s.id)
        for sid, fd in masters.items():  # kept by a hostd whose state did not name them
            os.close(fd)
            if self.fdstore is not None:
                self.fdstore.drop(sid, [])
        if self.fdstore is not None:
            self.fdstore.save(self.stored())
        if self._spool is not None:
            self._spool.remove_unclaimed()

    # -- upgrade in place -------------------------------------------------------------------

    def snapshot(self) -> builtins.list[SessionState]:
        """Every session as a handover document carries it (the registry is frozen: nothing moves)."""
        states = []
        for s in self._children.values():
            if s.deleted:
                continue
            status = s.status
            states.append(
                SessionState(
                    session=self._record(s),
                    master_fd=s.child.fd if s.child is not None and not s.child.closed else None,
                    pending_input=bytes(s.pending_input),
                    end=s.end_state(
                        reaped=status is not None,
                        exit_code=status.exit_code if status else None,
                        signal=status.signal if status else None,
                    ),
                    ring=s.ring.snapshot(),
                )
            )
        return states

    def resume(self, states: builtins.list[SessionState]) -> None:
        """Take over the sessions an earlier image of hostd handed over: each goes on where it was
        (reading, draining, or ended with its status), its output whole."""
        for state in states:
            record, end = state.session, state.end
            status = ExitStatus(end.exit_code, end.signal) if end.reaped else None
            child = None
            if record.pid is not None:
                if state.master_fd is None:  # it had ended and its master was closed
                    child = PtyChild(record.pid, -1, -1)
                    child.closed, child.status = True, status
                else:
                    child = PtyChild.adopt(record.pid, state.master_fd, status)
            s = self._rebuild(record, child)
            s.status = status
            s.resume_end(end)
            s.ring.resume(state.ring)
            if state.pending_input:
                s.pending_input += state.pending_input
                s.input_waiting.set()
            if end.done:
                s.done.set()
            elif child is not None:
                self._nursery.start_soon(self._supervise, s, name=f"session {s.id}")
        if self._spool is not None:
            self._spool.remove_unclaimed()

    # -- input and control ----------------------------------------------------------------

    async def write(self, session_id: str, data: bytes) -> int:
        """Accept input for the session without ever waiting on the PTY (:meth:`Session.take_input`);
        returns the bytes accepted."""
        if len(data) > m.MAX_INPUT_BYTES:
            raise RpcError(ErrorCode.INPUT_TOO_LARGE, f"input over {m.MAX_INPUT_BYTES} bytes", limit=m.MAX_INPUT_BYTES)
        return self._running(session_id).take_input(data)

    def resize(self, session_id: str, cols: int, rows: int) -> None:
        if not (1 <= cols <= m.MAX_TERMINAL_DIM and 1 <= rows <= m.MAX_TERMINAL_DIM):
            raise RpcError(ErrorCode.REQUEST_INVALID, f"terminal size {cols}x{rows} out of range", cols=cols, rows=rows)
        s = self._running(session_id)
        try:
            s.pty.resize(cols, rows)
        except (OSError, trio.ClosedResourceError):
            raise RpcError(
                ErrorCode.SESSION_EXITED, f"session {session_id!r} has exited", session_id=session_id
            ) from None
        s.cols, s.rows = cols, rows

    def signal(self, session_id: str, sig: str | int) -> None:
        """Send ``sig`` to the session's process group (the foreground job and the leader)."""
        signum = parse_signal(sig)
        s = self._running(session_id)
        if s.proxied:
            # The leader only relays (podman exec): the signal is for what runs inside.
            signal_marked(self._tree(s.id), signum, besides=s.pty.pid)
            return
        # Not reaped yet (checked above, no await since): the pgid is still ours.
        try:
            os.killpg(s.pty.pid, signum)
        except ProcessLookupError:
            pass

    async def _terminate(self, s: Session, grace_s: float) -> None:
        """End the session's tree; a session already ended still gets a sweep for escapees."""
        async with s.reap_lock:
            leader = None if s.child is None or s.child.reaped else s.child.pid
            await terminate_tree(leader=leader, pgid=leader, cgroup=s.cgroup, tree_id=self._tree(s.id), grace_s=grace_s)

    async def kill(self, session_id: str, grace_s: float | None) -> m.SessionInfo:
        s = self._find(session_id)
        await self._settle(s)
        if s.pending:
            self._end_pending(s, "killed")
        else:
            await self._kill(s, "killed", self._grace(grace_s))
        return s.info()

    async def delete(self, session_id: str) -> None:
        """Kill the tree if it runs, end subscribers (``StreamEnd(deleted)``), forget the session."""
        s = self._find(session_id)
        with trio.CancelScope(shield=True):
            await self._settle(s)
            self._mark_deleted(s)  # followers end now, with StreamEnd(deleted), not after the kill
            if not s.pending:
                await self._kill(s, "killed", self._config.stop_grace_s)
            await self._forget(s)
        log.info("session %s deleted", session_id)

    @staticmethod
    def _mark_deleted(s: Session) -> None:
        s.deleted = True
        s.ring.poke()  # parked subscribers wake and see it; a send in progress is not cut

    async def _forget(self, s: Session) -> None:
        self._mark_deleted(s)
        if self._children.get(s.id) is s:
            del self._children[s.id]
        s.ring.discard()
        await remove_cgroup(s.cgroup)

    # -- subscribers ------------------------------------------------------------------------

    def attached_by_instance(self) -> dict[str, builtins.list[str]]:
        """The running sessions a terminal follows (they keep their instance awake), by instance."""
        found: dict[str, builtins.list[str]] = {}
        for s in self._children.values():
            if s.subscribers and s.running and not s.deleted:
                found.setdefault(s.instance_id, []).append(s.id)
        return found

    async def subscribe(
        self,
        stream_id: int,
        session_id: str,
        from_seq: int | None,
        send: Callable[[m.Frame | builtins.list[m.Frame]], Awaitable[None]],
    ) -> None:
        """Replay from ``from_seq`` (None: only new output), then live, until exit or delete.

        Errors (unknown session, sequence out of range) are raised before anything is sent.
        """
        s = self._find(session_id)
        ring = s.ring
        start = start_seq(ring, from_seq)

        s.subscribers += 1
        try:
            await send(m.StreamOpened(id=stream_id, first_seq=ring.first_seq, next_seq=ring.next_seq))
            entries = follow(ring, start, max_items=_BATCH, max_bytes=_BATCH_BYTES, stop=lambda: s.deleted)
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
