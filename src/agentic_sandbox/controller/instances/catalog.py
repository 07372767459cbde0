"""The instance catalog's rows and the few rules everything that changes them follows.

:class:`Catalog` holds what those rules need (the store, the hostd link, operations, loadouts,
events): a row is stored before its change is announced (:meth:`Catalog.save`), an operation in
flight on an instance holds its key, hostd's view of an instance is asked for one way. It is
built once and handed to the two objects that change rows: the
:class:`~agentic_sandbox.controller.instances.provisioning.Provisioner` (making instances: cold,
from a warm pool, by fork or restore) and the
:class:`~agentic_sandbox.controller.instances.service.InstanceService` (reconciliation, reads,
lifecycle, decommission), which holds the provisioner too.

Each admin runtime maps onto one hostd runtime and provider (:data:`HOSTD_RUNTIMES`).
"""

from __future__ import annotations

import builtins
import logging
import time

import msgspec
import trio

from agentic_sandbox.proto import current_log_ids
from agentic_sandbox.proto import messages as m

from ..errors import NotFound, ValidationFailed
from ..events.bus import EventBus
from ..hostlink import HostdLink
from ..loadouts.service import LoadoutService
from ..metrics import Metrics
from ..operations import OperationService
from ..store import InstanceRecord, Store

log = logging.getLogger(__name__)

#: Admin runtime -> (hostd runtime, hostd provider), for the runtimes hostd has providers of.
HOSTD_RUNTIMES = {"host": ("host", "hostd"), "docker": ("container", "podman"), "qemu": ("vm", "libvirt")}
#: hostd runtime -> admin runtime (instances hostd holds that the catalog lacks are adopted as).
CATALOG_RUNTIMES = {hostd: admin for admin, (hostd, _provider) in HOSTD_RUNTIMES.items()}
#: Deadline of a lifecycle call to hostd per runtime (None: the link's). Making a container can
#: take long (a large image on vfs storage), so can a VM's ACPI stop; hostd bounds its own podman
#: and libvirt calls below this.
LIFECYCLE_TIMEOUT_S: dict[str, float | None] = {"host": None, "docker": 150.0, "qemu": 150.0}


def instance_key(instance_id: str) -> str:
    return f"instance:{instance_id}"


def name_key(name: str) -> str:
    return f"name:{name}"


def not_found(instance_id: str) -> NotFound:
    return NotFound("instance.not_found", f"no instance with id {instance_id!r}")


def provider_facts(info: m.InstanceInfo) -> tuple[builtins.list[str], str | None]:
    """What the catalog keeps of hostd's provider detail: capabilities, and the image as resolved."""
    detail = info.container or info.vm
    return list(info.capabilities), detail.image_ref if detail is not None else None


SleepFacts = tuple[dict[str, object] | None, dict[str, object] | None, int, int]


def sleep_facts(info: m.InstanceInfo) -> SleepFacts:
    """What the catalog keeps of hostd's word on sleep: how it sleeps now, its idle policy, and the
    counts of its sleeps and wakes (whose changes are announced)."""
    sleep = msgspec.to_builtins(info.sleep) if info.sleep is not None else None
    idle = msgspec.to_builtins(info.idle) if info.idle is not None else None
    return sleep, idle, info.sleeps, info.wakes


def set_sleep_facts(rec: InstanceRecord, facts: SleepFacts) -> None:
    rec.sleep, rec.idle, rec.sleeps, rec.wakes = facts


class Catalog:
    """See the module docstring."""

    def __init__(
        self,
        store: Store,
        link: HostdLink,
        operations: OperationService,
        *,
        loadouts: LoadoutService,
        events: EventBus,
        metrics: Metrics | None = None,
    ) -> None:
        self.store = store
        self.link = link
        self.operations = operations
        self.loadouts = loadouts
        self.events = events
        self.metrics = metrics

    def ours(self, rec: InstanceRecord) -> bool:
        """Whether the instance runs on this controller's host (an unplaced row may: its hostd says)."""
        return rec.host_id is None or rec.host_id == self.link.host_id

    def require_ours(self, rec: InstanceRecord) -> None:
        """Conflict ``instance.other_host`` for another host's instance (see HostdLink.require_host)."""
        self.link.require_host(rec.id, rec.host_id)

    def busy(self, instance_id: str) -> str | None:
        return self.operations.in_flight(instance_key(instance_id))

    async def save(self, rec: InstanceRecord, before: str | None) -> None:
        """Store the row, then say on the event bus if its state changed (after the store, so an
        event never names a state a GET could not show). The cause is the operation whose work
        this is, else reconciliation with hostd (an exit hostd saw, a restart, an adoption).

        A change reconciliation found is written only if the row still holds the state it was read
        with: another controller folding the same change first has announced it already."""
        reconciling = before != rec.state and current_log_ids().get("operation_id") is None
        if not await self.store.instances.update(rec, expect_state=before if reconciling else None):
            return
        self.announce(rec, before)

    async def save_slept(self, rec: InstanceRecord, before: str, counts: tuple[int, int], info: m.InstanceInfo) -> None:
        """:meth:`save` for a fold whose sleeps or wakes hostd counted more of than the row holds
        (``counts``): written only if the row still holds those counts (another controller that
        folded them first announced them), then ``instance.slept`` / ``instance.woke`` announced
        and counted, in the order they happened."""
        reconciling = before != rec.state
        expect_state = before if reconciling else None
        if not await self.store.instances.update(rec, expect_state=expect_state, expect_counts=counts):
            return
        slept, woke = rec.sleeps - counts[0], rec.wakes - counts[1]
        how = info.sleep.how if info.sleep is not None else info.last_wake.how if info.last_wake else None
        cause = info.sleep.cause if info.sleep is not None else None
        # Asleep now: it woke (if it did) before its last sleep; awake: after it.
        announce_woke_first = rec.state == "sleeping"
        if woke > 0 and announce_woke_first:
            self._announce_woke(rec, woke, info)
        if slept > 0:
            self.events.instance_slept(rec.id, how=how, cause=cause)
            if self.metrics is not None:
                self.metrics.count_sleeps(rec.runtime, how, slept)
        if woke > 0 and not announce_woke_first:
            self._announce_woke(rec, woke, info)
        self.announce(rec, before)

    def _announce_woke(self, rec: InstanceRecord, woke: int, info: m.InstanceInfo) -> None:
        if info.last_wake is not None:
            self.events.instance_woke(rec.id, wake=info.last_wake, slept_s=round(info.asleep_s, 3))
        if self.metrics is not None:
            self.metrics.count_wakes(rec.runtime, info.last_wake, woke)

    def announce(self, rec: InstanceRecord, before: str | None) -> None:
        if before == rec.state:
            return
        op_id = current_log_ids().get("operation_id")
        self.events.instance_state_changed(
            rec.id,
            before=before,
            after=rec.state,
            cause="operation" if op_id else "reconcile",
            operation_id=op_id,
            note=rec.note,
        )

    def take_facts(self, rec: InstanceRecord, info: m.InstanceInfo) -> None:
        """hostd's word on the instance, into its row (state, note, working dir, provider facts)."""
        rec.state, rec.note, rec.working_dir = info.state, info.note, info.working_dir
        rec.capabilities, rec.image_ref = provider_facts(info)
        set_sleep_facts(rec, sleep_facts(info))
        rec.updated_at = time.time()

    async def hostd_get(self, instance_id: str) -> m.InstanceInfo | None:
        """hostd's view of one instance; None if hostd does not know it (or the id cannot be one)."""
        try:
            return (await self.link.call(m.InstanceGetRequest(instance_id=instance_id))).instance
        except (NotFound, ValidationFailed):
            return None

    def loadout_service(self, name: str) -> builtins.list[str] | None:
        """Refuse an unknown loadout up front; return its ``service`` (the instance's main
        process), if it has one. Its ``command`` is what tasks run, one exec per A2A task, so
        it is not handed to hostd here."""
        loadout = self.loadouts.get(name)
        if loadout is None:
            raise ValidationFailed([{"field": "loadout", "message": f"unknown loadout {name!r}", "code": "not_found"}])
        return loadout.service

    async def record(self, instance_id: str) -> InstanceRecord:
        """The catalog's row, without asking hostd; NotFound if the catalog has none."""
        rec = await self.store.instances.get(instance_id)
        if rec is None:
            raise not_found(instance_id)
        return rec

    async def set_state(self, rec: InstanceRecord, state: str, note: str | None = None) -> None:
        before = rec.state
        rec.state, rec.note, rec.updated_at = state, note, time.time()
        await self.save(rec, before)

    async def restore_state(self, rec: InstanceRecord) -> None:
        """After a failed verb, show hostd's state again instead of the transient one."""
        try:
            with trio.move_on_after(self.link.call_timeout_s):
                info = await self.hostd_get(rec.id)
                await self.set_state(rec, info.state if info else "failed", info.note if info else rec.note)
        except Exception as exc:  # best effort; the next reconcile fixes the row
            log.info("could not re-read instance %s after a failed verb: %s", rec.id, exc)
