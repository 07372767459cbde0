"""The table of every instance of this hostd, and the rules everything that changes it follows.

:class:`InstanceTable` holds the instances (one record and one lock each), the providers and the
checkpoints, answers queries, and persists every change (:meth:`InstanceTable.commit` writes the
provider's record and the state file). It is built once by the
:class:`~agentic_sandbox.hostd.instances.InstanceRegistry` (the lifecycle, re-adoption at start),
which hands it to its :class:`~agentic_sandbox.hostd.instancecopies.InstanceCopies` (checkpoints,
restores, forks, warm pool claims: instances made from other instances) and holds both.
"""

from __future__ import annotations

import builtins
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager

import msgspec
import trio

from agentic_sandbox.proto import ErrorCode
from agentic_sandbox.proto import messages as m

from . import statefile
from .checkpoints import CheckpointStore
from .config import HostdConfig
from .errors import RpcError
from .providers import Instance, Provider

log = logging.getLogger(__name__)

StopHook = Callable[[str, float], Awaitable[None]]


class InstanceTable:
    """Every instance of this hostd; see the module docstring.

    ``providers`` is built by the caller with this registry's :meth:`commit` (so providers can report
    changes they notice by themselves); set it with :meth:`use_providers` before anything else.
    ``on_stop`` hooks are awaited on stop/destroy with ``(instance_id, grace_s)``.
    """

    def __init__(self, config: HostdConfig) -> None:
        self.config = config
        self.by_kind: dict[tuple[str, str], Provider] = {}
        self._defaults: dict[str, Provider] = {}
        self.instances: dict[str, Instance] = {}
        self.checkpoints = CheckpointStore(config.checkpoints_dir)
        self.closed = False
        self.on_stop: list[StopHook] = []
        self.count_children: Callable[[str], tuple[int, int]] = lambda _id: (0, 0)

    def use_providers(self, providers: Sequence[Provider]) -> None:
        for provider in providers:
            self.by_kind[(provider.runtime, provider.name)] = provider
            self._defaults.setdefault(provider.runtime, provider)
            provider.held_elsewhere = self._checkpoint_uuids

    # -- queries --------------------------------------------------------------------------------

    def providers(self) -> list[m.ProviderInfo]:
        return [p.describe(default=self._defaults.get(p.runtime) is p) for p in self.by_kind.values()]

    def get(self, instance_id: str) -> m.InstanceInfo:
        return self.public(self.find(instance_id))

    def list(self, *, pool_slots: bool = False) -> list[m.InstanceInfo]:
        return [self.public(inst) for inst in self.instances.values() if pool_slots or inst.info.pool is None]

    def slots(self, pool: str | None = None) -> builtins.list[m.InstanceInfo]:
        """The warm pool slots among the instances (of ``pool``, else of every pool)."""
        return [
            self.public(inst)
            for inst in self.instances.values()
            if inst.info.pool is not None and pool in (None, inst.info.pool)
        ]

    # -- the rules --------------------------------------------------------------------------------

    def provider_for(self, runtime: str, name: str | None, *, available: bool = True) -> Provider:
        """The provider a provision with ``runtime`` and ``name`` gets; ``provider.unavailable`` if
        this hostd offers none, or (``available``) if it cannot serve right now."""
        provider = self._defaults.get(runtime) if name is None else self.by_kind.get((runtime, name))
        if provider is None:
            offered = ", ".join(f"{r}/{n}" for r, n in self.by_kind) or "none"
            raise RpcError(
                ErrorCode.PROVIDER_UNAVAILABLE,
                f"no provider {runtime}/{name or '<default>'} on this hostd (offered: {offered})",
                runtime=runtime,
                provider=name,
            )
        reason = provider.availability()
        if available and reason is not None:
            raise RpcError(
                ErrorCode.PROVIDER_UNAVAILABLE,
                f"provider {provider.runtime}/{provider.name} is not available: {reason}",
                runtime=provider.runtime,
                provider=provider.name,
                reason=reason,
            )
        return provider

    async def run_hooks(self, instance_id: str, grace: float) -> None:
        async def run(hook: StopHook) -> None:
            try:
                await hook(instance_id, grace)
            except Exception:
                log.exception("on_stop hook %r failed for instance %s", hook, instance_id)

        async with trio.open_nursery() as nursery:
            for hook in self.on_stop:
                nursery.start_soon(run, hook)

    def _checkpoint_uuids(self) -> set[str]:
        return {c.uuid for c in self.checkpoints.list() if c.uuid}

    def grace(self, grace_s: float | None) -> float:
        return self.config.stop_grace_s if grace_s is None else grace_s

    @staticmethod
    def check_available(inst: Instance) -> None:
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

    def check_open(self) -> None:
        if self.closed:
            raise RpcError(ErrorCode.SHUTTING_DOWN)

    @asynccontextmanager
    async def locked(self, instance_id: str) -> AsyncIterator[Instance]:
        """The instance, under its lock, for lifecycle work: hostd open, the instance known and its
        provider available, and still there once the lock is had (a destroy may have come first)."""
        self.check_open()
        inst = self.find(instance_id)
        self.check_available(inst)
        async with inst.lock:
            self.find(instance_id)
            yield inst

    def reserve(
        self,
        instance_id: str,
        provider: Provider,
        env: dict[str, str],
        *,
        name: str,
        labels: dict[str, str],
        capabilities: builtins.list[str],
        loadout: str | None,
        command: builtins.list[str] | None = None,
        pool: str | None = None,
        launched_from: str | None = None,
    ) -> Instance:
        """A new instance in ``provisioning``, entered in the table before the caller's first await
        (so a concurrent twin gets ``instance.exists``)."""
        info = m.InstanceInfo(
            instance_id=instance_id,
            name=name,
            state="provisioning",
            instance_dir="",
            working_dir="",
            runtime=provider.runtime,
            provider=provider.name,
            capabilities=capabilities,
            labels=dict(labels),
            command=command,
            loadout=loadout,
            created_at=time.time(),
            pool=pool,
            launched_from=launched_from,
        )
        inst = Instance(info, env, provider)
        self.instances[instance_id] = inst
        return inst

    def find(self, instance_id: str) -> Instance:
        inst = self.instances.get(instance_id)
        if inst is None or inst.info.state == "destroyed":
            raise RpcError(ErrorCode.INSTANCE_NOT_FOUND, f"no instance {instance_id!r}", instance_id=instance_id)
        return inst

    def public(self, inst: Instance) -> m.InstanceInfo:
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
        self.save()

    def save(self) -> None:
        statefile.write(
            self.config.state_file,
            [
                statefile.PersistedInstance(info=inst.info, env=inst.env, detail=inst.provider.saved(inst))
                for inst in self.instances.values()
            ],
        )
