"""The instance catalog and its lifecycle, with hostd as the source of truth for what runs.

The catalog (SQLite) remembers what the admin API made: id, name, runtime, loadout, labels,
creation time. hostd knows what runs. :meth:`InstanceService.reconcile` folds hostd's view into the
catalog on every (re)connect and on every GET: a catalog row takes hostd's state (the two state sets
match name for name); a row hostd does not know is ``failed`` (unless it is destroyed or an
operation is working on it); an instance hostd holds that the catalog lacks (made by
``agentic-hostctl``, or a lost database) is adopted. A row with an operation in flight keeps the
transient state that operation set (``starting``, ``stopping``, ``destroying``).

Provisioning and lifecycle verbs are operations (:mod:`controller.operations`); this module checks
what can be checked before the operation is accepted (ValidationFailed, NotFound, InvalidState,
Unimplemented, hostd reachable) and gives the operation its work function. Runtimes other than
``host`` raise Unimplemented ``runtime.not_implemented`` until their providers exist; nothing falls
back to another runtime.

Decommission destroys the instance on hostd and forgets it. Without ``force`` it refuses an
instance that is running (InvalidState); with ``force`` it kills the tree at once (grace 0). It
never forgets an instance whose hostd side it could not check (Unavailable instead).

Errors: only :mod:`controller.errors` (hostd failures arrive translated by the link).
"""

from __future__ import annotations

import builtins
import logging
import time
from typing import Any

import trio

from proto import messages as m
from proto import new_id

from .credentials import InstanceCredentials
from .errors import (
    Conflict,
    ControllerError,
    InvalidState,
    NotFound,
    OperationFailed,
    OutcomeUnknown,
    Unavailable,
    Unimplemented,
    ValidationFailed,
)
from .hostlink import HostdLink
from .loadouts import LoadoutService
from .models import INSTANCE_STATES, RUNTIMES, ProvisionRequest
from .operations import OperationService
from .store import InstanceRecord, NameTaken, OperationRecord, Store

log = logging.getLogger(__name__)

LIFECYCLE_VERBS = ("start", "stop", "restart", "destroy")
TRANSIENT = {"start": "starting", "stop": "stopping", "restart": "stopping", "destroy": "destroying"}
LIVE_STATES = ("provisioning", "starting", "running", "stopping")


def _instance_key(instance_id: str) -> str:
    return f"instance:{instance_id}"


def _name_key(name: str) -> str:
    return f"name:{name}"


def _not_found(instance_id: str) -> NotFound:
    return NotFound("instance.not_found", f"no instance with id {instance_id!r}")


class InstanceService:
    """See the module docstring. Returns catalog records; the surfaces make their own views."""

    def __init__(
        self,
        store: Store,
        link: HostdLink,
        operations: OperationService,
        *,
        loadouts: LoadoutService,
        credentials: InstanceCredentials,
    ) -> None:
        self.store = store
        self.link = link
        self.operations = operations
        self.loadouts = loadouts
        self.credentials = credentials
        self._provision_lock = trio.Lock()

    # -- reconciliation -----------------------------------------------------------------------

    def _busy(self, instance_id: str) -> str | None:
        return self.operations.in_flight(_instance_key(instance_id))

    async def _fold(self, rec: InstanceRecord, info: m.InstanceInfo | None) -> InstanceRecord:
        """Apply hostd's view of one instance to its catalog row (and persist a change)."""
        if rec.runtime != "host" or self._busy(rec.id):
            return rec
        state, note, working_dir = rec.state, rec.note, rec.working_dir
        if info is not None:
            state, note, working_dir = info.state, info.note, info.working_dir
        elif rec.state not in ("destroyed", "failed"):
            state, note = "failed", "hostd does not know this instance"
        if (state, note, working_dir) != (rec.state, rec.note, rec.working_dir):
            rec.state, rec.note, rec.working_dir = state, note, working_dir
            rec.updated_at = time.time()
            await self.store.instances.update(rec)
        return rec

    async def _adopt(self, info: m.InstanceInfo) -> InstanceRecord:
        now = time.time()
        rec = InstanceRecord(
            id=info.instance_id,
            name=info.name,
            runtime="host",
            state=info.state,
            loadout=info.loadout,
            working_dir=info.working_dir,
            labels=dict(info.labels),
            source="hostd",
            note=info.note,
            created_at=info.created_at or now,
            updated_at=now,
        )
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
            return rec
        raise Conflict(
            "instance.already_exists",
            f"hostd instance {info.instance_id} cannot be adopted: the names {info.name!r} and {rec.name!r} are taken",
        )

    async def reconcile(self) -> list[InstanceRecord]:
        """Read every instance from hostd (Unavailable if it cannot) and fold it into the catalog."""
        infos = (await self.link.call(m.InstanceListRequest())).instances
        by_id = {info.instance_id: info for info in infos}
        out = []
        for rec in await self.store.instances.list():
            out.append(await self._fold(rec, by_id.pop(rec.id, None)))
        for info in by_id.values():
            if info.state != "destroyed":
                out.append(await self._adopt(info))
        return out

    async def reconcile_one(self, instance_id: str) -> InstanceRecord | None:
        rec = await self.store.instances.get(instance_id)
        if rec is not None and rec.runtime != "host":
            return rec
        info = await self._hostd_get(instance_id)
        if rec is None:
            return await self._adopt(info) if info is not None and info.state != "destroyed" else None
        return await self._fold(rec, info)

    async def _hostd_get(self, instance_id: str) -> m.InstanceInfo | None:
        """hostd's view of one instance; None if hostd does not know it (or the id cannot be one)."""
        try:
            return (await self.link.call(m.InstanceGetRequest(instance_id=instance_id))).instance
        except (NotFound, ValidationFailed):
            return None

    # -- reads --------------------------------------------------------------------------------

    async def list(
        self, *, state: str | None = None, runtime: str | None = None, provider: str | None = None
    ) -> list[InstanceRecord]:
        errors = []
        if state is not None and state not in INSTANCE_STATES:
            errors.append({"field": "state", "message": f"must be one of {', '.join(INSTANCE_STATES)}", "code": "enum"})
        if runtime is not None and runtime not in RUNTIMES:
            errors.append({"field": "runtime", "message": f"must be one of {', '.join(RUNTIMES)}", "code": "enum"})
        if errors:
            raise ValidationFailed(errors)
        records = await self.reconcile()
        return [
            r
            for r in records
            if (state is None or r.state == state)
            and (runtime is None or r.runtime == runtime)
            and (provider is None or r.provider == provider)
        ]

    async def get(self, instance_id: str) -> InstanceRecord:
        rec = await self.reconcile_one(instance_id)
        if rec is None:
            raise _not_found(instance_id)
        return rec

    async def record(self, instance_id: str) -> InstanceRecord:
        """The catalog's row, without asking hostd; NotFound if the catalog has none."""
        rec = await self.store.instances.get(instance_id)
        if rec is None:
            raise _not_found(instance_id)
        return rec

    async def storage_owner(self, instance_id: str) -> InstanceRecord:
        """The instance an inbox/outbox write is for: one the catalog knows (a write never conjures
        one up for a typo) that is not destroyed (a destroyed instance takes no more mail)."""
        rec = await self.record(instance_id)
        if rec.state == "destroyed":
            raise InvalidState("instance.invalid_state", f"instance {rec.id} is destroyed")
        return rec

    # -- provisioning -------------------------------------------------------------------------

    def _require_hostd(self) -> None:
        if not self.link.ready:
            raise Unavailable("internal.unavailable", f"hostd is not reachable: {self.link.reason}")

    def _loadout_service(self, name: str) -> builtins.list[str] | None:  # the method list shadows the type
        """Refuse an unknown loadout up front; return its ``service`` (the instance's main
        process), if it has one. Its ``command`` is what tasks run, one exec per A2A task, so
        it is not handed to hostd here."""
        loadout = self.loadouts.get(name)
        if loadout is None:
            raise ValidationFailed([{"field": "loadout", "message": f"unknown loadout {name!r}", "code": "not_found"}])
        return loadout.service

    async def provision(
        self, req: ProvisionRequest, *, instance_id: str | None = None
    ) -> tuple[OperationRecord, str | None]:
        """Start provisioning; returns (operation, the instance's A2A bearer token). The token is
        None for a second provision of a name in flight (it was returned to the first caller).
        ``instance_id`` fixes the id (the conformance instance); else a fresh UUIDv7."""
        if req.runtime != "host":
            raise Unimplemented(
                "runtime.not_implemented", f"runtime {req.runtime!r} is not implemented yet; only 'host' is available"
            )
        if req.provider is not None:
            raise ValidationFailed([{"field": "provider", "message": "valid only with runtime qemu"}])
        kind = (req.runtime_options or {}).get("kind")
        if kind is not None and kind != "host":
            raise ValidationFailed([{"field": "runtime_options.kind", "message": "must match runtime 'host'"}])
        async with self._provision_lock:
            existing = self.operations.in_flight(_name_key(req.name))
            if existing is not None:
                op = await self.operations.get(existing)
                if op is not None and op.kind == "instance.provision":
                    return op, None
                if op is not None:  # e.g. the decommission of the instance holding the name
                    raise Conflict(
                        "instance.already_exists",
                        f"the name {req.name!r} is held by operation {op.id} ({op.kind}); retry once it has ended",
                    )
            if await self.store.instances.get_by_name(req.name) is not None:
                raise Conflict("instance.already_exists", f"an instance named {req.name!r} already exists")
            self._require_hostd()
            service = self._loadout_service(req.loadout) if req.loadout else None
            now = time.time()
            rec = InstanceRecord(
                id=instance_id or new_id(),  # fixed before any work starts; reported in the operation's result
                name=req.name,
                runtime=req.runtime,
                state="provisioning",
                loadout=req.loadout,
                working_dir=req.working_dir,
                labels=dict(req.labels),
                source="admin-v2",
                created_at=now,
                updated_at=now,
            )
            await self.store.instances.insert(rec)
            token = await self.credentials.issue_token(rec.id)

            async def work(op: OperationRecord) -> dict[str, Any]:
                return await self._provision_work(rec, req, service)

            op = await self.operations.submit(
                "instance.provision", work, keys=(_name_key(req.name), _instance_key(rec.id)), instance_id=rec.id
            )
            return op, token

    async def _provision_work(
        self, rec: InstanceRecord, req: ProvisionRequest, service: builtins.list[str] | None
    ) -> dict[str, Any]:
        call = m.InstanceProvisionRequest(
            instance_id=rec.id,
            name=rec.name,
            working_dir=req.working_dir,
            labels=dict(req.labels),
            command=service,
            start=req.start,
            loadout=req.loadout,
        )
        try:
            info: m.InstanceInfo = (await self.link.call(call)).instance
        except OutcomeUnknown as exc:
            # hostd went away mid-call: keep the row; reconciliation settles it.
            rec.state, rec.note, rec.updated_at = "failed", f"provisioning outcome unknown: {exc.message}", time.time()
            await self.store.instances.update(rec)
            raise
        except ControllerError:
            # hostd refused (or was never asked): nothing was made, so the name is free again.
            await self.store.instances.delete(rec.id)
            await self.credentials.forget(rec.id)
            raise
        rec.state, rec.note, rec.working_dir, rec.updated_at = info.state, info.note, info.working_dir, time.time()
        await self.store.instances.update(rec)
        if info.state == "failed":
            raise OperationFailed("instance.start_failed", info.note or "the agent command failed")
        return {"instance_id": rec.id, "name": rec.name, "state": info.state}

    # -- lifecycle ----------------------------------------------------------------------------

    async def _record_for_verb(
        self, instance_id: str, kind: str
    ) -> tuple[InstanceRecord | None, OperationRecord | None]:
        rec = await self.store.instances.get(instance_id)
        if rec is None:
            raise _not_found(instance_id)
        if rec.runtime != "host":
            raise Unimplemented("runtime.not_implemented", f"runtime {rec.runtime!r} is not implemented yet")
        busy = self._busy(instance_id)
        if busy is not None:
            op = await self.operations.get(busy)
            if op is not None and op.kind == kind:
                return rec, op  # the same verb is already under way: answer with it
            raise InvalidState("instance.invalid_state", f"operation {busy} is in progress on this instance")
        self._require_hostd()
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

        return await self.operations.submit(kind, work, keys=(_instance_key(rec.id),), instance_id=rec.id)

    async def _set_state(self, rec: InstanceRecord, state: str, note: str | None = None) -> None:
        rec.state, rec.note, rec.updated_at = state, note, time.time()
        await self.store.instances.update(rec)

    async def _lifecycle_work(self, rec: InstanceRecord, verb: str) -> dict[str, Any]:
        try:
            info = await self._hostd_get(rec.id)
            if info is None:
                if verb == "destroy":
                    await self._set_state(rec, "destroyed", "hostd no longer knew the instance")
                    return {"instance_id": rec.id, "state": "destroyed"}
                raise NotFound("instance.not_found", "hostd does not know this instance")
            await self._set_state(rec, TRANSIENT[verb], rec.note)
            if verb in ("stop", "restart") and info.state in ("running", "starting"):
                info = (await self.link.call(m.InstanceStopRequest(instance_id=rec.id))).instance
            if verb in ("start", "restart") and info.state != "running":
                info = (await self.link.call(m.InstanceStartRequest(instance_id=rec.id))).instance
            if verb == "destroy" and info.state != "destroyed":
                info = (await self.link.call(m.InstanceDestroyRequest(instance_id=rec.id))).instance
        except Exception:
            # (On cancellation the row keeps its transient state: the next reconcile fixes it.)
            await self._restore_state(rec)
            raise
        await self._set_state(rec, info.state, info.note)
        if verb in ("start", "restart") and info.state != "running":
            raise OperationFailed("instance.start_failed", info.note or f"state {info.state}")
        return {"instance_id": rec.id, "state": info.state}

    async def _restore_state(self, rec: InstanceRecord) -> None:
        """After a failed verb, show hostd's state again instead of the transient one."""
        try:
            with trio.move_on_after(self.link.call_timeout_s):
                info = await self._hostd_get(rec.id)
                await self._set_state(rec, info.state if info else "failed", info.note if info else rec.note)
        except Exception as exc:  # best effort; the next reconcile fixes the row
            log.info("could not re-read instance %s after a failed verb: %s", rec.id, exc)

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
            await self._set_state(rec, "destroying", rec.note)
            try:
                await self.link.call(m.InstanceDestroyRequest(instance_id=rec.id, grace_s=0.0 if force else None))
            except NotFound:
                pass  # hostd no longer has it: forgetting it is all that is left
            except Exception:
                await self._restore_state(rec)
                raise
            await self.store.instances.delete(rec.id)
            await self.credentials.forget(rec.id)
            return {"instance_id": rec.id, "name": rec.name, "decommissioned": True}

        return await self.operations.submit(
            kind, work, keys=(_instance_key(rec.id), _name_key(rec.name)), instance_id=rec.id
        )

    async def issue_token(self, instance_id: str) -> str:
        """A new A2A bearer token for a catalogued instance (the previous one stops working)."""
        rec = await self.record(instance_id)
        if rec.state == "destroyed":
            raise InvalidState("instance.invalid_state", f"instance {rec.id} is destroyed")
        return await self.credentials.issue_token(rec.id)

    # -- dev mode -----------------------------------------------------------------------------

    async def ensure_dev_instance(
        self, name: str = "dev", *, instance_id: str | None = None, loadout: str | None = None
    ) -> InstanceRecord | None:
        """Provision (first start) or start (if stopped) the dev host instance; wait for it.
        (Also the conformance instance: a fixed id on the echo loadout.)"""
        rec = await self.store.instances.get_by_name(name)
        if rec is None:
            req = ProvisionRequest(name=name, runtime="host", start=True, loadout=loadout)
            op, _ = await self.provision(req, instance_id=instance_id)
        elif rec.state in ("stopped", "failed"):
            op = await self.lifecycle(rec.id, "start")
        else:
            return rec
        await self.operations.wait(op.id)
        done = await self.operations.get(op.id)
        if done is not None and done.state != "succeeded":
            log.error("dev instance %r: %s failed: %s", name, done.kind, done.error)
        return await self.store.instances.get_by_name(name)
