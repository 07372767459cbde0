"""The instance registry's table and the rules every part of it shares.

:class:`RegistryBase` holds the instances (one record and one lock each), the providers and the
checkpoints, answers queries, and persists every change (:meth:`RegistryBase.commit` writes the
provider's record and the state file). The registry itself is built on it in two parts:
:mod:`hostd.instancecopies` (checkpoints, restores, forks, warm pool claims: instances made from
other instances) and :mod:`hostd.instances` (the lifecycle, re-adoption at start).
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


class RegistryBase:
    """Every instance of this hostd; see :class:`hostd.instances.InstanceRegistry`.

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
            provider.held_elsewhere = self._checkpoint_uuids

    # -- queries --------------------------------------------------------------------------------

    def providers(self) -> list[m.ProviderInfo]:
        return [p.describe(default=self._defaults.get(p.runtime) is p) for p in self._providers.values()]

    def get(self, instance_id: str) -> m.InstanceInfo:
        return self._public(self._find(instance_id))

    def list(self, *, pool_slots: bool = False) -> list[m.InstanceInfo]:
        return [self._public(inst) for inst in self._instances.values() if pool_slots or inst.info.pool is None]

    def slots(self, pool: str | None = None) -> builtins.list[m.InstanceInfo]:
        """The warm pool slots among the instances (of ``pool``, else of every pool)."""
        return [
            self._public(inst)
            for inst in self._instances.values()
            if inst.info.pool is not None and pool in (None, inst.info.pool)
        ]

    # -- internals ------------------------------------------------------------------------------

    def provider_for(self, runtime: str, name: str | None, *, available: bool = True) -> Provider:
        """The provider a provision with ``runtime`` and ``name`` gets; ``provider.unavailable`` if
        this hostd offers none, or (``available``) if it cannot serve right now."""
        return self._provider_for(runtime, name, available=available)

    def _provider_for(self, runtime: str, name: str | None, *, available: bool = True) -> Provider:
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
        if available and reason is not None:
            raise RpcError(
                ErrorCode.PROVIDER_UNAVAILABLE,
                f"provider {provider.runtime}/{provider.name} is not available: {reason}",
                runtime=provider.runtime,
                provider=provider.name,
                reason=reason,
            )
        return provider

    async def _run_hooks(self, instance_id: str, grace: float) -> None:
        async def run(hook: StopHook) -> None:
            try:
                await hook(instance_id, grace)
            except Exception:
                log.exception("on_stop hook %r failed for instance %s", hook, instance_id)

        async with trio.open_nursery() as nursery:
            for hook in self.on_stop:
                nursery.start_soon(run, hook)

    def _checkpoint_uuids(self) -> set[str]:
        return {c.uuid for c in self._checkpoints.list() if c.uuid}

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

    @asynccontextmanager
    async def _locked(self, instance_id: str) -> AsyncIterator[Instance]:
        """The instance, under its lock, for lifecycle work: hostd open, the instance known and its
        provider available, and still there once the lock is had (a destroy may have come first)."""
        self._check_open()
        inst = self._find(instance_id)
        self._check_available(inst)
        async with inst.lock:
            self._find(instance_id)
            yield inst

    def _reserve(
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
        self._instances[instance_id] = inst
        return inst

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
