"""Host-runtime instances: a working dir, an env, a cgroup and optionally a supervised main process.

On disk (``<state_dir>`` from the config): ``<state_dir>/hostd-state.json`` records every
instance after each change (:mod:`hostd.statefile`); ``<state_dir>/instances/<id>/`` is the
instance's dir with agent.env, metadata.json, main.log and the default working dir
(:mod:`hostd.instancedir`, which also builds the environment of the instance's processes).

Lifecycle: ``provision`` → ``running`` (start=True) or ``stopped``; ``start``/``stop`` are
idempotent; ``destroy`` stops, removes the dir and the cgroup, and forgets the instance.
While work runs the state is ``starting``/``stopping``; one lock per instance serializes
start/stop/destroy of the same instance.

The main process (``command``) runs in its own session (pgid == pid), carries
``AIWG_TREE=<namespace>:instance:<id>`` and lives in the cgroup ``<id>/main``. When it exits on its own the
instance is ``stopped`` (exit code 0) or ``failed`` (anything else, ``note`` says why), and
what it left behind in its tree is killed, as systemd does for a service's control group. Its
PTY sessions and execs are not touched then; ``stop``/``destroy`` end them through ``on_stop``.

Restart of hostd: ``shutdown`` only persists and leaves main processes running; ``load``
re-adopts each one whose pid still has the recorded start time and reports honestly the ones
that died meanwhile (``failed``, ``adopted=False``, ``note``).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import msgspec
import trio

from proto import ErrorCode
from proto import messages as m

from . import instancedir, procspawn, proctree, statefile
from .config import HostdConfig
from .errors import RpcError
from .proctree import Cgroups

log = logging.getLogger(__name__)

#: How long stop waits for the main process's exit to be collected after the tree was killed.
_EXIT_WAIT_S = 5.0
_LIVE_STATES = ("running", "starting", "stopping")


class InstanceContext(msgspec.Struct, frozen=True):
    """What a session or exec needs from its (running) instance.

    ``cgroup`` is the instance's cgroup v2 directory (a :class:`Path`; None without cgroups):
    children make their own cgroup below it. Never encoded, so a Path is fine here.
    """

    instance_id: str
    working_dir: str
    env: dict[str, str]
    cgroup: Path | None


class _Instance:
    """Mutable runtime record; ``info`` is the public view (counts filled in on read)."""

    def __init__(self, info: m.InstanceInfo, env: dict[str, str]) -> None:
        self.info = info
        self.env = env
        self.lock = trio.Lock()
        self.proc: trio.Process | None = None
        self.create_time: float | None = None
        self.main_done: trio.Event | None = None
        #: Bumped per main start (and by stop), so a late watcher of an older run changes nothing.
        self.run = 0
        self.stopping = False
        self.child_env: dict[str, str] = {}


class InstanceRegistry:
    """Every host-runtime instance of this hostd; see the module docstring.

    Watchers of main processes run in ``nursery`` (owned by the server, outliving connections).
    ``on_stop`` hooks are awaited on stop/destroy with ``(instance_id, grace_s)``; the server
    registers the session and exec registries' ``kill_instance`` there.
    """

    def __init__(self, config: HostdConfig, cgroups: Cgroups, nursery: trio.Nursery) -> None:
        self._config = config
        self._cgroups = cgroups
        self._nursery = nursery
        self._instances: dict[str, _Instance] = {}
        self._closed = False
        self.on_stop: list[Callable[[str, float], Awaitable[None]]] = []
        self.count_children: Callable[[str], tuple[int, int]] = lambda _id: (0, 0)

    # -- queries --------------------------------------------------------------------------------

    def _tree(self, instance_id: str) -> str:
        """The ``AIWG_TREE`` mark of this instance's process tree."""
        return self._config.tree_id("instance", instance_id)

    def get(self, instance_id: str) -> m.InstanceInfo:
        return self._public(self._find(instance_id))

    def list(self) -> list[m.InstanceInfo]:
        return [self._public(inst) for inst in self._instances.values()]

    def context(self, instance_id: str) -> InstanceContext:
        inst = self._find(instance_id)
        if inst.info.state != "running":
            raise RpcError(
                ErrorCode.INSTANCE_INVALID_STATE,
                f"instance {instance_id!r} is {inst.info.state}, not running",
                instance_id=instance_id,
                state=inst.info.state,
            )
        cgroup = Path(inst.info.cgroup) if inst.info.cgroup else None
        return InstanceContext(instance_id, inst.info.working_dir, dict(inst.child_env), cgroup)

    # -- lifecycle ------------------------------------------------------------------------------

    async def provision(self, req: m.InstanceProvisionRequest) -> m.InstanceInfo:
        self._check_open()
        iid = req.instance_id
        existing = self._instances.get(iid)
        if existing is not None:
            raise RpcError(
                ErrorCode.INSTANCE_EXISTS,
                f"instance {iid!r} already exists (name {existing.info.name!r})",
                instance_id=iid,
                name=existing.info.name,
            )
        instancedir.validate_env(req.env)
        working_dir = instancedir.requested_working_dir(req.working_dir)
        inst_dir = self._config.instances_dir / iid
        info = m.InstanceInfo(
            instance_id=iid,
            name=req.name,
            state="provisioning",
            instance_dir=str(inst_dir),
            working_dir=working_dir,
            labels=dict(req.labels),
            command=list(req.command) if req.command else None,
            loadout=req.loadout,
            created_at=time.time(),
        )
        inst = _Instance(info, dict(req.env))
        self._instances[iid] = inst  # reserved before the first await: a concurrent twin gets EXISTS
        try:
            async with inst.lock:
                info.working_dir = instancedir.create(inst_dir, info.working_dir, self._config.workspace_root)
                instancedir.write_agent_env(info, inst.env)
                cgroup = self._cgroups.create(iid)
                info.cgroup = str(cgroup) if cgroup else None
                inst.child_env = instancedir.child_env(info, inst.env)
                if req.start:
                    await self._start_locked(inst)
                else:
                    info.state = "stopped"
                self._commit(inst)
        except BaseException:
            # A failed provision leaves nothing behind: the caller sees only the error.
            self._instances.pop(iid, None)
            with trio.CancelScope(shield=True):
                await self._discard(inst)
            self._save()
            raise
        return self._public(inst)

    async def start(self, instance_id: str) -> m.InstanceInfo:
        self._check_open()
        inst = self._find(instance_id)
        async with inst.lock:
            self._find(instance_id)  # destroyed while we waited for the lock?
            if inst.info.state != "running":
                try:
                    await self._start_locked(inst)
                finally:
                    self._commit(inst)
            return self._public(inst)

    async def stop(self, instance_id: str, grace_s: float | None) -> m.InstanceInfo:
        self._check_open()
        inst = self._find(instance_id)
        async with inst.lock:
            self._find(instance_id)
            if inst.info.state != "stopped":
                await self._stop_locked(inst, self._grace(grace_s))
            return self._public(inst)

    async def destroy(self, instance_id: str, grace_s: float | None) -> m.InstanceInfo:
        self._check_open()
        inst = self._find(instance_id)
        async with inst.lock:
            self._find(instance_id)
            with trio.CancelScope(shield=True):  # half a destroy would leave an orphaned dir or cgroup
                await self._stop_locked(inst, self._grace(grace_s))
                inst.info.state = "destroyed"
                self._instances.pop(instance_id, None)
                await self._discard(inst)
                self._save()
            return self._public(inst)

    async def shutdown(self) -> None:
        """Persist and leave every main process running.

        hostd's unit uses ``KillMode=process``: a restart of hostd must not take the agents
        down with it. The next hostd finds them by pid and start time in the state file and
        re-adopts them (``load``). Watchers end with the registry's nursery.
        """
        self._closed = True
        self._save()

    async def load(self) -> None:
        """Read the state file and re-adopt what is still alive; see the module docstring."""
        records = statefile.read(self._config.state_file)
        if records is None:
            return
        now = time.time()
        for saved in records:
            info = saved.info
            if info.state == "destroyed" or info.instance_id in self._instances:
                continue
            inst = _Instance(info, saved.env)
            inst.create_time = saved.main_create_time
            if info.cgroup:
                cgroup = self._cgroups.create(info.instance_id)
                info.cgroup = str(cgroup) if cgroup else None
            inst.child_env = instancedir.child_env(info, inst.env)
            if info.state == "provisioning":
                info.state, info.note = "failed", "hostd went down while provisioning this instance"
            elif info.state in _LIVE_STATES and info.pid is not None:
                if proctree.pid_matches(info.pid, saved.main_create_time):
                    info.state, info.adopted, info.note = "running", True, None
                    self._watch(inst, None, info.pid)
                else:
                    info.state, info.adopted, info.stopped_at = "failed", False, now
                    info.note = f"main process {info.pid} ended while hostd was down"
                    info.pid = info.pgid = inst.create_time = None
            elif info.state == "stopping":
                info.state, info.stopped_at = "stopped", now
            elif info.state == "starting" or (info.state == "running" and info.command):
                info.state, info.adopted, info.stopped_at = "failed", False, now
                info.note = "main process was not running when hostd went down"
            elif info.state == "running":
                info.adopted = True
                info.note = "PTY sessions and execs from the previous hostd ended with it"
            self._instances[info.instance_id] = inst
        self._save()

    # -- internals ------------------------------------------------------------------------------

    async def _start_locked(self, inst: _Instance) -> None:
        info = inst.info
        now = time.time()
        if info.command is None:
            info.state, info.started_at, info.stopped_at = "running", now, None
            info.exit_code = info.adopted = info.note = None
            return
        info.state = "starting"
        main_cgroup = self._cgroups.create(f"{info.instance_id}/main") if info.cgroup else None
        log_fd = procspawn.open_log(Path(info.instance_dir) / "main.log")
        try:
            proc = await procspawn.spawn(
                info.command,
                cwd=info.working_dir,
                env=inst.child_env,
                tree_id=self._tree(info.instance_id),
                cgroup=main_cgroup,
                stdin=procspawn.DEVNULL,
                stdout=log_fd,
                stderr=procspawn.STDOUT,
            )
        except RpcError as exc:
            info.state, info.note, info.stopped_at = "failed", exc.message, time.time()
            raise
        finally:
            os.close(log_fd)
        inst.proc = proc
        inst.create_time = proctree.create_time(proc.pid)
        info.pid = info.pgid = proc.pid
        info.state, info.started_at, info.stopped_at = "running", now, None
        info.exit_code = info.adopted = info.note = None
        self._watch(inst, proc, proc.pid)

    def _watch(self, inst: _Instance, proc: trio.Process | None, pid: int) -> None:
        inst.run += 1
        inst.main_done = trio.Event()
        self._nursery.start_soon(self._watch_main, inst, inst.run, proc, pid, inst.main_done)

    async def _watch_main(
        self, inst: _Instance, run: int, proc: trio.Process | None, pid: int, done: trio.Event
    ) -> None:
        if proc is not None:
            code, sig = await procspawn.wait_exit(proc)
        else:
            code, sig = await procspawn.wait_pid_exit(pid)
        try:
            info = inst.info
            if inst.run != run:
                return
            if not inst.stopping and info.state == "running":
                # What the main process left behind in its tree goes with it, before the instance
                # shows as ended: a start that follows at once must not have its new main swept.
                await proctree.kill_tree_now(
                    leader=None, pgid=pid, cgroup=self._main_cgroup(info), tree_id=self._tree(info.instance_id)
                )
                if inst.run != run:
                    return
            inst.proc = None
            info.pid = info.pgid = inst.create_time = None
            info.exit_code = code
            if inst.stopping or info.state != "running":
                return  # stop() is killing it and records the outcome
            info.stopped_at = time.time()
            if code == 0:
                info.state, info.note = "stopped", "main process exited with code 0"
            else:
                info.state = "failed"
                if sig is not None:
                    info.note = f"main process {pid} was killed by signal {sig}"
                elif code is not None:
                    info.note = f"main process {pid} exited with code {code}"
                else:
                    info.note = f"main process {pid} ended (exit status unknown: adopted after a hostd restart)"
            self._commit(inst)
        finally:
            done.set()

    async def _stop_locked(self, inst: _Instance, grace: float) -> None:
        info = inst.info
        iid = info.instance_id
        was_stopped = info.state == "stopped"
        info.state = "stopping"
        inst.stopping = True
        self._commit(inst)
        try:
            with trio.CancelScope(shield=True):  # a half-done stop would leave a half-killed instance
                await self._run_hooks(iid, grace)
                pid = info.pid
                live = pid is not None and (
                    (inst.proc is not None and inst.proc.returncode is None)
                    or proctree.pid_matches(pid, inst.create_time)
                )
                await proctree.terminate_tree(
                    leader=pid if live else None,
                    pgid=pid,
                    cgroup=self._main_cgroup(info),
                    tree_id=self._tree(iid),
                    grace_s=grace,
                )
                if pid is not None and inst.main_done is not None:
                    with trio.move_on_after(_EXIT_WAIT_S):
                        await inst.main_done.wait()
                # Final sweep: anything still in the instance's cgroup (sessions, execs, escapees).
                Cgroups.kill(Path(info.cgroup) if info.cgroup else None)
        finally:
            inst.stopping = False
            inst.run += 1
            inst.proc = None
            info.pid = info.pgid = inst.create_time = None
            info.state = "stopped"
            if not was_stopped:
                info.stopped_at = time.time()
            self._commit(inst)

    async def _run_hooks(self, instance_id: str, grace: float) -> None:
        async def run(hook: Callable[[str, float], Awaitable[None]]) -> None:
            try:
                await hook(instance_id, grace)
            except Exception:
                log.exception("on_stop hook %r failed for instance %s", hook, instance_id)

        async with trio.open_nursery() as nursery:
            for hook in self.on_stop:
                nursery.start_soon(run, hook)

    async def _discard(self, inst: _Instance) -> None:
        """Kill what may be left of the instance and remove its dir and cgroup."""
        info = inst.info
        cgroup = Path(info.cgroup) if info.cgroup else None
        if inst.proc is not None and inst.proc.returncode is None:
            await proctree.kill_tree_now(
                leader=inst.proc.pid, pgid=inst.proc.pid, cgroup=cgroup, tree_id=self._tree(info.instance_id)
            )
        await trio.to_thread.run_sync(instancedir.remove, Path(info.instance_dir))
        await proctree.remove_cgroup(cgroup)

    def _main_cgroup(self, info: m.InstanceInfo) -> Path | None:
        return Path(info.cgroup) / "main" if info.cgroup else None

    def _grace(self, grace_s: float | None) -> float:
        return self._config.stop_grace_s if grace_s is None else grace_s

    def _check_open(self) -> None:
        if self._closed:
            raise RpcError(ErrorCode.SHUTTING_DOWN)

    def _find(self, instance_id: str) -> _Instance:
        inst = self._instances.get(instance_id)
        if inst is None or inst.info.state == "destroyed":
            raise RpcError(ErrorCode.INSTANCE_NOT_FOUND, f"no instance {instance_id!r}", instance_id=instance_id)
        return inst

    def _public(self, inst: _Instance) -> m.InstanceInfo:
        sessions, execs = (0, 0) if inst.info.state == "destroyed" else self.count_children(inst.info.instance_id)
        return msgspec.structs.replace(inst.info, sessions=sessions, execs=execs)

    def _commit(self, inst: _Instance) -> None:
        """Record a change of ``inst``: its metadata.json and the state file (failures are logged)."""
        instancedir.write_metadata(inst.info)
        self._save()

    def _save(self) -> None:
        statefile.write(
            self._config.state_file,
            [
                statefile.PersistedInstance(info=inst.info, env=inst.env, main_create_time=inst.create_time)
                for inst in self._instances.values()
            ],
        )
