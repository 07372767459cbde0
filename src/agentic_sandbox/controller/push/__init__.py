"""A2A push notifications: configs of a task's webhooks, and delivery of its events to them.

Modules: ``target`` (a webhook URL parsed, resolved once and checked against private addresses),
``sender`` (POSTs over kept-alive connections, each pinned to the address checked), ``configs``
(the configs' operations), ``delivery`` (the durable, ordered, retrying workers), ``metrics``.
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
    def __init__(self, store: Store, hub: TaskHub, config: ControllerConfig, registry: CollectorRegistry) -> None:
        self.configs = PushConfigs(store, allow_private=config.push_allow_private)
        self.delivery = PushDelivery(store, hub, config, PushMetrics(registry))

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
