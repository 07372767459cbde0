"""Execs: processes without a PTY inside an instance (agent tasks), with an optional control channel.

Each exec is the leader of its own tree (session, ``AIWG_TREE=<namespace>:exec:<id>``, cgroup
``<instance cgroup>/x-<exec id>`` when the instance has one). Its stdout and stderr are separate
pipes read into one :class:`OutputRing` (kind 1 = stdout, 2 = stderr) by reader tasks in the
registry's nursery, whether or not anyone subscribes. With ``control=True`` the child also gets
a control channel (:mod:`hostd.control`): JSON objects, one per line, both ways. Messages the
child writes go into the same ring (kind 3, the JSON bytes), so replay interleaves output and
control messages in the order hostd saw them.

Lifetime: the exec ends when its leader exits and its pipes are closed. If something the leader
started keeps the pipes open past a short drain, the rest of the tree is killed (the tree goes
with its leader). ``cancel``, ``timeout_s``, ``kill_instance`` and ``shutdown`` kill the whole
tree (SIGTERM, grace, SIGKILL). The exit status stays until ``delete``.

stdin: one writer task per exec owns the pipe (:mod:`hostd.stdinqueue`); ``start`` queues
``req.stdin`` first, so later ``write`` calls land after it, in order. ``write`` returns once its
data is in the pipe.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Awaitable, Callable
from contextlib import aclosing
from pathlib import Path

import msgspec
import trio

from proto import ErrorCode, bind_log_ids, new_id
from proto import messages as m

from . import control, procspawn, proctree
from .config import HostdConfig
from .control import ControlChannel
from .errors import RpcError
from .instancedir import validate_child_env
from .instances import InstanceContext
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
#: After the leader exits, how long its pipes may stay open before the rest of the tree is killed.
_DRAIN_S = 0.5
#: How long to wait for the pipes to close once the tree was killed.
_PIPE_CLOSE_WAIT_S = 3.0
#: How long cancel/delete/kill wait for an exec's exit to be recorded after killing its tree.
_FINISH_WAIT_S = 5.0
_SHUTDOWN_GRACE_S = 0.5


class _Exec:
    def __init__(self, req: m.ExecStartRequest, exec_id: str, cwd: str, proc: trio.Process, ring: OutputRing) -> None:
        self.exec_id = exec_id
        self.instance_id = req.instance_id
        self.argv = list(req.argv)
        self.cwd = cwd
        self.control = req.control
        self.created_at = time.time()
        self.proc = proc
        self.ring = ring
        self.cgroup: Path | None = None
        self.ctrl: ControlChannel | None = None
        self.running = True
        self.exited_at: float | None = None
        self.exit_code: int | None = None
        self.signal: int | None = None
        self.end_reason: str | None = None
        #: Why hostd killed the tree (canceled, timeout, killed); None if it ended on its own.
        self.kill_reason: str | None = None
        self.done = trio.Event()
        self.deleted = False
        self.stdin = StdinQueue(exec_id, req.stdin, req.keep_stdin_open)
        self.open_pipes = 3 if req.control else 2
        self.pipes_closed = trio.Event()

    def info(self) -> m.ExecInfo:
        return m.ExecInfo(
            exec_id=self.exec_id,
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


class ExecRegistry:
    """Every exec of this hostd; reader, writer and waiter tasks live in ``nursery``."""

    def __init__(
        self,
        config: HostdConfig,
        cgroups: Cgroups,
        nursery: trio.Nursery,
        resolve: Callable[[str], InstanceContext],
    ) -> None:
        self._config = config
        self._cgroups = cgroups
        self._nursery = nursery
        self._resolve = resolve
        self._execs: dict[str, _Exec] = {}
        self._starting: set[str] = set()  # exec ids being spawned (reserved, counted as live)
        self._closing = False

    # -- queries --------------------------------------------------------------------------------

    def _tree(self, exec_id: str) -> str:
        """The ``AIWG_TREE`` mark of this exec's process tree."""
        return self._config.tree_id("exec", exec_id)

    def get(self, exec_id: str) -> m.ExecInfo:
        return self._find(exec_id).info()

    def list(self, instance_id: str | None = None) -> list[m.ExecInfo]:
        return [x.info() for x in self._execs.values() if instance_id is None or x.instance_id == instance_id]

    def count(self, instance_id: str | None = None) -> int:
        """Execs held (running or exited, not yet deleted), of one instance or all."""
        return sum(1 for x in self._execs.values() if instance_id is None or x.instance_id == instance_id)

    def _live(self) -> int:
        return sum(1 for x in self._execs.values() if x.running) + len(self._starting)

    # -- start ----------------------------------------------------------------------------------

    async def start(self, req: m.ExecStartRequest) -> m.ExecInfo:
        if self._closing:
            raise RpcError(ErrorCode.SHUTTING_DOWN)
        ctx = self._resolve(req.instance_id)
        if self._live() >= self._config.max_sessions:
            raise RpcError(
                ErrorCode.LIMIT_REACHED,
                f"{self._config.max_sessions} execs are running already",
                limit=self._config.max_sessions,
            )
        retained = len(self._execs) - sum(1 for x in self._execs.values() if x.running)
        if retained >= self._config.max_retained:
            raise RpcError(
                ErrorCode.LIMIT_REACHED,
                f"{retained} exited execs are kept; delete some before starting more",
                retained=retained,
            )
        exec_id = req.exec_id or new_id()
        bind_log_ids(exec_id=exec_id)  # this request's lines and the exec's tasks name it
        if exec_id in self._execs or exec_id in self._starting:
            raise RpcError(ErrorCode.REQUEST_INVALID, f"exec id {exec_id!r} is already in use", exec_id=exec_id)
        validate_child_env(req.env)
        # An absolute cwd is taken as is, a relative one below the instance's working dir.
        cwd = os.path.join(ctx.working_dir, req.cwd) if req.cwd else ctx.working_dir
        if not os.path.isdir(cwd):
            raise RpcError(ErrorCode.WORKING_DIR_NOT_FOUND, f"cwd {cwd!r} is not a directory", cwd=cwd)
        env = {**ctx.env, **req.env, "AIWG_EXEC_ID": exec_id}
        cgroup = self._make_cgroup(ctx.cgroup, exec_id)
        parent_sock = child_sock = None
        if req.control:
            parent_sock, child_sock = control.socketpair()
            env[control.CONTROL_FD_ENV] = str(child_sock.fileno())
        self._starting.add(exec_id)
        try:
            proc = await procspawn.spawn(
                req.argv,
                cwd=cwd,
                env=env,
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
            Cgroups.remove(cgroup)
            raise
        finally:
            self._starting.discard(exec_id)
            if child_sock is not None:
                child_sock.close()  # the child has its own copy; ours would hide its EOF
        # No checkpoint from here on: the process is registered and watched before anything
        # can cancel us.
        rec = _Exec(
            req, exec_id, cwd, proc, OutputRing(max_frames=self._config.ring_frames, max_bytes=self._config.ring_bytes)
        )
        rec.cgroup = cgroup
        if parent_sock is not None:
            rec.ctrl = ControlChannel(parent_sock, exec_id)
        self._execs[exec_id] = rec
        self._nursery.start_soon(self._run, rec, req.timeout_s)
        try:
            # Stopped or destroyed while we spawned? Its kill_instance did not see this exec.
            self._resolve(req.instance_id)
        except RpcError:
            with trio.CancelScope(shield=True):
                await self.delete(exec_id)
            raise
        return rec.info()

    def _make_cgroup(self, parent: Path | None, exec_id: str) -> Path | None:
        if parent is None or not self._cgroups.available:
            return None
        return Cgroups(parent).create(f"x-{exec_id}")

    # -- the exec's tasks -----------------------------------------------------------------------

    async def _run(self, rec: _Exec, timeout_s: float | None) -> None:
        """Own the exec until it ended: readers, stdin writer, timeout, exit collection."""
        proc = rec.proc
        try:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(rec.stdin.run, proc)
                if timeout_s is not None:
                    nursery.start_soon(self._timeout, rec, timeout_s)
                async with trio.open_nursery() as pipes:
                    assert proc.stdout is not None and proc.stderr is not None
                    pipes.start_soon(self._pump, rec, proc.stdout, KIND_STDOUT)
                    pipes.start_soon(self._pump, rec, proc.stderr, KIND_STDERR)
                    if rec.ctrl is not None:
                        pipes.start_soon(self._control_reader, rec, rec.ctrl)
                    rec.exit_code, rec.signal = await procspawn.wait_exit(proc)
                    with trio.move_on_after(_DRAIN_S):
                        await rec.pipes_closed.wait()
                    if not rec.pipes_closed.is_set():
                        # Something the leader started holds the pipes: it goes with its leader.
                        await proctree.kill_tree_now(
                            leader=None, pgid=proc.pid, cgroup=rec.cgroup, tree_id=self._tree(rec.exec_id)
                        )
                        with trio.move_on_after(_PIPE_CLOSE_WAIT_S):
                            await rec.pipes_closed.wait()
                        pipes.cancel_scope.cancel()
                nursery.cancel_scope.cancel()
        except BaseException:
            # Cancelled (the registry's nursery is going away) or a bug: never leave the tree behind.
            if proc.returncode is None:
                rec.kill_reason = rec.kill_reason or "killed"
                await proctree.kill_tree_now(
                    leader=proc.pid, pgid=proc.pid, cgroup=rec.cgroup, tree_id=self._tree(rec.exec_id)
                )
                proc.poll()  # reap it if it is gone already; nobody will wait for it any more
            raise
        finally:
            self._finish(rec)
        # _finish tried once; a cgroup can stay busy for a moment after its last process died.
        await proctree.remove_cgroup(rec.cgroup)

    def _finish(self, rec: _Exec) -> None:
        rec.running = False
        rec.stdin.open = False
        rec.exited_at = time.time()
        if rec.kill_reason is not None:
            rec.end_reason = rec.kill_reason
        elif rec.signal is not None:
            rec.end_reason = "signaled"
        elif rec.exit_code is not None:
            rec.end_reason = "exited"
        else:
            rec.end_reason = "lost"
        for stream in (rec.proc.stdin, rec.proc.stdout, rec.proc.stderr):
            if stream is not None:
                stream.close()  # type: ignore[attr-defined]
        if rec.ctrl is not None:
            rec.ctrl.close()
        rec.ring.close()  # last: subscribers that see it closed find the exit status set
        rec.done.set()
        Cgroups.remove(rec.cgroup)

    def _pipe_closed(self, rec: _Exec) -> None:
        rec.open_pipes -= 1
        if rec.open_pipes == 0:
            rec.pipes_closed.set()

    async def _pump(self, rec: _Exec, stream: trio.abc.ReceiveStream, kind: int) -> None:
        try:
            while True:
                try:
                    data = await stream.receive_some(_READ_CHUNK)
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    break
                if not data or rec.ring.closed:
                    break
                rec.ring.append(data, kind)
        finally:
            self._pipe_closed(rec)

    async def _control_reader(self, rec: _Exec, ctrl: ControlChannel) -> None:
        def deliver(message: bytes) -> None:
            if not rec.ring.closed:
                rec.ring.append(message, KIND_CONTROL)

        try:
            await ctrl.receive(deliver)
        finally:
            self._pipe_closed(rec)

    async def _timeout(self, rec: _Exec, timeout_s: float) -> None:
        await trio.sleep(timeout_s)
        await self._kill(rec, "timeout", self._config.stop_grace_s)

    async def _kill(self, rec: _Exec, reason: str, grace_s: float) -> None:
        """Kill the exec's whole tree; ``reason`` becomes its end reason unless it already exited."""
        proc = rec.proc
        if proc.returncode is None and rec.kill_reason is None:
            rec.kill_reason = reason
        await proctree.terminate_tree(
            leader=proc.pid if proc.returncode is None else None,
            pgid=proc.pid,
            cgroup=rec.cgroup,
            tree_id=self._tree(rec.exec_id),
            grace_s=grace_s,
        )

    async def _kill_and_wait(self, rec: _Exec, reason: str, grace_s: float) -> None:
        await self._kill(rec, reason, grace_s)
        with trio.move_on_after(_FINISH_WAIT_S):
            await rec.done.wait()

    # -- operations -----------------------------------------------------------------------------

    async def write(self, exec_id: str, data: bytes, eof: bool) -> int:
        rec = self._find(exec_id)
        if not rec.running:
            raise RpcError(ErrorCode.EXEC_EXITED, f"exec {exec_id!r} has exited", exec_id=exec_id)
        return await rec.stdin.write(data, eof)

    async def control_send(self, exec_id: str, message: dict[str, object]) -> None:
        rec = self._find(exec_id)
        if rec.ctrl is None:
            raise RpcError(ErrorCode.CONTROL_UNAVAILABLE, f"exec {exec_id!r} has no control channel", exec_id=exec_id)
        if not rec.running:
            raise RpcError(ErrorCode.EXEC_EXITED, f"exec {exec_id!r} has exited", exec_id=exec_id)
        try:
            await rec.ctrl.send(message)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            if not rec.running or rec.proc.returncode is not None:
                raise RpcError(ErrorCode.EXEC_EXITED, f"exec {exec_id!r} has exited", exec_id=exec_id) from None
            raise RpcError(
                ErrorCode.CONTROL_UNAVAILABLE, f"exec {exec_id!r} closed its control channel", exec_id=exec_id
            ) from None

    async def cancel(self, exec_id: str, grace_s: float | None) -> m.ExecInfo:
        """Kill the exec's tree (end reason ``canceled``); an exited exec is returned as is."""
        rec = self._find(exec_id)
        if rec.running:
            await self._kill_and_wait(rec, "canceled", self._config.stop_grace_s if grace_s is None else grace_s)
        return rec.info()

    async def delete(self, exec_id: str) -> None:
        """Kill the tree if it still runs, end subscribers (``StreamEnd(deleted)``), forget the exec."""
        rec = self._find(exec_id)
        if rec.running:
            await self._kill_and_wait(rec, "killed", 0)
        rec.deleted = True
        rec.ring.close()  # wakes parked subscribers, which then see ``deleted``
        self._execs.pop(exec_id, None)

    async def kill_instance(self, instance_id: str, grace_s: float) -> None:
        """Kill every running exec of an instance (it is stopping or being destroyed)."""
        victims = [x for x in self._execs.values() if x.instance_id == instance_id and x.running]
        async with trio.open_nursery() as nursery:
            for rec in victims:
                nursery.start_soon(self._kill_and_wait, rec, "killed", grace_s)

    async def shutdown(self) -> None:
        """hostd is going away: kill every running tree (short grace). Pipes cannot be re-adopted."""
        self._closing = True
        victims = [x for x in self._execs.values() if x.running]
        with trio.CancelScope(shield=True):
            async with trio.open_nursery() as nursery:
                for rec in victims:
                    nursery.start_soon(self._kill_and_wait, rec, "killed", _SHUTDOWN_GRACE_S)

    # -- subscribers ----------------------------------------------------------------------------

    async def subscribe(
        self,
        stream_id: int,
        exec_id: str,
        from_seq: int | None,
        send: Callable[[m.Frame | list[m.Frame]], Awaitable[None]],
    ) -> None:
        """Replay from ``from_seq`` (None: only new), then live: output, control messages and
        lag notices, then ``ExecExited`` + ``StreamEnd(exited)``, or ``StreamEnd(deleted)``.

        Errors (unknown exec, sequence out of range) are raised before anything is sent.
        """
        rec = self._find(exec_id)
        ring = rec.ring
        start = start_seq(ring, from_seq)
        await send(m.StreamOpened(id=stream_id, first_seq=ring.first_seq, next_seq=ring.next_seq))
        entries = follow(ring, start, max_items=_BATCH, stop=lambda: rec.deleted)
        async with aclosing(entries):
            async for item in entries:
                if isinstance(item, Lag):
                    await send(m.ExecLagged(id=stream_id, missed_from=item.missed_from, resume_seq=item.resume_seq))
                else:  # one write per batch
                    await send([self._event(stream_id, seq, kind, data) for seq, kind, data in item])
        if rec.deleted:
            await send(m.StreamEnd(id=stream_id, reason="deleted"))
            return
        await send(
            m.ExecExited(
                id=stream_id,
                exit_code=rec.exit_code,
                signal=rec.signal,
                reason=rec.end_reason or "lost",
                last_seq=ring.next_seq - 1,
            )
        )
        await send(m.StreamEnd(id=stream_id, reason="exited"))

    @staticmethod
    def _event(stream_id: int, seq: int, kind: int, data: bytes) -> m.Event:
        if kind == KIND_CONTROL:
            return m.ExecControlMessage(id=stream_id, seq=seq, message=msgspec.json.decode(data))
        return m.ExecOutput(id=stream_id, seq=seq, stream=_STREAM_NAMES[kind], data=data)  # type: ignore[arg-type]

    def _find(self, exec_id: str) -> _Exec:
        rec = self._execs.get(exec_id)
        if rec is None or rec.deleted:
            raise RpcError(ErrorCode.EXEC_NOT_FOUND, f"no exec {exec_id!r}", exec_id=exec_id)
        return rec
