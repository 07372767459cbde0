"""This controller among others on one shared store: what they write reaches it.

With PostgreSQL (``AIWG_DATABASE_URL``) any number of controllers serve one host's instances. Each
keeps in memory only what it can rebuild from the store, and learns what the others wrote through
the store's notifications (:mod:`controller.store.listener`), handed here:

* ``aiwg_tasks`` ``"<task> <seq>"``: :meth:`TaskService.news` wakes the task's waiters here (SSE
  streams, blocking sends, push workers) with the new events.
* ``aiwg_outbox`` ``"<task>"``: a control message was queued for the task's agent (a follow-up, an
  answer); where this controller follows the task it hands it over (:meth:`TaskService.outbox_news`).
* ``aiwg_events`` ``"<id>"``: the admin event stream catches up from the store
  (:meth:`EventBus.catch_up`), so an event id means the same at every controller.
* ``aiwg_tokens`` ``"<instance>"``: the instance's token digest is read again, so a token issued or
  revoked at one controller works or fails at all of them as soon as the change commits.

Notifications arrive on the event loop in bursts; they are coalesced here (the highest sequence per
task, the set of instances) and handled by one worker task, so a burst costs one store read per
task, never a task per notification. After every reconnect of the listener (when notifications may
have been missed) and every ``AIWG_NOTIFY_POLL_S``, each of them catches up from the store.

Resource handling: :meth:`Cluster.run` in the app's nursery (``nursery.start``); cancelling it
stops the listener and the worker.
"""

from __future__ import annotations

import logging

import trio

from .auth.credentials import InstanceCredentials
from .events.bus import EventBus
from .store.listener import Listener
from .tasks import TaskService

log = logging.getLogger(__name__)

TASKS, EVENTS, TOKENS, OUTBOX = "aiwg_tasks", "aiwg_events", "aiwg_tokens", "aiwg_outbox"


class Cluster:
    def __init__(
        self,
        url: str,
        *,
        tasks: TaskService,
        events: EventBus,
        credentials: InstanceCredentials,
        poll_s: float,
        connect_timeout_s: float,
    ) -> None:
        self.tasks = tasks
        self.events = events
        self.credentials = credentials
        self.listener = Listener(
            url,
            (TASKS, EVENTS, TOKENS, OUTBOX),
            on_news=self._news,
            on_resync=self._resync,
            on_poll=self._poll,
            poll_s=poll_s,
            connect_timeout_s=connect_timeout_s,
        )
        self._task_seqs: dict[str, int] = {}
        self._tokens: set[str] = set()
        self._outboxes: set[str] = set()
        #: The highest admin event id announced and not taken in yet (0: none).
        self._event_id = 0
        self._wake = trio.Event()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._work)
            await nursery.start(self.listener.run)
            task_status.started()

    def _news(self, channel: str, payload: str) -> None:
        if channel == TASKS:
            task_id, _, seq = payload.partition(" ")
            try:
                number = int(seq)
            except ValueError:
                return
            if number > self._task_seqs.get(task_id, 0):
                self._task_seqs[task_id] = number
        elif channel == EVENTS:
            try:
                self._event_id = max(self._event_id, int(payload))
            except ValueError:
                return
        elif channel == TOKENS:
            self._tokens.add(payload)
        elif channel == OUTBOX:
            self._outboxes.add(payload)
        self._wake.set()

    async def _work(self) -> None:
        while True:
            await self._wake.wait()
            self._wake = trio.Event()
            seqs, self._task_seqs = self._task_seqs, {}
            tokens, self._tokens = self._tokens, set()
            outboxes, self._outboxes = self._outboxes, set()
            event_id, self._event_id = self._event_id, 0
            try:
                if event_id:
                    await self.events.catch_up(event_id)  # nothing to read for its own events
                for instance_id in tokens:
                    await self.credentials.refresh(instance_id)
                for task_id, seq in seqs.items():
                    await self.tasks.news(task_id, seq)
                for task_id in outboxes:
                    await self.tasks.outbox_news(task_id)
            except Exception as exc:  # the store went away meanwhile: the next poll catches up
                log.warning("cluster: could not take in another controller's news (%s)", exc)

    async def _resync(self) -> None:
        await self.credentials.refresh_all()
        await self._poll()

    async def _poll(self) -> None:
        await self.events.catch_up()
        await self.tasks.poll()
