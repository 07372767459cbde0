"""Push delivery: each config's events POSTed in order, at least once, resumable after a crash,
by one controller at a time.

One worker per config being delivered here, in the service's nursery. The store is the queue: a
worker reads its task's events after the config's cursor (the hub's in-memory tail while it keeps
up, else the store), POSTs each status and artifact update as a StreamResponse over the
:class:`~controller.push.sender.Sender`'s kept-alive connections, and moves its cursor past an
event once a receiver answered 2xx or its retry budget is spent. The cursor is written to the
store (``delivered_seq``) in batches: when the worker has caught up and waits, and at least every
:data:`FLUSH_EVENTS` events; so a controller killed with SIGKILL is resumed from the last written
cursor, and the events delivered since (fewer than that many, and the one in flight) may arrive
twice, which A2A receivers expect (at-least-once, dedupe on their side).

Ownership (:mod:`controller.store.push`): a worker first claims its config in the store
(``owner`` is this controller's id, the same as its task claims, so the controller's one lease
loop renews them all: :mod:`controller.store.leases`), then reads the config and its cursor afresh.
On the embedded store there is one controller: the claim is always taken, and
:meth:`PushDelivery.recover` starts a worker for every config with something to deliver. On a
shared store several controllers sweep (:meth:`PushDelivery.run_sweeps`, every quarter of the
lease TTL) for configs whose claim ran out with something left to deliver (their controller died
or stopped renewing) and start a worker for each; the one whose claim wins delivers, from the
stored cursor, so a SIGKILLed controller's configs are resumed within about a lease TTL. Before
each POST attempt a worker checks that the config is still its own (a keyed read; a claim about to
run out is extended then), and its cursor writes are fenced the same way: a config deleted,
replaced or taken over elsewhere stops the worker (:class:`ClaimLost`) before it POSTs anything
more, except an attempt already in flight. A worker that finished (its task ended, everything
delivered) gives its claim up. A store that cannot be reached makes the worker start over from the
stored cursor once it answers (claiming again first); an unexpected error stops it, logged, its
claim kept (so the config is not retried in a loop) until this controller stops.

Deleting a config here (:meth:`PushDelivery.stop`) cancels its worker at once, an attempt in
flight included; replacing it starts a new one. A worker waits for news on the task hub
(:mod:`controller.tasks.hub`) like any stream: on a shared store another controller's events reach
the hub through :meth:`TaskService.news` for every task watched here, which the worker's watch
makes its task. It ends once its task has ended and everything is delivered. Retries back off
exponentially (``push_backoff_s`` doubled per attempt, capped at :data:`MAX_BACKOFF_S`, the upper
half of each wait random) until ``push_retry_s`` has passed since the first attempt. A config more
than ``push_max_queue`` events behind skips the oldest (counted as failures), so a dead receiver
cannot make a busy task's backlog unbounded.
"""

from __future__ import annotations

import logging
import random
import time
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec
import trio

from agentic_sandbox.proto import new_id

from ..config import ControllerConfig
from ..errors import ValidationFailed
from ..store import PushConfigRecord, Store, StoreClosed, StoreUnavailable, TaskEvent
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
#: The first pause before a worker whose store failed tries again (doubled up to the lease TTL).
STORE_RETRY_S = 0.1

Key = tuple[str, str]
Guard = Callable[[], Awaitable[None]]


class ClaimLost(Exception):
    """The config is no longer this controller's (deleted, replaced, or taken over by another
    controller after its claim ran out): its worker delivers nothing more."""


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
    """The workers of this controller (see the module docstring). ``owner``: this controller's
    id, the one its lease loop renews claims in (a fresh id if None: claims nobody renews, which
    only a worker busy delivering keeps up); ``lease_ttl_s``: how long a claim lasts unrenewed."""

    def __init__(
        self,
        store: Store,
        hub: TaskHub,
        config: ControllerConfig,
        metrics: PushMetrics,
        *,
        owner: str | None = None,
        lease_ttl_s: float = 2.0,
    ) -> None:
        self.store = store
        self.hub = hub
        self.config = config
        self.metrics = metrics
        self.owner = owner or new_id()
        self.lease_ttl_s = lease_ttl_s
        self.sender = Sender(allow_private=config.push_allow_private, timeout=config.push_timeout_s)
        self._nursery: trio.Nursery | None = None
        self._workers: dict[Key, trio.CancelScope] = {}
        #: The workers delivering now (claimed, config read), by config.
        self._running: dict[Key, _Worker] = {}

    def attach(self, nursery: trio.Nursery) -> None:
        self._nursery = nursery

    def start(self, cfg: PushConfigRecord) -> None:
        """A worker delivers ``cfg``'s events once it has claimed it (one per config here: a
        replaced config's worker is stopped)."""
        if self._nursery is None:
            return
        key = (cfg.task_id, cfg.id)
        self.stop(*key)
        scope = self._workers[key] = trio.CancelScope()
        self._nursery.start_soon(self._run, key, scope)

    def stop(self, task_id: str, config_id: str) -> None:
        """The config is gone: its worker (if any) stops, an attempt in flight included."""
        scope = self._workers.pop((task_id, config_id), None)
        if scope is not None:
            scope.cancel()

    def delivering(self) -> list[Key]:
        """The configs (task id, config id) with a worker here now."""
        return list(self._workers)

    def behind(self) -> set[str]:
        """The instances with events still to push from here (they stay awake: docs/sleep.md)."""
        return {w.cfg.instance_id for w in self._running.values() if w.depth > 0}

    async def recover(self) -> None:
        """At start: on the embedded store a worker for every config with events left to
        deliver; on a shared store those of them whose claim ran out (a sweep, as
        :meth:`run_sweeps` goes on doing)."""
        if self.store.shared:
            await self.sweep()
            return
        for cfg in await self.store.push.pending():
            self.start(cfg)

    async def run_sweeps(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """On a shared store: :meth:`sweep` every quarter of the lease TTL, forever (the embedded
        store has one controller, whose :meth:`recover` took everything: this returns at once).
        Needs :meth:`attach` first: the workers run in that nursery, not this task's."""
        task_status.started()
        if not self.store.shared:
            return
        interval = self.lease_ttl_s / 4
        while True:
            try:
                await self.sweep()
            except StoreUnavailable as exc:
                log.warning("push sweep: %s (tried again in %.2f s)", exc.message, interval)
            except StoreClosed:
                return
            await trio.sleep(interval)

    async def sweep(self) -> None:
        """A worker for each config whose claim ran out with something left to deliver, unless
        one runs here already; each claims its config first, so of the controllers sweeping at
        once exactly one delivers it (the others' workers end at once)."""
        for cfg in await self.store.push.orphans(time.time()):
            if (cfg.task_id, cfg.id) not in self._workers:
                self.start(cfg)

    def close(self) -> None:
        self.sender.close()

    async def _run(self, key: Key, scope: trio.CancelScope) -> None:
        pause = STORE_RETRY_S
        try:
            with scope:
                while not await self._work(key):
                    await trio.sleep(pause)
                    pause = min(pause * 2, self.lease_ttl_s)
        finally:
            if self._workers.get(key) is scope:
                del self._workers[key]

    async def _work(self, key: Key) -> bool:
        """Claim the config and deliver it until done; False if the store failed (try again)."""
        task_id, config_id = key
        worker: _Worker | None = None
        try:
            now = time.time()
            # The embedded store has one controller: a claim its dead predecessor left is its own.
            steal = not self.store.shared
            if not await self.store.push.claim(
                task_id, config_id, self.owner, now + self.lease_ttl_s, now, steal=steal
            ):
                return True  # another controller delivers it
            # Read once claimed: the cursor as its last owner left it (that one writes no more).
            cfg = await self.store.push.get(task_id, config_id)
            if cfg is None:
                return True
            worker = self._running[key] = _Worker(self, cfg)
            await worker.run()
            await self.store.push.release(task_id, config_id, self.owner)
            return True
        except ClaimLost:
            log.info("push config %s of task %s: no longer this controller's; delivered elsewhere", config_id, task_id)
            return True
        except StoreUnavailable as exc:
            log.warning(
                "push config %s of task %s: %s; resumed once the store is back", config_id, task_id, exc.message
            )
            return False
        except StoreClosed:
            return True
        except Exception:
            log.exception("push config %s of task %s: delivery stopped", config_id, task_id)
            return True
        finally:
            if worker is not None:
                worker.gauge.dec(worker.depth)
                if self._running.get(key) is worker:
                    del self._running[key]

    async def deliver(self, target: _Target, body: bytes, guard: Guard) -> bool:
        """POST ``body`` until a 2xx or the retry budget is spent; True if delivered. ``guard``
        runs before each attempt (:class:`ClaimLost` stops it)."""
        cfg = target.cfg
        deadline = trio.current_time() + self.config.push_retry_s
        attempt = 0
        while True:
            await guard()
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

    def __init__(self, delivery: PushDelivery, cfg: PushConfigRecord) -> None:
        self.delivery = delivery
        self.cfg = cfg
        self.target = _Target(cfg, delivery.metrics)
        self.cursor = self.saved = cfg.delivered_seq
        self.shows_prompts = activated(cfg.extensions)
        self.gauge = delivery.metrics.queue_depth.labels(instance=cfg.instance_id)
        #: The newest event of the task known, and the gauge's share of this worker.
        self.latest = cfg.delivered_seq
        self.depth = 0
        self.ended = False

    async def run(self) -> None:
        store, task_id = self.delivery.store, self.cfg.task_id
        with self.delivery.hub.watch(task_id) as watch:
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
                        await self.delivery.deliver(self.target, body, self._guard)
                    self.cursor = event.seq
                    self.ended = self.ended or ends(event)
                    self._gauge()
                    if self.cursor - self.saved >= FLUSH_EVENTS:
                        await self._flush()

    async def _catch_up(self) -> bool:
        """Read the task row (at the start, or when the tail does not reach back to the cursor):
        whether it ended and how far it is. False if the task is gone."""
        task = await self.delivery.store.tasks.get(self.cfg.task_id)
        if task is None:
            return False
        self.ended = task.terminal
        await self._learn(task.last_seq)
        return True

    async def _learn(self, last_seq: int) -> None:
        """The task has events up to ``last_seq``: past the queue bound, the oldest are skipped."""
        self.latest = max(self.latest, last_seq)
        limit = self.delivery.config.push_max_queue
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

    async def _guard(self) -> None:
        """Before a POST on a shared store: the config must still be this controller's, its claim
        good for half a lease TTL at least (extended if not; the controller's renewals fell behind)."""
        delivery = self.delivery
        if not delivery.store.shared:
            return  # one controller: a config deleted or replaced here stopped this worker already
        now, ttl = time.time(), delivery.lease_ttl_s
        cfg = self.cfg
        held = await delivery.store.push.hold(
            cfg.task_id, cfg.id, owner=delivery.owner, created_at=cfg.created_at, need=now + ttl / 2, until=now + ttl
        )
        if not held:
            raise ClaimLost

    async def _flush(self) -> None:
        if self.cursor != self.saved:
            cfg = self.cfg
            owner = self.delivery.owner
            if not await self.delivery.store.push.advance(
                cfg.task_id, cfg.id, self.cursor, owner=owner, created_at=cfg.created_at
            ):
                raise ClaimLost
            self.saved = self.cursor
