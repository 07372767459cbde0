"""VM checkpoints (upstream's ``/libvirt/checkpoints`` routes): capture and restore, as operations.

A checkpoint is hostd's libvirt save of a running ``qemu`` instance, captured before any secret
enters the guest (``pre_enrollment: true`` is required). Capturing retires the instance: its
catalog row is removed (the name is free again) and what ran in it lives in the checkpoint.
Restoring (single use) brings the saved domain back, under its own libvirt name and UUID (libvirt
refuses any other), as a new instance with a fresh instance id: the source instance's name if it
is free, else that name with the id's first eight characters.

Errors: only :mod:`controller.errors` (hostd failures arrive translated by the link).
"""

from __future__ import annotations

import time
from typing import Any

from agentic_sandbox.proto import messages as m
from agentic_sandbox.proto import new_id

from ..errors import InvalidState, NotFound, Unimplemented, ValidationFailed
from ..hostlink import HostdLink
from ..models import LibvirtCheckpointRequest, LibvirtRestoreRequest
from ..operations import OperationService
from ..store import InstanceRecord, OperationRecord, Store
from .catalog import provider_facts


def _checkpoint_key(checkpoint_id: str) -> str:
    return f"checkpoint:{checkpoint_id}"


class CheckpointService:
    def __init__(self, store: Store, link: HostdLink, operations: OperationService) -> None:
        self.store = store
        self.link = link
        self.operations = operations

    async def _require_capability(self, capability: str) -> None:
        """hostd's VM provider must publish it: checkpoints exist only where they work, and an older
        hostd would not know the checkpoint requests at all (proto/README.md)."""
        providers = (await self.link.call(m.ProviderListRequest())).providers
        if not any(p.runtime == "vm" and capability in p.capabilities for p in providers):
            raise Unimplemented("capability.unsupported", f"hostd's VM runtime does not offer {capability}")

    async def _source(self, vm: str) -> InstanceRecord:
        rec = await self.store.instances.get(vm) or await self.store.instances.get_by_name(vm)
        if rec is None:
            raise NotFound("instance.not_found", f"no instance with id or name {vm!r}")
        if rec.runtime != "qemu":
            raise InvalidState("instance.invalid_state", f"instance {rec.name!r} is not a qemu instance")
        return rec

    async def capture(self, req: LibvirtCheckpointRequest) -> OperationRecord:
        rec = await self._source(req.vm)
        key = f"instance:{rec.id}"
        for held in (key, _checkpoint_key(req.checkpoint_id)):
            if self.operations.in_flight(held) is not None:
                raise InvalidState("instance.invalid_state", f"an operation on {held} is in progress")
        self.link.require_ready()
        await self._require_capability("instance.snapshot")

        async def work(op: OperationRecord) -> dict[str, Any]:
            call = m.CheckpointCreateRequest(checkpoint_id=req.checkpoint_id, instance_id=rec.id)
            saved: m.CheckpointInfo = (await self.link.call(call, timeout=300)).checkpoint
            await self.store.instances.delete(rec.id)  # retired into the checkpoint
            return {
                "checkpoint_id": saved.checkpoint_id,
                "vm": rec.name,
                "source_instance_id": rec.id,
                "domain": saved.domain,
                "uuid": saved.uuid,
                "size_bytes": saved.size_bytes,
                "pre_enrollment": True,
            }

        return await self.operations.submit(
            "libvirt.checkpoint", work, keys=(key, _checkpoint_key(req.checkpoint_id)), instance_id=rec.id
        )

    async def restore(self, checkpoint_id: str, req: LibvirtRestoreRequest) -> OperationRecord:
        if self.operations.in_flight(_checkpoint_key(checkpoint_id)) is not None:
            raise InvalidState("instance.invalid_state", f"an operation on checkpoint {checkpoint_id!r} is in progress")
        self.link.require_ready()
        await self._require_capability("instance.restore")
        listed = (await self.link.call(m.CheckpointListRequest())).checkpoints
        saved = next((c for c in listed if c.checkpoint_id == checkpoint_id), None)
        if saved is None:
            raise NotFound("checkpoint.not_found", f"no checkpoint {checkpoint_id!r}")
        if saved.pool is not None:
            message = f"checkpoint {checkpoint_id!r} is a slot of warm pool {saved.pool!r}; hand it off from the pool"
            raise InvalidState("instance.invalid_state", message)
        if req.name not in (saved.domain, saved.source_name):
            raise ValidationFailed(
                [{"field": "name", "message": f"the checkpoint holds domain {saved.domain!r} ({saved.source_name!r})"}]
            )
        iid = (req.instance_id or new_id()).lower()
        if await self.store.instances.get(iid) is not None:
            raise ValidationFailed([{"field": "instance_id", "message": f"instance {iid} already exists"}])
        name = saved.source_name
        if await self.store.instances.get_by_name(name) is not None:
            name = f"{name}-{iid[:8]}"
        now = time.time()
        rec = InstanceRecord(
            id=iid,
            name=name,
            runtime="qemu",
            provider="libvirt",
            state="provisioning",
            source="admin-v2",
            created_at=now,
            updated_at=now,
            host_id=self.link.host_id,
        )
        await self.store.instances.insert(rec)

        async def work(op: OperationRecord) -> dict[str, Any]:
            call = m.CheckpointRestoreRequest(checkpoint_id=checkpoint_id, instance_id=iid, name=name)
            try:
                info: m.InstanceInfo = (await self.link.call(call, timeout=300)).instance
            except Exception:
                await self.store.instances.delete(iid)
                raise
            rec.state, rec.working_dir, rec.updated_at = info.state, info.working_dir, time.time()
            rec.capabilities, rec.image_ref = provider_facts(info)
            await self.store.instances.update(rec)
            return {"instance_id": iid, "name": name, "state": info.state, "checkpoint_id": checkpoint_id}

        return await self.operations.submit(
            "libvirt.restore", work, keys=(_checkpoint_key(checkpoint_id), f"instance:{iid}"), instance_id=iid
        )
