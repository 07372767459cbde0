"""The instance catalog and its lifecycle, with hostd as the source of truth for what runs.

The catalog (SQLite) remembers what the admin API made: id, name, runtime, loadout, labels,
creation time. hostd knows what runs. :meth:`InstanceService.reconcile` folds hostd's view into the
catalog on every (re)connect and on every GET: a catalog row takes hostd's state (the two state sets
match name for name); a row hostd does not know is ``failed`` (unless it is destroyed or an
operation is working on it); an instance hostd holds that the catalog lacks (made by
``agentic-hostctl``, or a lost database) is adopted. A row with an operation in flight keeps the
transient state that operation set (``starting``, ``stopping``, ``destroying``).

Several hosts on one store (docs/hosts.md): each row names its host, and a controller folds only
its own host's rows (and unplaced ones its hostd knows) with its hostd; another host's row is read
as stored and never acted on here (Conflict ``instance.other_host``: the router sends requests
about it to its host).

Provisioning (:mod:`controller.instances.provisioning`) and lifecycle verbs are operations
(:mod:`controller.operations`); this module checks what can be checked before the operation is
accepted (NotFound, InvalidState, Unimplemented, hostd reachable) and gives the operation its work
function. Each admin runtime maps onto one hostd runtime and provider
(:data:`controller.instances.catalog.HOSTD_RUNTIMES`: ``host`` → host/hostd, ``docker`` (also accepted
as ``container``) → container/podman, ``qemu`` → vm/libvirt). Nothing falls back to another
runtime: a provider hostd cannot use now (podman or libvirt down) fails the operation with hostd's
reason. A row also keeps hostd's provider facts of its instance (capabilities, the image as
resolved), folded in like its state: the AgentCard and every Task's ``runtime.*`` read them there.

Events: every change of a row's state is published on the event bus once it is stored
(``instance.state_changed``, with cause ``operation`` inside an operation's work, else
``reconcile``), and so is a row forgotten (``instance.removed``). Reconciles fold under one lock
and re-read the rows, so two at once (the hostd watch, a GET) cannot announce one change twice.

Reprovision (an operation, ``instance.reprovision``) destroys the instance on hostd and provisions
it again under the same id, with the given or current loadout; the controller's storage for the
id is not touched.

Decommission destroys the instance on hostd and forgets it. Without ``force`` it refuses an
instance that is running (InvalidState); with ``force`` it kills the tree at once (grace 0). It
never forgets an instance whose hostd side it could not check (Unavailable instead).

Errors: only :mod:`controller.errors` (hostd failures arrive translated by the link).
"""

from __future__ import annotations

import builtins
import logging
import time
from collections.abc import Sequence
from typing import Any

import trio

from agentic_sandbox.proto import messages as m

from ..auth.credentials import InstanceCredentials
from ..errors import Conflict, ControllerError, InvalidState, NotFound, OperationFailed, Unimplemented, ValidationFailed
from ..events.bus import EventBus
from ..hostlink import HostdLink
from ..loadouts.service import LoadoutService
from ..metrics import Metrics
from ..models import INSTANCE_STATES, RUNTIME_ALIASES, RUNTIMES, ProvisionRequest, Runtime
from ..operations import OperationService
from ..store import InstanceRecord, NameTaken, OperationRecord, Store
from .catalog import (
    CATALOG_RUNTIMES,
    HOSTD_RUNTIMES,
    LIFECYCLE_TIMEOUT_S,
    Catalog,
    SleepFacts,
    instance_key,
    name_key,
    not_found,
    provider_facts,
    set_sleep_facts,
    sleep_facts,
)
from .pools import WarmPoolService
from .provisioning import DEFAULT_START, Provisioner

__all__ = ["CATALOG_RUNTIMES", "DEFAULT_START", "HOSTD_RUNTIMES", "InstanceService"]

log = logging.getLogger(__name__)

LIFECYCLE_VERBS = ("start", "stop", "restart", "destroy")
TRANSIENT = {"start": "starting", "stop": "stopping", "restart": "stopping", "destroy": "destroying"}
LIVE_STATES = ("provisioning", "starting", "running", "stopping")


def _check_filters(state: str | None, runtime: str | None) -> str | None:
    """422 for a state or runtime that is not one; the runtime as stored (aliases resolved)."""
    errors = []
    if state is not None and state not in INSTANCE_STATES:
        errors.append({"field": "state", "message": f"must be one of {', '.join(INSTANCE_STATES)}", "code": "enum"})
    if runtime is not None and runtime not in RUNTIMES:
        errors.append({"field": "runtime", "message": f"must be one of {', '.join(RUNTIMES)}", "code": "enum"})
    if errors:
        raise ValidationFailed(errors)
    return RUNTIME_ALIASES.get(runtime, runtime) if runtime is not None else None


class InstanceService:
    """See the module docstring. Returns catalog records; the surfaces make their own views.

    It builds the :class:`~agentic_sandbox.controller.instances.catalog.Catalog` (the rows and
    their rules) and the :class:`~agentic_sandbox.controller.instances.provisioning.Provisioner`
    it hands the catalog to, and holds both."""

    def __init__(
        self,
        store: Store,
        link: HostdLink,
        operations: OperationService,
        *,
        loadouts: LoadoutService,
        events: EventBus,
        credentials: InstanceCredentials,
        pools: WarmPoolService,
        metrics: Metrics | None = None,
    ) -> None:
        self.catalog = Catalog(store, link, operations, loadouts=loadouts, events=events, metrics=metrics)
        self.provisioner = Provisioner(self.catalog, credentials=credentials, pools=pools)
        self.store = store
        self.link = link
        self.operations = operations
        self.events = events
        self.credentials = credentials
        self._fold_lock = trio.Lock()

    async def provision(
        self, req: ProvisionRequest, *, instance_id: str | None = None, kind: str = "instance.provision"
    ) -> tuple[OperationRecord, str | None]:
        """A new instance (see :meth:`Provisioner.provision`)."""
        return await self.provisioner.provision(req, instance_id=instance_id, kind=kind)

    async def handoff(self, pool: str) -> tuple[OperationRecord, str | None]:
        """A ready slot of ``pool`` handed off as a new instance (see :meth:`Provisioner.handoff`)."""
        return await self.provisioner.handoff(pool)

    async def count_by_state(self) -> dict[str, int]:
        """How many catalog rows are in each state (the instances gauge)."""
        return await self.store.instances.count_by_state()

    async def record(self, instance_id: str) -> InstanceRecord:
        """The catalog's row, without asking hostd; NotFound if the catalog has none."""
        return await self.catalog.record(instance_id)

    # -- reconciliation -----------------------------------------------------------------------

    async def _fold(self, rec: InstanceRecord, info: m.InstanceInfo | None) -> InstanceRecord:
        """Apply hostd's view of one instance to its catalog row (and persist a change). A row of
        another host is left as it is (this hostd's silence says nothing of it); an unplaced row
        (from before hosts were recorded) becomes this host's once its hostd knows it."""
        own = self.link.host_id
        if rec.runtime not in HOSTD_RUNTIMES or self.catalog.busy(rec.id):
            return rec
        if rec.host_id != own:
            if rec.host_id is not None or info is None:
                return rec
            rec.host_id = own
            await self.store.instances.update(rec)
        state, note, working_dir = rec.state, rec.note, rec.working_dir
        capabilities, image_ref = rec.capabilities, rec.image_ref
        had: SleepFacts = (rec.sleep, rec.idle, rec.sleeps, rec.wakes)
        slept = had
        if info is not None:
            state, note, working_dir = info.state, info.note, info.working_dir
            capabilities, image_ref = provider_facts(info)
            slept = sleep_facts(info)
        elif rec.state not in ("destroyed", "failed"):
            state, note = "failed", "hostd does not know this instance"
            slept = (None, rec.idle, rec.sleeps, rec.wakes)
        now = (state, note, working_dir, capabilities, image_ref)
        if now != (rec.state, rec.note, rec.working_dir, rec.capabilities, rec.image_ref) or slept != had:
            before = rec.state
            rec.state, rec.note, rec.working_dir, rec.capabilities, rec.image_ref = now
            set_sleep_facts(rec, slept)
            rec.updated_at = time.time()
            if info is not None and slept[2:] != had[2:]:
                await self.catalog.save_slept(rec, before, (had[2], had[3]), info)
            else:
                await self.catalog.save(rec, before)
        return rec

    async def _adopt(self, info: m.InstanceInfo) -> InstanceRecord:
        now = time.time()
        rec = InstanceRecord(
            id=info.instance_id,
            name=info.name,
            runtime=CATALOG_RUNTIMES.get(info.runtime, info.runtime),
            provider=None if info.runtime == "host" else info.provider,
            state=info.state,
            loadout=info.loadout,
            working_dir=info.working_dir,
            labels=dict(info.labels),
            source="hostd",
            note=info.note,
            created_at=info.created_at or now,
            updated_at=now,
            host_id=self.link.host_id,
        )
        rec.capabilities, rec.image_ref = provider_facts(info)
        set_sleep_facts(rec, sleep_facts(info))
        for name in (info.name, f"{info.name}-{info.instance_id[:8]}"):
            rec.name = name
            try:
                await self.store.instances.insert(rec)
            except NameTaken:
                # A concurrent reconcile (another GET, a /metrics scrape) may have adopted it first.
                existing = await self.store.instances.get(rec.id)
                if existing is not None:
                    return existing
                continue
            log.info("adopted hostd instance %s (%s) into the catalog", rec.id, rec.name)
            self.catalog.announce(rec, None)
            return rec
        raise Conflict(
            "instance.already_exists",
            f"hostd instance {info.instance_id} cannot be adopted: the names {info.name!r} and {rec.name!r} are taken",
        )

    async def reconcile(self) -> list[InstanceRecord]:
        """Read every instance from hostd (Unavailable if it cannot) and fold it into the catalog:
        this host's rows (and the unplaced ones), which it returns."""
        infos = (await self.link.call(m.InstanceListRequest())).instances
        by_id = {info.instance_id: info for info in infos}
        out = []
        # Folds are serialized and read the rows afresh: two reconciles at once (the watch, a GET)
        # would otherwise both fold the same stale row and announce one change twice.
        async with self._fold_lock:
            # This host's rows and the unplaced ones: another host's hostd speaks for the rest.
            for rec in await self.store.instances.list(host_id=self.link.host_id):
                out.append(await self._fold(rec, by_id.pop(rec.id, None)))
            for info in by_id.values():
                if info.state != "destroyed":
                    out.append(await self._adopt(info))
        return out

    async def reconcile_one(self, instance_id: str) -> InstanceRecord | None:
        return (await self._reconcile_one(instance_id))[0]

    async def _reconcile_one(self, instance_id: str) -> tuple[InstanceRecord | None, m.InstanceInfo | None]:
        rec = await self.store.instances.get(instance_id)
        if rec is not None and (rec.runtime not in HOSTD_RUNTIMES or not self.catalog.ours(rec)):
            return rec, None
        info = await self.catalog.hostd_get(instance_id)
        async with self._fold_lock:
            rec = await self.store.instances.get(instance_id)
            if rec is None:
                adopted = await self._adopt(info) if info is not None and info.state != "destroyed" else None
                return adopted, info
            return await self._fold(rec, info), info

    # -- reads --------------------------------------------------------------------------------

    async def list(
        self,
        *,
        state: str | None = None,
        runtime: str | None = None,
        provider: str | None = None,
        labels: Sequence[tuple[str, str | None]] = (),
    ) -> list[InstanceRecord]:
        """Every instance, reconciled with hostd first, matching the filters (each label pair
        ``(key, value)`` holds; value None: the instance has the key)."""
        runtime = _check_filters(state, runtime)
        await self.reconcile()
        records = await self.store.instances.list()  # every host's
        return [
            r
            for r in records
            if (state is None or r.state == state)
            and (runtime is None or r.runtime == runtime)
            and (provider is None or r.provider == provider)
            and all(r.labels.get(k) == v if v is not None else k in r.labels for k, v in labels)
        ]

    async def page(
        self,
        *,
        state: str | None = None,
        runtime: str | None = None,
        provider: str | None = None,
        labels: Sequence[tuple[str, str | None]] = (),
        instance_id: str | None = None,
        host_id: str | None = None,
        after: tuple[float, str] | None = None,
        limit: int,
    ) -> tuple[builtins.list[InstanceRecord], bool]:
        """One page of the catalog, oldest first, after ``after`` (see :meth:`InstanceTable.page`),
        and whether more follow; ``instance_id`` narrows it to that instance, ``host_id`` to that host's.

        Unlike :meth:`list` it does not reconcile the whole catalog with hostd (that costs a read
        of every row): the rows are as the hostd watch last folded them (every
        ``AIWG_WATCH_INTERVAL_S``) and as operations wrote them. It still fails closed while
        hostd is unreachable, as :meth:`list` does."""
        runtime = _check_filters(state, runtime)
        self.link.require_ready()
        return await self.store.instances.page(
            state=state,
            runtime=runtime,
            provider=provider,
            instance_id=instance_id,
            host_id=host_id,
            labels=labels,
            after=after,
            limit=limit,
        )

    async def get(self, instance_id: str) -> InstanceRecord:
        return (await self.get_detail(instance_id))[0]

    async def get_detail(self, instance_id: str) -> tuple[InstanceRecord, m.InstanceInfo | None]:
        """The catalog's row after reconciling it, and hostd's view of the instance (None if hostd
        does not run it): its provider state for the detail views."""
        rec, info = await self._reconcile_one(instance_id)
        if rec is None:
            raise not_found(instance_id)
        return rec, info

    async def storage_owner(self, instance_id: str) -> InstanceRecord:
        """The instance an inbox/outbox write is for: one the catalog knows (a write never conjures
        one up for a typo) that is not destroyed (a destroyed instance takes no more mail)."""
        rec = await self.record(instance_id)
        if rec.state == "destroyed":
            raise InvalidState("instance.invalid_state", f"instance {rec.id} is destroyed")
        return rec

    # -- lifecycle ----------------------------------------------------------------------------

    async def _record_for_verb(
        self, instance_id: str, kind: str
    ) -> tuple[InstanceRecord | None, OperationRecord | None]:
        rec = await self.store.instances.get(instance_id)
        if rec is None:
            raise not_found(instance_id)
        if rec.runtime not in HOSTD_RUNTIMES:
            raise Unimplemented("runtime.not_implemented", f"runtime {rec.runtime!r} is not implemented yet")
        self.catalog.require_ours(rec)
        busy = self.catalog.busy(instance_id)
        if busy is not None:
            op = await self.operations.get(busy)
            if op is not None and op.kind == kind:
                return rec, op  # the same verb is already under way: answer with it
            raise InvalidState("instance.invalid_state", f"operation {busy} is in progress on this instance")
        self.link.require_ready()
        return rec, None

    async def lifecycle(self, instance_id: str, verb: str) -> OperationRecord:
        if verb not in LIFECYCLE_VERBS:
            raise NotFound("instance.not_found", f"no lifecycle verb {verb!r}")
        kind = f"instance.{verb}"
        rec, existing = await self._record_for_verb(instance_id, kind)
        if existing is not None:
            return existing
        assert rec is not None
        if rec.state == "destroyed" and verb != "destroy":
            raise InvalidState("instance.invalid_state", "the instance was destroyed")

        async def work(op: OperationRecord) -> dict[str, Any]:
            return await self._lifecycle_work(rec, verb)

        return await self.operations.submit(kind, work, keys=(instance_key(rec.id),), instance_id=rec.id)

    async def _lifecycle_work(self, rec: InstanceRecord, verb: str) -> dict[str, Any]:
        timeout = LIFECYCLE_TIMEOUT_S.get(rec.runtime)
        try:
            info = await self.catalog.hostd_get(rec.id)
            if info is None:
                if verb == "destroy":
                    await self.catalog.set_state(rec, "destroyed", "hostd no longer knew the instance")
                    return {"instance_id": rec.id, "state": "destroyed"}
                raise NotFound("instance.not_found", "hostd does not know this instance")
            await self.catalog.set_state(rec, TRANSIENT[verb], rec.note)
            if verb in ("stop", "restart") and info.state in ("running", "starting"):
                info = (await self.link.call(m.InstanceStopRequest(instance_id=rec.id), timeout=timeout)).instance
            if verb in ("start", "restart") and info.state != "running":
                info = (await self.link.call(m.InstanceStartRequest(instance_id=rec.id), timeout=timeout)).instance
            if verb == "destroy" and info.state != "destroyed":
                info = (await self.link.call(m.InstanceDestroyRequest(instance_id=rec.id), timeout=timeout)).instance
        except Exception:
            # (On cancellation the row keeps its transient state: the next reconcile fixes it.)
            await self.catalog.restore_state(rec)
            raise
        await self.catalog.set_state(rec, info.state, info.note)
        if verb in ("start", "restart") and info.state != "running":
            raise OperationFailed("instance.start_failed", info.note or f"state {info.state}")
        return {"instance_id": rec.id, "state": info.state}

    # -- sleep ---------------------------------------------------------------------------------

    async def _sleep_call(self, instance_id: str, request: m.Request) -> tuple[InstanceRecord, m.InstanceInfo]:
        """An operator's sleep, wake or idle policy for an instance of this host, answered at once
        (not an operation: hostd bounds it), its row folded with hostd's answer."""
        rec = await self.catalog.record(instance_id)
        if rec.runtime not in HOSTD_RUNTIMES:
            raise Unimplemented("runtime.not_implemented", f"runtime {rec.runtime!r} is not implemented yet")
        self.catalog.require_ours(rec)
        busy = self.catalog.busy(instance_id)
        if busy is not None:
            raise InvalidState("instance.invalid_state", f"operation {busy} is in progress on this instance")
        self.link.require_ready()
        reply = await self.link.call(request, timeout=LIFECYCLE_TIMEOUT_S.get(rec.runtime))
        info: m.InstanceInfo = reply.instance
        async with self._fold_lock:
            fresh = await self.store.instances.get(instance_id)
            return (await self._fold(fresh, info) if fresh is not None else rec), info

    async def sleep(self, instance_id: str, how: m.SleepForm | None, *, pushing: bool) -> InstanceRecord:
        """Put the instance to sleep now; Conflict ``instance.busy`` under work (an exec, an
        attached terminal: hostd's word; ``pushing``: a push delivery still behind)."""
        if pushing:
            raise Conflict("instance.busy", f"instance {instance_id} stays awake: push deliveries are still behind")
        return (await self._sleep_call(instance_id, m.InstanceSleepRequest(instance_id=instance_id, how=how)))[0]

    async def wake(self, instance_id: str) -> InstanceRecord:
        """Wake the instance (whatever its policy says); nothing to do if it is awake."""
        return (await self._sleep_call(instance_id, m.InstanceWakeRequest(instance_id=instance_id)))[0]

    async def set_idle(self, instance_id: str, idle: m.IdlePolicy | None) -> InstanceRecord:
        """Replace the instance's idle policy (None: it never sleeps by itself)."""
        return (await self._sleep_call(instance_id, m.InstanceIdleSetRequest(instance_id=instance_id, idle=idle)))[0]

    async def reprovision(self, instance_id: str, loadout: str | None) -> OperationRecord:
        """Re-run provisioning for the same id: hostd destroys the instance and provisions it again
        with the given loadout (else its current one), its name, labels and a working dir the
        caller chose (the default one, inside the instance's directory, is made afresh). The
        controller's inbox and outbox for the id are untouched. It is started again if it ran."""
        kind = "instance.reprovision"
        rec, existing = await self._record_for_verb(instance_id, kind)
        if existing is not None:
            return existing
        assert rec is not None
        if rec.state == "destroyed":
            raise InvalidState("instance.invalid_state", "the instance was destroyed")
        chosen = loadout if loadout is not None else rec.loadout
        service = self.catalog.loadout_service(chosen) if chosen else None

        async def work(op: OperationRecord) -> dict[str, Any]:
            return await self._reprovision_work(rec, chosen, service)

        return await self.operations.submit(kind, work, keys=(instance_key(rec.id),), instance_id=rec.id)

    async def _reprovision_work(
        self, rec: InstanceRecord, loadout: str | None, service: builtins.list[str] | None
    ) -> dict[str, Any]:
        info = await self.catalog.hostd_get(rec.id)
        if info is None:
            raise NotFound("instance.not_found", "hostd does not know this instance")
        own_dir = info.instance_dir.rstrip("/") + "/"
        working_dir = None if (info.working_dir + "/").startswith(own_dir) else info.working_dir
        was_running = info.state in ("running", "starting")
        await self.catalog.set_state(rec, "provisioning", "reprovisioning")
        try:
            await self.link.call(m.InstanceDestroyRequest(instance_id=rec.id))
        except NotFound:
            pass  # already gone on hostd: provisioning it again is all that is left
        except Exception:
            await self.catalog.restore_state(rec)
            raise
        call = m.InstanceProvisionRequest(
            instance_id=rec.id,
            name=rec.name,
            working_dir=working_dir,
            labels=dict(info.labels),
            command=service,
            start=was_running,
            loadout=loadout,
            idle=info.idle,
        )
        try:
            info = (await self.link.call(call)).instance
        except Exception as exc:
            message = exc.message if isinstance(exc, ControllerError) else "unexpected error"
            await self.catalog.set_state(
                rec, "failed", f"reprovision failed after the old instance was destroyed: {message}"
            )
            raise
        rec.loadout, rec.working_dir = loadout, info.working_dir
        await self.catalog.set_state(rec, info.state, info.note)
        if info.state == "failed":
            raise OperationFailed("instance.start_failed", info.note or "the agent command failed")
        return {"instance_id": rec.id, "state": info.state, "loadout": loadout}

    async def decommission(self, instance_id: str, *, force: bool) -> OperationRecord:
        kind = "instance.decommission"
        if not force and self.link.ready:
            # Judge "running" by hostd's state now, not the catalog's last view (hostctl may have
            # started it since); a hostd that cannot answer fails this request closed (503).
            await self.reconcile_one(instance_id)
        rec, existing = await self._record_for_verb(instance_id, kind)
        if existing is not None:
            return existing
        assert rec is not None
        if not force and rec.state in LIVE_STATES:
            raise InvalidState(
                "instance.invalid_state", f"the instance is {rec.state}; stop it first or decommission with force=true"
            )

        async def work(op: OperationRecord) -> dict[str, Any]:
            await self.catalog.set_state(rec, "destroying", rec.note)
            try:
                await self.link.call(
                    m.InstanceDestroyRequest(instance_id=rec.id, grace_s=0.0 if force else None),
                    timeout=LIFECYCLE_TIMEOUT_S.get(rec.runtime),
                )
            except NotFound:
                pass  # hostd no longer has it: forgetting it is all that is left
            except Exception:
                await self.catalog.restore_state(rec)
                raise
            await self.store.instances.delete(rec.id)
            await self.credentials.forget(rec.id)
            self.events.instance_removed(rec.id, name=rec.name, operation_id=op.id, reason="decommissioned")
            return {"instance_id": rec.id, "name": rec.name, "decommissioned": True}

        return await self.operations.submit(
            kind, work, keys=(instance_key(rec.id), name_key(rec.name)), instance_id=rec.id
        )

    async def issue_token(self, instance_id: str) -> str:
        """A new A2A bearer token for a catalogued instance (the previous one stops working)."""
        rec = await self.record(instance_id)
        if rec.state == "destroyed":
            raise InvalidState("instance.invalid_state", f"instance {rec.id} is destroyed")
        return await self.credentials.issue_token(rec.id)

    # -- dev mode -----------------------------------------------------------------------------

    async def ensure_dev_instance(
        self,
        name: str = "dev",
        *,
        instance_id: str | None = None,
        runtime: Runtime = "host",
        loadout: str | None = None,
    ) -> InstanceRecord | None:
        """Provision (first start) or start (if stopped) the dev host instance; wait for it.
        (Also the conformance instances: fixed ids, each on a built-in loadout of its runtime.)"""
        rec = await self.store.instances.get_by_name(name)
        if rec is not None and not self.catalog.ours(rec):
            return rec  # another host's (several hosts on one store): its controllers look after it
        if rec is None:
            req = ProvisionRequest(name=name, runtime=runtime, start=True, loadout=loadout)
            op, _ = await self.provision(req, instance_id=instance_id)
        elif rec.state in ("stopped", "failed"):
            op = await self.lifecycle(rec.id, "start")
        else:
            return rec
        await self.operations.wait(op.id)
        done = await self.operations.get(op.id)
        if done is not None and done.state != "succeeded":
            log.error("instance %r: %s failed: %s", name, done.kind, done.error)
        return await self.store.instances.get_by_name(name)
