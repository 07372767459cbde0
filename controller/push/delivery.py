"""Push delivery: each config's events POSTed in order, at least once, resumable after a crash.

One worker per config with something to deliver, in the service's nursery. The store is the
queue: a worker reads its task's events after the config's cursor (``delivered_seq``), POSTs each
status and artifact update as a StreamResponse, and moves the cursor past it once a receiver
answered 2xx or its retry budget is spent. Nothing is held in memory, so a controller killed with
SIGKILL resumes at the cursor (:meth:`PushDelivery.recover`); the event in flight then may arrive
twice, which A2A receivers expect (at-least-once, dedupe on their side).

A worker waits for news on the task hub (:mod:`controller.tasks.hub`) like any stream, and ends
when its config is deleted or its task has ended and everything is delivered. Retries back off
exponentially (``push_backoff_s`` doubled per attempt, capped at :data:`MAX_BACKOFF_S`, the
upper half of each wait random) until ``push_retry_s`` has passed since the first attempt. A
config more than ``push_max_queue`` events behind skips the oldest (counted as failures), so a
dead receiver cannot make a busy task's backlog unbounded.
"""

from __future__ import annotations

import logging
import random
from typing import Any

import msgspec
import trio

from ..config import ControllerConfig
from ..errors import ValidationFailed
from ..store import PushConfigRecord, Store
from ..tasks.hub import TaskHub
from ..tasks.prompts import activated, shown_event
from .metrics import PushMetrics
from .sender import DeliveryFailed, post
from .target import parse_url, resolve

log = logging.getLogger(__name__)

A2A_JSON = "application/a2a+json"
KIND_MEMBER = {"status": "statusUpdate", "artifact": "artifactUpdate"}
MAX_BACKOFF_S = 30.0
BATCH = 64


def headers_of(cfg: PushConfigRecord) -> list[tuple[str, str]]:
    headers = [("Content-Type", A2A_JSON)]
    if cfg.auth_scheme is not None:
        value = cfg.auth_scheme if not cfg.auth_credentials else f"{cfg.auth_scheme} {cfg.auth_credentials}"
        headers.append(("Authorization", value))
    if cfg.token:
        headers.append(("X-A2A-Notification-Token", cfg.token))  # what a2a-sdk receivers check
    return headers


class PushDelivery:
    def __init__(self, store: Store, hub: TaskHub, config: ControllerConfig, metrics: PushMetrics) -> None:
        self.store = store
        self.hub = hub
        self.config = config
        self.metrics = metrics
        self._nursery: trio.Nursery | None = None
        self._running: set[tuple[str, str]] = set()

    def attach(self, nursery: trio.Nursery) -> None:
        self._nursery = nursery

    def start(self, cfg: PushConfigRecord) -> None:
        """Make sure a worker delivers ``cfg``'s events (one per config)."""
        key = (cfg.task_id, cfg.id)
        if self._nursery is None or key in self._running:
            return
        self._running.add(key)
        self._nursery.start_soon(self._run, key, cfg.instance_id)

    async def recover(self) -> None:
        """Workers for every config with events left to deliver (after a restart)."""
        for cfg in await self.store.push.pending():
            self.start(cfg)

    async def _run(self, key: tuple[str, str], instance_id: str) -> None:
        task_id, config_id = key
        gauge = self.metrics.queue_depth.labels(instance=instance_id)
        depth = 0
        try:
            with self.hub.watch(task_id) as watch:
                while True:
                    changed = watch.changed()
                    cfg = await self.store.push.get(task_id, config_id)
                    task = await self.store.tasks.get(task_id)
                    if cfg is None or task is None:
                        return
                    backlog = max(0, task.last_seq - cfg.delivered_seq)
                    gauge.inc(backlog - depth)
                    depth = backlog
                    if backlog > self.config.push_max_queue:
                        await self._drop_oldest(cfg, task.last_seq - self.config.push_max_queue)
                        continue
                    events = watch.tail_after(cfg.delivered_seq)  # recent events from memory, else the store
                    if events is None:
                        events = await self.store.tasks.events_after(task_id, cfg.delivered_seq, limit=BATCH)
                    if not events:
                        if task.terminal:
                            return
                        await changed.wait()
                        continue
                    for event in events:
                        member = KIND_MEMBER.get(event.kind)
                        if member is not None:
                            body = msgspec.json.encode({member: shown_event(event, activated(cfg.extensions))})
                            delivered = await self._deliver(cfg, body)
                            if not delivered and await self.store.push.get(task_id, config_id) is None:
                                return  # deleted while we retried
                        await self.store.push.advance(task_id, config_id, event.seq)
                        depth -= 1
                        gauge.dec()
        except Exception:
            log.exception("push config %s of task %s: delivery stopped", config_id, task_id)
        finally:
            gauge.dec(depth)
            self._running.discard(key)

    async def _drop_oldest(self, cfg: PushConfigRecord, seq: int) -> None:
        dropped = seq - cfg.delivered_seq
        log.warning("push config %s of task %s: queue full, %d oldest events dropped", cfg.id, cfg.task_id, dropped)
        self.metrics.failures.labels(instance=cfg.instance_id).inc(dropped)
        await self.store.push.advance(cfg.task_id, cfg.id, seq)

    async def _deliver(self, cfg: PushConfigRecord, body: bytes) -> bool:
        """POST ``body`` until a 2xx or the retry budget is spent; True if delivered."""
        labels: dict[str, Any] = {"instance": cfg.instance_id}
        deadline = trio.current_time() + self.config.push_retry_s
        headers = headers_of(cfg)
        attempt = 0
        while True:
            try:
                # Resolved (and checked) again at each attempt; the address checked is the one used.
                target = await resolve(parse_url(cfg.url), allow_private=self.config.push_allow_private)
                await post(target, body, headers, timeout=self.config.push_timeout_s)
                self.metrics.deliveries.labels(**labels).inc()
                return True
            except (DeliveryFailed, ValidationFailed) as exc:
                reason = exc.message if isinstance(exc, ValidationFailed) else str(exc)
                log.info("push config %s of task %s: attempt %d failed: %s", cfg.id, cfg.task_id, attempt + 1, reason)
            wait = min(MAX_BACKOFF_S, self.config.push_backoff_s * 2**attempt)
            wait = wait / 2 + random.uniform(0, wait / 2)
            attempt += 1
            if trio.current_time() + wait > deadline:
                log.warning("push config %s of task %s: event dropped after %d attempts", cfg.id, cfg.task_id, attempt)
                self.metrics.failures.labels(**labels).inc()
                return False
            await trio.sleep(wait)
            if await self.store.push.get(cfg.task_id, cfg.id) is None:
                return False
            self.metrics.retries.labels(**labels).inc()
