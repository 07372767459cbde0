"""What PTY sessions and execs share: the start path, limits, lookups, kill, and one failure policy.

A *child* is a process tree hostd starts inside an instance for a caller: a PTY session
(:mod:`hostd.sessions`) or an exec (:mod:`hostd.execs`). :class:`ChildRegistry` is the part both
registries have in common; each subclass adds how its tree is spawned, read and followed.

Start path (:meth:`ChildRegistry._admit`, then the subclass spawns, then :meth:`ChildRegistry._adopt`):
refuse while hostd shuts down; the instance must be running (its provider decides where and how a
process starts, :meth:`hostd.instances.Placement.spawn_spec`); the id must be free; at most
``max_live`` run at once and at most ``max_retained`` exited ones are kept (their exit status and
output stay until deleted: new ones are refused rather than old ones dropped behind a caller's back);
the caller's env must be acceptable (:mod:`hostd.envrules`). The id is reserved across the spawn, which
awaits. Once spawned the child is registered and its run task started in the registry's nursery
(never a connection's), and the instance is checked again: a stop or destroy that ran meanwhile did
not see the child, so it is killed and the start fails.

Failure policy: a child's run task that fails with an unexpected error is logged with its traceback,
its whole tree is killed at once (nobody would read or reap it any more), and its end is recorded
as ``lost``; hostd and every other child keep running. When the registry's nursery is cancelled
(hostd going away) the tree is killed too and the cancellation goes on.

Kill: one verb, :meth:`ChildRegistry.kill` (SIGTERM, grace, SIGKILL, by every mark of the tree), with
the end reason the caller names (``killed``, ``canceled``, ``timeout``); a child that already ended
keeps its own reason.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import ClassVar, Generic, TypeVar

import trio

from agentic_sandbox.proto import ErrorCode, Limit, bind_log_ids, new_id

from .config import HostdConfig
from .envrules import validate_child_env
from .errors import SLOT_RETRY_S, RpcError, limit_reached
from .handover import EndState
from .instances import Placement
from .proctree import Cgroups

log = logging.getLogger(__name__)

#: How long kill waits for the run task to record the end after the tree is dead.
_SETTLE_S = 5.0
#: Grace of the kill every running child gets when hostd shuts down.
SHUTDOWN_GRACE_S = 0.5


class Child:
    """One process tree hostd runs inside an instance. Subclasses add their process and output."""

    def __init__(self, child_id: str, instance_id: str, argv: list[str], cwd: str, cgroup: Path | None) -> None:
        self.id = child_id
        self.instance_id = instance_id
        self.argv = argv
        self.cwd = cwd
        self.cgroup = cgroup
        self.created_at = time.time()
        self.exited_at: float | None = None
        #: Why hostd ended the tree (killed, canceled, timeout, lost); None if it ended on its own.
        self.kill_reason: str | None = None
        self.end_reason: str | None = None
        self.deleted = False
        #: Set once the end is recorded and the output closed.
        self.done = trio.Event()

    @property
    def running(self) -> bool:
        return not self.done.is_set()

    @property
    def leader_alive(self) -> bool:
        """Whether the tree's leader has not exited yet (a kill then decides how the child ended)."""
        return self.running

    def end_state(self, *, reaped: bool, exit_code: int | None, signal: int | None) -> EndState:
        """How far the child's end has come, for a handover document (:mod:`hostd.handover`)."""
        return EndState(
            reaped=reaped,
            exit_code=exit_code,
            signal=signal,
            exited_at=self.exited_at,
            kill_reason=self.kill_reason,
            end_reason=self.end_reason,
            done=self.done.is_set(),
        )

    def resume_end(self, end: EndState) -> None:
        """Take :meth:`end_state` back (the caller sets its own exit status and ``done``)."""
        self.exited_at, self.kill_reason, self.end_reason = end.exited_at, end.kill_reason, end.end_reason


C = TypeVar("C", bound=Child)


def _cancelled(exc: BaseException) -> bool:
    if isinstance(exc, trio.Cancelled):
        return True
    if isinstance(exc, BaseExceptionGroup):
        matched, _rest = exc.split(trio.Cancelled)
        return matched is not None
    return False


class ChildRegistry(Generic[C]):
    """The children of one kind; see the module docstring. Subclasses set the class attributes and
    implement :meth:`_run` (own the child until it ended, recording the end) and :meth:`_terminate`."""

    kind: ClassVar[str]
    #: Prefix of a child's cgroup name below its instance's (``s-<id>``, ``x-<id>``).
    cgroup_prefix: ClassVar[str]
    not_found: ClassVar[ErrorCode]
    exited: ClassVar[ErrorCode]
    #: The hostd setting of ``max_live`` (``AIWG_MAX_SESSIONS``, ...), named when a limit is hit.
    setting: ClassVar[str]

    def __init__(
        self,
        config: HostdConfig,
        cgroups: Cgroups,
        nursery: trio.Nursery,
        resolve: Callable[[str], Placement],
        *,
        max_live: int,
    ) -> None:
        self._config = config
        self._cgroups = cgroups
        self._nursery = nursery
        self._resolve = resolve
        self.max_live = max_live
        self.max_retained = config.retained_per_live * max_live
        self._children: dict[str, C] = {}
        self._starting: set[str] = set()
        self._closing = False

    # -- lookups --------------------------------------------------------------------------------

    def _tree(self, child_id: str) -> str:
        """The ``AIWG_TREE`` mark of this child's process tree."""
        return self._config.tree_id(self.kind, child_id)

    def _find(self, child_id: str) -> C:
        child = self._children.get(child_id)
        if child is None or child.deleted:
            raise RpcError(self.not_found, f"no {self.kind} {child_id!r}", **{f"{self.kind}_id": child_id})
        return child

    def _running(self, child_id: str) -> C:
        child = self._find(child_id)
        if not child.running:
            raise RpcError(self.exited, f"{self.kind} {child_id!r} has exited", **{f"{self.kind}_id": child_id})
        return child

    def _held(self, instance_id: str | None = None) -> list[C]:
        return [
            c
            for c in self._children.values()
            if not c.deleted and (instance_id is None or c.instance_id == instance_id)
        ]

    def instance_of(self, child_id: str, *, running: bool = False) -> str | None:
        """The instance the child runs in (None: no such child, the request's handler says so;
        ``running``: or it has ended)."""
        child = self._children.get(child_id)
        return None if child is None or (running and not child.running) else child.instance_id

    def running_by_instance(self) -> dict[str, list[str]]:
        """The children that run now, by instance (one pass over them all)."""
        found: dict[str, list[str]] = {}
        for c in self._children.values():
            if c.running and not c.deleted:
                found.setdefault(c.instance_id, []).append(c.id)
        return found

    def count(self, instance_id: str | None = None) -> int:
        """Children held (running or exited, not yet deleted), of one instance or all."""
        return len(self._held(instance_id))

    def counts(self) -> tuple[int, int]:
        """(held, running)."""
        held = self._held()
        return len(held), sum(1 for c in held if c.running)

    # -- the start path -------------------------------------------------------------------------

    def _admit(
        self, requested_id: str | None, instance_id: str, env: dict[str, str], *, live: bool = True, held: bool = False
    ) -> tuple[str, Placement]:
        """Every check before a spawn; reserves and returns the child's id (release with
        :meth:`_release` once the spawn returned or failed). ``live=False``: nothing will run yet
        (a pending session), so the running limit does not apply; ``held``: the id is the one of a
        child this registry holds and is about to start (a pending session)."""
        if self._closing:
            raise RpcError(ErrorCode.SHUTTING_DOWN)
        placement = self._resolve(instance_id)
        child_id = requested_id or new_id()
        bind_log_ids(**{f"{self.kind}_id": child_id})  # this request's lines and the child's tasks name it
        if (child_id in self._children and not held) or child_id in self._starting:
            raise RpcError(
                ErrorCode.REQUEST_INVALID,
                f"{self.kind} id {child_id!r} is already in use",
                **{f"{self.kind}_id": child_id},
            )
        running = sum(1 for c in self._children.values() if c.running) + len(self._starting)
        if live and running >= self.max_live:
            raise limit_reached(
                f"at most {self.max_live} {self.kind}s may run at once",
                Limit(name=f"{self.kind}s", limit=self.max_live, setting=self.setting, retry_after_s=SLOT_RETRY_S),
            )
        retained = sum(1 for c in self._children.values() if c.done.is_set())
        if retained >= self.max_retained:
            # Waiting does not help: exited ones stay until deleted.
            raise limit_reached(
                f"{retained} exited {self.kind}s are kept; delete some before starting more",
                Limit(name=f"exited_{self.kind}s", limit=self.max_retained, setting=self.setting),
                retained=retained,
            )
        validate_child_env(env)
        self._starting.add(child_id)
        return child_id, placement

    def _release(self, child_id: str) -> None:
        self._starting.discard(child_id)

    def _make_cgroup(self, parent: Path | None, child_id: str) -> Path | None:
        if parent is None or not self._cgroups.available:
            return None
        return Cgroups(parent).create(f"{self.cgroup_prefix}-{child_id}")

    async def _adopt(self, child: C) -> None:
        """Register a spawned child and start its run task; fail if its instance went away meanwhile.

        No checkpoint before the task is started: the child is watched before anything can cancel us.
        """
        self._children[child.id] = child
        self._nursery.start_soon(self._supervise, child, name=f"{self.kind} {child.id}")
        try:
            self._resolve(child.instance_id)
        except RpcError:
            with trio.CancelScope(shield=True):
                await self._kill(child, "killed", 0)
                await self._forget(child)
            raise

    async def _supervise(self, child: C) -> None:
        try:
            await self._run(child)
        except BaseException as exc:
            cancelled = _cancelled(exc)
            if not cancelled:
                log.exception("%s %s: its run task failed; killing its tree", self.kind, child.id)
            child.kill_reason = child.kill_reason or ("killed" if cancelled else "lost")
            with trio.CancelScope(shield=True):
                await self._terminate(child, 0)
            if cancelled or not isinstance(exc, Exception):
                raise
        finally:
            if child.running:
                self._finish(child)
        await self._cleanup(child)

    # -- what subclasses implement ----------------------------------------------------------

    async def _run(self, child: C) -> None:
        """Own the child until it ended; :meth:`_finish` records the end."""
        raise NotImplementedError  # pragma: no cover - abstract

    def _finish(self, child: C) -> None:
        """Record the end (reason, time), close the output, set ``done``. Called once."""
        raise NotImplementedError  # pragma: no cover - abstract

    async def _terminate(self, child: C, grace_s: float) -> None:
        """End the child's whole tree (SIGTERM, grace, SIGKILL); also sweeps an ended child's escapees."""
        raise NotImplementedError  # pragma: no cover - abstract

    async def _cleanup(self, child: C) -> None:
        """After the end was recorded (e.g. remove the child's cgroup once the kernel lets go)."""

    async def _forget(self, child: C) -> None:
        """Drop a deleted child: wake its followers and remove it from the table and its cgroup."""
        raise NotImplementedError  # pragma: no cover - abstract

    # -- kill -----------------------------------------------------------------------------------

    def _grace(self, grace_s: float | None) -> float:
        return self._config.stop_grace_s if grace_s is None else grace_s

    async def _kill(self, child: C, reason: str, grace_s: float, *, settle: bool = True) -> None:
        """End the child's tree; ``settle``: and wait (a while) for its end to be recorded, which
        a task of the child's own (its timeout) must not: the record waits for it."""
        with trio.CancelScope(shield=True):
            if child.leader_alive and child.kill_reason is None:  # one that exited keeps its reason
                child.kill_reason = reason
            await self._terminate(child, grace_s)
            if settle:
                with trio.move_on_after(_SETTLE_S):
                    await child.done.wait()

    async def kill_instance(self, instance_id: str, grace_s: float) -> None:
        """Kill every running child of an instance (it is stopping or being destroyed)."""
        victims = [c for c in self._held(instance_id) if c.running]
        async with trio.open_nursery() as nursery:
            for child in victims:
                nursery.start_soon(self._kill, child, "killed", grace_s)

    async def shutdown(self) -> None:
        """hostd is going away: kill every running tree (short grace). They cannot be re-adopted."""
        self._closing = True
        victims = [c for c in self._children.values() if c.running]
        with trio.CancelScope(shield=True):
            async with trio.open_nursery() as nursery:
                for child in victims:
                    nursery.start_soon(self._kill, child, "killed", SHUTDOWN_GRACE_S)

    def end_reason(self, child: C, exit_code: int | None, signal: int | None) -> str:
        """How a child ended, for its info: hostd's reason if hostd ended it, else what the OS said."""
        if child.kill_reason is not None:
            return child.kill_reason
        if signal is not None:
            return "signaled"
        if exit_code is not None:
            return "exited"
        return "lost"
