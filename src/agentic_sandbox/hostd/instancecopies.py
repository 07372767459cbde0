"""Instances made from other instances: checkpoints and their restores, forks, warm pool claims.

A checkpoint retires the instance it saves (libvirt save); a restore brings one back, once, as a
new instance. A fork copies a running instance into a new one through its provider, the source
going on. A claim turns a ready warm pool slot (:mod:`hostd.pools` keeps the pools) into the
instance a caller asked for: a running slot is renamed and relabelled, a saved one restored.
"""

from __future__ import annotations

import builtins
import logging
import os
import time
from collections.abc import Mapping

import trio

from agentic_sandbox.proto import ErrorCode
from agentic_sandbox.proto import messages as m

from .checkpoints import CheckpointRecord
from .errors import RpcError
from .instancetable import InstanceTable

log = logging.getLogger(__name__)


class InstanceCopies:
    """See the module docstring; held by :class:`~agentic_sandbox.hostd.instances.InstanceRegistry`,
    which builds it with its :class:`~agentic_sandbox.hostd.instancetable.InstanceTable`."""

    def __init__(self, table: InstanceTable) -> None:
        self._table = table

    # -- checkpoints ----------------------------------------------------------------------------

    def checkpoints(self) -> builtins.list[m.CheckpointInfo]:
        return self._table.checkpoints.list()

    async def checkpoint(self, instance_id: str, checkpoint_id: str, *, pool: str | None = None) -> m.CheckpointInfo:
        """Save a running instance into a new checkpoint; the instance is retired (see
        :class:`proto.messages.CheckpointCreateRequest`). Its sessions and execs end first.
        ``pool``: the checkpoint is a slot hostd made for that warm pool."""
        async with self._table.locked(instance_id) as inst:
            if inst.info.state != "running":
                raise RpcError(
                    ErrorCode.INSTANCE_INVALID_STATE,
                    f"instance {instance_id!r} is {inst.info.state}; only a running instance can be checkpointed",
                    instance_id=instance_id,
                    state=inst.info.state,
                )
            path = self._table.checkpoints.prepare(checkpoint_id)
            with trio.CancelScope(shield=True):  # half a save leaves a stopped domain and no record
                await self._table.run_hooks(inst.id, self._table.config.stop_grace_s)
                try:
                    detail = await inst.provider.checkpoint(inst, path)
                except BaseException:
                    path.unlink(missing_ok=True)
                    self._table.commit(inst)
                    raise
                info = m.CheckpointInfo(
                    checkpoint_id=checkpoint_id,
                    source_instance_id=inst.id,
                    source_name=inst.info.name,
                    runtime=inst.info.runtime,
                    provider=inst.info.provider,
                    domain=inst.info.vm.domain if inst.info.vm else None,
                    uuid=inst.info.vm.uuid if inst.info.vm else None,
                    size_bytes=path.stat().st_size if path.exists() else 0,
                    created_at=time.time(),
                    pool=pool,
                )
                self._table.checkpoints.write(CheckpointRecord(info=info, detail=detail, pool_made=pool is not None))
                inst.info.state, inst.info.note = "destroyed", f"retired into checkpoint {checkpoint_id}"
                self._table.instances.pop(instance_id, None)
                self._table.save()
        log.info("instance %s checkpointed as %s (%d bytes)", instance_id, checkpoint_id, info.size_bytes)
        return info

    def checkpoint_records(self) -> builtins.list[CheckpointRecord]:
        return self._table.checkpoints.records()

    def set_checkpoint_pool(self, checkpoint_id: str, pool: str | None) -> None:
        """Make a checkpoint a slot of ``pool`` (None: a plain checkpoint again)."""
        record = self._table.checkpoints.get(checkpoint_id)
        record.info.pool = pool
        self._table.checkpoints.write(record)

    async def remove_checkpoint(self, checkpoint_id: str) -> None:
        """Forget a checkpoint, its saved state and what its provider kept for it (a VM's domain): a
        warm pool slot hostd made and no longer wants."""
        record = self._table.checkpoints.get(checkpoint_id)
        provider = self._table.by_kind.get((record.info.runtime, record.info.provider))
        if provider is not None:
            with trio.CancelScope(shield=True):
                await provider.drop_checkpoint(record.detail)
        self._table.checkpoints.remove(checkpoint_id)

    async def wait_usable(self, instance_id: str) -> None:
        """Until a freshly started instance (a pool slot) is ready to be handed out."""
        inst = self._table.find(instance_id)
        await inst.provider.wait_usable(inst)

    async def restore(self, req: m.CheckpointRestoreRequest, *, from_pool: bool = False) -> m.InstanceInfo:
        """Restore a checkpoint (single use) as a new running instance. A warm pool's slot is
        restored only by its pool (``from_pool``: a claim)."""
        self._table.check_open()
        record = self._table.checkpoints.get(req.checkpoint_id)
        if record.info.pool is not None and not from_pool:
            raise RpcError(
                ErrorCode.REQUEST_INVALID,
                f"checkpoint {req.checkpoint_id!r} is a slot of warm pool {record.info.pool!r}; claim it from the pool",
                checkpoint_id=req.checkpoint_id,
                pool=record.info.pool,
            )
        if req.instance_id in self._table.instances:
            raise RpcError(ErrorCode.INSTANCE_EXISTS, f"instance {req.instance_id!r} already exists")
        provider = self._table.provider_for(record.info.runtime, record.info.provider)
        inst = self._table.reserve(
            req.instance_id,
            provider,
            {},
            name=req.name,
            labels=req.labels,
            capabilities=provider.capabilities(),
            loadout=req.loadout,
            launched_from=f"warm_pool:{record.info.pool}" if from_pool else f"checkpoint:{req.checkpoint_id}",
        )
        info = inst.info
        try:
            async with inst.lock:
                await provider.restore(inst, record.detail, self._table.checkpoints.data_path(req.checkpoint_id))
                info.capabilities = provider.instance_capabilities(info)
                self._table.checkpoints.remove(req.checkpoint_id)  # single use: its domain runs again
                self._table.commit(inst)
        except BaseException:
            self._table.instances.pop(req.instance_id, None)
            self._table.save()
            raise
        log.info("checkpoint %s restored as instance %s (%s)", req.checkpoint_id, req.instance_id, req.name)
        return self._table.public(inst)

    # -- fork and pool claims ---------------------------------------------------------------------

    async def fork(self, req: m.InstanceForkRequest) -> m.InstanceInfo:
        """A running copy of a running instance, as a new instance (see
        :class:`proto.messages.InstanceForkRequest`). The source's lock is held throughout, so no
        stop or destroy cuts the copy short; its sessions and execs go on."""
        self._table.check_open()
        source = self._table.find(req.source_instance_id)
        self._table.check_available(source)
        if req.instance_id in self._table.instances:
            raise RpcError(ErrorCode.INSTANCE_EXISTS, f"instance {req.instance_id!r} already exists")
        if "instance.fork" not in source.info.capabilities:
            raise RpcError(
                ErrorCode.UNSUPPORTED,
                f"instance {source.id!r} ({source.info.runtime}/{source.info.provider}) cannot be forked",
                capability="instance.fork",
            )
        provider = source.provider
        inst = self._table.reserve(
            req.instance_id,
            provider,
            dict(source.env),
            name=req.name,
            labels=req.labels,
            capabilities=list(source.info.capabilities),
            command=list(source.info.command) if source.info.command else None,
            loadout=source.info.loadout,
            launched_from=f"fork:{source.id}",
        )
        info = inst.info
        try:
            async with source.lock, inst.lock:
                self._table.find(source.id)
                if source.info.state != "running" or source.info.pool is not None:
                    raise RpcError(
                        ErrorCode.INSTANCE_INVALID_STATE,
                        f"instance {source.id!r} is {source.info.state}; only a running instance can be forked",
                        instance_id=source.id,
                        state=source.info.state,
                    )
                await provider.fork(source, inst)
                info.capabilities = provider.instance_capabilities(info)
                self._table.commit(inst)
        except BaseException:
            self._table.instances.pop(req.instance_id, None)
            with trio.CancelScope(shield=True):
                await provider.discard(inst)
            self._table.save()
            raise
        log.info("instance %s forked as %s (%s)", source.id, req.instance_id, req.name)
        return self._table.public(inst)

    async def claim(self, slot_id: str, *, instance_id: str, name: str, labels: Mapping[str, str]) -> m.InstanceInfo:
        """Make the running warm pool slot ``slot_id`` the new instance ``instance_id`` (renamed,
        relabelled, no longer a slot); its provider renames what it made."""
        self._table.check_open()
        inst = self._table.find(slot_id)
        if instance_id in self._table.instances:
            raise RpcError(ErrorCode.INSTANCE_EXISTS, f"instance {instance_id!r} already exists")
        async with inst.lock:
            info = inst.info
            if info.pool is None or info.state != "running" or self._table.instances.get(slot_id) is not inst:
                raise RpcError(ErrorCode.INSTANCE_INVALID_STATE, f"instance {slot_id!r} is not a ready pool slot")
            before = (info.name, info.labels, info.pool, info.launched_from)
            self._table.instances[instance_id] = inst  # reserved: a concurrent provision of the id gets EXISTS
            info.instance_id, info.name, info.labels = instance_id, name, dict(labels)
            info.pool, info.launched_from = None, f"warm_pool:{before[2]}"
            try:
                await inst.provider.take_identity(inst, slot_id)
            except BaseException:
                self._table.instances.pop(instance_id, None)
                info.instance_id = slot_id
                info.name, info.labels, info.pool, info.launched_from = before
                raise
            del self._table.instances[slot_id]
            self._move_dir(info, slot_id)
            self._table.commit(inst)
        log.info("warm pool %s: slot %s claimed as instance %s (%s)", before[2], slot_id, instance_id, name)
        return self._table.public(inst)

    def _move_dir(self, info: m.InstanceInfo, old_id: str) -> None:
        """A claimed slot's directory follows its new id (best effort: the old path still works)."""
        old = self._table.config.instances_dir / old_id
        if info.instance_dir != str(old):
            return
        new = self._table.config.instances_dir / info.instance_id
        try:
            os.rename(old, new)
        except OSError as exc:
            log.warning("instance %s: directory %s stays where it is: %s", info.instance_id, old, exc)
            return
        info.instance_dir = str(new)
        if info.working_dir == str(old) or info.working_dir.startswith(f"{old}/"):
            info.working_dir = str(new) + info.working_dir[len(str(old)) :]
