"""The instance registry: every instance of this hostd, whatever its runtime, and its lifecycle.

The registry knows no runtime's details: it owns the table of instances, one lock per instance, the
lifecycle states and the state file, and dispatches the work to the instance's provider
(:mod:`hostd.providers`), chosen at provision by ``runtime`` and ``provider``.

Lifecycle: ``provision`` → ``running`` (start=True) or ``stopped``; ``start``/``stop`` are
idempotent; ``destroy`` stops, lets the provider remove everything, and forgets the instance. While
work runs the state is ``starting``/``stopping``; the instance's lock serializes start, stop and
destroy of one instance. Stop ends the instance's sessions and execs first, through the ``on_stop``
hooks (the session and exec registries register theirs).

State file (``<state_dir>/hostd-state.json``, :mod:`hostd.statefile`): rewritten after each change.
``shutdown`` only persists: instances keep running for the next hostd, whose ``load`` hands each
record back to its provider to re-adopt (an instance cut off mid-provision is ``failed``).

Sessions and execs start processes inside an instance through :meth:`InstanceRegistry.placement`,
which asks the instance's provider how (:meth:`hostd.providers.Provider.spawn_spec`).
"""

from __future__ import annotations

import builtins
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence

import msgspec
import trio

from proto import ErrorCode
from proto import messages as m

from . import statefile
from .checkpoints import CheckpointRecord, CheckpointStore
from .config import HostdConfig
from .envrules import validate_instance_env
from .errors import RpcError
from .providers import AbsentProvider, Instance, Provider, SpawnSpec

log = logging.getLogger(__name__)

StopHook = Callable[[str, float], Awaitable[None]]


class Placement:
    """A running instance as sessions and execs see it: where a process starts inside it."""

    def __init__(self, instance: Instance) -> None:
        self._instance = instance
        self.instance_id = instance.id

    @property
    def capabilities(self) -> list[str]:
        return self._instance.info.capabilities

    def spawn_spec(self, argv: Sequence[str], cwd: str | None, env: Mapping[str, str], *, tty: bool) -> SpawnSpec:
        return self._instance.provider.spawn_spec(self._instance, argv, cwd, env, tty=tty)


class InstanceRegistry:
    """Every instance of this hostd; see the module docstring.

    ``providers`` is built by the caller with this registry's :meth:`commit` (so providers can report
    changes they notice by themselves); set it with :meth:`use_providers` before anything else.
    ``on_stop`` hooks are awaited on stop/destroy with ``(instance_id, grace_s)``.
    """

    def __init__(self, config: HostdConfig) -> None:
        self._config = config
        self._providers: dict[tuple[str, str], Provider] = {}
        self._defaults: dict[str, Provider] = {}
        self._instances: dict[str, Instance] = {}
        self._checkpoints = CheckpointStore(config.checkpoints_dir)
        self._closed = False
        self.on_stop: list[StopHook] = []
        self.count_children: Callable[[str], tuple[int, int]] = lambda _id: (0, 0)

    def use_providers(self, providers: Sequence[Provider]) -> None:
        for provider in providers:
            self._providers[(provider.runtime, provider.name)] = provider
            self._defaults.setdefault(provider.runtime, provider)

    # -- queries --------------------------------------------------------------------------------

    def providers(self) -> list[m.ProviderInfo]:
        return [p.describe(default=self._defaults.get(p.runtime) is p) for p in self._providers.values()]

    def get(self, instance_id: str) -> m.InstanceInfo:
        return self._public(self._find(instance_id))

    def list(self) -> list[m.InstanceInfo]:
        return [self._public(inst) for inst in self._instances.values()]

    def placement(self, instance_id: str) -> Placement:
        """Where sessions and execs start processes; ``INSTANCE_INVALID_STATE`` unless running."""
        inst = self._find(instance_id)
        if inst.info.state != "running":
            raise RpcError(
                ErrorCode.INSTANCE_INVALID_STATE,
                f"instance {instance_id!r} is {inst.info.state}, not running",
                instance_id=instance_id,
                state=inst.info.state,
            )
        return Placement(inst)

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
        provider = self._provider_for(req.runtime, req.provider)
        validate_instance_env(req.env)
        info = m.InstanceInfo(
            instance_id=iid,
            name=req.name,
            state="provisioning",
            instance_dir="",
            working_dir="",
            runtime=provider.runtime,
            provider=provider.name,
            capabilities=provider.capabilities(),
            labels=dict(req.labels),
            command=list(req.command) if req.command else None,
            loadout=req.loadout,
            created_at=time.time(),
        )
        inst = Instance(info, dict(req.env), provider)
        self._instances[iid] = inst  # reserved before the first await: a concurrent twin gets EXISTS
        try:
            async with inst.lock:
                await provider.provision(inst, req)
                if req.start:
                    await provider.start(inst)
                else:
                    info.state = "stopped"
                self.commit(inst)
        except BaseException:
            # A failed provision leaves nothing behind: the caller sees only the error.
            self._instances.pop(iid, None)
            with trio.CancelScope(shield=True):
                await provider.discard(inst)
            self._save()
            raise
        log.info("instance %s (%s) provisioned on %s/%s: %s", iid, req.name, info.runtime, info.provider, info.state)
        return self._public(inst)

    async def start(self, instance_id: str) -> m.InstanceInfo:
        self._check_open()
        inst = self._find(instance_id)
        self._check_available(inst)
        async with inst.lock:
            self._find(instance_id)  # destroyed while we waited for the lock?
            if inst.info.state != "running":
                try:
                    await inst.provider.start(inst)
                finally:
                    self.commit(inst)
            return self._public(inst)

    async def stop(self, instance_id: str, grace_s: float | None) -> m.InstanceInfo:
        self._check_open()
        inst = self._find(instance_id)
        self._check_available(inst)
        async with inst.lock:
            self._find(instance_id)
            if inst.info.state != "stopped":
                await self._stop_locked(inst, self._grace(grace_s))
            return self._public(inst)

    async def destroy(self, instance_id: str, grace_s: float | None) -> m.InstanceInfo:
        self._check_open()
        inst = self._find(instance_id)
        self._check_available(inst)
        async with inst.lock:
            self._find(instance_id)
            with trio.CancelScope(shield=True):  # half a destroy would leave orphaned files or processes
                await self._stop_locked(inst, self._grace(grace_s))
                inst.info.state = "destroyed"
                self._instances.pop(instance_id, None)
                await inst.provider.discard(inst)
                self._save()
            log.info("instance %s destroyed", instance_id)
            return self._public(inst)

    # -- checkpoints ----------------------------------------------------------------------------

    def checkpoints(self) -> builtins.list[m.CheckpointInfo]:
        return self._checkpoints.list()

    async def checkpoint(self, instance_id: str, checkpoint_id: str) -> m.CheckpointInfo:
        """Save a running instance into a new checkpoint; the instance is retired (see
        :class:`proto.messages.CheckpointCreateRequest`). Its sessions and execs end first."""
        self._check_open()
        inst = self._find(instance_id)
        self._check_available(inst)
        async with inst.lock:
            self._find(instance_id)
            if inst.info.state != "running":
                raise RpcError(
                    ErrorCode.INSTANCE_INVALID_STATE,
                    f"instance {instance_id!r} is {inst.info.state}; only a running instance can be checkpointed",
                    instance_id=instance_id,
                    state=inst.info.state,
                )
            path = self._checkpoints.prepare(checkpoint_id)
            with trio.CancelScope(shield=True):  # half a save leaves a stopped domain and no record
                await self._run_hooks(inst.id, self._config.stop_grace_s)
                try:
                    detail = await inst.provider.checkpoint(inst, path)
                except BaseException:
                    path.unlink(missing_ok=True)
                    self.commit(inst)
                    raise
                info = m.CheckpointInfo(
                    checkpoint_id=checkpoint_id,
                    source_instance_id=inst.id,
                    source_name=inst.info.name,
                    runtime=inst.info.runtime,
                    provider=inst.info.provider,
                    domain=inst.info.vm.domain if inst.info.vm else None,
                    uuid=inst.info.vm.uuid if inst.info.vm else None,
                    size_bytes=path.stat().st_size if path.exists() else 0,
                    created_at=time.time(),
                )
                self._checkpoints.write(CheckpointRecord(info=info, detail=detail))
                inst.info.state, inst.info.note = "destroyed", f"retired into checkpoint {checkpoint_id}"
                self._instances.pop(instance_id, None)
                self._save()
        log.info("instance %s checkpointed as %s (%d bytes)", instance_id, checkpoint_id, info.size_bytes)
        return info

    async def restore(self, req: m.CheckpointRestoreRequest) -> m.InstanceInfo:
        """Restore a checkpoint (single use) as a new running instance."""
        self._check_open()
        record = self._checkpoints.get(req.checkpoint_id)
        if req.instance_id in self._instances:
            raise RpcError(ErrorCode.INSTANCE_EXISTS, f"instance {req.instance_id!r} already exists")
        provider = self._provider_for(record.info.runtime, record.info.provider)
        info = m.InstanceInfo(
            instance_id=req.instance_id,
            name=req.name,
            state="provisioning",
            instance_dir="",
            working_dir="",
            runtime=provider.runtime,
            provider=provider.name,
            capabilities=provider.capabilities(),
            labels=dict(req.labels),
            loadout=req.loadout,
            created_at=time.time(),
        )
        inst = Instance(info, {}, provider)
        self._instances[req.instance_id] = inst
        try:
            async with inst.lock:
                await provider.restore(inst, record.detail, self._checkpoints.data_path(req.checkpoint_id))
                self._checkpoints.remove(req.checkpoint_id)  # single use: its domain runs again
                self.commit(inst)
        except BaseException:
            self._instances.pop(req.instance_id, None)
            self._save()
            raise
        log.info("checkpoint %s restored as instance %s (%s)", req.checkpoint_id, req.instance_id, req.name)
        return self._public(inst)

    async def shutdown(self) -> None:
        """Persist and leave every instance running: hostd's unit uses ``KillMode=process``, and a
        restart of hostd must not take the agents down with it. The next hostd re-adopts them."""
        self._closed = True
        self._save()
        for provider in self._providers.values():
            await provider.shutdown()

    async def load(self, records: Sequence[statefile.PersistedInstance] | None = None) -> None:
        """Let each instance's provider re-adopt what is still alive, from ``records`` (read from the
        state file when not given)."""
        if records is None:
            records = statefile.read(self._config.state_file)
        for saved in records or ():
            info = saved.info
            if info.state == "destroyed" or info.instance_id in self._instances:
                continue
            provider = self._providers.get((info.runtime, info.provider))
            if provider is None:
                log.error("instance %s: provider %s/%s is not offered", info.instance_id, info.runtime, info.provider)
                provider = AbsentProvider(info.runtime, info.provider)
            info.capabilities = provider.capabilities()  # what this hostd's provider can do now
            inst = Instance(info, saved.env, provider)
            was = info.state
            await provider.readopt(inst, saved.detail)
            if was == "provisioning":
                info.state, info.note = "failed", "hostd went down while provisioning this instance"
            self._instances[info.instance_id] = inst
        if records is not None:
            self._save()
        for provider in self._providers.values():
            await provider.startup()

    # -- internals ------------------------------------------------------------------------------

    def _provider_for(self, runtime: str, name: str | None) -> Provider:
        provider = self._defaults.get(runtime) if name is None else self._providers.get((runtime, name))
        if provider is None:
            offered = ", ".join(f"{r}/{n}" for r, n in self._providers) or "none"
            raise RpcError(
                ErrorCode.PROVIDER_UNAVAILABLE,
                f"no provider {runtime}/{name or '<default>'} on this hostd (offered: {offered})",
                runtime=runtime,
                provider=name,
            )
        reason = provider.availability()
        if reason is not None:
            raise RpcError(
                ErrorCode.PROVIDER_UNAVAILABLE,
                f"provider {provider.runtime}/{provider.name} is not available: {reason}",
                runtime=provider.runtime,
                provider=provider.name,
                reason=reason,
            )
        return provider

    async def _stop_locked(self, inst: Instance, grace: float) -> None:
        info = inst.info
        was_stopped = info.state == "stopped"
        info.state = "stopping"
        self.commit(inst)
        try:
            with trio.CancelScope(shield=True):  # a half-done stop would leave a half-killed instance
                await inst.provider.stop(inst, grace, lambda: self._run_hooks(inst.id, grace))
        finally:
            info.state = "stopped"
            if not was_stopped:
                info.stopped_at = time.time()
            self.commit(inst)

    async def _run_hooks(self, instance_id: str, grace: float) -> None:
        async def run(hook: StopHook) -> None:
            try:
                await hook(instance_id, grace)
            except Exception:
                log.exception("on_stop hook %r failed for instance %s", hook, instance_id)

        async with trio.open_nursery() as nursery:
            for hook in self.on_stop:
                nursery.start_soon(run, hook)

    def _grace(self, grace_s: float | None) -> float:
        return self._config.stop_grace_s if grace_s is None else grace_s

    @staticmethod
    def _check_available(inst: Instance) -> None:
        """Lifecycle work needs the instance's provider: nothing is done halfway or elsewhere."""
        reason = inst.provider.availability()
        if reason is not None:
            raise RpcError(
                ErrorCode.PROVIDER_UNAVAILABLE,
                f"instance {inst.id!r}: {reason}",
                instance_id=inst.id,
                runtime=inst.info.runtime,
                provider=inst.info.provider,
            )

    def _check_open(self) -> None:
        if self._closed:
            raise RpcError(ErrorCode.SHUTTING_DOWN)

    def _find(self, instance_id: str) -> Instance:
        inst = self._instances.get(instance_id)
        if inst is None or inst.info.state == "destroyed":
            raise RpcError(ErrorCode.INSTANCE_NOT_FOUND, f"no instance {instance_id!r}", instance_id=instance_id)
        return inst

    def _public(self, inst: Instance) -> m.InstanceInfo:
        sessions, execs = (0, 0) if inst.info.state == "destroyed" else self.count_children(inst.id)
        info = inst.info
        # A snapshot: the provider goes on changing its own detail of the live record.
        host = msgspec.structs.replace(info.host) if info.host is not None else None
        container = msgspec.structs.replace(info.container) if info.container is not None else None
        vm = msgspec.structs.replace(info.vm) if info.vm is not None else None
        return msgspec.structs.replace(info, host=host, container=container, vm=vm, sessions=sessions, execs=execs)

    def commit(self, inst: Instance) -> None:
        """Record a change of ``inst``: its provider's view of it and the state file (failures are logged)."""
        inst.provider.record(inst)
        self._save()

    def _save(self) -> None:
        statefile.write(
            self._config.state_file,
            [
                statefile.PersistedInstance(info=inst.info, env=inst.env, detail=inst.provider.saved(inst))
                for inst in self._instances.values()
            ],
        )
