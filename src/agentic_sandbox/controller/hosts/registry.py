"""This host among the hosts of a store: its heartbeat, and the view of the fleet routing reads.

:meth:`HostRegistry.run` (a service in the app's nursery) reports this controller's host and itself
to the store every ``AIWG_HOST_HEARTBEAT_S``, and at once when the hostd link (re)connects: hostd's
host and boot id, the machine's name, ``AIWG_HOST_LABELS``, the admin runtimes whose hostd provider
is available now, CPUs and memory (read here: the controller runs on its host) and
``AIWG_HOST_MAX_INSTANCES``; and its own row with ``url``, where peers reach it (set once the server
bound its port). Each round also reads back every host and the live controllers, which the router
asks synchronously (:meth:`peer_for`, :meth:`state_of`): a view at most one heartbeat old.

A host is ``available`` while some controller of it reported within ``AIWG_HOST_TIMEOUT_S``;
cordoned and draining are flags an operator sets beside that. :meth:`place` chooses a host for a
new instance from fresh reads (:mod:`controller.hosts.placement`).

A store from before hosts were recorded has unplaced instances: at its first report, when at most
this host is registered, this controller takes them as its host's (a single host upgrading).

Error handling: a report that fails (the store or hostd away) is logged once per outage and
tried again at the next beat; the view keeps what it last read (the hosts it knew do not vanish
from the router because the database blinked). Resource handling: :meth:`leave` at a clean stop
deletes the controller's row, so peers stop forwarding to it at once.
"""

from __future__ import annotations

import itertools
import logging
import os
import socket
import time
from collections.abc import Set

import msgspec
import psutil
import trio

from agentic_sandbox.proto import messages as m

from ..errors import ControllerError, Unavailable
from ..hostlink import HostdLink
from ..instances.catalog import CATALOG_RUNTIMES
from ..models import RUNTIME_ALIASES
from ..store import ControllerRecord, HostCapacity, HostFacts, HostRecord, Store, StoreClosed
from .placement import choose

log = logging.getLogger(__name__)

#: A controller not heard from for this long is forgotten (its row is shown meanwhile, not alive).
FORGET_SILENT_S = 24 * 3600.0


class HostRegistry:
    """See the module docstring."""

    def __init__(
        self,
        store: Store,
        link: HostdLink,
        *,
        controller_id: str,
        url: str | None,
        labels: dict[str, str],
        heartbeat_s: float,
        timeout_s: float,
        max_instances: int,
    ) -> None:
        self.store = store
        self.link = link
        self.controller_id = controller_id
        #: Where peers reach this controller; None until the server bound its port (:meth:`listening_at`):
        #: nothing is reported before (a peer could not reach it), placement counts this host meanwhile.
        self.url = url
        self.labels = dict(labels)
        self.heartbeat_s = heartbeat_s
        self.timeout_s = timeout_s
        self.max_instances = max_instances
        #: This host's row as the last report stored it (with what an operator set on it).
        self.own: HostRecord | None = None
        self._hosts: dict[str, HostRecord] = {}
        self._peers: dict[str, list[str]] = {}
        self._turns = itertools.count()
        self._placed_unplaced = False
        self._failing = False
        self._wake = trio.Event()

    @property
    def host_id(self) -> str | None:
        return self.link.host_id

    def listening_at(self, url: str) -> None:
        """The server bound its port: peers reach this controller at ``url``. Reported at once, so
        what an operator set on this host (drain, cordon) is known here within a store round trip."""
        self.url = url
        self._wake.set()

    @property
    def draining(self) -> bool:
        return self.own is not None and self.own.draining

    def require_open(self) -> None:
        """Refuse new work (a task, a session) on a draining host."""
        if self.draining:
            raise Unavailable(
                "host.draining",
                f"host {self.host_id} is draining: it takes no new work"
                f" (POST /api/v2/admin/hosts/{self.host_id}/undrain ends that)",
            )

    # -- the heartbeat ------------------------------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        self.link.on_connected.append(self._connected)
        task_status.started()
        while True:
            try:
                await self.report()
            except StoreClosed:
                return  # the app is shutting down
            except ControllerError as exc:
                if not self._failing:
                    log.warning("host heartbeat failed: %s (tried again every %.1f s)", exc.message, self.heartbeat_s)
                self._failing = True
            else:
                if self._failing:
                    log.info("host heartbeat works again")
                self._failing = False
            with trio.move_on_after(self.heartbeat_s):
                await self._wake.wait()
            self._wake = trio.Event()

    async def _connected(self) -> None:
        self._wake.set()  # a (new) hostd: report it now rather than at the next beat

    async def report(self) -> None:
        """One heartbeat: this host and controller into the store, every host and live controller out."""
        host_id = self.link.host_id
        if host_id is not None and self.link.ready and self.url is not None:
            facts = await self._facts(host_id)
            now = time.time()
            self.own = await self.store.hosts.heartbeat(facts, self.controller_id, self.url, now)
            if not self._placed_unplaced:
                await self._place_unplaced(host_id)
                # Once a start: controllers that stopped long ago (a crash leaves its row) go.
                await self.store.hosts.forget_silent(now - FORGET_SILENT_S)
        await self.refresh()

    async def _facts(self, host_id: str) -> HostFacts:
        providers = (await self.link.call(m.ProviderListRequest())).providers
        runtimes = sorted(
            {CATALOG_RUNTIMES[p.runtime] for p in providers if p.available and p.runtime in CATALOG_RUNTIMES}
        )
        memory = psutil.virtual_memory()
        return HostFacts(
            id=host_id,
            boot_id=self.link.boot_id or "",
            name=socket.gethostname(),
            labels=self.labels,
            runtimes=runtimes,
            capacity=HostCapacity(
                cpus=os.cpu_count() or 1,
                memory_bytes=memory.total,
                memory_available_bytes=memory.available,
                max_instances=self.max_instances,
            ),
        )

    async def _place_unplaced(self, host_id: str) -> None:
        hosts = await self.store.hosts.list()
        if all(h.id == host_id for h in hosts):
            placed = await self.store.instances.place_unplaced(host_id)
            if placed:
                log.info("%d instance(s) from before hosts were recorded are this host's (%s)", placed, host_id)
        self._placed_unplaced = True

    async def refresh(self) -> None:
        """Read every host and the live controllers into the view the router asks."""
        now = time.time()
        hosts = await self.store.hosts.list()
        alive = await self.store.hosts.controllers(alive_since=now - self.timeout_s)
        self._hosts = {h.id: h for h in hosts}
        peers: dict[str, list[str]] = {}
        for ctl in alive:
            if ctl.id != self.controller_id:
                peers.setdefault(ctl.host_id, []).append(ctl.url)
        self._peers = peers

    async def leave(self) -> None:
        """A clean stop: the others stop forwarding here at once (best effort)."""
        try:
            await self.store.hosts.forget_controller(self.controller_id)
        except (ControllerError, StoreClosed) as exc:
            log.info("could not remove this controller from the hosts table: %s", exc)

    # -- the view -----------------------------------------------------------------------------------

    def available(self, rec: HostRecord, now: float | None = None) -> bool:
        return rec.heard(now or time.time(), self.timeout_s)

    def state_of(self, host_id: str | None) -> str | None:
        """``available`` or ``unavailable`` as last seen; None for no host or one not seen yet."""
        if host_id is None:
            return None
        if host_id == self.host_id:
            return "available"  # this controller is its host's and serving: it is heard
        rec = self._hosts.get(host_id)
        if rec is None:
            return None
        return "available" if self.available(rec) else "unavailable"

    def hosts(self) -> list[HostRecord]:
        return list(self._hosts.values())

    @property
    def several(self) -> bool:
        """Whether the store holds other hosts than this one (as last read)."""
        return any(h != self.host_id for h in self._hosts)

    def peer_for(self, host_id: str, *, avoid: Set[str] = frozenset()) -> str | None:
        """A live controller of ``host_id`` (round robin), not this one and none in ``avoid``."""
        urls = [url for url in self._peers.get(host_id, ()) if url not in avoid]
        if not urls:
            return None
        return urls[next(self._turns) % len(urls)]

    def why_unreachable(self, host_id: str) -> str:
        rec = self._hosts.get(host_id)
        if rec is None:
            return f"host {host_id} is not known to this controller yet"
        ago = time.time() - rec.heartbeat_at
        if ago > self.timeout_s:
            return f"host {rec.name} ({host_id}) is unavailable: none of its controllers was heard from for {ago:.0f} s"
        return f"no controller of host {rec.name} ({host_id}) answers"

    async def controllers(self) -> list[ControllerRecord]:
        """Every controller's row (for the admin views)."""
        return await self.store.hosts.controllers()

    # -- placement ----------------------------------------------------------------------------------

    async def place(self, runtime: str, *, host: str | None = None, label: str | None = None) -> HostRecord:
        """The host a new instance of ``runtime`` goes to (see :mod:`.placement`), from fresh reads."""
        stored = RUNTIME_ALIASES.get(runtime, runtime)
        hosts = await self.store.hosts.list()
        counts = await self.store.hosts.instance_counts()
        own = self.host_id
        if own is not None and all(h.id != own for h in hosts) and self.link.ready:
            # Not registered yet (the first heartbeat is under way): this host counts with its live facts.
            facts = await self._facts(own)
            now = time.time()
            hosts.append(HostRecord(**msgspec.structs.asdict(facts), registered_at=now, heartbeat_at=now))
        if not hosts:
            raise Unavailable("placement.unavailable", "no host has registered yet (is hostd running?)")
        return choose(hosts, counts, runtime=stored, host=host, label=label, now=time.time(), timeout_s=self.timeout_s)
