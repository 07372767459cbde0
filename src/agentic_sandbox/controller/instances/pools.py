"""Warm pools as the controller sees them: which pools exist (its configuration), what hostd holds.

Where the state lives: hostd keeps the pools themselves (their slots, refills, counters;
``hostd/pools.py`` says why), the controller keeps identities. So this service holds no pool state
of its own: ``AIWG_WARM_POOLS`` (``loadout=size,...``) names the pools, one per loadout, and
:meth:`WarmPoolService.sync` tells hostd after every connect (``PoolSet`` with a template made from
the loadout: its runtime, image and service; ``PoolDelete`` for a template pool no longer
configured). A claim (:mod:`controller.instances.provisioning`) gets a slot as an instance id the controller
chose, whose A2A token and signing key the controller made. Upstream's libvirt warm pools (pools
of checkpoints, ``POST /libvirt/warm-pools``) are made here too, as operations.

New hostd requests are sent only to a hostd that lists ``warm_pool.manage`` among its providers'
capabilities (an older hostd would close the connection on an unknown request, proto/README.md).

Errors: only :mod:`controller.errors` (hostd failures arrive translated by the link).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from agentic_sandbox.proto import messages as m

from ..config import ConfigError
from ..errors import ControllerError, InvalidState, NotFound, Unimplemented
from ..hostlink import HostdLink
from ..loadouts.service import LoadoutService
from ..models import LibvirtWarmPoolInitRequest
from ..operations import OperationService
from ..store import OperationRecord

log = logging.getLogger(__name__)

CAPABILITY = "warm_pool.manage"
#: Admin runtime of a loadout -> (hostd runtime, provider) of its pool's slots.
POOL_RUNTIMES = {"docker": ("container", "podman"), "qemu": ("vm", "libvirt")}


def _pool_key(pool: str) -> str:
    return f"warm_pool:{pool}"


class WarmPoolService:
    """See the module docstring. ``configured``: loadout name -> slots to keep ready."""

    def __init__(
        self, link: HostdLink, operations: OperationService, loadouts: LoadoutService, configured: Mapping[str, int]
    ) -> None:
        self.link = link
        self.operations = operations
        self.loadouts = loadouts
        self.configured = dict(configured)
        #: Whether the hostd of the last sync manages pools (claims are only sent then).
        self.supported = False
        #: The configured pools hostd accepted at the last sync.
        self.active: set[str] = set()

    def check_config(self) -> None:
        """Refuse to start with a pool of a loadout that does not exist or has no pools."""
        for name in self.configured:
            loadout = self.loadouts.get(name)
            if loadout is None:
                raise ConfigError(f"AIWG_WARM_POOLS names loadout {name!r}, which does not exist")
            if loadout.runtime not in POOL_RUNTIMES:
                raise ConfigError(
                    f"AIWG_WARM_POOLS: loadout {name!r} is for runtime {loadout.runtime!r}, which has no warm pools"
                )

    def template(self, loadout_name: str) -> m.PoolTemplate:
        loadout = self.loadouts.get(loadout_name)
        assert loadout is not None  # check_config
        runtime, provider = POOL_RUNTIMES[loadout.runtime]
        return m.PoolTemplate(
            runtime=runtime,
            provider=provider,
            image=loadout.image if runtime == "container" else None,
            command=loadout.service,
            loadout=loadout.name,
        )

    def pool_for(self, loadout: str | None) -> str | None:
        """The pool a cold provision of ``loadout`` may take a slot from (hostd accepted it)."""
        return loadout if loadout is not None and self.supported and loadout in self.active else None

    async def _supported(self) -> bool:
        providers = (await self.link.call(m.ProviderListRequest())).providers
        return any(CAPABILITY in p.capabilities for p in providers)

    async def require(self) -> None:
        """Unimplemented unless this hostd manages warm pools."""
        self.link.require_ready()
        if not await self._supported():
            raise Unimplemented("capability.unsupported", "hostd's runtimes do not offer warm pools")

    async def sync(self) -> None:
        """Tell hostd which template pools exist (an ``on_connected`` hook: never raises)."""
        try:
            self.supported = await self._supported()
            if not self.supported:
                if self.configured:
                    names = ", ".join(self.configured)
                    log.warning("warm pools configured, but hostd's runtimes offer none: %s", names)
                return
            active = set()
            for name, size in self.configured.items():
                try:
                    await self.link.call(m.PoolSetRequest(pool=name, template=self.template(name), size=size))
                    active.add(name)
                except ControllerError as exc:
                    log.error("warm pool %s: hostd refused it: %s", name, exc.message)
            self.active = active
            for pool in (await self.link.call(m.PoolListRequest())).pools:
                if pool.source == "template" and pool.pool not in self.configured:
                    log.info("warm pool %s is no longer configured: hostd removes its slots", pool.pool)
                    await self.link.call(m.PoolDeleteRequest(pool=pool.pool))
        except ControllerError as exc:
            log.warning("warm pools not synced with hostd: %s", exc.message)

    async def list(self) -> list[m.PoolInfo]:
        await self.require()
        pools: list[m.PoolInfo] = (await self.link.call(m.PoolListRequest())).pools
        return pools

    async def get(self, name: str) -> m.PoolInfo:
        for pool in await self.list():
            if pool.pool == name:
                return pool
        raise NotFound("warm_pool.not_found", f"no warm pool {name!r}")

    async def init_libvirt(self, req: LibvirtWarmPoolInitRequest) -> OperationRecord:
        """Upstream's ``POST /libvirt/warm-pools``: checkpoints become the slots of a new pool."""
        busy = self.operations.in_flight(_pool_key(req.pool))
        if busy is not None:
            raise InvalidState("instance.invalid_state", f"operation {busy} is making warm pool {req.pool!r}")
        await self.require()

        async def work(op: OperationRecord) -> dict[str, Any]:
            call = m.PoolFromCheckpointsRequest(pool=req.pool, checkpoint_ids=list(req.checkpoint_ids))
            pool: m.PoolInfo = (await self.link.call(call)).pool
            return {"pool": pool.pool, "slots": pool.ready, "checkpoint_ids": list(req.checkpoint_ids)}

        return await self.operations.submit("libvirt.warm_pool.init", work, keys=(_pool_key(req.pool),))
