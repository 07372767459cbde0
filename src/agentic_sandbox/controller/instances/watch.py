"""Watching hostd for what happens without the controller: instance exits, sessions coming and going.

hostd has no push channel for these, so :meth:`HostdWatch.run` polls every ``interval_s``
(``AIWG_WATCH_INTERVAL_S``) while the link is up: it reconciles the instance catalog with hostd
(:meth:`InstanceService.reconcile`, which publishes ``instance.state_changed`` with cause
``reconcile`` for a main process that exited, an instance ``agentic-hostctl`` stopped, ...) and
lists hostd's sessions, publishing ``session.created`` for each one it has not seen and
``session.exited`` once for each that ended. The first listing after a (re)connect is the
baseline: sessions already there are not announced again (the controller may just have
restarted), except that one seen running before and exited now is. A session created and ended
between two polls is announced both ways. Memory is one small entry per session hostd holds.

Several controllers (a shared store): every controller reconciles (the catalog row is updated, and
its change published, once: by whoever finds it changed first), but hostd's sessions are announced
by one of them, the holder of the ``hostd-watch`` claim (:class:`controller.store.LeaseTable`); the
others keep their listing current, so whoever takes over when it dies announces only what is new.

Resource handling: a service in the app's nursery, started with ``nursery.start``; it ends only
when cancelled (or once the store is closed at shutdown). Error handling: a failed poll (hostd
away, a timeout) is logged at debug and the next poll tries again; nothing is published from a
listing that failed.
"""

from __future__ import annotations

import logging
import time

import trio

from agentic_sandbox.proto import messages as m

from ..errors import ControllerError
from ..events.bus import EventBus
from ..hostlink import HostdLink
from ..store import Store, StoreClosed
from .service import InstanceService

log = logging.getLogger(__name__)


class HostdWatch:
    def __init__(
        self,
        link: HostdLink,
        instances: InstanceService,
        events: EventBus,
        *,
        interval_s: float,
        store: Store | None = None,
        owner: str = "",
        lease_ttl_s: float = 2.0,
    ) -> None:
        self.store = store
        self.owner = owner
        self.lease_ttl_s = lease_ttl_s
        self.link = link
        self.instances = instances
        self.events = events
        self.interval_s = interval_s
        #: session id -> "running" | "exited", as last seen; None until a baseline was taken.
        self._sessions: dict[str, str] | None = None
        self._connects_seen = -1
        self.polls = 0

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        while True:
            await trio.sleep(self.interval_s)
            if not self.link.ready:
                continue
            try:
                await self.poll()
            except ControllerError as exc:
                log.debug("hostd watch poll failed: %s", exc)
            except StoreClosed:
                return  # the app is shutting down

    async def poll(self) -> None:
        """One round: reconcile the catalog, then diff hostd's sessions against the last listing."""
        if self.link.connects != self._connects_seen:
            # A new connection may be a new hostd: what the old one held says nothing now.
            self._connects_seen = self.link.connects
            self._sessions = None
        await self.instances.reconcile()
        sessions = (await self.link.call(m.SessionListRequest())).sessions
        self._diff(sessions, announce=await self._announces())
        self.polls += 1

    async def _announces(self) -> bool:
        """Whether this controller announces sessions (always, unless the store is shared)."""
        if self.store is None or not self.store.shared:
            return True
        now = time.time()
        until = now + max(self.lease_ttl_s, 2 * self.interval_s)
        return await self.store.leases.acquire("hostd-watch", self.owner, until, now)

    def _diff(self, sessions: list[m.SessionInfo], *, announce: bool = True) -> None:
        seen = self._sessions
        current: dict[str, str] = {s.session_id: s.state for s in sessions}
        if seen is not None and announce:
            for info in sessions:
                before = seen.get(info.session_id)
                if before is None:
                    self.events.session_created(info.session_id, instance_id=info.instance_id)
                if info.state == "exited" and before != "exited":
                    self.events.session_exited(
                        info.session_id,
                        instance_id=info.instance_id,
                        exit_code=info.exit_code,
                        signal=info.signal,
                        end_reason=info.end_reason,
                    )
        self._sessions = current
