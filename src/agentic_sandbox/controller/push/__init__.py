"""A2A push notifications: configs of a task's webhooks, and delivery of its events to them.

Modules: ``target`` (a webhook URL parsed, resolved once and checked against private addresses),
``sender`` (POSTs over kept-alive connections, each pinned to the address checked), ``configs``
(the configs' operations), ``delivery`` (the durable, ordered, retrying workers, one controller
per config on a shared store), ``metrics``.
:class:`PushService` holds them together.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry

from ..config import ControllerConfig
from ..store import PushConfigRecord, Store
from ..tasks.hub import TaskHub
from .configs import ListParams, PushConfigIn, PushConfigs
from .delivery import PushDelivery
from .metrics import PushMetrics


class PushService:
    """``owner`` and ``lease_ttl_s`` are the controller's id and lease TTL, as its task service
    has them (see :class:`~controller.push.delivery.PushDelivery`). Resource handling: the owner
    of the app's nursery calls ``delivery.attach(nursery)``, then ``await delivery.recover()``,
    then ``nursery.start(delivery.run_sweeps)``; ``delivery.close()`` once it stopped."""

    def __init__(
        self,
        store: Store,
        hub: TaskHub,
        config: ControllerConfig,
        registry: CollectorRegistry,
        *,
        owner: str | None = None,
        lease_ttl_s: float = 2.0,
    ) -> None:
        self.configs = PushConfigs(store, allow_private=config.push_allow_private)
        self.delivery = PushDelivery(store, hub, config, PushMetrics(registry), owner=owner, lease_ttl_s=lease_ttl_s)

    async def create(
        self, instance_id: str, task_id: str, cfg: PushConfigIn, *, from_seq: int, extensions: list[str]
    ) -> PushConfigRecord:
        rec = await self.configs.create(instance_id, task_id, cfg, from_seq=from_seq, extensions=extensions)
        self.delivery.start(rec)
        return rec

    async def delete(self, task_id: str, config_id: str) -> None:
        """Idempotent (spec §4); a delivery in flight for it stops."""
        await self.configs.delete(task_id, config_id)
        self.delivery.stop(task_id, config_id)


__all__ = ["ListParams", "PushConfigIn", "PushService"]
