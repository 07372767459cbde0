"""Push delivery: each config's events POSTed in order, at least once, resumable after a crash.

One worker per config with something to deliver, in the service's nursery. The store is the
queue: a worker reads its task's events after the config's cursor (the hub's in-memory tail while
it keeps up, else the store), POSTs each status and artifact update as a StreamResponse over the
:class:`~controller.push.sender.Sender`'s kept-alive connections, and moves its cursor past an
event once a receiver answered 2xx or its retry budget is spent. The cursor is written to the
store (``delivered_seq``) in batches: when the worker has caught up and waits, and at least every
:data:`FLUSH_EVENTS` events; so a controller killed with SIGKILL resumes from the last written
cursor (:meth:`PushDelivery.recover`), and the events delivered since (at most that many, and the
one in flight) may arrive twice, which A2A receivers expect (at-least-once, dedupe on their side).

A worker holds its config in memory: deleting the config (:meth:`PushDelivery.stop`) cancels it,
and replacing it starts a new one. It waits for news on the task hub
(:mod:`controller.tasks.hub`) like any stream and ends once its task has ended and everything is
delivered. Retries back off exponentially (``push_backoff_s`` doubled per attempt, capped at
:data:`MAX_BACKOFF_S`, the upper half of each wait random) until ``push_retry_s`` has passed since
the first attempt. A config more than ``push_max_queue`` events behind skips the oldest (counted as
failures), so a dead receiver cannot make a busy task's backlog unbounded.
"""

from __future__ import annotations

import logging
import random
from typing import Any

import msgspec
import trio

from ..config import ControllerConfig
from ..errors import ValidationFailed
from ..store import PushConfigRecord, Store, TaskEvent
from ..store.tasks import TERMINAL
from ..tasks.hub import TaskHub
from ..tasks.prompts import activated, shown_event
from .metrics import PushMetrics
from .sender import DeliveryFailed, Sender
from .target import parse_url

log = logging.getLogger(__name__)

A2A_JSON = "application/a2a+json"
KIND_MEMBER = {"status": "statusUpdate", "artifact": "artifactUpdate"}
MAX_BACKOFF_S = 30.0
BATCH = 64
#: Events delivered between two cursor writes at most (while a backlog is being worked off).
FLUSH_EVENTS = 32

Key = tuple[str, str]


def headers_of(cfg: PushConfigRecord) -> list[tuple[str, str]]:
    headers = [("Content-Type", A2A_JSON)]
    if cfg.auth_scheme is not None:
        value = cfg.auth_scheme if not cfg.auth_credentials else f"{cfg.auth_scheme} {cfg.auth_credentials}"
        headers.append(("Authorization", value))
    if cfg.token:
        headers.append(("X-A2A-Notification-Token", cfg.token))  # what a2a-sdk receivers check
    return headers


def ends(event: TaskEvent) -> bool:
    return event.kind == "status" and event.body["status"]["state"] in TERMINAL


class PushDelivery:
    def __init__(self, store: Store, hub: TaskHub, config: ControllerConfig, metrics: PushMetrics) -> None:
        self.store = store
        self.hub = hub
        self.config = config
        self.metrics = metrics
        self.sender = Sender(allow_private=config.push_allow_private, timeout=config.push_timeout_s)
        self._nursery: trio.Nursery | None = None
        self._workers: dict[Key, trio.CancelScope] = {}

    def attach(self, nursery: trio.Nursery) -> None:
        self._nursery = nursery

    def start(self, cfg: PushConfigRecord) -> None:
        """A worker delivers ``cfg``'s events (one per config: a replaced config's worker is stopped)."""
        if self._nursery is None:
            return
        key = (cfg.task_id, cfg.id)
        self.stop(*key)
        scope = self._workers[key] = trio.CancelScope()
        self._nursery.start_soon(self._run, cfg, scope)

    def stop(self, task_id: str, config_id: str) -> None:
        """The config is gone: its worker (if any) stops, an attempt in flight included."""
        scope = self._workers.pop((task_id, config_id), None)
        if scope is not None:
            scope.cancel()

    async def recover(self) -> None:
        """Workers for every config with events left to deliver (after a restart)."""
        for cfg in await self.store.push.pending():
            self.start(cfg)

    def close(self) -> None:
        self.sender.close()

    async def _run(self, cfg: PushConfigRecord, scope: trio.CancelScope) -> None:
        worker: _Worker | None = None
        try:
            with scope:
                worker = _Worker(self, cfg)
                await worker.run()
        except Exception:
            log.exception("push config %s of task %s: delivery stopped", cfg.id, cfg.task_id)
        finally:
            if worker is not None:
                worker.gauge.dec(worker.depth)
            key = (cfg.task_id, cfg.id)
            if self._workers.get(key) is scope:
                del self._workers[key]

    async def deliver(self, target: _Target, body: bytes) -> bool:
        """POST ``body`` until a 2xx or the retry budget is spent; True if delivered."""
        cfg = target.cfg
        deadline = trio.current_time() + self.config.push_retry_s
        attempt = 0
        while True:
            try:
                # A new connection resolves and checks the URL again; the address checked is the one used.
                await self.sender.post(target.url, body, target.headers)
                target.delivered.inc()
                return True
            except (DeliveryFailed, ValidationFailed) as exc:
                reason = exc.message if isinstance(exc, ValidationFailed) else str(exc)
                log.info("push config %s of task %s: attempt %d failed: %s", cfg.id, cfg.task_id, attempt + 1, reason)
            wait = min(MAX_BACKOFF_S, self.config.push_backoff_s * 2**attempt)
            wait = wait / 2 + random.uniform(0, wait / 2)
            attempt += 1
            if trio.current_time() + wait > deadline:
                log.warning("push config %s of task %s: event dropped after %d attempts", cfg.id, cfg.task_id, attempt)
                target.failed.inc()
                return False
            await trio.sleep(wait)
            target.retried.inc()


class _Target:
    """What every delivery of one config needs, made once: its URL parsed, headers, metric series."""

    def __init__(self, cfg: PushConfigRecord, metrics: PushMetrics) -> None:
        self.cfg = cfg
        self.url = parse_url(cfg.url)  # checked when the config was made
        self.headers = headers_of(cfg)
        labels: dict[str, Any] = {"instance": cfg.instance_id}
        self.delivered = metrics.deliveries.labels(**labels)
        self.failed = metrics.failures.labels(**labels)
        self.retried = metrics.retries.labels(**labels)


class _Worker:
    """One config's delivery loop: its cursor, the part of it written, how far behind it is."""

    def __init__(self, owner: PushDelivery, cfg: PushConfigRecord) -> None:
        self.owner = owner
        self.cfg = cfg
        self.target = _Target(cfg, owner.metrics)
        self.cursor = self.saved = cfg.delivered_seq
        self.shows_prompts = activated(cfg.extensions)
        self.gauge = owner.metrics.queue_depth.labels(instance=cfg.instance_id)
        #: The newest event of the task known, and the gauge's share of this worker.
        self.latest = cfg.delivered_seq
        self.depth = 0
        self.ended = False

    async def run(self) -> None:
        store, task_id = self.owner.store, self.cfg.task_id
        with self.owner.hub.watch(task_id) as watch:
            if not await self._catch_up():
                return
            while True:
                changed = watch.changed()
                events = watch.tail_after(self.cursor)  # recent events from memory
                if events is None:
                    if not await self._catch_up():
                        return
                    events = await store.tasks.events_after(task_id, self.cursor, limit=BATCH)
                elif events:
                    await self._learn(events[-1].seq)
                    events = [event for event in events if event.seq > self.cursor]
                if not events:
                    await self._flush()
                    if self.ended:
                        return
                    await changed.wait()
                    continue
                for event in events:
                    member = KIND_MEMBER.get(event.kind)
                    if member is not None:
                        body = msgspec.json.encode({member: shown_event(event, self.shows_prompts)})
                        await self.owner.deliver(self.target, body)
                    self.cursor = event.seq
                    self.ended = self.ended or ends(event)
                    self._gauge()
                    if self.cursor - self.saved >= FLUSH_EVENTS:
                        await self._flush()

    async def _catch_up(self) -> bool:
        """Read the task row (at the start, or when the tail does not reach back to the cursor):
        whether it ended and how far it is. False if the task is gone."""
        task = await self.owner.store.tasks.get(self.cfg.task_id)
        if task is None:
            return False
        self.ended = task.terminal
        await self._learn(task.last_seq)
        return True

    async def _learn(self, last_seq: int) -> None:
        """The task has events up to ``last_seq``: past the queue bound, the oldest are skipped."""
        self.latest = max(self.latest, last_seq)
        limit = self.owner.config.push_max_queue
        if self.latest - self.cursor > limit:
            dropped = self.latest - limit - self.cursor
            log.warning(
                "push config %s of task %s: queue full, %d oldest events dropped",
                self.cfg.id,
                self.cfg.task_id,
                dropped,
            )
            self.target.failed.inc(dropped)
            self.cursor = self.latest - limit
            await self._flush()
        self._gauge()

    def _gauge(self) -> None:
        depth = max(0, self.latest - self.cursor)
        self.gauge.inc(depth - self.depth)
        self.depth = depth

    async def _flush(self) -> None:
        if self.cursor != self.saved:
            await self.owner.store.push.advance(self.cfg.task_id, self.cfg.id, self.cursor)
            self.saved = self.cursor
