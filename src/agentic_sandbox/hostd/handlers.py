"""The API face of hostd: one method per request type, each a thin call into a registry.

:class:`Handlers` knows nothing about sockets or frames; :mod:`hostd.server` decides how each
request is scheduled (see :data:`INLINE`, :data:`ORDERED` and :data:`STREAMS`) and turns what
a handler raises into the wire error.
"""

from __future__ import annotations

import os
import time
from collections.abc import Awaitable, Callable
from typing import Any

from agentic_sandbox.proto import PROTOCOL_VERSION
from agentic_sandbox.proto import messages as m

from .config import HostdConfig
from .errors import RpcError
from .execs import ExecRegistry
from .instances import InstanceRegistry
from .pools import WarmPools
from .proctree import Cgroups
from .providers.podman.images import ImageCatalog
from .sessions import SessionRegistry

HOSTD_VERSION = "0.1.0"

#: How a stream handler sends: one frame, or a list sent in one write.
Send = Callable[[m.Frame | list[m.Frame]], Awaitable[None]]

#: Requests answered at once, in the connection's read loop (never block).
INLINE: frozenset[type[m.Request]] = frozenset(
    {
        m.PingRequest,
        m.StatusRequest,
        m.ProviderListRequest,
        m.InstanceGetRequest,
        m.InstanceListRequest,
        m.SessionGetRequest,
        m.SessionListRequest,
        m.SessionResizeRequest,
        m.SessionSignalRequest,
        m.SessionWriteRequest,  # never waits: the session keeps an ordered input backlog
        m.ExecGetRequest,
        m.ExecControlAckRequest,  # never waits: it only moves a counter
        m.InstanceActivityRequest,  # never waits: it only notes times
        m.InstanceIdleSetRequest,
    }
)

#: Requests that must keep their order per target (session or exec) but may wait on it.
ORDERED: frozenset[type[m.Request]] = frozenset({m.ExecWriteRequest, m.ExecControlSendRequest})

#: Requests answered by a stream.
STREAMS: frozenset[type[m.Request]] = frozenset(m.STREAM_REQUESTS)


def ordered_key(request: m.Request) -> str:
    """Requests with the same key run one after another, in arrival order."""
    return getattr(request, "exec_id", "")


class Handlers:
    def __init__(
        self,
        *,
        config: HostdConfig,
        cgroups: Cgroups,
        instances: InstanceRegistry,
        pools: WarmPools,
        sessions: SessionRegistry,
        execs: ExecRegistry,
        images: ImageCatalog,
        host_id: str,
        boot_id: str,
        connections: Callable[[], int],
        upgrade: Callable[[], Awaitable[m.UpgradeResponse]],
        started_at: float | None = None,
        upgrades: int = 0,
    ) -> None:
        self.config = config
        self.cgroups = cgroups
        self.instances = instances
        self.pools = pools
        self.sessions = sessions
        self.execs = execs
        self.images = images
        self.host_id = host_id
        self.boot_id = boot_id
        #: When this hostd first started (an upgrade in place keeps it) and when this image did.
        self.image_started_at = time.time()
        self.started_at = started_at if started_at is not None else self.image_started_at
        self.upgrades = upgrades
        self._connections = connections
        self._upgrade = upgrade
        self._table: dict[type, Callable[[Any], Awaitable[m.Response]]] = {
            m.PingRequest: self.ping,
            m.StatusRequest: self.status,
            m.UpgradeRequest: self.upgrade,
            m.ProviderListRequest: self.provider_list,
            m.InstanceProvisionRequest: self.instance_provision,
            m.InstanceStartRequest: self.instance_start,
            m.InstanceStopRequest: self.instance_stop,
            m.InstanceDestroyRequest: self.instance_destroy,
            m.InstanceGetRequest: self.instance_get,
            m.InstanceListRequest: self.instance_list,
            m.InstanceSleepRequest: self.instance_sleep,
            m.InstanceWakeRequest: self.instance_wake,
            m.InstanceIdleSetRequest: self.instance_idle_set,
            m.InstanceActivityRequest: self.instance_activity,
            m.CheckpointCreateRequest: self.checkpoint_create,
            m.CheckpointRestoreRequest: self.checkpoint_restore,
            m.CheckpointListRequest: self.checkpoint_list,
            m.InstanceForkRequest: self.instance_fork,
            m.PoolSetRequest: self.pool_set,
            m.PoolFromCheckpointsRequest: self.pool_from_checkpoints,
            m.PoolDeleteRequest: self.pool_delete,
            m.PoolListRequest: self.pool_list,
            m.PoolClaimRequest: self.pool_claim,
            m.SessionCreateRequest: self.session_create,
            m.SessionStartRequest: self.session_start,
            m.SessionWriteRequest: self.session_write,
            m.SessionResizeRequest: self.session_resize,
            m.SessionSignalRequest: self.session_signal,
            m.SessionKillRequest: self.session_kill,
            m.SessionGetRequest: self.session_get,
            m.SessionListRequest: self.session_list,
            m.SessionDeleteRequest: self.session_delete,
            m.ExecStartRequest: self.exec_start,
            m.ExecWriteRequest: self.exec_write,
            m.ExecControlSendRequest: self.exec_control_send,
            m.ExecControlAckRequest: self.exec_control_ack,
            m.ExecCancelRequest: self.exec_cancel,
            m.ExecGetRequest: self.exec_get,
            m.ExecDeleteRequest: self.exec_delete,
            m.ImageListRequest: self.image_list,
        }

    def hello(self, peer_uid: int, peer_gid: int) -> m.HelloResponse:
        return m.HelloResponse(
            protocol_version=PROTOCOL_VERSION,
            host_id=self.host_id,
            boot_id=self.boot_id,
            hostd_version=HOSTD_VERSION,
            pid=os.getpid(),
            peer_uid=peer_uid,
            peer_gid=peer_gid,
        )

    async def call(self, request: m.Request) -> m.Response:
        return await self._table[type(request)](request)

    def pin(self, request: m.Request) -> None:
        """Fix a subscription's "only new output" (``from_seq=None``) to the sequence next when the
        request is read, however late its task starts: it then sees the effect of every request
        read after it (the echo of a keystroke sent right behind the subscribe). An unknown id is
        left for the stream to refuse."""
        try:
            if isinstance(request, m.SessionSubscribeRequest) and request.from_seq is None:
                request.from_seq = self.sessions.get(request.session_id).next_seq
            elif isinstance(request, m.ExecSubscribeRequest) and request.from_seq is None:
                request.from_seq = self.execs.get(request.exec_id).next_seq
        except RpcError:
            pass

    async def stream(self, request: m.Request, send: Send) -> None:
        if isinstance(request, m.SessionSubscribeRequest):
            # An attached terminal wants the instance awake (and keeps it so while it follows).
            await self._awake(self.sessions.instance_of(request.session_id), "attach")
            await self.sessions.subscribe(request.id, request.session_id, request.from_seq, send)
        elif isinstance(request, m.ExecSubscribeRequest):
            await self.execs.subscribe(request.id, request.exec_id, request.from_seq, send)
        else:  # pragma: no cover - STREAMS and this method change together
            raise TypeError(type(request).__name__)

    # -- host ---------------------------------------------------------------------------------

    async def ping(self, req: m.PingRequest) -> m.PingResponse:
        return m.PingResponse(payload=req.payload)

    async def status(self, req: m.StatusRequest) -> m.StatusResponse:
        sessions, running = self.sessions.counts()
        now = time.time()
        return m.StatusResponse(
            host_id=self.host_id,
            boot_id=self.boot_id,
            hostd_version=HOSTD_VERSION,
            protocol_version=PROTOCOL_VERSION,
            pid=os.getpid(),
            started_at=self.started_at,
            uptime_s=now - self.started_at,
            state_dir=self.config.state_dir,
            cgroup_root=str(self.cgroups.root) if self.cgroups.root else None,
            instances=len(self.instances.list()),
            sessions=sessions,
            sessions_running=running,
            execs=self.execs.count(),
            connections=self._connections(),
            providers=self.instances.providers(),
            upgrades=self.upgrades,
            image_started_at=self.image_started_at,
        )

    async def upgrade(self, req: m.UpgradeRequest) -> m.UpgradeResponse:
        """Check the code now installed and hand over to it right after this answer."""
        return await self._upgrade()

    async def provider_list(self, req: m.ProviderListRequest) -> m.ProviderListResponse:
        return m.ProviderListResponse(providers=self.instances.providers())

    # -- instances ----------------------------------------------------------------------------

    async def instance_provision(self, req: m.InstanceProvisionRequest) -> m.InstanceProvisionResponse:
        return m.InstanceProvisionResponse(instance=await self.instances.provision(req))

    async def instance_start(self, req: m.InstanceStartRequest) -> m.InstanceStartResponse:
        return m.InstanceStartResponse(instance=await self.instances.start(req.instance_id))

    async def instance_stop(self, req: m.InstanceStopRequest) -> m.InstanceStopResponse:
        return m.InstanceStopResponse(instance=await self.instances.stop(req.instance_id, req.grace_s))

    async def checkpoint_create(self, req: m.CheckpointCreateRequest) -> m.CheckpointCreateResponse:
        await self.instances.sleep.wake(req.instance_id, "checkpoint")
        return m.CheckpointCreateResponse(
            checkpoint=await self.instances.copies.checkpoint(req.instance_id, req.checkpoint_id)
        )

    async def checkpoint_restore(self, req: m.CheckpointRestoreRequest) -> m.CheckpointRestoreResponse:
        return m.CheckpointRestoreResponse(instance=await self.instances.copies.restore(req))

    async def checkpoint_list(self, req: m.CheckpointListRequest) -> m.CheckpointListResponse:
        return m.CheckpointListResponse(checkpoints=self.instances.copies.checkpoints())

    async def instance_fork(self, req: m.InstanceForkRequest) -> m.InstanceForkResponse:
        await self.instances.sleep.wake(req.source_instance_id, "fork")
        return m.InstanceForkResponse(instance=await self.instances.copies.fork(req))

    # -- warm pools ---------------------------------------------------------------------------

    async def pool_set(self, req: m.PoolSetRequest) -> m.PoolSetResponse:
        return m.PoolSetResponse(pool=self.pools.set(req))

    async def pool_from_checkpoints(self, req: m.PoolFromCheckpointsRequest) -> m.PoolFromCheckpointsResponse:
        return m.PoolFromCheckpointsResponse(pool=self.pools.from_checkpoints(req))

    async def pool_delete(self, req: m.PoolDeleteRequest) -> m.PoolDeleteResponse:
        self.pools.delete(req.pool)
        return m.PoolDeleteResponse()

    async def pool_list(self, req: m.PoolListRequest) -> m.PoolListResponse:
        return m.PoolListResponse(pools=self.pools.list())

    async def pool_claim(self, req: m.PoolClaimRequest) -> m.PoolClaimResponse:
        return m.PoolClaimResponse(instance=await self.pools.claim(req))

    async def instance_destroy(self, req: m.InstanceDestroyRequest) -> m.InstanceDestroyResponse:
        return m.InstanceDestroyResponse(instance=await self.instances.destroy(req.instance_id, req.grace_s))

    async def instance_get(self, req: m.InstanceGetRequest) -> m.InstanceGetResponse:
        return m.InstanceGetResponse(instance=self.instances.get(req.instance_id))

    async def instance_list(self, req: m.InstanceListRequest) -> m.InstanceListResponse:
        return m.InstanceListResponse(instances=self.instances.list(pool_slots=req.pool_slots))

    # -- sleep --------------------------------------------------------------------------------

    async def instance_sleep(self, req: m.InstanceSleepRequest) -> m.InstanceSleepResponse:
        return m.InstanceSleepResponse(instance=await self.instances.sleep.sleep(req.instance_id, req.how, req.cause))

    async def instance_wake(self, req: m.InstanceWakeRequest) -> m.InstanceWakeResponse:
        info, woke = await self.instances.sleep.wake(req.instance_id, req.cause)
        return m.InstanceWakeResponse(instance=info, woke=woke)

    async def instance_idle_set(self, req: m.InstanceIdleSetRequest) -> m.InstanceIdleSetResponse:
        return m.InstanceIdleSetResponse(instance=self.instances.sleep.set_idle(req.instance_id, req.idle))

    async def instance_activity(self, req: m.InstanceActivityRequest) -> m.InstanceActivityResponse:
        self.instances.sleep.report(req)
        return m.InstanceActivityResponse()

    async def _awake(self, instance_id: str | None, cause: str) -> None:
        """Wake the instance a request needs, if it sleeps (None: the request names no known
        child; its handler says so)."""
        if instance_id is not None:
            await self.instances.sleep.awake(instance_id, cause)

    async def _wake_to_end(self, instance_id: str | None, cause: str) -> None:
        """A running child of a sleeping instance is ended awake, whatever the instance's policy: a
        frozen process handles no SIGTERM, and in a paused container not even a SIGKILL ends it."""
        if instance_id is not None and self.instances.sleep.sleeping(instance_id):
            await self.instances.sleep.wake(instance_id, cause)

    def _nudge(self, instance_id: str | None, cause: str) -> None:
        if instance_id is not None:
            self.instances.sleep.nudge(instance_id, cause)

    # -- sessions -----------------------------------------------------------------------------

    async def session_create(self, req: m.SessionCreateRequest) -> m.SessionCreateResponse:
        if not req.deferred:
            await self._awake(req.instance_id, "session")
        return m.SessionCreateResponse(session=await self.sessions.create(req))

    async def session_start(self, req: m.SessionStartRequest) -> m.SessionStartResponse:
        await self._awake(self.sessions.instance_of(req.session_id), "session")
        session, started = await self.sessions.start(req)
        return m.SessionStartResponse(session=session, started=started)

    async def session_write(self, req: m.SessionWriteRequest) -> m.SessionWriteResponse:
        # Never waits: the keys wait in the PTY for the instance the nudge wakes.
        self._nudge(self.sessions.instance_of(req.session_id), "pty.input")
        return m.SessionWriteResponse(written=await self.sessions.write(req.session_id, req.data))

    async def session_resize(self, req: m.SessionResizeRequest) -> m.SessionResizeResponse:
        self._nudge(self.sessions.instance_of(req.session_id), "pty.resize")
        self.sessions.resize(req.session_id, req.cols, req.rows)
        return m.SessionResizeResponse()

    async def session_signal(self, req: m.SessionSignalRequest) -> m.SessionSignalResponse:
        self._nudge(self.sessions.instance_of(req.session_id), "pty.signal")
        self.sessions.signal(req.session_id, req.signal)
        return m.SessionSignalResponse()

    async def session_kill(self, req: m.SessionKillRequest) -> m.SessionKillResponse:
        await self._wake_to_end(self.sessions.instance_of(req.session_id, running=True), "session.kill")
        return m.SessionKillResponse(session=await self.sessions.kill(req.session_id, req.grace_s))

    async def session_get(self, req: m.SessionGetRequest) -> m.SessionGetResponse:
        return m.SessionGetResponse(session=self.sessions.get(req.session_id))

    async def session_list(self, req: m.SessionListRequest) -> m.SessionListResponse:
        return m.SessionListResponse(sessions=self.sessions.list(req.instance_id))

    async def session_delete(self, req: m.SessionDeleteRequest) -> m.SessionDeleteResponse:
        await self._wake_to_end(self.sessions.instance_of(req.session_id, running=True), "session.kill")
        await self.sessions.delete(req.session_id)
        return m.SessionDeleteResponse()

    # -- execs --------------------------------------------------------------------------------

    async def exec_start(self, req: m.ExecStartRequest) -> m.ExecStartResponse:
        await self._awake(req.instance_id, "exec")
        return m.ExecStartResponse(exec=await self.execs.start(req))

    async def exec_write(self, req: m.ExecWriteRequest) -> m.ExecWriteResponse:
        await self._awake(self.execs.instance_of(req.exec_id), "exec.input")
        return m.ExecWriteResponse(written=await self.execs.write(req.exec_id, req.data, req.eof))

    async def exec_control_send(self, req: m.ExecControlSendRequest) -> m.ExecControlSendResponse:
        # The answer a parked exec waited for: it works again, and needs its instance awake.
        self.instances.sleep.unpark(req.exec_id)
        await self._awake(self.execs.instance_of(req.exec_id), "exec.control")
        await self.execs.control_send(req.exec_id, req.message)
        return m.ExecControlSendResponse()

    async def exec_control_ack(self, req: m.ExecControlAckRequest) -> m.ExecControlAckResponse:
        self.execs.control_ack(req.exec_id, req.seq)
        return m.ExecControlAckResponse()

    async def exec_cancel(self, req: m.ExecCancelRequest) -> m.ExecCancelResponse:
        await self._wake_to_end(self.execs.instance_of(req.exec_id, running=True), "exec.cancel")
        return m.ExecCancelResponse(exec=await self.execs.kill(req.exec_id, req.grace_s, reason="canceled"))

    async def exec_get(self, req: m.ExecGetRequest) -> m.ExecGetResponse:
        return m.ExecGetResponse(exec=self.execs.get(req.exec_id))

    async def exec_delete(self, req: m.ExecDeleteRequest) -> m.ExecDeleteResponse:
        await self._wake_to_end(self.execs.instance_of(req.exec_id, running=True), "exec.cancel")
        await self.execs.delete(req.exec_id)
        return m.ExecDeleteResponse()

    # -- images -------------------------------------------------------------------------------

    async def image_list(self, req: m.ImageListRequest) -> m.ImageListResponse:
        # Not INLINE: it waits on podman (bounded, in a worker thread).
        return await self.images.list()
