"""Execs: processes without a PTY inside an instance (agent tasks), with an optional control channel.

Each exec is the leader of its own tree (session, ``AIWG_TREE=<namespace>:exec:<id>``, cgroup
``<instance cgroup>/x-<exec id>`` when the instance has one). Its stdout and stderr are separate
pipes read into one :class:`OutputRing` (kind 1 = stdout, 2 = stderr) by reader tasks in the
registry's nursery, whether or not anyone subscribes. With ``control=True`` the child also gets
a control channel (:mod:`hostd.control`): JSON objects, one per line, both ways; an inherited fd,
or a socket in the instance to connect to where the provider says so
(:meth:`~hostd.providers.base.Provider.control_socket`). Messages the child writes go into the
same ring (kind 3, the JSON bytes), so replay interleaves output and control messages in the
order hostd saw them. With ``control_flow=True`` the subscriber acknowledges what it processed
(:meth:`ExecRegistry.control_ack`) and the channel is read only while less than
:data:`CONTROL_UNACKED_BYTES` (or half the ring's frames) of it is unacknowledged: a fast child
waits on its writes instead of its messages being evicted before anyone read them. Once the
leader exited, what is left is read regardless.

Lifetime: the exec ends when its leader exits and its pipes are closed. If something the leader
started keeps the pipes open past a short drain, the rest of the tree is killed (the tree goes
with its leader). ``cancel``, ``timeout_s``, ``kill_instance`` and ``shutdown`` kill the whole
tree (SIGTERM, grace, SIGKILL). The exit status stays until ``delete``.

stdin: one writer task per exec owns the pipe (:mod:`hostd.stdinqueue`); ``start`` queues
``req.stdin`` first, so later ``write`` calls land after it, in order. ``write`` returns once its
data is in the pipe.
"""

from __future__ import annotations

import builtins
import contextlib
import logging
import os
import socket
import time
from collections import deque
from collections.abc import Awaitable, Callable
from contextlib import aclosing
from functools import partial
from pathlib import Path

import msgspec
import trio

from agentic_sandbox.proto import ErrorCode
from agentic_sandbox.proto import messages as m

from . import control, procspawn, proctree
from .children import Child, ChildRegistry
from .config import HostdConfig
from .control import ControlChannel
from .errors import RpcError
from .freezer import Freezer
from .handover import ExecState, StdinWrite
from .instances import Placement
from .proctree import Cgroups
from .ring import Lag, OutputRing, follow, start_seq
from .stdinqueue import StdinQueue

log = logging.getLogger(__name__)

KIND_STDOUT = 1
KIND_STDERR = 2
KIND_CONTROL = 3
_STREAM_NAMES: dict[int, str] = {KIND_STDOUT: "stdout", KIND_STDERR: "stderr"}
_READ_CHUNK = 64 * 1024
_BATCH = 32
_BATCH_BYTES = 64 * 1024  # as for sessions: bounded writes keep one connection fair between streams
#: After the leader exits, how long its pipes may stay open before the rest of the tree is killed.
_DRAIN_S = 0.5
#: How long to wait for the pipes to close once the tree was killed.
_PIPE_CLOSE_WAIT_S = 3.0
#: Control bytes a ``control_flow`` exec may have unacknowledged before hostd stops reading them.
CONTROL_UNACKED_BYTES = 2 * 1024 * 1024

#: How often a timed-out exec of a sleeping instance looks whether it woke (its deadline then moves).
_ASLEEP_POLL_S = 0.5


class _Exec(Child):
    def __init__(
        self,
        req: m.ExecStartRequest,
        exec_id: str,
        cwd: str,
        proc: procspawn.Process,
        ring: OutputRing,
        cgroup: Path | None,
        ctrl: ControlChannel | None,
    ) -> None:
        super().__init__(exec_id, req.instance_id, list(req.argv), cwd, cgroup)
        self.control = req.control
        self.proc = proc
        self.ring = ring
        self.ctrl = ctrl
        self.exit_code: int | None = None
        self.signal: int | None = None
        self.stdin = StdinQueue(exec_id, req.stdin, req.keep_stdin_open)
        #: The streams not at their end yet (stdout, stderr and the control channel, by kind).
        self.open_streams = {KIND_STDOUT, KIND_STDERR, KIND_CONTROL} if req.control else {KIND_STDOUT, KIND_STDERR}
        #: Wall-clock time of the timeout (kept across an upgrade in place), if there is one.
        self.deadline = time.time() + req.timeout_s if req.timeout_s is not None else None
        #: The leader was reaped (its status is in ``exit_code``/``signal``).
        self.reaped = False
        #: The leader is a client for the real process (:attr:`hostd.providers.SpawnSpec.proxied`).
        self.proxied = False
        self.pipes_closed = trio.Event()
        self.leader_exited = trio.Event()
        #: Flow control (``control_flow``): (seq, size) of control messages not acknowledged yet.
        self.control_flow = req.control_flow
        self.unacked: deque[tuple[int, int]] = deque()
        self.unacked_bytes = 0
        self.acked = trio.Event()

    @property
    def leader_alive(self) -> bool:
        return self.proc.returncode is None

    def info(self) -> m.ExecInfo:
        return m.ExecInfo(
            exec_id=self.id,
            instance_id=self.instance_id,
            argv=self.argv,
            cwd=self.cwd,
            pid=self.proc.pid,
            state="running" if self.running else "exited",
            control=self.control,
            created_at=self.created_at,
            exited_at=self.exited_at,
            exit_code=self.exit_code,
            signal=self.signal,
            end_reason=self.end_reason,
            first_seq=self.ring.first_seq,
            next_seq=self.ring.next_seq,
        )


def _listen(path: str, instance_id: str) -> socket.socket:
    try:
        return control.listen(path)
    except OSError as exc:
        raise RpcError(
            ErrorCode.CONTROL_UNAVAILABLE,
            f"instance {instance_id!r}: cannot open the control socket {path}: {exc}",
            instance_id=instance_id,
        ) from exc


def _open_fd(stream: trio.lowlevel.FdStream | None) -> int | None:
    """The fd of a pipe stream still open, for a handover document."""
    if stream is None:
        return None
    fd = stream.fileno()
    return fd if fd >= 0 else None


class ExecRegistry(ChildRegistry[_Exec]):
    """Every exec of this hostd; reader, writer and waiter tasks live in ``nursery``.

    At most ``config.max_execs`` execs run at once.
    """

    kind = "exec"
    cgroup_prefix = "x"
    not_found = ErrorCode.EXEC_NOT_FOUND
    exited = ErrorCode.EXEC_EXITED
    setting = "AIWG_MAX_EXECS"

    def __init__(
        self,
        config: HostdConfig,
        cgroups: Cgroups,
        nursery: trio.Nursery,
        resolve: Callable[[str], Placement],
    ) -> None:
        super().__init__(config, cgroups, nursery, resolve, max_live=config.max_execs)
        #: Parks the pipe readers and stdin writers for an upgrade in place (:mod:`hostd.upgrade`).
        self.freezer = Freezer()
        #: Whether an instance sleeps now (set by the caller): an exec's timeout waits while it does.
        self.sleeping: Callable[[str], bool] = lambda _id: False

    def slept(self, instance_id: str, slept_s: float) -> None:
        """The instance woke after ``slept_s`` asleep: its execs' timeouts move on by that much
        (sleeping time counts against no timeout)."""
        for rec in self._held(instance_id):
            if rec.deadline is not None:
                rec.deadline += slept_s

    def get(self, exec_id: str) -> m.ExecInfo:
        return self._find(exec_id).info()

    def list(self, instance_id: str | None = None) -> list[m.ExecInfo]:
        return [x.info() for x in self._held(instance_id)]

    # -- start ----------------------------------------------------------------------------------

    async def start(self, req: m.ExecStartRequest) -> m.ExecInfo:
        env = dict(req.env)
        exec_id, placement = self._admit(req.exec_id, req.instance_id, env)
        parent_sock = child_sock = listener = None
        try:
            if req.control and "exec.control" not in placement.capabilities:
                raise RpcError(
                    ErrorCode.CONTROL_UNAVAILABLE,
                    f"instance {req.instance_id!r} cannot give an exec a control channel",
                    instance_id=req.instance_id,
                )
            env["AIWG_EXEC_ID"] = exec_id
            where = placement.control_socket(exec_id) if req.control else None
            argv = list(req.argv)
            if where is not None:
                env.update(where.inside_env)
                argv = [*where.argv_prefix, *argv]
            spec = placement.spawn_spec(argv, req.cwd, env, tty=False)
            cgroup = self._make_cgroup(spec.cgroup_parent, exec_id)
            host_env = dict(spec.env)
            try:
                if where is not None:
                    listener = _listen(where.host_path, req.instance_id)
                elif req.control:
                    parent_sock, child_sock = control.socketpair()
                    host_env[control.CONTROL_FD_ENV] = str(child_sock.fileno())
                proc = await procspawn.spawn(
                    spec.argv,
                    cwd=spec.cwd,
                    env=host_env,
                    tree_id=self._tree(exec_id),
                    cgroup=cgroup,
                    stdin=procspawn.PIPE,
                    stdout=procspawn.PIPE,
                    stderr=procspawn.PIPE,
                    pass_fds=(child_sock.fileno(),) if child_sock else (),
                )
            except BaseException:
                if parent_sock is not None:
                    parent_sock.close()
                if listener is not None and where is not None:
                    listener.close()
                    with contextlib.suppress(OSError):
                        os.unlink(where.host_path)
                Cgroups.remove(cgroup)
                raise
        finally:
            self._release(exec_id)
            if child_sock is not None:
                child_sock.close()  # the child has its own copy; ours would hide its EOF
        ring = OutputRing(max_frames=self._config.ring_frames, max_bytes=self._config.ring_bytes)
        ctrl = None
        if parent_sock is not None:
            ctrl = ControlChannel(exec_id, sock=parent_sock)
        elif listener is not None and where is not None:
            ctrl = ControlChannel(exec_id, listener=listener, path=where.host_path)
        rec = _Exec(req, exec_id, spec.shown_cwd, proc, ring, cgroup, ctrl)
        rec.proxied = spec.proxied
        await self._adopt(rec)
        return rec.info()

    # -- the exec's tasks -----------------------------------------------------------------------

    async def _run(self, rec: _Exec) -> None:
        """Own the exec until it ended: readers, stdin writer, timeout, exit collection.

        Also what an exec handed over by an earlier image of hostd runs: it goes on with the
        streams still open, and one whose leader was reaped already goes straight on to the drain.
        """
        proc = rec.proc
        freezer = self.freezer
        async with trio.open_nursery() as nursery:
            nursery.start_soon(freezer.run, partial(rec.stdin.run, proc))
            if rec.deadline is not None:
                nursery.start_soon(self._timeout, rec)
            async with trio.open_nursery() as pipes:
                for kind, stream in ((KIND_STDOUT, proc.stdout), (KIND_STDERR, proc.stderr)):
                    if kind in rec.open_streams and stream is not None:
                        pipes.start_soon(freezer.run, partial(self._pump, rec, stream, kind))
                if rec.ctrl is not None and KIND_CONTROL in rec.open_streams:
                    pipes.start_soon(freezer.run, partial(self._control_reader, rec, rec.ctrl))
                if not rec.open_streams:
                    rec.pipes_closed.set()
                if not rec.reaped:
                    await proc.wait_exited()
                    await freezer.thawed()  # a handover under way leaves the zombie to the next image
                    rec.exit_code, rec.signal = await procspawn.wait_exit(proc)
                    rec.reaped = True
                rec.leader_exited.set()
                rec.acked.set()  # what is left on the control channel is read regardless
                if rec.proxied:
                    # What it ran inside the instance goes with its client (no hangup reaches it).
                    await proctree.kill_tree_now(leader=None, pgid=None, cgroup=None, tree_id=self._tree(rec.id))
                with trio.move_on_after(_DRAIN_S):
                    await rec.pipes_closed.wait()
                if not rec.pipes_closed.is_set():
                    # Something the leader started holds the pipes: it goes with its leader.
                    await proctree.kill_tree_now(
                        leader=None, pgid=proc.pid, cgroup=rec.cgroup, tree_id=self._tree(rec.id)
                    )
                    with trio.move_on_after(_PIPE_CLOSE_WAIT_S):
                        await rec.pipes_closed.wait()
                await freezer.thawed()
                pipes.cancel_scope.cancel()
            nursery.cancel_scope.cancel()

    def _finish(self, rec: _Exec) -> None:
        rec.proc.poll()  # reap a leader killed after a failure; nobody will wait for it any more
        rec.stdin.close()
        rec.exited_at = time.time()
        rec.end_reason = self.end_reason(rec, rec.exit_code, rec.signal)
        for stream in (rec.proc.stdin, rec.proc.stdout, rec.proc.stderr):
            if isinstance(stream, trio.lowlevel.FdStream):  # what procspawn gives (None where not a pipe)
                stream.close()
        if rec.ctrl is not None:
            rec.ctrl.close()
        rec.ring.close()  # last: subscribers that see it closed find the exit status set
        rec.done.set()

    async def _cleanup(self, rec: _Exec) -> None:
        # A cgroup can stay busy for a moment after its last process died.
        await proctree.remove_cgroup(rec.cgroup)

    @staticmethod
    def _pipe_closed(rec: _Exec, kind: int) -> None:
        rec.open_streams.discard(kind)
        if not rec.open_streams:
            rec.pipes_closed.set()

    async def _pump(self, rec: _Exec, stream: trio.abc.ReceiveStream, kind: int) -> None:
        """Read one pipe into the ring until its end. Restartable (:mod:`hostd.freezer`): a read
        that is cancelled has taken nothing, and what one took is in the ring before the next."""
        while True:
            try:
                data = await stream.receive_some(_READ_CHUNK)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                break
            if not data or rec.ring.closed:
                break
            rec.ring.append(data if isinstance(data, bytes) else bytes(data), kind)  # FdStream: bytes
        self._pipe_closed(rec, kind)

    async def _control_reader(self, rec: _Exec, ctrl: ControlChannel) -> None:
        frames = max(1, self._config.ring_frames // 2)

        def deliver(message: bytes) -> None:
            if not rec.ring.closed:
                seq = rec.ring.append(message, KIND_CONTROL)
                if rec.control_flow:
                    rec.unacked.append((seq, len(message)))
                    rec.unacked_bytes += len(message)

        async def ready() -> None:
            while (
                rec.control_flow
                and not rec.leader_exited.is_set()
                and (rec.unacked_bytes > CONTROL_UNACKED_BYTES or len(rec.unacked) > frames)
            ):
                rec.acked = trio.Event()  # set by an ack, and when the leader exits
                await rec.acked.wait()

        await ctrl.receive(deliver, ready=ready, leader_exited=rec.leader_exited)
        self._pipe_closed(rec, KIND_CONTROL)

    def control_ack(self, exec_id: str, seq: int) -> None:
        """The subscriber processed the exec's events up to ``seq`` (see the module docstring)."""
        rec = self._find(exec_id)
        while rec.unacked and rec.unacked[0][0] <= seq:
            rec.unacked_bytes -= rec.unacked.popleft()[1]
        rec.acked.set()

    async def _timeout(self, rec: _Exec) -> None:
        # The deadline moves while the instance sleeps (slept()): look again once it is reached.
        while rec.deadline is not None:
            await trio.sleep(max(0.0, rec.deadline - time.time()))
            if time.time() < rec.deadline:
                continue
            if not self.sleeping(rec.instance_id):
                break
            await trio.sleep(_ASLEEP_POLL_S)
        await self._kill(rec, "timeout", self._config.stop_grace_s, settle=False)

    async def _terminate(self, rec: _Exec, grace_s: float) -> None:
        proc = rec.proc
        await proctree.terminate_tree(
            leader=proc.pid if proc.returncode is None else None,
            pgid=proc.pid,
            cgroup=rec.cgroup,
            tree_id=self._tree(rec.id),
            grace_s=grace_s,
        )

    # -- upgrade in place -----------------------------------------------------------------------

    def snapshot(self) -> builtins.list[ExecState]:
        """Every exec as a handover document carries it (the registry is frozen: nothing moves)."""
        states = []
        for rec in self._children.values():
            if rec.deleted:
                continue
            proc = rec.proc
            connected, listening, path = rec.ctrl.fds() if rec.ctrl is not None else (None, None, None)
            partial_line = bytes(rec.ctrl.partial) if rec.ctrl is not None else b""
            states.append(
                ExecState(
                    id=rec.id,
                    instance_id=rec.instance_id,
                    argv=rec.argv,
                    cwd=rec.cwd,
                    created_at=rec.created_at,
                    pid=proc.pid,
                    stdin_fd=_open_fd(proc.stdin),
                    stdout_fd=_open_fd(proc.stdout),
                    stderr_fd=_open_fd(proc.stderr),
                    cgroup=str(rec.cgroup) if rec.cgroup is not None else None,
                    proxied=rec.proxied,
                    control=rec.control,
                    control_flow=rec.control_flow,
                    control_fd=connected,
                    control_listener_fd=listening,
                    control_path=path,
                    control_partial=partial_line,
                    control_skipping=rec.ctrl.skipping if rec.ctrl is not None else False,
                    unacked=list(rec.unacked),
                    open_streams=sorted(rec.open_streams),
                    stdin_open=rec.stdin.open,
                    stdin_queue=[StdinWrite(data, eof) for data, eof in rec.stdin.snapshot()],
                    deadline=rec.deadline,
                    end=rec.end_state(reaped=rec.reaped, exit_code=rec.exit_code, signal=rec.signal),
                    ring=rec.ring.snapshot(),
                )
            )
        return states

    def resume(self, states: builtins.list[ExecState]) -> None:
        """Take over the execs an earlier image of hostd handed over: each goes on where it was."""
        for state in states:
            end = state.end
            returncode = None
            if end.reaped:
                returncode = -end.signal if end.signal is not None else end.exit_code or 0
            proc = procspawn.Process.adopt(state.pid, state.stdin_fd, state.stdout_fd, state.stderr_fd, returncode)
            ring = OutputRing(max_frames=self._config.ring_frames, max_bytes=self._config.ring_bytes)
            ring.resume(state.ring)
            ctrl = ControlChannel.adopt(state.id, state.control_fd, state.control_listener_fd, state.control_path)
            if ctrl is not None:
                ctrl.partial[:] = state.control_partial
                ctrl.skipping = state.control_skipping
            req = m.ExecStartRequest(
                instance_id=state.instance_id,
                argv=state.argv,
                control=state.control,
                control_flow=state.control_flow,
                keep_stdin_open=True,
            )
            cgroup = Path(state.cgroup) if state.cgroup else None
            rec = _Exec(req, state.id, state.cwd, proc, ring, cgroup, ctrl)
            rec.created_at, rec.proxied, rec.deadline = state.created_at, state.proxied, state.deadline
            rec.open_streams = set(state.open_streams)
            rec.stdin.open = state.stdin_open
            rec.stdin.resume([(w.data, w.eof) for w in state.stdin_queue])
            rec.unacked.extend((seq, size) for seq, size in state.unacked)
            rec.unacked_bytes = sum(size for _, size in rec.unacked)
            rec.reaped, rec.exit_code, rec.signal = end.reaped, end.exit_code, end.signal
            rec.resume_end(end)
            self._children[rec.id] = rec
            if end.done:
                rec.stdin.close()
                rec.done.set()
            else:
                self._nursery.start_soon(self._supervise, rec, name=f"exec {rec.id}")

    # -- operations -----------------------------------------------------------------------------

    async def write(self, exec_id: str, data: bytes, eof: bool) -> int:
        rec = self._running(exec_id)
        return await rec.stdin.write(data, eof)

    async def control_send(self, exec_id: str, message: dict[str, object]) -> None:
        rec = self._find(exec_id)
        if rec.ctrl is None:
            raise RpcError(ErrorCode.CONTROL_UNAVAILABLE, f"exec {exec_id!r} has no control channel", exec_id=exec_id)
        self._running(exec_id)
        try:
            await rec.ctrl.send(message)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            if not rec.running or rec.proc.returncode is not None:
                raise RpcError(ErrorCode.EXEC_EXITED, f"exec {exec_id!r} has exited", exec_id=exec_id) from None
            raise RpcError(
                ErrorCode.CONTROL_UNAVAILABLE, f"exec {exec_id!r} closed its control channel", exec_id=exec_id
            ) from None

    async def kill(self, exec_id: str, grace_s: float | None, reason: str = "canceled") -> m.ExecInfo:
        """Kill the exec's tree (end reason ``reason``); an exited exec is returned as is."""
        rec = self._find(exec_id)
        if rec.running:
            await self._kill(rec, reason, self._grace(grace_s))
        return rec.info()

    async def delete(self, exec_id: str) -> None:
        """Kill the tree if it still runs, end subscribers (``StreamEnd(deleted)``), forget the exec."""
        rec = self._find(exec_id)
        if rec.running:
            await self._kill(rec, "killed", 0)
        await self._forget(rec)

    async def _forget(self, rec: _Exec) -> None:
        rec.deleted = True
        rec.ring.close()  # wakes parked subscribers, which then see ``deleted``
        if self._children.get(rec.id) is rec:
            del self._children[rec.id]

    # -- subscribers ----------------------------------------------------------------------------

    async def subscribe(
        self,
        stream_id: int,
        exec_id: str,
        from_seq: int | None,
        send: Callable[[m.Frame | builtins.list[m.Frame]], Awaitable[None]],
    ) -> None:
        """Replay from ``from_seq`` (None: only new), then live: output, control messages and
        lag notices, then ``ExecExited`` + ``StreamEnd(exited)``, or ``StreamEnd(deleted)``.

        Errors (unknown exec, sequence out of range) are raised before anything is sent.
        """
        rec = self._find(exec_id)
        ring = rec.ring
        start = start_seq(ring, from_seq)
        await send(m.StreamOpened(id=stream_id, first_seq=ring.first_seq, next_seq=ring.next_seq))
        entries = follow(ring, start, max_items=_BATCH, max_bytes=_BATCH_BYTES, stop=lambda: rec.deleted)
        async with aclosing(entries):
            async for item in entries:
                if isinstance(item, Lag):
                    await send(m.ExecLagged(id=stream_id, missed_from=item.missed_from, resume_seq=item.resume_seq))
                else:  # one write per batch
                    await send([self._event(stream_id, seq, kind, data) for seq, kind, data in item])
        if rec.deleted:
            await send(m.StreamEnd(id=stream_id, reason="deleted"))
            return
        exited = m.ExecExited(
            id=stream_id,
            exit_code=rec.exit_code,
            signal=rec.signal,
            reason=rec.end_reason or "lost",
            last_seq=ring.next_seq - 1,
        )
        # One write: a client that reads the exit finds the end beside it (and need not cancel).
        await send([exited, m.StreamEnd(id=stream_id, reason="exited")])

    @staticmethod
    def _event(stream_id: int, seq: int, kind: int, data: bytes) -> m.Event:
        if kind == KIND_CONTROL:
            return m.ExecControlMessage(id=stream_id, seq=seq, message=msgspec.json.decode(data))
        return m.ExecOutput(id=stream_id, seq=seq, stream=_STREAM_NAMES[kind], data=data)  # type: ignore[arg-type]
