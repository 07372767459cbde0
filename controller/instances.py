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
Unimplemented, hostd reachable) and gives the operation its work function. Each admin runtime maps
onto one hostd runtime and provider (:data:`HOSTD_RUNTIMES`: ``host`` → host/hostd, ``docker``
(also accepted as ``container``) → container/podman, ``qemu`` → vm/libvirt); the others raise
Unimplemented ``runtime.not_implemented`` until their providers exist. Nothing falls back to another
runtime: a provider hostd cannot use now (podman or libvirt down) fails the operation with hostd's
reason.

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
import re
import time
from typing import Any

import trio

from proto import current_log_ids, new_id
from proto import messages as m

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
from .events import EventBus
from .hostlink import HostdLink
from .loadouts import LoadoutService
from .models import INSTANCE_STATES, RUNTIME_ALIASES, RUNTIMES, ProvisionRequest
from .operations import OperationService
from .store import InstanceRecord, NameTaken, OperationRecord, Store

log = logging.getLogger(__name__)

#: An OCI image reference (the same rule hostd's protocol checks): name[:tag][@sha256:<64 hex>].
IMAGE_REF = re.compile(
    r"^[a-z0-9]+([._-][a-z0-9]+)*(:[0-9]+)?(/[a-z0-9]+([._-][a-z0-9]+)*)*"
    r"(:[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?(@sha256:[0-9a-f]{64})?$"
)

LIFECYCLE_VERBS = ("start", "stop", "restart", "destroy")
TRANSIENT = {"start": "starting", "stop": "stopping", "restart": "stopping", "destroy": "destroying"}
LIVE_STATES = ("provisioning", "starting", "running", "stopping")
#: Admin runtime -> (hostd runtime, hostd provider), for the runtimes hostd has providers of.
HOSTD_RUNTIMES = {"host": ("host", "hostd"), "docker": ("container", "podman"), "qemu": ("vm", "libvirt")}
#: hostd runtime -> admin runtime (instances hostd holds that the catalog lacks are adopted as).
CATALOG_RUNTIMES = {hostd: admin for admin, (hostd, _provider) in HOSTD_RUNTIMES.items()}
#: Whether a runtime's instances start when the request does not say (``docker run`` does).
DEFAULT_START = {"host": False, "docker": True, "qemu": False}
#: Deadline of a lifecycle call to hostd per runtime (None: the link's). Making a container can
#: take long (a large image on vfs storage), so can a VM's ACPI stop; hostd bounds its own podman
#: and libvirt calls below this.
LIFECYCLE_TIMEOUT_S: dict[str, float | None] = {"host": None, "docker": 150.0, "qemu": 150.0}


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
        events: EventBus,
        credentials: InstanceCredentials,
    ) -> None:
        self.store = store
        self.events = events
        self.link = link
        self.operations = operations
        self.loadouts = loadouts
        self.credentials = credentials
        self._provision_lock = trio.Lock()
        self._fold_lock = trio.Lock()

    # -- reconciliation -----------------------------------------------------------------------

    def _busy(self, instance_id: str) -> str | None:
        return self.operations.in_flight(_instance_key(instance_id))

    async def _fold(self, rec: InstanceRecord, info: m.InstanceInfo | None) -> InstanceRecord:
        """Apply hostd's view of one instance to its catalog row (and persist a change)."""
        if rec.runtime not in HOSTD_RUNTIMES or self._busy(rec.id):
            return rec
        state, note, working_dir = rec.state, rec.note, rec.working_dir
        if info is not None:
            state, note, working_dir = info.state, info.note, info.working_dir
        elif rec.state not in ("destroyed", "failed"):
            state, note = "failed", "hostd does not know this instance"
        if (state, note, working_dir) != (rec.state, rec.note, rec.working_dir):
            before = rec.state
            rec.state, rec.note, rec.working_dir = state, note, working_dir
            rec.updated_at = time.time()
            await self._save(rec, before)
        return rec

    async def _save(self, rec: InstanceRecord, before: str | None) -> None:
        """Store the row, then say on the event bus if its state changed (after the store, so an
        event never names a state a GET could not show). The cause is the operation whose work
        this is, else reconciliation with hostd (an exit hostd saw, a restart, an adoption)."""
        await self.store.instances.update(rec)
        self._announce(rec, before)

    def _announce(self, rec: InstanceRecord, before: str | None) -> None:
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
            self._announce(rec, None)
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
        # Folds are serialized and read the rows afresh: two reconciles at once (the watch, a GET)
        # would otherwise both fold the same stale row and announce one change twice.
        async with self._fold_lock:
            for rec in await self.store.instances.list():
                out.append(await self._fold(rec, by_id.pop(rec.id, None)))
            for info in by_id.values():
                if info.state != "destroyed":
                    out.append(await self._adopt(info))
        return out

    async def reconcile_one(self, instance_id: str) -> InstanceRecord | None:
        return (await self._reconcile_one(instance_id))[0]

    async def _reconcile_one(self, instance_id: str) -> tuple[InstanceRecord | None, m.InstanceInfo | None]:
        rec = await self.store.instances.get(instance_id)
        if rec is not None and rec.runtime not in HOSTD_RUNTIMES:
            return rec, None
        info = await self._hostd_get(instance_id)
        async with self._fold_lock:
            rec = await self.store.instances.get(instance_id)
            if rec is None:
                adopted = await self._adopt(info) if info is not None and info.state != "destroyed" else None
                return adopted, info
            return await self._fold(rec, info), info

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
        runtime = RUNTIME_ALIASES.get(runtime, runtime) if runtime is not None else None
        records = await self.reconcile()
        return [
            r
            for r in records
            if (state is None or r.state == state)
            and (runtime is None or r.runtime == runtime)
            and (provider is None or r.provider == provider)
        ]

    async def get(self, instance_id: str) -> InstanceRecord:
        return (await self.get_detail(instance_id))[0]

    async def get_detail(self, instance_id: str) -> tuple[InstanceRecord, m.InstanceInfo | None]:
        """The catalog's row after reconciling it, and hostd's view of the instance (None if hostd
        does not run it): its provider state for the detail views."""
        rec, info = await self._reconcile_one(instance_id)
        if rec is None:
            raise _not_found(instance_id)
        return rec, info

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

    def _check_runtime(self, req: ProvisionRequest) -> tuple[str, str | None]:
        """The request's runtime as stored (aliases resolved) and the container image it runs
        (docker only; a VM's ``image`` goes to hostd as its ``image_ref``)."""
        runtime = RUNTIME_ALIASES.get(req.runtime, req.runtime)
        if runtime not in HOSTD_RUNTIMES:
            offered = ", ".join(f"{r!r}" for r in HOSTD_RUNTIMES)
            raise Unimplemented(
                "runtime.not_implemented", f"runtime {req.runtime!r} is not implemented yet; available: {offered}"
            )
        hostd_runtime, hostd_provider = HOSTD_RUNTIMES[runtime]
        if runtime == "host" and req.provider is not None:
            raise ValidationFailed([{"field": "provider", "message": "valid only with runtime qemu or docker"}])
        if req.provider not in (None, hostd_provider):
            raise ValidationFailed([{"field": "provider", "message": f"must be {hostd_provider!r}"}])
        kind = (req.runtime_options or {}).get("kind")
        if kind is not None and kind != hostd_runtime:
            message = f"must match runtime {req.runtime!r} ({hostd_runtime!r})"
            raise ValidationFailed([{"field": "runtime_options.kind", "message": message}])
        if runtime != "docker":
            refused = ("image", "resources") if runtime == "host" else ("resources",)
            for field in refused:
                if getattr(req, field) is not None:
                    raise ValidationFailed([{"field": field, "message": "valid only with runtime docker"}])
            return runtime, None
        loadout = self.loadouts.get(req.loadout) if req.loadout else None
        if req.loadout and loadout is None:
            self._loadout_service(req.loadout)  # raises: unknown loadout
        if loadout is not None and loadout.runtime != "docker":
            message = f"loadout {loadout.name!r} is for runtime {loadout.runtime!r}"
            raise ValidationFailed([{"field": "loadout", "message": message, "code": "runtime_mismatch"}])
        image = req.image or (loadout.image if loadout is not None else None)
        if image is None:
            raise ValidationFailed(
                [{"field": "image", "message": "runtime docker needs an image (or a loadout naming one)"}]
            )
        if not IMAGE_REF.match(image):
            raise ValidationFailed(
                [{"field": "image", "message": "must be an OCI reference: name[:tag][@sha256:<hex>]"}]
            )
        return runtime, image

    async def provision(
        self, req: ProvisionRequest, *, instance_id: str | None = None
    ) -> tuple[OperationRecord, str | None]:
        """Start provisioning; returns (operation, the instance's A2A bearer token). The token is
        None for a second provision of a name in flight (it was returned to the first caller).
        ``instance_id`` fixes the id (the conformance instance); else a fresh UUIDv7."""
        runtime, image = self._check_runtime(req)
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
                runtime=runtime,
                provider=None if runtime == "host" else HOSTD_RUNTIMES[runtime][1],
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
                return await self._provision_work(rec, req, service, image)

            op = await self.operations.submit(
                "instance.provision", work, keys=(_name_key(req.name), _instance_key(rec.id)), instance_id=rec.id
            )
            self.events.instance_state_changed(
                rec.id, before=None, after=rec.state, cause="operation", operation_id=op.id
            )
            return op, token

    async def _provision_work(
        self, rec: InstanceRecord, req: ProvisionRequest, service: builtins.list[str] | None, image: str | None
    ) -> dict[str, Any]:
        resources = req.resources
        runtime, provider = HOSTD_RUNTIMES[rec.runtime]
        call = m.InstanceProvisionRequest(
            instance_id=rec.id,
            name=rec.name,
            runtime=runtime,
            provider=provider,
            working_dir=req.working_dir,
            labels=dict(req.labels),
            command=service,
            start=DEFAULT_START[rec.runtime] if req.start is None else req.start,
            loadout=req.loadout,
            image=req.image if runtime == "vm" else image,
            limits=m.ResourceLimits(cpus=resources.cpus, memory_bytes=resources.memory_bytes, pids=resources.pids)
            if resources is not None
            else None,
        )
        try:
            info: m.InstanceInfo = (await self.link.call(call, timeout=LIFECYCLE_TIMEOUT_S.get(rec.runtime))).instance
        except OutcomeUnknown as exc:
            # hostd went away mid-call: keep the row; reconciliation settles it.
            rec.state, rec.note, rec.updated_at = "failed", f"provisioning outcome unknown: {exc.message}", time.time()
            await self._save(rec, "provisioning")
            raise
        except ControllerError:
            # hostd refused (or was never asked): nothing was made, so the name is free again.
            await self.store.instances.delete(rec.id)
            await self.credentials.forget(rec.id)
            self.events.instance_removed(
                rec.id, name=rec.name, operation_id=current_log_ids().get("operation_id"), reason="provision_refused"
            )
            raise
        rec.state, rec.note, rec.working_dir, rec.updated_at = info.state, info.note, info.working_dir, time.time()
        await self._save(rec, "provisioning")
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
        if rec.runtime not in HOSTD_RUNTIMES:
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
        before = rec.state
        rec.state, rec.note, rec.updated_at = state, note, time.time()
        await self._save(rec, before)

    async def _lifecycle_work(self, rec: InstanceRecord, verb: str) -> dict[str, Any]:
        timeout = LIFECYCLE_TIMEOUT_S.get(rec.runtime)
        try:
            info = await self._hostd_get(rec.id)
            if info is None:
                if verb == "destroy":
                    await self._set_state(rec, "destroyed", "hostd no longer knew the instance")
                    return {"instance_id": rec.id, "state": "destroyed"}
                raise NotFound("instance.not_found", "hostd does not know this instance")
            await self._set_state(rec, TRANSIENT[verb], rec.note)
            if verb in ("stop", "restart") and info.state in ("running", "starting"):
                info = (await self.link.call(m.InstanceStopRequest(instance_id=rec.id), timeout=timeout)).instance
            if verb in ("start", "restart") and info.state != "running":
                info = (await self.link.call(m.InstanceStartRequest(instance_id=rec.id), timeout=timeout)).instance
            if verb == "destroy" and info.state != "destroyed":
                info = (await self.link.call(m.InstanceDestroyRequest(instance_id=rec.id), timeout=timeout)).instance
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
        service = self._loadout_service(chosen) if chosen else None

        async def work(op: OperationRecord) -> dict[str, Any]:
            return await self._reprovision_work(rec, chosen, service)

        return await self.operations.submit(kind, work, keys=(_instance_key(rec.id),), instance_id=rec.id)

    async def _reprovision_work(
        self, rec: InstanceRecord, loadout: str | None, service: builtins.list[str] | None
    ) -> dict[str, Any]:
        info = await self._hostd_get(rec.id)
        if info is None:
            raise NotFound("instance.not_found", "hostd does not know this instance")
        own_dir = info.instance_dir.rstrip("/") + "/"
        working_dir = None if (info.working_dir + "/").startswith(own_dir) else info.working_dir
        was_running = info.state in ("running", "starting")
        await self._set_state(rec, "provisioning", "reprovisioning")
        try:
            await self.link.call(m.InstanceDestroyRequest(instance_id=rec.id))
        except NotFound:
            pass  # already gone on hostd: provisioning it again is all that is left
        except Exception:
            await self._restore_state(rec)
            raise
        call = m.InstanceProvisionRequest(
            instance_id=rec.id,
            name=rec.name,
            working_dir=working_dir,
            labels=dict(info.labels),
            command=service,
            start=was_running,
            loadout=loadout,
        )
        try:
            info = (await self.link.call(call)).instance
        except Exception as exc:
            message = exc.message if isinstance(exc, ControllerError) else "unexpected error"
            await self._set_state(rec, "failed", f"reprovision failed after the old instance was destroyed: {message}")
            raise
        rec.loadout, rec.working_dir = loadout, info.working_dir
        await self._set_state(rec, info.state, info.note)
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
            await self._set_state(rec, "destroying", rec.note)
            try:
                await self.link.call(
                    m.InstanceDestroyRequest(instance_id=rec.id, grace_s=0.0 if force else None),
                    timeout=LIFECYCLE_TIMEOUT_S.get(rec.runtime),
                )
            except NotFound:
                pass  # hostd no longer has it: forgetting it is all that is left
            except Exception:
                await self._restore_state(rec)
                raise
            await self.store.instances.delete(rec.id)
            await self.credentials.forget(rec.id)
            self.events.instance_removed(rec.id, name=rec.name, operation_id=op.id, reason="decommissioned")
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
