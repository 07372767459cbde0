"""The host runtime: an instance is a working dir, an env, a cgroup and optionally a supervised main process.

Full host access: everything in a host instance runs as hostd's user, on the host's filesystem. The
instance's directory and environment are :mod:`hostd.providers.host.directory`'s business.

The main process (``command``) runs in its own session (pgid == pid), carries
``AIWG_TREE=<namespace>:instance:<id>`` and lives in the cgroup ``<id>/main``. When it exits on its
own the instance is ``stopped`` (exit code 0) or ``failed`` (anything else, ``note`` says why), and
what it left behind in its tree is killed, as systemd does for a service's control group. Its PTY
sessions and execs are not touched then; ``stop`` ends them first through the registry's hook.

Restart of hostd: main processes keep running (the unit's ``KillMode=process``); :meth:`readopt`
finds each by pid and start time and reports honestly the ones that died meanwhile.

Processes inside an instance (sessions, execs) run on the host as asked, in the instance's working
dir (a relative cwd is taken below it), with the instance's environment, each in a cgroup of its own
below the instance's.

Sleep (``freeze`` only: the host has no way to write a process tree's memory to disk) is the cgroup v2
freezer on the instance's cgroup: the main process, every session and exec and whatever they forked,
in one write. Where hostd has no cgroups, host instances cannot sleep.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import trio

from agentic_sandbox.proto import ErrorCode
from agentic_sandbox.proto import messages as m

from ... import procspawn, proctree
from ...config import HostdConfig
from ...errors import RpcError
from ...proctree import Cgroups
from ..base import EndChildren, Instance, Provider, Saved, SpawnSpec
from . import directory

log = logging.getLogger(__name__)

#: How long stop waits for the main process's exit to be collected after the tree was killed.
_EXIT_WAIT_S = 5.0
_LIVE_STATES = ("running", "starting", "stopping", "sleeping")

SLEEP_FREEZE = "instance.sleep.freeze"
#: How long the kernel may take to freeze or thaw an instance's tree.
_FREEZE_WAIT_S = 10.0

CAPABILITIES = [
    "instance.start",
    "instance.stop",
    "instance.restart",
    "instance.destroy",
    "session.pty",
    "exec",
    "exec.control",
]


class _MainRun:
    """The host provider's record of one instance: its main process and what its children inherit."""

    def __init__(self) -> None:
        self.proc: procspawn.Process | None = None
        self.create_time: float | None = None
        self.done: trio.Event | None = None
        #: Bumped per main start (and by stop), so a late watcher of an older run changes nothing.
        self.generation = 0
        #: The whole environment of a process in the instance (nothing inherited from hostd but PATH).
        self.child_env: dict[str, str] = {}


def _run(instance: Instance) -> _MainRun:
    state = instance.state
    assert isinstance(state, _MainRun)
    return state


def _detail(instance: Instance) -> m.HostDetail:
    if instance.info.host is None:
        instance.info.host = m.HostDetail()
    return instance.info.host


class HostProvider(Provider):
    """Supervised process trees on this host. Watchers of main processes run in ``nursery`` (owned by
    hostd's registry, outliving connections)."""

    runtime = "host"
    name = "hostd"

    def __init__(
        self, config: HostdConfig, cgroups: Cgroups, nursery: trio.Nursery, commit: Callable[[Instance], None]
    ) -> None:
        super().__init__(commit)
        self._config = config
        self._cgroups = cgroups
        self._nursery = nursery

    def capabilities(self) -> list[str]:
        return [*CAPABILITIES, SLEEP_FREEZE] if self._cgroups.available else list(CAPABILITIES)

    def instance_capabilities(self, info: m.InstanceInfo) -> list[str]:
        # An instance made while hostd had no cgroups has none to freeze.
        host = info.host
        if host is not None and host.cgroup is None and info.state != "provisioning":
            return list(CAPABILITIES)
        return self.capabilities()

    def _tree(self, instance_id: str) -> str:
        """The ``AIWG_TREE`` mark of this instance's process tree."""
        return self._config.tree_id("instance", instance_id)

    # -- lifecycle ------------------------------------------------------------------------------

    async def provision(self, instance: Instance, req: m.InstanceProvisionRequest) -> None:
        info = instance.info
        instance.state = _MainRun()
        info.working_dir = directory.requested_working_dir(req.working_dir)
        info.instance_dir = str(self._config.instances_dir / info.instance_id)
        info.host = m.HostDetail()
        info.working_dir = directory.create(Path(info.instance_dir), info.working_dir, self._config.workspace_root)
        directory.write_agent_env(info, instance.env)
        cgroup = self._cgroups.create(info.instance_id)
        info.host.cgroup = str(cgroup) if cgroup else None
        _run(instance).child_env = directory.child_env(info, instance.env)

    async def start(self, instance: Instance) -> None:
        info, run = instance.info, _run(instance)
        host = _detail(instance)
        now = time.time()
        if info.command is None:
            info.state, info.started_at, info.stopped_at = "running", now, None
            info.exit_code = info.adopted = info.note = None
            return
        info.state = "starting"
        main_cgroup = self._cgroups.create(f"{info.instance_id}/main") if host.cgroup else None
        log_fd = procspawn.open_log(Path(info.instance_dir) / "main.log")
        try:
            proc = await procspawn.spawn(
                info.command,
                cwd=info.working_dir,
                env=run.child_env,
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
        run.proc = proc
        run.create_time = proctree.create_time(proc.pid)
        host.pid = host.pgid = proc.pid
        info.state, info.started_at, info.stopped_at = "running", now, None
        info.exit_code = info.adopted = info.note = None
        self._watch(instance, proc, proc.pid)

    async def stop(self, instance: Instance, grace_s: float, end_children: EndChildren) -> None:
        info, run = instance.info, _run(instance)
        host = _detail(instance)
        try:
            await end_children()
            pid = host.pid
            live = pid is not None and (
                (run.proc is not None and run.proc.returncode is None) or proctree.pid_matches(pid, run.create_time)
            )
            await proctree.terminate_tree(
                leader=pid if live else None,
                pgid=pid,
                cgroup=self._main_cgroup(host),
                tree_id=self._tree(info.instance_id),
                grace_s=grace_s,
            )
            if pid is not None and run.done is not None:
                with trio.move_on_after(_EXIT_WAIT_S):
                    await run.done.wait()
            # Final sweep: anything still in the instance's cgroup (sessions, execs, escapees).
            Cgroups.kill(Path(host.cgroup) if host.cgroup else None)
        finally:
            run.generation += 1
            run.proc = None
            run.create_time = None
            host.pid = host.pgid = None

    async def discard(self, instance: Instance) -> None:
        info = instance.info
        host = _detail(instance)
        cgroup = Path(host.cgroup) if host.cgroup else None
        run = instance.state
        if isinstance(run, _MainRun) and run.proc is not None and run.proc.returncode is None:
            await proctree.kill_tree_now(
                leader=run.proc.pid, pgid=run.proc.pid, cgroup=cgroup, tree_id=self._tree(info.instance_id)
            )
        if info.instance_dir:
            await trio.to_thread.run_sync(directory.remove, Path(info.instance_dir))
        await proctree.remove_cgroup(cgroup)

    async def readopt(self, instance: Instance, saved: Saved) -> None:
        info = instance.info
        run = instance.state = _MainRun()
        create_time = saved.get("main_create_time")
        run.create_time = float(create_time) if isinstance(create_time, int | float) else None
        host = _detail(instance)
        if host.cgroup:
            cgroup = self._cgroups.create(info.instance_id)
            host.cgroup = str(cgroup) if cgroup else None
        run.child_env = directory.child_env(info, instance.env)
        now = time.time()
        frozen = host.cgroup is not None and Cgroups.frozen(Path(host.cgroup))
        if info.state == "sleeping":
            # Still frozen: it sleeps on. Thawed meanwhile (by hand): it runs, as found.
            info.state = "sleeping" if frozen else "running"
            if not frozen:
                info.sleep = None
        elif frozen and host.cgroup is not None:
            # Frozen with its instance awake: a sleep hostd went down in the middle of (the freezer
            # written, the record not). Nothing could run in it: thawed.
            with contextlib.suppress(OSError):
                (Path(host.cgroup) / "cgroup.freeze").write_text("0")
        if info.state in _LIVE_STATES and host.pid is not None:
            if proctree.pid_matches(host.pid, run.create_time):
                info.adopted, info.note = True, None
                if info.state != "sleeping":
                    info.state = "running"
                self._watch(instance, None, host.pid)
            else:
                self._thaw_now(info)
                info.state, info.adopted, info.stopped_at = "failed", False, now
                info.note = f"main process {host.pid} ended while hostd was down"
                host.pid = host.pgid = run.create_time = None
        elif info.state == "stopping":
            info.state, info.stopped_at = "stopped", now
        elif info.state == "starting" or (info.state in ("running", "sleeping") and info.command):
            self._thaw_now(info)
            info.state, info.adopted, info.stopped_at = "failed", False, now
            info.note = "main process was not running when hostd went down"
        elif info.state in ("running", "sleeping"):
            info.adopted = True
            info.note = "PTY sessions and execs from the previous hostd ended with it"

    @staticmethod
    def _thaw_now(info: m.InstanceInfo) -> None:
        """The instance ended while asleep: what is left of its tree must be able to die."""
        if info.sleep is not None and info.host is not None and info.host.cgroup is not None:
            with contextlib.suppress(OSError):
                (Path(info.host.cgroup) / "cgroup.freeze").write_text("0")
        info.sleep = None

    # -- sleep ----------------------------------------------------------------------------------

    def _cgroup_of(self, instance: Instance) -> Path:
        host = _detail(instance)
        if host.cgroup is None:
            raise RpcError(
                ErrorCode.UNSUPPORTED,
                f"host instance {instance.id!r} has no cgroup (hostd runs without cgroups): it cannot sleep",
            )
        return Path(host.cgroup)

    async def sleep(self, instance: Instance, how: m.SleepForm) -> None:
        if how != "freeze":
            await super().sleep(instance, how)
        cgroup = self._cgroup_of(instance)
        try:
            await Cgroups.freeze(cgroup, True, timeout_s=_FREEZE_WAIT_S)
        except OSError as exc:
            # Half frozen is no state to leave it in: thaw what was taken.
            with contextlib.suppress(OSError):
                await Cgroups.freeze(cgroup, False, timeout_s=_FREEZE_WAIT_S)
            raise RpcError(ErrorCode.PROVIDER_FAILED, f"cannot freeze instance {instance.id!r}: {exc}") from exc

    async def wake(self, instance: Instance, how: m.SleepForm) -> None:
        cgroup = self._cgroup_of(instance)
        try:
            await Cgroups.freeze(cgroup, False, timeout_s=_FREEZE_WAIT_S)
        except OSError as exc:
            raise RpcError(ErrorCode.PROVIDER_FAILED, f"cannot thaw instance {instance.id!r}: {exc}") from exc

    def record(self, instance: Instance) -> None:
        directory.write_metadata(instance.info)

    def saved(self, instance: Instance) -> Saved:
        run = instance.state
        return {"main_create_time": run.create_time} if isinstance(run, _MainRun) and run.create_time else {}

    # -- processes inside -----------------------------------------------------------------------

    def spawn_spec(
        self, instance: Instance, argv: Sequence[str], cwd: str | None, env: Mapping[str, str], *, tty: bool
    ) -> SpawnSpec:
        # A relative cwd is taken inside the instance's working dir; an absolute one as it is.
        path = os.path.normpath(os.path.join(instance.info.working_dir, cwd or ""))
        if not os.path.isdir(path):
            raise RpcError(ErrorCode.WORKING_DIR_NOT_FOUND, f"working directory {path!r} does not exist", cwd=path)
        host = _detail(instance)
        return SpawnSpec(
            argv=list(argv),
            cwd=path,
            env={**_run(instance).child_env, **env},
            shown_cwd=path,
            cgroup_parent=Path(host.cgroup) if host.cgroup and self._cgroups.available else None,
        )

    # -- the main process -----------------------------------------------------------------------

    def _watch(self, instance: Instance, proc: procspawn.Process | None, pid: int) -> None:
        run = _run(instance)
        run.generation += 1
        run.done = trio.Event()
        self._nursery.start_soon(self._watch_main, instance, run.generation, proc, pid, run.done)

    async def _watch_main(
        self, instance: Instance, generation: int, proc: procspawn.Process | None, pid: int, done: trio.Event
    ) -> None:
        run = _run(instance)
        if proc is not None:
            code, sig = await procspawn.wait_exit(proc)
        else:
            code, sig = await procspawn.wait_pid_exit(pid)
        try:
            info = instance.info
            host = _detail(instance)
            if run.generation != generation:
                return
            if info.state == "sleeping":
                # Killed while frozen (the OOM killer, an operator's SIGKILL): it ended asleep.
                self._thaw_now(info)
                info.state = "running"
            if info.state == "running":
                # What the main process left behind in its tree goes with it, before the instance
                # shows as ended: a start that follows at once must not have its new main swept.
                await proctree.kill_tree_now(
                    leader=None, pgid=pid, cgroup=self._main_cgroup(host), tree_id=self._tree(info.instance_id)
                )
                if run.generation != generation:
                    return
            run.proc = None
            run.create_time = None
            host.pid = host.pgid = None
            info.exit_code = code
            if info.state != "running":
                return  # a stop is killing it and records the outcome
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
            self._commit(instance)
        finally:
            done.set()

    @staticmethod
    def _main_cgroup(host: m.HostDetail) -> Path | None:
        return Path(host.cgroup) / "main" if host.cgroup else None
