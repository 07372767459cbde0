"""Instances that sleep when idle and wake on traffic.

An instance with an idle policy (``InstanceInfo.idle``: ``after_s``, ``sleep``, ``wake_on_traffic``)
sleeps once it has been idle ``after_s``: no exec running (one whose task waits for an answer,
*parked*, does not count), no terminal attached (a session with a subscriber) and no request about it
(hostd's own, and those the controller reports in ``InstanceActivity``). How it sleeps is its
provider's business (:meth:`Provider.sleep`): ``freeze`` keeps its memory, ``save`` writes it to disk
where the runtime can (elsewhere a policy's ``save`` falls back to ``freeze``). Warm pool slots never
sleep: nobody's yet, they are kept ready on purpose.

Waking: a request that needs the instance (an exec, a session's start, a keystroke, an attach, a
start) wakes it first (:meth:`InstanceSleep.awake`), unless its policy says ``wake_on_traffic``
false (``instance.sleeping``). One wake runs per instance however many callers wait on it; each waits
at most ``AIWG_WAKE_TIMEOUT_S`` and then fails with ``instance.wake_failed`` (the wake goes on, so
the instance ends in a known state: awake, or still asleep with the reason logged). Keystrokes,
resizes and signals never wait (:meth:`InstanceSleep.nudge`): the wake is started and the input
waits in the PTY.

Time: an instance's record counts its sleeps, wakes, the seconds it slept and its last wake (cause,
how long it took); the ``on_wake`` hooks hear how long it slept, so an exec's timeout moves on by that
much (sleeping time counts against no timeout).

Persistence: the state is in the instance's record, so a hostd restart or upgrade while it sleeps
finds it asleep (its provider's :meth:`readopt` checks it still is) and wakeable.

Resource handling: :meth:`InstanceSleep.run` is a service in the registries' nursery; it owns the
idle watch and every wake (a caller that gives up waiting does not cancel the wake).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

import trio

from agentic_sandbox.proto import ErrorCode
from agentic_sandbox.proto import messages as m

from .errors import RpcError
from .instancetable import InstanceTable
from .providers import Instance

log = logging.getLogger(__name__)

#: How often the idle watch looks at every instance (an idle policy's ``after_s`` is at least 1 s).
WATCH_TICK_S = 0.25
#: How long a parked exec stays parked without the controller saying so again.
PARKED_TTL_S = 30.0

#: Hooks told of a wake: (instance id, seconds it slept).
WakeHook = Callable[[str, float], None]
#: The running execs and the attached sessions, by instance.
Work = tuple[dict[str, list[str]], dict[str, list[str]]]


class _Wake:
    """One wake of one instance, shared by every caller that needs it."""

    def __init__(self) -> None:
        self.done = trio.Event()
        self.error: RpcError | None = None


class InstanceSleep:
    """Sleep and wake of the instances of one table; see the module docstring.

    ``running_execs`` and ``attached_sessions`` (set by the caller, like the table's
    ``count_children``) name the running execs and the sessions a terminal is attached to, by
    instance: each one pass over them, made once per round of the idle watch, so a round costs
    what the instances and children are in number, not their product.
    """

    def __init__(self, table: InstanceTable) -> None:
        self._table = table
        self._timeout_s = table.config.wake_timeout_s
        #: instance id -> when something last happened to it (monotonic)
        self._last: dict[str, float] = {}
        #: exec id -> until when it is parked (monotonic)
        self._parked: dict[str, float] = {}
        self._wakes: dict[str, _Wake] = {}
        #: instances the idle watch is putting to sleep right now
        self._falling: set[str] = set()
        self._nursery: trio.Nursery | None = None
        self.running_execs: Callable[[], dict[str, list[str]]] = dict
        self.attached_sessions: Callable[[], dict[str, list[str]]] = dict
        self.on_wake: list[WakeHook] = []

    # -- activity -------------------------------------------------------------------------------

    def touch(self, instance_id: str) -> None:
        """Something happened to the instance: its idle time starts over (an unknown id is not
        kept: a request naming one is refused by its handler)."""
        if instance_id in self._table.instances:
            self._last[instance_id] = time.monotonic()

    def report(self, req: m.InstanceActivityRequest) -> None:
        """What the controller saw (see :class:`~agentic_sandbox.proto.messages.InstanceActivityRequest`)."""
        now = time.monotonic()
        for instance_id in req.instance_ids:
            if instance_id in self._table.instances:  # another host's: its own hostd hears of it
                self._last[instance_id] = now
        until = now + PARKED_TTL_S
        for exec_id in req.parked_execs:
            self._parked[exec_id] = until

    def unpark(self, exec_id: str) -> None:
        """The exec was sent a control message (the answer it waited for): it works again."""
        self._parked.pop(exec_id, None)

    def sleeping(self, instance_id: str) -> bool:
        inst = self._table.instances.get(instance_id)
        return inst is not None and inst.info.state == "sleeping"

    def _work(self) -> Work:
        return self.running_execs(), self.attached_sessions()

    def busy(self, instance_id: str, work: Work | None = None) -> str | None:
        """What keeps the instance awake, or None (``work``: :meth:`_work`, when already read)."""
        running, attached = work or self._work()
        now = time.monotonic()
        execs = [e for e in running.get(instance_id, ()) if self._parked.get(e, 0.0) <= now]
        if execs:
            return f"exec {execs[0]} is running" + (f" (and {len(execs) - 1} more)" if len(execs) > 1 else "")
        sessions = attached.get(instance_id)
        if sessions:
            return f"a terminal is attached to session {sessions[0]}"
        return None

    # -- waking ---------------------------------------------------------------------------------

    async def awake(self, instance_id: str, cause: str) -> None:
        """A request needs the instance: wake it if it sleeps, and return once it runs. Raises
        ``instance.sleeping`` (its policy wants an operator's wake) or ``instance.wake_failed``."""
        self.touch(instance_id)
        inst = self._table.instances.get(instance_id)
        if inst is None or inst.info.state != "sleeping":
            return  # the usual case: one dict lookup
        idle = inst.info.idle
        if idle is not None and not idle.wake_on_traffic:
            raise RpcError(
                ErrorCode.INSTANCE_SLEEPING,
                f"instance {instance_id!r} is asleep and its idle policy does not wake it on traffic; wake it first",
                instance_id=instance_id,
            )
        await self._await_wake(inst, cause)

    def nudge(self, instance_id: str, cause: str) -> None:
        """A request that must not wait (a keystroke) touched the instance: wake it in the background
        if it sleeps and wakes on traffic."""
        self.touch(instance_id)
        inst = self._table.instances.get(instance_id)
        if inst is None or inst.info.state != "sleeping":
            return
        idle = inst.info.idle
        if (idle is None or idle.wake_on_traffic) and instance_id not in self._wakes:
            self._start_wake(inst, cause)

    async def wake(self, instance_id: str, cause: str) -> tuple[m.InstanceInfo, bool]:
        """An operator's wake (whatever the policy says): the instance, and whether it slept."""
        self._table.check_open()
        inst = self._table.find(instance_id)
        self._table.check_available(inst)
        self.touch(instance_id)
        woke = inst.info.state == "sleeping" or instance_id in self._wakes
        if woke:
            await self._await_wake(inst, cause)
        return self._table.public(inst), woke

    async def _await_wake(self, inst: Instance, cause: str) -> None:
        wake = self._wakes.get(inst.id) or self._start_wake(inst, cause)
        with trio.move_on_after(self._timeout_s):
            await wake.done.wait()
        if not wake.done.is_set():
            raise RpcError(
                ErrorCode.INSTANCE_WAKE_FAILED,
                f"instance {inst.id!r} did not wake within {self._timeout_s:g} s (AIWG_WAKE_TIMEOUT_S); "
                "its wake goes on",
                instance_id=inst.id,
                state=inst.info.state,
            )
        if wake.error is not None:
            raise wake.error

    def _start_wake(self, inst: Instance, cause: str) -> _Wake:
        wake = self._wakes[inst.id] = _Wake()
        if self._nursery is None:  # pragma: no cover - run() is started before hostd serves
            raise RpcError(ErrorCode.SHUTTING_DOWN)
        self._nursery.start_soon(self._run_wake, inst, cause, wake)
        return wake

    async def _run_wake(self, inst: Instance, cause: str, wake: _Wake) -> None:
        try:
            async with self._table.locked(inst.id) as held:
                if held.info.state == "sleeping":
                    await self.wake_locked(held, cause)
        except RpcError as exc:
            code = exc.code if exc.code == ErrorCode.SHUTTING_DOWN else ErrorCode.INSTANCE_WAKE_FAILED
            wake.error = RpcError(
                code,
                f"instance {inst.id!r} could not be woken: {exc.message}",
                instance_id=inst.id,
                state=inst.info.state,
                reason=exc.code.value,
            )
            log.warning("instance %s: wake (%s) failed: %s", inst.id, cause, exc.message)
        except Exception:
            log.exception("instance %s: wake (%s) failed", inst.id, cause)
            wake.error = RpcError(
                ErrorCode.INSTANCE_WAKE_FAILED,
                f"instance {inst.id!r} could not be woken (hostd's log says why)",
                instance_id=inst.id,
                state=inst.info.state,
            )
        finally:
            del self._wakes[inst.id]
            wake.done.set()

    async def wake_locked(self, inst: Instance, cause: str) -> None:
        """Wake ``inst`` (its lock held, it sleeps). Lifecycle verbs (stop, destroy, checkpoint,
        fork) call it too: they work on a running instance."""
        info = inst.info
        how = info.sleep.how if info.sleep is not None else "freeze"
        since = info.sleep.since if info.sleep is not None else time.time()
        started = time.monotonic()
        try:
            with trio.CancelScope(shield=True):  # half a wake would leave it neither asleep nor awake
                await inst.provider.wake(inst, how)
        except BaseException:
            if info.state != "sleeping":  # the provider found it gone: it says what it is now
                info.sleep = None
            self._table.commit(inst)
            raise
        now = time.time()
        slept = max(0.0, now - since)
        info.state, info.sleep = "running", None
        info.wakes += 1
        info.asleep_s += slept
        info.last_wake = m.WakeDetail(cause=cause, at=now, took_s=time.monotonic() - started, how=how)
        self._table.commit(inst)
        self.touch(inst.id)
        for hook in self.on_wake:
            hook(inst.id, slept)
        log.info(
            "instance %s woke (%s, from %s) in %.1f ms after %.1f s asleep",
            inst.id,
            cause,
            how,
            info.last_wake.took_s * 1000,
            slept,
        )

    # -- sleeping -------------------------------------------------------------------------------

    async def sleep(self, instance_id: str, how: m.SleepForm | None, cause: str) -> m.InstanceInfo:
        """Put the instance to sleep now (an operator's word); ``instance.busy`` under work."""
        async with self._table.locked(instance_id) as inst:
            if inst.info.state != "sleeping":
                await self._sleep_locked(inst, how, cause)
            return self._table.public(inst)

    def _form(self, inst: Instance, how: m.SleepForm | None) -> m.SleepForm:
        """How it sleeps: as asked, else as its policy says where the runtime can, else frozen."""
        info = inst.info
        if how is None:
            wanted = info.idle.sleep if info.idle is not None else "freeze"
            if f"instance.sleep.{wanted}" in info.capabilities:
                return wanted
            how = "freeze"
        if f"instance.sleep.{how}" not in info.capabilities:
            raise RpcError(
                ErrorCode.UNSUPPORTED,
                f"instance {inst.id!r} ({info.runtime}/{info.provider}) cannot sleep by {how}",
                instance_id=inst.id,
                how=how,
            )
        return how

    async def _sleep_locked(self, inst: Instance, how: m.SleepForm | None, cause: str) -> None:
        info = inst.info
        if info.pool is not None:
            raise RpcError(
                ErrorCode.INSTANCE_INVALID_STATE,
                f"instance {inst.id!r} is a ready slot of warm pool {info.pool!r}; slots do not sleep",
                instance_id=inst.id,
            )
        if info.state != "running":
            raise RpcError(
                ErrorCode.INSTANCE_INVALID_STATE,
                f"instance {inst.id!r} is {info.state}, not running: it cannot sleep",
                instance_id=inst.id,
                state=info.state,
            )
        form = self._form(inst, how)
        busy = self.busy(inst.id)
        if busy is not None:
            raise RpcError(
                ErrorCode.INSTANCE_BUSY, f"instance {inst.id!r} stays awake: {busy}", instance_id=inst.id, busy=busy
            )
        with trio.CancelScope(shield=True):  # half a sleep would leave it neither asleep nor awake
            await inst.provider.sleep(inst, form)
        info.state = "sleeping"
        info.sleep = m.SleepDetail(how=form, since=time.time(), cause=cause)
        info.sleeps += 1
        self._table.commit(inst)
        log.info("instance %s sleeps (%s, %s)", inst.id, form, cause)

    def set_idle(self, instance_id: str, idle: m.IdlePolicy | None) -> m.InstanceInfo:
        self._table.check_open()
        inst = self._table.find(instance_id)
        inst.info.idle = idle
        self._table.commit(inst)
        self.touch(instance_id)
        return self._table.public(inst)

    # -- the service ----------------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """The idle watch, and the nursery every wake runs in."""
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            task_status.started()
            while True:
                await trio.sleep(WATCH_TICK_S)
                for instance_id in self._idle_ones():
                    nursery.start_soon(self._sleep_idle, instance_id)

    def _idle_ones(self) -> list[str]:
        """Instances whose idle policy says it is time; touches the busy ones."""
        now = time.monotonic()
        self._parked = {e: until for e, until in self._parked.items() if until > now}
        due: list[str] = []
        watched = [i for i in self._table.instances.values() if i.info.idle is not None]
        if not watched:
            return due
        work = self._work()
        for inst in watched:
            info = inst.info
            if info.idle is None or info.state != "running" or info.pool is not None:
                continue
            if inst.lock.locked() or self.busy(inst.id, work) is not None:
                self._last[inst.id] = now
                continue
            if inst.id not in self._falling and now - self._last.setdefault(inst.id, now) >= info.idle.after_s:
                due.append(inst.id)
                self._falling.add(inst.id)
        return due

    async def _sleep_idle(self, instance_id: str) -> None:
        try:
            async with self._table.locked(instance_id) as inst:
                info = inst.info
                # Looked at again under the lock: a request may have come in meanwhile.
                if info.idle is None or info.state != "running" or self.busy(instance_id) is not None:
                    return
                if time.monotonic() - self._last.get(instance_id, 0.0) < info.idle.after_s:
                    return
                await self._sleep_locked(inst, None, "idle")
        except RpcError as exc:
            self.touch(instance_id)  # not again before another after_s
            log.warning("instance %s: idle sleep refused: %s", instance_id, exc.message)
        finally:
            self._falling.discard(instance_id)

    def forget(self, instance_id: str) -> None:
        self._last.pop(instance_id, None)
