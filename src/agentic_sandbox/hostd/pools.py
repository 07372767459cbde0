"""Warm pools: instances made ahead of time, each handed out once by a claim as a new instance.

Where the state lives, and why here: hostd owns what runs, so it owns the pools. A slot is an
instance (or, for VMs, a checkpoint) in hostd's own records, marked with its pool and persisted with
it: a restarted hostd re-adopts slots like any instance, refilling goes on while the controller is
down, and a claim is one change of hostd's instance table, never two processes agreeing. The
controller owns identities: it decides which pools exist (it sends ``PoolSet`` after every
connect), and a claimed slot becomes an instance id the controller chose, with the A2A token and
signing key the controller made for it; no secret ever enters a slot (slots are "pre-enrollment").

Two kinds of pool:

* ``template`` (``PoolSetRequest``): hostd keeps ``size`` slots made from a template ready and
  refills in the background. How a slot waits is the provider's (:attr:`Provider.pool_form`):
  ``running`` (containers: made and started; a claim renames it) or ``saved`` (VMs: booted until the
  guest answers, then saved with libvirt, so an idle slot holds no memory; a claim restores it
  under its own domain and UUID, which is why every VM slot is its own domain).
* ``checkpoints`` (``PoolFromCheckpointsRequest``, upstream's libvirt warm pools): VM checkpoints
  an operator took become the slots; never refilled.

A claim takes the oldest ready slot; none ready is ``pool.empty`` and counts as a miss. Fills run in
this service's nursery, at most :data:`FILL_CONCURRENCY` at once in all pools and one at a time per
pool; a failing template backs off (doubling, up to :data:`MAX_BACKOFF_S`) and says why in
``PoolInfo.last_error``.

Nothing lost or leaked across restarts (``<state>/warm-pools.json`` holds the definitions and
counters, 0600): at start, slots of pools no longer defined, slots whose fill was cut off (a VM not
yet saved, a container not running) and instances a fill left half made are destroyed; checkpoints
an operator gave to a pool that is gone become plain checkpoints again (and the providers remove
what a fill cut off before hostd recorded it: see their strays). The file is rewritten at every
change; a definition's change is synced to disk, a counter's only renamed into place (a killed
hostd loses nothing, a machine that loses power may lose the last counts).
"""

from __future__ import annotations

import builtins
import logging
import time

import msgspec
import trio

from agentic_sandbox.proto import ErrorCode, new_id
from agentic_sandbox.proto import messages as m

from . import poolfile
from .config import HostdConfig
from .errors import RpcError
from .instances import InstanceRegistry
from .poolfile import PoolRecord

log = logging.getLogger(__name__)

FILL_CONCURRENCY = 2
FIRST_BACKOFF_S = 1.0
MAX_BACKOFF_S = 60.0
#: How often the filler looks even when nothing woke it (a provider that came back).
IDLE_LOOK_S = 5.0


class _Pool:
    def __init__(self, record: PoolRecord, form: str) -> None:
        self.record = record
        #: ``running`` or ``saved`` (checkpoint pools: ``saved``).
        self.form = form
        #: Slots being made, each with the scope that cancels its fill.
        self.filling: dict[str, trio.CancelScope] = {}
        #: Slots a claim has taken and is turning into an instance.
        self.claiming: set[str] = set()
        self.backoff_s = 0.0
        self.retry_at = 0.0


class WarmPools:
    """The warm pools of this hostd; see the module docstring. :meth:`load` once the registry has
    re-adopted its instances, then :meth:`run` in the registry's nursery."""

    def __init__(self, config: HostdConfig, registry: InstanceRegistry) -> None:
        self._config = config
        self._registry = registry
        self._pools: dict[str, _Pool] = {}
        self._wake = trio.Event()
        self._limiter = trio.CapacityLimiter(FILL_CONCURRENCY)
        self._nursery: trio.Nursery | None = None
        #: Slots to destroy in the background (leftovers found at start, surplus, stale templates).
        self._doomed: list[str] = []

    # -- queries --------------------------------------------------------------------------------

    def list(self) -> list[m.PoolInfo]:
        return [self._info(pool) for pool in self._pools.values()]

    def _info(self, pool: _Pool) -> m.PoolInfo:
        rec = pool.record
        return m.PoolInfo(
            pool=rec.pool,
            runtime=rec.runtime,
            provider=rec.provider,
            source=rec.source,
            size=rec.size,
            ready=len(self._ready(pool)),
            filling=len(pool.filling),
            hits=rec.hits,
            misses=rec.misses,
            refills=rec.refills,
            failures=rec.failures,
            last_error=rec.last_error,
            loadout=rec.template.loadout if rec.template else None,
            template=rec.template,
        )

    def _ready(self, pool: _Pool) -> builtins.list[str]:
        """Ready slot ids, oldest first (not those being claimed, made or destroyed)."""
        busy = pool.claiming | set(pool.filling) | set(self._doomed)
        if pool.form == "running":
            slots = [i for i in self._registry.slots(pool.record.pool) if i.state == "running"]
            return [i.instance_id for i in sorted(slots, key=lambda i: i.created_at) if i.instance_id not in busy]
        records = [r.info for r in self._registry.copies.checkpoint_records() if r.info.pool == pool.record.pool]
        return [c.checkpoint_id for c in sorted(records, key=lambda c: c.created_at) if c.checkpoint_id not in busy]

    def _get(self, name: str) -> _Pool:
        pool = self._pools.get(name)
        if pool is None:
            raise RpcError(ErrorCode.POOL_NOT_FOUND, f"no warm pool {name!r}", pool=name)
        return pool

    # -- definitions ----------------------------------------------------------------------------

    def set(self, req: m.PoolSetRequest) -> m.PoolInfo:
        """Define or change a template pool (module docstring)."""
        template = req.template
        provider = self._registry.provider_for(template.runtime, template.provider, available=False)
        if provider.pool_form is None:
            raise RpcError(
                ErrorCode.UNSUPPORTED,
                f"runtime {provider.runtime}/{provider.name} has no warm pools",
                capability="warm_pool.manage",
            )
        template = msgspec.structs.replace(template, runtime=provider.runtime, provider=provider.name)
        pool = self._pools.get(req.pool)
        if pool is not None and pool.record.source != "template":
            raise RpcError(ErrorCode.REQUEST_INVALID, f"warm pool {req.pool!r} is made of checkpoints", pool=req.pool)
        if pool is None:
            record = PoolRecord(
                pool=req.pool, runtime=provider.runtime, provider=provider.name, source="template", size=req.size
            )
            pool = self._pools[req.pool] = _Pool(record, provider.pool_form)
        rec = pool.record
        if rec.template != template:
            if rec.template is not None:
                log.info("warm pool %s: template changed; its slots are replaced", req.pool)
            self._drain(pool, keep=0)
            rec.template, rec.runtime, rec.provider = template, provider.runtime, provider.name
            pool.form, pool.backoff_s, pool.retry_at, rec.last_error = provider.pool_form, 0.0, 0.0, None
        rec.size = req.size
        self._drain(pool, keep=req.size)
        self._save()
        self._wake.set()
        return self._info(pool)

    def from_checkpoints(self, req: m.PoolFromCheckpointsRequest) -> m.PoolInfo:
        """A pool of checkpoints the caller took (upstream's libvirt warm pool); never refilled."""
        if req.pool in self._pools:
            raise RpcError(ErrorCode.INSTANCE_EXISTS, f"warm pool {req.pool!r} already exists", pool=req.pool)
        if len(set(req.checkpoint_ids)) != len(req.checkpoint_ids):
            raise RpcError(ErrorCode.REQUEST_INVALID, "checkpoint_ids must be distinct")
        records = {r.info.checkpoint_id: r.info for r in self._registry.copies.checkpoint_records()}
        kinds = set()
        for cid in req.checkpoint_ids:
            given = records.get(cid)
            if given is None:
                raise RpcError(ErrorCode.CHECKPOINT_NOT_FOUND, f"no checkpoint {cid!r}", checkpoint_id=cid)
            if given.pool is not None:
                message = f"checkpoint {cid!r} is already a slot of warm pool {given.pool!r}"
                raise RpcError(ErrorCode.REQUEST_INVALID, message, checkpoint_id=cid)
            kinds.add((given.runtime, given.provider))
        if len(kinds) != 1:
            raise RpcError(ErrorCode.REQUEST_INVALID, "the checkpoints of one pool must share their runtime")
        runtime, provider = kinds.pop()
        for cid in req.checkpoint_ids:
            self._registry.copies.set_checkpoint_pool(cid, req.pool)
        record = PoolRecord(
            pool=req.pool, runtime=runtime, provider=provider, source="checkpoints", size=len(req.checkpoint_ids)
        )
        pool = self._pools[req.pool] = _Pool(record, "saved")
        self._save()
        log.info("warm pool %s made of checkpoints %s", req.pool, ", ".join(req.checkpoint_ids))
        return self._info(pool)

    def delete(self, name: str) -> None:
        pool = self._get(name)
        if pool.record.source == "checkpoints":
            for cid in self._ready(pool):
                self._registry.copies.set_checkpoint_pool(cid, None)
        else:
            self._drain(pool, keep=0)
        del self._pools[name]
        self._save()
        log.info("warm pool %s deleted", name)

    def _drain(self, pool: _Pool, *, keep: int) -> None:
        """Stop fills and send ready slots beyond ``keep`` to be destroyed (newest first)."""
        ready = self._ready(pool)
        surplus = len(ready) + len(pool.filling) - keep
        for slot in list(pool.filling)[: max(0, surplus)]:
            pool.filling.pop(slot).cancel()  # its fill cleans up after itself
            surplus -= 1
        if surplus > 0:
            self._doom(ready[-surplus:])

    def _doom(self, slots: builtins.list[str]) -> None:
        self._doomed.extend(s for s in slots if s not in self._doomed)
        self._wake.set()

    # -- claims ---------------------------------------------------------------------------------

    async def claim(self, req: m.PoolClaimRequest) -> m.InstanceInfo:
        pool = self._get(req.pool)
        try:
            self._registry.get(req.instance_id)
        except RpcError:
            pass
        else:
            raise RpcError(ErrorCode.INSTANCE_EXISTS, f"instance {req.instance_id!r} already exists")
        rec = pool.record
        ready = self._ready(pool)
        if not ready:
            rec.misses += 1
            self._counted()
            raise RpcError(
                ErrorCode.POOL_EMPTY,
                f"warm pool {req.pool!r} has no ready slot ({len(pool.filling)} being made)",
                pool=req.pool,
            )
        slot = ready[0]
        pool.claiming.add(slot)  # taken before the first await: a concurrent claim gets the next one
        try:
            if pool.form == "running":
                info = await self._registry.copies.claim(
                    slot, instance_id=req.instance_id, name=req.name, labels=req.labels
                )
            else:
                restore = m.CheckpointRestoreRequest(
                    checkpoint_id=slot,
                    instance_id=req.instance_id,
                    name=req.name,
                    labels=req.labels,
                    loadout=rec.template.loadout if rec.template else None,
                )
                info = await self._registry.copies.restore(restore, from_pool=True)
        except RpcError as exc:
            # A slot that failed to become an instance is not handed out again, unless what failed
            # was getting to its provider (it is whole; the next claim may take it).
            log.warning("warm pool %s: slot %s could not be claimed: %s", req.pool, slot, exc.message)
            if exc.code not in (ErrorCode.PROVIDER_UNAVAILABLE, ErrorCode.SHUTTING_DOWN):
                self._doom([slot])
            raise
        finally:
            pool.claiming.discard(slot)
        rec.hits += 1
        self._counted()
        self._wake.set()  # refill
        return info

    # -- the filler -----------------------------------------------------------------------------

    async def load(self) -> None:
        """Read the definitions and sort out what the last hostd left (module docstring)."""
        for record in poolfile.read(self._config.pools_file):
            form = "saved" if record.source == "checkpoints" else None
            if form is None:
                try:
                    form = self._registry.provider_for(record.runtime, record.provider, available=False).pool_form
                except RpcError:
                    form = None
            if form is None:
                log.error("warm pool %s: provider %s/%s is not offered; pool dropped", record.pool,
                          record.runtime, record.provider)  # fmt: skip
                continue
            self._pools[record.pool] = _Pool(record, form)
        for slot in self._registry.slots():
            pool = self._pools.get(slot.pool or "")
            if pool is None or pool.form != "running" or slot.state != "running":
                log.info("warm pool %s: slot %s (%s) left from before is removed", slot.pool, slot.instance_id,
                         slot.state)  # fmt: skip
                self._doomed.append(slot.instance_id)
        for kept in self._registry.copies.checkpoint_records():
            name = kept.info.pool
            if name is None or name in self._pools:
                continue
            if kept.pool_made:
                self._doomed.append(kept.info.checkpoint_id)
            else:
                self._registry.copies.set_checkpoint_pool(kept.info.checkpoint_id, None)

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Fill pools, destroy doomed slots and flush counters until cancelled."""
        async with trio.open_nursery() as nursery:
            self._nursery = nursery
            task_status.started()
            while True:
                self._wake = trio.Event()
                await self._destroy_doomed()
                self._start_fills(nursery)
                with trio.move_on_after(self._next_look()):
                    await self._wake.wait()

    def _next_look(self) -> float:
        now = time.monotonic()
        waits = [p.retry_at - now for p in self._pools.values() if p.retry_at > now]
        return max(0.05, min([IDLE_LOOK_S, *waits]))

    def _start_fills(self, nursery: trio.Nursery) -> None:
        now = time.monotonic()
        for pool in self._pools.values():
            rec = pool.record
            if rec.source != "template" or rec.template is None or pool.filling or pool.retry_at > now:
                continue
            if len(self._ready(pool)) < rec.size:
                slot = f"slot-{new_id()}"
                scope = trio.CancelScope()
                pool.filling[slot] = scope
                nursery.start_soon(self._fill, pool, slot, scope)

    async def _fill(self, pool: _Pool, slot: str, scope: trio.CancelScope) -> None:
        rec = pool.record
        template = rec.template
        assert template is not None
        req = m.InstanceProvisionRequest(
            instance_id=slot,
            name=f"{rec.pool}-slot",
            runtime=template.runtime,
            provider=template.provider,
            working_dir=template.working_dir,
            command=template.command,
            loadout=template.loadout,
            image=template.image,
            limits=template.limits,
            vm=template.vm,
            start=True,
        )
        failure: str | None = None
        with scope:  # cancelled by a drain, a delete, hostd stopping: only while waiting
            try:
                async with self._limiter:
                    # Never cut short: a provider call cancelled half way may go on in its worker
                    # thread and make what no record holds (the slot is removed after, if unwanted).
                    with trio.CancelScope(shield=True):
                        await self._registry.provision(req, pool=rec.pool)
                    if pool.form == "saved":
                        await self._registry.copies.wait_usable(slot)
                        with trio.CancelScope(shield=True):
                            await self._registry.copies.checkpoint(slot, slot, pool=rec.pool)
            except RpcError as exc:
                failure = exc.message
            except trio.TooSlowError:
                failure = "the guest did not answer its agent in time"
            except BaseException:
                if not scope.cancel_called:  # hostd is stopping (a start removes what is left)
                    with trio.CancelScope(shield=True):
                        await self._remove(slot)
                raise
        if scope.cancel_called:
            # Drained or deleted while being made (maybe past its last cancellable wait): unwanted.
            with trio.CancelScope(shield=True):
                await self._remove(slot)
        elif failure is not None:
            rec.failures, rec.last_error = rec.failures + 1, failure
            pool.backoff_s = min(MAX_BACKOFF_S, pool.backoff_s * 2 or FIRST_BACKOFF_S)
            pool.retry_at = time.monotonic() + pool.backoff_s
            log.warning("warm pool %s: making a slot failed (retry in %g s): %s", rec.pool, pool.backoff_s, failure)
            await self._remove(slot)
        else:
            rec.refills += 1
            pool.backoff_s, pool.retry_at = 0.0, 0.0
            log.info("warm pool %s: slot %s ready", rec.pool, slot)
        pool.filling.pop(slot, None)
        self._counted()
        self._wake.set()

    async def _destroy_doomed(self) -> None:
        while self._doomed:
            slot = self._doomed[-1]
            await self._remove(slot)
            self._doomed.remove(slot)  # only now: until it is gone, no claim may take it

    async def _remove(self, slot: str) -> None:
        """Destroy a slot, whichever form it has now (instance or checkpoint); never raises."""
        try:
            try:
                self._registry.get(slot)
            except RpcError:
                if any(r.info.checkpoint_id == slot for r in self._registry.copies.checkpoint_records()):
                    await self._registry.copies.remove_checkpoint(slot)
            else:
                await self._registry.destroy(slot, 0.0)
        except RpcError as exc:
            log.warning("warm pool slot %s not removed (a later start tries again): %s", slot, exc.message)

    # -- persistence ----------------------------------------------------------------------------

    def _counted(self) -> None:
        self._save(durable=False)

    def _save(self, *, durable: bool = True) -> None:
        poolfile.write(self._config.pools_file, [p.record for p in self._pools.values()], durable=durable)

    def flush(self) -> None:
        """Write everything, synced (hostd is stopping)."""
        self._save()
