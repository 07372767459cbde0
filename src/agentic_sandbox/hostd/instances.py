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

Sleep and wake (:mod:`hostd.sleeping`): a ``sleeping`` instance is woken before a start, stop or
destroy; :attr:`InstanceRegistry.sleep` puts instances to sleep when idle and wakes them on traffic.

Warm pool slots (:mod:`hostd.pools` owns the pools) are instances like any other, marked with
``info.pool`` and persisted with it, so a restarted hostd re-adopts them; a plain listing leaves
them out, and nothing runs in one until :meth:`InstanceCopies.claim` (a running slot) or
:meth:`InstanceCopies.restore` (a saved one) made it a new instance. :meth:`InstanceCopies.fork`
copies a running instance into a new one through its provider.
"""

from __future__ import annotations

import builtins
import logging
import time
from collections.abc import Callable, Mapping, Sequence

import trio

from agentic_sandbox.proto import ErrorCode
from agentic_sandbox.proto import messages as m

from . import statefile
from .config import HostdConfig
from .envrules import validate_instance_env
from .errors import RpcError
from .instancecopies import InstanceCopies
from .instancetable import InstanceTable, StopHook
from .providers import AbsentProvider, ControlSocket, Instance, Provider, SpawnSpec
from .sleeping import InstanceSleep

__all__ = ["InstanceRegistry", "Placement", "StopHook"]

log = logging.getLogger(__name__)


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

    def control_socket(self, exec_id: str) -> ControlSocket | None:
        return self._instance.provider.control_socket(self._instance, exec_id)


class InstanceRegistry:
    """Every instance of this hostd; see the module docstring. It holds the
    :class:`~agentic_sandbox.hostd.instancetable.InstanceTable` (the instances, queries,
    persistence) and the :class:`~agentic_sandbox.hostd.instancecopies.InstanceCopies` built on it
    (checkpoints, restores, forks, pool claims), and answers for both.

    ``on_stop`` hooks are awaited on stop/destroy with ``(instance_id, grace_s)``;
    ``count_children`` says how many sessions and execs an instance has (its callers set both).
    """

    def __init__(self, config: HostdConfig) -> None:
        self._table = InstanceTable(config)
        self.copies = InstanceCopies(self._table)
        self.sleep = InstanceSleep(self._table)
        self.on_stop: list[StopHook] = self._table.on_stop

    @property
    def count_children(self) -> Callable[[str], tuple[int, int]]:
        return self._table.count_children

    @count_children.setter
    def count_children(self, count: Callable[[str], tuple[int, int]]) -> None:
        self._table.count_children = count

    # -- the table -----------------------------------------------------------------------------

    def use_providers(self, providers: Sequence[Provider]) -> None:
        self._table.use_providers(providers)

    def providers(self) -> list[m.ProviderInfo]:
        return self._table.providers()

    def provider_for(self, runtime: str, name: str | None, *, available: bool = True) -> Provider:
        return self._table.provider_for(runtime, name, available=available)

    def get(self, instance_id: str) -> m.InstanceInfo:
        return self._table.get(instance_id)

    def list(self, *, pool_slots: bool = False) -> list[m.InstanceInfo]:
        return self._table.list(pool_slots=pool_slots)

    def slots(self, pool: str | None = None) -> builtins.list[m.InstanceInfo]:
        return self._table.slots(pool)

    def commit(self, inst: Instance) -> None:
        self._table.commit(inst)

    def placement(self, instance_id: str) -> Placement:
        """Where sessions and execs start processes; ``INSTANCE_INVALID_STATE`` unless running (and
        not a warm pool slot, which is nobody's until claimed)."""
        inst = self._table.find(instance_id)
        if inst.info.pool is not None:
            raise RpcError(
                ErrorCode.INSTANCE_INVALID_STATE,
                f"instance {instance_id!r} is a ready slot of warm pool {inst.info.pool!r}; claim it first",
                instance_id=instance_id,
            )
        if inst.info.state != "running":
            raise RpcError(
                ErrorCode.INSTANCE_INVALID_STATE,
                f"instance {instance_id!r} is {inst.info.state}, not running",
                instance_id=instance_id,
                state=inst.info.state,
            )
        return Placement(inst)

    # -- lifecycle ------------------------------------------------------------------------------

    async def provision(self, req: m.InstanceProvisionRequest, *, pool: str | None = None) -> m.InstanceInfo:
        """Make and (``req.start``) start a new instance; ``pool`` makes it a slot of that warm pool."""
        self._table.check_open()
        iid = req.instance_id
        existing = self._table.instances.get(iid)
        if existing is not None:
            raise RpcError(
                ErrorCode.INSTANCE_EXISTS,
                f"instance {iid!r} already exists (name {existing.info.name!r})",
                instance_id=iid,
                name=existing.info.name,
            )
        provider = self._table.provider_for(req.runtime, req.provider)
        validate_instance_env(req.env)
        inst = self._table.reserve(
            iid,
            provider,
            dict(req.env),
            name=req.name,
            labels=req.labels,
            capabilities=provider.capabilities(),
            command=list(req.command) if req.command else None,
            loadout=req.loadout,
            pool=pool,
        )
        info = inst.info
        info.idle = req.idle
        try:
            async with inst.lock:
                await provider.provision(inst, req)
                info.capabilities = provider.instance_capabilities(info)
                if req.start:
                    await provider.start(inst)
                else:
                    info.state = "stopped"
                self._table.commit(inst)
        except BaseException:
            # A failed provision leaves nothing behind: the caller sees only the error.
            self._table.instances.pop(iid, None)
            with trio.CancelScope(shield=True):
                await provider.discard(inst)
            self._table.save()
            raise
        log.info("instance %s (%s) provisioned on %s/%s: %s", iid, req.name, info.runtime, info.provider, info.state)
        return self._table.public(inst)

    async def start(self, instance_id: str) -> m.InstanceInfo:
        async with self._table.locked(instance_id) as inst:
            if inst.info.state == "sleeping":
                await self.sleep.wake_locked(inst, "start")
            elif inst.info.state != "running":
                try:
                    await inst.provider.start(inst)
                finally:
                    self._table.commit(inst)
            return self._table.public(inst)

    async def stop(self, instance_id: str, grace_s: float | None) -> m.InstanceInfo:
        async with self._table.locked(instance_id) as inst:
            if inst.info.state == "sleeping":
                await self.sleep.wake_locked(inst, "stop")
            if inst.info.state != "stopped":
                await self._stop_locked(inst, self._table.grace(grace_s))
            return self._table.public(inst)

    async def destroy(self, instance_id: str, grace_s: float | None) -> m.InstanceInfo:
        async with self._table.locked(instance_id) as inst:
            with trio.CancelScope(shield=True):  # half a destroy would leave orphaned files or processes
                await self._wake_to_end(inst)
                await self._stop_locked(inst, self._table.grace(grace_s))
                inst.info.state = "destroyed"
                self._table.instances.pop(instance_id, None)
                await inst.provider.discard(inst)
                self._table.save()
                self.sleep.forget(instance_id)
            log.info("instance %s destroyed", instance_id)
            return self._table.public(inst)

    def persist(self) -> None:
        """Write the state file now (an upgrade in place: the next image re-adopts from it)."""
        self._table.save()

    async def shutdown(self) -> None:
        """Persist and leave every instance running: hostd's unit uses ``KillMode=process``, and a
        restart of hostd must not take the agents down with it. The next hostd re-adopts them."""
        self._table.closed = True
        self._table.save()
        for provider in self._table.by_kind.values():
            await provider.shutdown()

    async def load(self, records: Sequence[statefile.PersistedInstance] | None = None) -> None:
        """Let each instance's provider re-adopt what is still alive, from ``records`` (read from the
        state file when not given)."""
        if records is None:
            records = statefile.read(self._table.config.state_file)
        self._table.checkpoints.sweep()
        for saved in records or ():
            info = saved.info
            if info.state == "destroyed" or info.instance_id in self._table.instances:
                continue
            provider = self._table.by_kind.get((info.runtime, info.provider))
            if provider is None:
                log.error("instance %s: provider %s/%s is not offered", info.instance_id, info.runtime, info.provider)
                provider = AbsentProvider(info.runtime, info.provider)
            info.capabilities = provider.instance_capabilities(info)  # what this hostd's provider can do now
            inst = Instance(info, saved.env, provider)
            was = info.state
            await provider.readopt(inst, saved.detail)
            if info.state != "sleeping":
                info.sleep = None
            if was == "provisioning":
                info.state, info.note = "failed", "hostd went down while provisioning this instance"
            self._table.instances[info.instance_id] = inst
        if records is not None:
            self._table.save()
        for provider in self._table.by_kind.values():
            await provider.startup()

    # -- internals ----------------------------------------------------------------------------------

    async def _wake_to_end(self, inst: Instance) -> None:
        """A destroy of a sleeping instance wakes it, so its processes can be ended as usual; one
        that cannot be woken is destroyed anyway (its provider removes what is left)."""
        if inst.info.state != "sleeping":
            return
        try:
            await self.sleep.wake_locked(inst, "destroy")
        except RpcError as exc:
            log.warning("instance %s: woken to be destroyed, it did not wake: %s", inst.id, exc.message)

    async def _stop_locked(self, inst: Instance, grace: float) -> None:
        info = inst.info
        was_stopped = info.state == "stopped"
        info.state = "stopping"
        self._table.commit(inst)
        try:
            with trio.CancelScope(shield=True):  # a half-done stop would leave a half-killed instance
                await inst.provider.stop(inst, grace, lambda: self._table.run_hooks(inst.id, grace))
        finally:
            info.state = "stopped"
            if not was_stopped:
                info.stopped_at = time.time()
            self._table.commit(inst)
