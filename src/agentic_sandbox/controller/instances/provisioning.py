"""Provisioning: a new instance in the catalog and on hostd, made cold, from a warm pool, by fork or
by restore (:mod:`controller.instances.launch` reads which from the request).

What is checked before the operation is accepted: the runtime and its fields (ValidationFailed,
Unimplemented ``runtime.not_implemented``), the launch plan and its asset (the pool, checkpoint or
source instance must exist: 422 naming ``runtime_options.launch_strategy.asset_ref``), a name in
use (Conflict), hostd reachable. Then the catalog row is stored (``provisioning``, id fixed), the
instance's identity is made (its A2A token, returned once, and its card signing key: a slot taken
from a warm pool gets a fresh one like any new instance; no secret ever entered the slot), and the
operation is submitted. Its work asks hostd once (``InstanceProvision``, ``PoolClaim``,
``InstanceFork`` or ``CheckpointRestore``) and folds the answer into the row, provider facts
included. hostd refusing frees the name again (the row and credentials go); hostd going away
mid-call keeps the row ``failed`` for reconciliation to settle. Nothing falls back to another
runtime; an implicit warm pool with no ready slot falls back to a cold provision of the same
request (a miss, which hostd counts).
"""

from __future__ import annotations

import builtins
import re
import time
from typing import Any

import trio

from agentic_sandbox.proto import current_log_ids, new_id
from agentic_sandbox.proto import messages as m

from ..auth.credentials import InstanceCredentials
from ..errors import (
    Conflict,
    ControllerError,
    NotFound,
    OperationFailed,
    OutcomeUnknown,
    Unimplemented,
    ValidationFailed,
)
from ..loadouts.service import LaunchStrategy, RuntimeOptions
from ..models import RUNTIME_ALIASES, ProvisionRequest
from ..store import InstanceRecord, NameTaken, OperationRecord
from .catalog import HOSTD_RUNTIMES, LIFECYCLE_TIMEOUT_S, Catalog, instance_key, name_key
from .launch import LaunchPlan, plan_launch
from .pools import WarmPoolService

#: An OCI image reference (the same rule hostd's protocol checks): name[:tag][@sha256:<64 hex>].
IMAGE_REF = re.compile(
    r"^[a-z0-9]+([._-][a-z0-9]+)*(:[0-9]+)?(/[a-z0-9]+([._-][a-z0-9]+)*)*"
    r"(:[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?(@sha256:[0-9a-f]{64})?$"
)
#: Whether a runtime's instances start when the request does not say (``docker run`` does).
DEFAULT_START = {"host": False, "docker": True, "qemu": False}
ASSET_FIELD = "runtime_options.launch_strategy.asset_ref"


def _asset_invalid(message: str) -> ValidationFailed:
    return ValidationFailed([{"field": ASSET_FIELD, "message": message}])


def pool_instance_name(pool: str, instance_id: str) -> str:
    """The name of an instance handed off from ``pool`` (the contract's handoff has no body)."""
    slug = re.sub(r"[^a-z0-9-]+", "-", pool.lower()).strip("-")[:40] or "pool"
    if not slug[0].isalpha():
        slug = f"pool-{slug}"
    return f"{slug}-{instance_id.replace('-', '')[-8:]}"


class Provisioner:
    """See the module docstring; held by :class:`~agentic_sandbox.controller.instances.service.InstanceService`."""

    def __init__(
        self,
        catalog: Catalog,
        *,
        credentials: InstanceCredentials,
        pools: WarmPoolService,
    ) -> None:
        # The store, the link, operations, loadouts and events are the catalog's: one set for both.
        self.catalog = catalog
        self.credentials = credentials
        self.pools = pools
        self._provision_lock = trio.Lock()

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
        kind = req.runtime_options.kind if req.runtime_options is not None else None
        if kind is not None and kind != hostd_runtime:
            message = f"must match runtime {req.runtime!r} ({hostd_runtime!r})"
            raise ValidationFailed([{"field": "runtime_options.kind", "message": message}])
        if runtime != "docker":
            refused = ("image", "resources") if runtime == "host" else ("resources",)
            for field in refused:
                if getattr(req, field) is not None:
                    raise ValidationFailed([{"field": field, "message": "valid only with runtime docker"}])
            return runtime, None
        loadout = self.catalog.loadouts.get(req.loadout) if req.loadout else None
        if req.loadout and loadout is None:
            self.catalog.loadout_service(req.loadout)  # raises: unknown loadout
        if loadout is not None and loadout.runtime != "docker":
            message = f"loadout {loadout.name!r} is for runtime {loadout.runtime!r}"
            raise ValidationFailed([{"field": "loadout", "message": message, "code": "runtime_mismatch"}])
        image = req.image or (loadout.image if loadout is not None else None)
        if image is None and self._cold(req):
            raise ValidationFailed(
                [{"field": "image", "message": "runtime docker needs an image (or a loadout naming one)"}]
            )
        if image is not None and not IMAGE_REF.match(image):
            raise ValidationFailed(
                [{"field": "image", "message": "must be an OCI reference: name[:tag][@sha256:<hex>]"}]
            )
        return runtime, image

    @staticmethod
    def _cold(req: ProvisionRequest) -> bool:
        strategy = req.runtime_options.launch_strategy if req.runtime_options is not None else None
        return strategy is None or strategy.mode == "cold"

    def _slot_fits(self, req: ProvisionRequest, runtime: str) -> builtins.set[str]:
        """The loadouts whose warm pool could serve this request as it is: a slot is made from the
        loadout alone and handed out running, so nothing else may be asked for."""
        if req.loadout is None or (not DEFAULT_START[runtime] and req.start is not True) or req.start is False:
            return set()
        loadout = self.catalog.loadouts.get(req.loadout)
        if loadout is None or loadout.runtime != runtime or self.pools.pool_for(req.loadout) is None:
            return set()
        if req.image not in (None, loadout.image) or req.resources is not None or req.working_dir is not None:
            return set()
        return {req.loadout}

    async def _check_asset(self, plan: LaunchPlan, runtime: str) -> tuple[str | None, InstanceRecord | None]:
        """The loadout the asset makes the instance run, and the fork's source; 422 for an asset
        that does not exist or does not fit the runtime."""
        asset = plan.asset or ""
        hostd_runtime = HOSTD_RUNTIMES[runtime][0]
        if plan.mode == "fork":
            source = await self.catalog.store.instances.get(asset) or await self.catalog.store.instances.get_by_name(
                asset
            )
            if source is None or source.state == "destroyed":
                raise _asset_invalid(f"no instance with id or name {asset!r} to fork")
            if source.runtime != runtime:
                raise _asset_invalid(f"instance {source.name!r} is a {source.runtime} instance, not {runtime}")
            if "instance.fork" not in source.capabilities:
                raise Unimplemented(
                    "capability.unsupported", f"instance {source.name!r}: its provider cannot fork it here"
                )
            return source.loadout, source
        if plan.mode == "restore":
            listed = (await self.catalog.link.call(m.CheckpointListRequest())).checkpoints
            saved = next((c for c in listed if c.checkpoint_id == asset), None)
            if saved is None or saved.runtime != hostd_runtime:
                raise _asset_invalid(f"no {hostd_runtime} checkpoint {asset!r}")
            if saved.pool is not None:
                raise _asset_invalid(f"checkpoint {asset!r} is a slot of warm pool {saved.pool!r}; claim it from there")
            return None, None
        if plan.implicit:
            return asset, None
        await self.pools.require()
        try:
            pool = await self.pools.get(asset)
        except NotFound:
            raise _asset_invalid(f"no warm pool {asset!r}") from None
        if pool.runtime != hostd_runtime:
            raise _asset_invalid(f"warm pool {asset!r} holds {pool.runtime} slots, not {hostd_runtime}")
        if plan.fallback_cold and (pool.loadout is None or self.catalog.loadouts.get(pool.loadout) is None):
            raise _asset_invalid(f"warm pool {asset!r} names no loadout to fall back to")
        return pool.loadout, None

    async def provision(
        self, req: ProvisionRequest, *, instance_id: str | None = None, kind: str = "instance.provision"
    ) -> tuple[OperationRecord, str | None]:
        """Start provisioning; returns (operation, the instance's A2A bearer token). The token is
        None for a second provision of a name in flight (it was returned to the first caller).
        ``instance_id`` fixes the id (the conformance instance, a handoff); else a fresh UUIDv7."""
        runtime, image = self._check_runtime(req)
        if req.start is False and not self._cold(req):
            raise ValidationFailed([{"field": "start", "message": "an instance from an asset is handed out running"}])
        plan = plan_launch(req, runtime, HOSTD_RUNTIMES[runtime][1], self._slot_fits(req, runtime))
        async with self._provision_lock:
            existing = self.catalog.operations.in_flight(name_key(req.name))
            if existing is not None:
                op = await self.catalog.operations.get(existing)
                if op is not None and op.kind == kind:
                    return op, None
                if op is not None:  # e.g. the decommission of the instance holding the name
                    raise Conflict(
                        "instance.already_exists",
                        f"the name {req.name!r} is held by operation {op.id} ({op.kind}); retry once it has ended",
                    )
            self.catalog.link.require_ready()
            loadout, source = req.loadout, None
            if plan.mode != "cold":
                loadout, source = await self._check_asset(plan, runtime)
            service = self.catalog.loadout_service(loadout) if loadout else None
            now = time.time()
            rec = InstanceRecord(
                id=instance_id or new_id(),  # fixed before any work starts; reported in the operation's result
                name=req.name,
                runtime=runtime,
                provider=None if runtime == "host" else HOSTD_RUNTIMES[runtime][1],
                state="provisioning",
                loadout=loadout,
                working_dir=req.working_dir,
                labels=dict(req.labels),
                source="admin-v2",
                created_at=now,
                updated_at=now,
                host_id=self.catalog.link.host_id,
            )
            try:
                await self.catalog.store.instances.insert(rec)  # the name's uniqueness is the table's
            except NameTaken:
                raise Conflict("instance.already_exists", f"an instance named {req.name!r} already exists") from None
            token = await self.credentials.issue_identity(rec.id)  # token and key: whole before it runs

            async def work(op: OperationRecord) -> dict[str, Any]:
                return await self._provision_work(rec, req, service, image, plan, source)

            keys = (name_key(req.name), instance_key(rec.id))
            op = await self.catalog.operations.submit(kind, work, keys=keys, instance_id=rec.id)
            self.catalog.events.instance_state_changed(
                rec.id, before=None, after=rec.state, cause="operation", operation_id=op.id
            )
            return op, token

    async def handoff(self, pool: str) -> tuple[OperationRecord, str | None]:
        """Upstream's libvirt warm pool handoff: a VM slot of ``pool`` as a new instance, named
        after the pool (the request has no body)."""
        await self.pools.require()
        try:
            info = await self.pools.get(pool)
        except NotFound:
            raise NotFound("warm_pool.not_found", f"no libvirt warm pool {pool!r}") from None
        if info.runtime != "vm":
            raise NotFound("warm_pool.not_found", f"no libvirt warm pool {pool!r} (it holds {info.runtime} slots)")
        iid = new_id()
        options = RuntimeOptions(kind="vm", launch_strategy=LaunchStrategy(mode="warm_pool", asset_ref=pool))
        req = ProvisionRequest(name=pool_instance_name(pool, iid), runtime="qemu", runtime_options=options)
        return await self.provision(req, instance_id=iid, kind="libvirt.warm_pool.handoff")

    def _launch_call(
        self, rec: InstanceRecord, req: ProvisionRequest, plan: LaunchPlan, source: InstanceRecord | None
    ) -> m.Request:
        labels = dict(req.labels)
        if plan.mode == "warm_pool":
            return m.PoolClaimRequest(pool=plan.asset or "", instance_id=rec.id, name=rec.name, labels=labels)
        if plan.mode == "fork":
            assert source is not None
            return m.InstanceForkRequest(source_instance_id=source.id, instance_id=rec.id, name=rec.name)
        return m.CheckpointRestoreRequest(checkpoint_id=plan.asset or "", instance_id=rec.id, name=rec.name)

    def _cold_call(
        self, rec: InstanceRecord, req: ProvisionRequest, service: builtins.list[str] | None, image: str | None
    ) -> m.InstanceProvisionRequest:
        resources = req.resources
        runtime, provider = HOSTD_RUNTIMES[rec.runtime]
        if image is None and runtime == "container" and rec.loadout:
            loadout = self.catalog.loadouts.get(rec.loadout)
            image = loadout.image if loadout is not None else None  # a pool's fallback: its loadout's
        return m.InstanceProvisionRequest(
            instance_id=rec.id,
            name=rec.name,
            runtime=runtime,
            provider=provider,
            working_dir=req.working_dir,
            labels=dict(req.labels),
            command=service,
            start=True if not self._cold(req) else DEFAULT_START[rec.runtime] if req.start is None else req.start,
            loadout=rec.loadout,
            image=req.image if runtime == "vm" else image,
            limits=m.ResourceLimits(cpus=resources.cpus, memory_bytes=resources.memory_bytes, pids=resources.pids)
            if resources is not None
            else None,
            idle=self._idle_for(rec, req),
        )

    def _idle_for(self, rec: InstanceRecord, req: ProvisionRequest) -> m.IdlePolicy | None:
        """When it sleeps by itself: as the request says, else as its loadout says (else never)."""
        if req.idle is not None:
            return req.idle
        loadout = self.catalog.loadouts.get(rec.loadout) if rec.loadout else None
        return loadout.idle if loadout is not None else None

    async def _provision_work(
        self,
        rec: InstanceRecord,
        req: ProvisionRequest,
        service: builtins.list[str] | None,
        image: str | None,
        plan: LaunchPlan,
        source: InstanceRecord | None,
    ) -> dict[str, Any]:
        timeout = LIFECYCLE_TIMEOUT_S.get(rec.runtime)
        launch: dict[str, Any] = {"mode": plan.mode}
        if plan.asset is not None:
            launch["asset_ref"] = plan.asset
        try:
            info: m.InstanceInfo | None = None
            if plan.mode != "cold":
                try:
                    info = (
                        await self.catalog.link.call(self._launch_call(rec, req, plan, source), timeout=timeout)
                    ).instance
                except Conflict as exc:
                    if exc.code != "warm_pool.empty" or not plan.fallback_cold:
                        raise
                    launch["fallback"] = "cold"  # no ready slot (a miss): made from scratch instead
            if info is None:
                info = (
                    await self.catalog.link.call(self._cold_call(rec, req, service, image), timeout=timeout)
                ).instance
            idle = self._idle_for(rec, req)
            if idle != info.idle:  # a claimed slot, a fork or a restore: made before its policy was known
                info = (await self.catalog.link.call(m.InstanceIdleSetRequest(instance_id=rec.id, idle=idle))).instance
        except OutcomeUnknown as exc:
            # hostd went away mid-call: keep the row; reconciliation settles it.
            rec.state, rec.note, rec.updated_at = "failed", f"provisioning outcome unknown: {exc.message}", time.time()
            await self.catalog.save(rec, "provisioning")
            raise
        except ControllerError:
            # hostd refused (or was never asked): nothing was made, so the name is free again.
            await self.catalog.store.instances.delete(rec.id)
            await self.credentials.forget(rec.id)
            self.catalog.events.instance_removed(
                rec.id, name=rec.name, operation_id=current_log_ids().get("operation_id"), reason="provision_refused"
            )
            raise
        self.catalog.take_facts(rec, info)
        await self.catalog.save(rec, "provisioning")
        if info.state == "failed":
            raise OperationFailed("instance.start_failed", info.note or "the agent command failed")
        if info.launched_from is not None:
            launch["launched_from"] = info.launched_from
        return {"instance_id": rec.id, "name": rec.name, "state": info.state, "launch": launch}
