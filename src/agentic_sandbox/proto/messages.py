"""The whole hostd API: every request, response and stream event on the Unix socket.

Reading guide: one banner per method with ``XRequest`` and ``XResponse`` side by side, then
the stream events, then helper types, then the unions both sides decode with.

Wire rules (see STYLE.md, "The contract in proto/"):

* Every frame is a tagged msgspec Struct; the tag is the class name in field ``t``.
* Requests carry ``id`` (chosen by the client, unique among its in-flight calls); every
  response, stream event and error for that call carries the same ``id``. ``id`` 0 is the
  connection itself (hello, connection-level errors).
* Evolve by adding fields with defaults. Never change a field's type, never reuse a tag.
  A change of meaning is a new field or a bump of :data:`PROTOCOL_VERSION`; ``proto/README.md``
  says exactly what needs a bump.
* Wire Structs tolerate unknown fields so an older peer reads a newer message.

Streams: ``SessionSubscribeRequest`` and ``ExecSubscribeRequest`` are answered by one
``StreamOpened`` (or an ``ErrorResponse``), then any number of events with the request's id,
and end with exactly one ``StreamEnd`` or ``ErrorResponse``.
The client ends a stream early with ``StreamCancel``.
"""

from __future__ import annotations

from typing import Annotated, Literal, Union

import msgspec

PROTOCOL_VERSION = 1

#: Upper bound for one frame's body unless configured otherwise (both directions).
DEFAULT_MAX_FRAME_BYTES = 8 * 1024 * 1024
#: Upper bound for one input write (PTY input, exec stdin).
MAX_INPUT_BYTES = 1024 * 1024
#: Upper bound for one control message to a child, as a line (an agent's ``task`` line carries the
#: task's whole first message, raw parts in base64).
MAX_CONTROL_MESSAGE_BYTES = 4 * 1024 * 1024
#: Terminal sizes accepted for PTYs.
MAX_TERMINAL_DIM = 1024
#: argv and env bounds.
MAX_ARGV_ITEMS = 4096
MAX_ENV_ITEMS = 4096

# Constrained field types: a frame that breaks one is answered with ``request.invalid`` for its
# id; the connection stays up.
Argv = Annotated[
    list[Annotated[str, msgspec.Meta(max_length=65536)]], msgspec.Meta(min_length=1, max_length=MAX_ARGV_ITEMS)
]
Env = Annotated[dict[str, str], msgspec.Meta(max_length=MAX_ENV_ITEMS)]
Labels = Annotated[dict[str, str], msgspec.Meta(max_length=256)]
Dim = Annotated[int, msgspec.Meta(ge=1, le=MAX_TERMINAL_DIM)]
Input = Annotated[bytes, msgspec.Meta(max_length=MAX_INPUT_BYTES)]
Seq = Annotated[int, msgspec.Meta(ge=0)]
Grace = Annotated[float, msgspec.Meta(ge=0, le=3600)]
ObjectId = Annotated[str, msgspec.Meta(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")]
Name = Annotated[str, msgspec.Meta(min_length=1, max_length=128)]
#: Runtime kinds and provider names are opaque tokens (runtime/v1's pattern): new ones may appear.
RuntimeKind = Annotated[str, msgspec.Meta(min_length=1, max_length=64, pattern=r"^[a-z0-9][a-z0-9._-]*$")]
ProviderName = Annotated[str, msgspec.Meta(min_length=1, max_length=128, pattern=r"^[a-z0-9][a-z0-9._-]*$")]
#: An image reference; its form is the runtime's (containers: OCI, checked by the provider).
ImageRef = Annotated[str, msgspec.Meta(min_length=1, max_length=8192)]
#: Most slots one warm pool holds (upstream's bound on a libvirt warm pool).
MAX_POOL_SLOTS = 64


class Frame(msgspec.Struct, tag_field="t", tag=True, kw_only=True):
    """Base of every frame."""

    id: int = 0


class Request(Frame, kw_only=True):
    """Base of every client request; ``trace_id`` is carried into hostd's logs."""

    trace_id: str | None = None


class Response(Frame, kw_only=True):
    """Base of every successful reply."""


class Event(Frame, kw_only=True):
    """Base of every stream event."""


# ---------------------------------------------------------------------------------------------
# Hello: the first frame on every connection.


class HelloRequest(Request):
    protocol_version: int
    client_name: str = ""


class HelloResponse(Response):
    protocol_version: int
    host_id: str
    boot_id: str
    hostd_version: str
    pid: int
    peer_uid: int
    peer_gid: int


# ---------------------------------------------------------------------------------------------
# Ping: the cheapest round trip (readiness probes, benchmarks).


class PingRequest(Request):
    payload: bytes = b""


class PingResponse(Response):
    payload: bytes = b""


# ---------------------------------------------------------------------------------------------
# Status: what hostd is and holds.


class StatusRequest(Request):
    pass


class StatusResponse(Response):
    host_id: str
    boot_id: str
    hostd_version: str
    protocol_version: int
    pid: int
    started_at: float
    uptime_s: float
    state_dir: str
    cgroup_root: str | None
    instances: int
    sessions: int
    sessions_running: int
    execs: int
    connections: int
    #: Every runtime provider and whether it is available now (as ``ProviderListResponse``).
    providers: list[ProviderInfo] = []
    #: Upgrades in place since this hostd first started (the pid stays; ``started_at`` is the first
    #: start's), and when the running image took over.
    upgrades: int = 0
    image_started_at: float | None = None


# ---------------------------------------------------------------------------------------------
# Upgrade in place: hostd replaces its own image with the code now installed (same pid), handing
# over its socket, sessions, execs and their output.


class UpgradeRequest(Request):
    pass


class UpgradeResponse(Response):
    """The new code accepted the handover document; hostd hands over right after this answer, and
    its connections then end with ``hostd.restarting``."""

    pid: int
    hostd_version: str
    handover_version: int
    sessions: int
    execs: int


# ---------------------------------------------------------------------------------------------
# Runtime providers: what kinds of instances this hostd can run, right now.


class ProviderListRequest(Request):
    pass


class ProviderListResponse(Response):
    providers: list[ProviderInfo]


# ---------------------------------------------------------------------------------------------
# Instances, of any runtime kind (``runtime`` names the kind, ``provider`` what implements it).


class InstanceProvisionRequest(Request):
    instance_id: ObjectId
    name: Name
    #: Runtime kind (runtime/v1 terms: ``host``, ``container``, ``vm``).
    runtime: RuntimeKind = "host"
    #: Provider of that kind; None = the kind's default provider on this hostd.
    provider: ProviderName | None = None
    working_dir: str | None = None
    env: Env = {}
    labels: Labels = {}
    #: Supervised main process of the instance (the loadout's agent command); None = no main.
    command: Argv | None = None
    start: bool = True
    loadout: str | None = None
    #: The image of the instance, in its runtime's form (containers: OCI, ``name[:tag][@sha256:<hex>]``,
    #: a digest preferred; VMs: ``qcow2://PATH@sha256:HEX`` or
    #: ``direct://KERNEL@sha256:HEX,INITRD@sha256:HEX``). None = the provider's default image (the
    #: built guest image for VMs); ignored by runtimes without images.
    image: ImageRef | None = None
    #: Resource limits of the instance (containers: cpu, memory, pids); None = the runtime's defaults.
    limits: ResourceLimits | None = None
    #: Sizes of a VM (its loadout's); None = the provider's defaults. Ignored by other runtimes.
    vm: VmSpec | None = None
    #: When it sleeps by itself; None = never.
    idle: IdlePolicy | None = None


class InstanceProvisionResponse(Response):
    instance: InstanceInfo


class InstanceStartRequest(Request):
    instance_id: ObjectId


class InstanceStartResponse(Response):
    instance: InstanceInfo


class InstanceStopRequest(Request):
    instance_id: ObjectId
    #: Seconds between SIGTERM and SIGKILL; None = hostd's configured default.
    grace_s: Grace | None = None


class InstanceStopResponse(Response):
    instance: InstanceInfo


class InstanceDestroyRequest(Request):
    instance_id: ObjectId
    grace_s: Grace | None = None


class InstanceDestroyResponse(Response):
    instance: InstanceInfo


class InstanceGetRequest(Request):
    instance_id: ObjectId


class InstanceGetResponse(Response):
    instance: InstanceInfo


class InstanceSleepRequest(Request):
    """Put a running instance to sleep now (``how``: None = its idle policy's, else ``freeze``).
    Refused with ``instance.busy`` while an exec runs or a terminal is attached to it."""

    instance_id: ObjectId
    how: SleepForm | None = None
    cause: Cause = "operator"


class InstanceSleepResponse(Response):
    instance: InstanceInfo


class InstanceWakeRequest(Request):
    """Wake a sleeping instance (a running one: nothing to do, ``woke`` False)."""

    instance_id: ObjectId
    cause: Cause = "operator"


class InstanceWakeResponse(Response):
    instance: InstanceInfo
    woke: bool = False


class InstanceIdleSetRequest(Request):
    """Replace an instance's idle policy (None: it never sleeps by itself)."""

    instance_id: ObjectId
    idle: IdlePolicy | None = None


class InstanceIdleSetResponse(Response):
    instance: InstanceInfo


class InstanceActivityRequest(Request):
    """What the controller saw that hostd cannot: requests about these instances (their idle time
    starts over), and the execs whose task waits for an answer (``input-required``: they do not
    keep their instance awake until a control message is sent to them)."""

    instance_ids: Annotated[list[ObjectId], msgspec.Meta(max_length=65536)] = []
    parked_execs: Annotated[list[ObjectId], msgspec.Meta(max_length=65536)] = []


class InstanceActivityResponse(Response):
    pass


class InstanceListRequest(Request):
    #: Also list the ready slots of warm pools (``InstanceInfo.pool`` set); they are not instances
    #: anyone asked for yet, so a plain listing (the controller's catalog) never sees them.
    pool_slots: bool = False


class InstanceListResponse(Response):
    instances: list[InstanceInfo]


# ---------------------------------------------------------------------------------------------
# Checkpoints: an instance's memory and device state saved to a file (VMs: libvirt save), restored
# once as a new instance. Only where the provider lists ``instance.snapshot`` / ``instance.restore``.


class CheckpointCreateRequest(Request):
    """Save the running instance's state into checkpoint ``checkpoint_id``. This retires the
    instance: what ran in it now lives in the checkpoint (libvirt restores a saved domain only under
    its own name and UUID), and :class:`CheckpointRestoreRequest` brings it back as a new instance."""

    checkpoint_id: ObjectId
    instance_id: ObjectId


class CheckpointCreateResponse(Response):
    checkpoint: CheckpointInfo


class CheckpointRestoreRequest(Request):
    """Restore checkpoint ``checkpoint_id`` (single use) as the new running instance ``instance_id``."""

    checkpoint_id: ObjectId
    instance_id: ObjectId
    name: Name
    labels: Labels = {}
    loadout: str | None = None


class CheckpointRestoreResponse(Response):
    instance: InstanceInfo


class CheckpointListRequest(Request):
    pass


class CheckpointListResponse(Response):
    checkpoints: list[CheckpointInfo]


# ---------------------------------------------------------------------------------------------
# Fork: a running instance copied into a new instance with its own identity. Only where the
# instance lists ``instance.fork``; what is copied depends on the runtime (``InstanceInfo.launched_from``
# names the source): a VM's memory and device state (a live memory snapshot, restored as a new
# libvirt domain with its own name and UUID), a container's filesystem (``podman commit``, then a
# new container whose processes start anew).


class InstanceForkRequest(Request):
    source_instance_id: ObjectId
    instance_id: ObjectId
    name: Name
    labels: Labels = {}


class InstanceForkResponse(Response):
    instance: InstanceInfo


# ---------------------------------------------------------------------------------------------
# Warm pools: instances made ahead of time, per pool, taken by a claim as a new instance (renamed,
# relabelled; the caller gives it its identity). hostd keeps them: slots are re-adopted after a
# restart like any instance, and a pool with a template is refilled in the background. Only where a
# provider lists ``warm_pool.manage``. Containers wait as running containers; VMs as saved memory
# images (booted, then saved before anything secret entered them), restored on claim.


class PoolSetRequest(Request):
    """Define or change pool ``pool``: keep ``size`` slots made from ``template`` ready. Ready slots
    of an older template are replaced; ``size`` 0 empties the pool (it stays defined)."""

    pool: ObjectId
    template: PoolTemplate
    size: Annotated[int, msgspec.Meta(ge=0, le=MAX_POOL_SLOTS)]


class PoolSetResponse(Response):
    pool: PoolInfo


class PoolFromCheckpointsRequest(Request):
    """A pool of saved VMs: each checkpoint (taken before enrollment) becomes one slot, claimed once
    and never refilled (a save image restores only under its own domain name and UUID)."""

    pool: ObjectId
    checkpoint_ids: Annotated[list[ObjectId], msgspec.Meta(min_length=1, max_length=MAX_POOL_SLOTS)]


class PoolFromCheckpointsResponse(Response):
    pool: PoolInfo


class PoolDeleteRequest(Request):
    """Forget pool ``pool``: ready slots hostd made are destroyed, checkpoints it was given are
    released (plain checkpoints again), fills under way are stopped and cleaned up."""

    pool: ObjectId


class PoolDeleteResponse(Response):
    pass


class PoolListRequest(Request):
    pass


class PoolListResponse(Response):
    pools: list[PoolInfo]


class PoolClaimRequest(Request):
    """Take the oldest ready slot of ``pool`` as the new running instance ``instance_id``, named
    ``name`` with ``labels``; ``pool.empty`` (counted as a miss) when no slot is ready."""

    pool: ObjectId
    instance_id: ObjectId
    name: Name
    labels: Labels = {}


class PoolClaimResponse(Response):
    instance: InstanceInfo


# ---------------------------------------------------------------------------------------------
# PTY sessions.


class SessionCreateRequest(Request):
    instance_id: ObjectId
    argv: Argv
    cwd: str | None = None
    env: Env = {}
    cols: Dim = 80
    rows: Dim = 24
    #: Chosen by the caller (e.g. the A2A session id) or by hostd when None.
    session_id: ObjectId | None = None
    #: Hold the session without starting anything (``SessionInfo.pending``) until a
    #: ``SessionStartRequest``; the instance, id, cwd and env are checked now all the same.
    deferred: bool = False


class SessionCreateResponse(Response):
    session: SessionInfo


class SessionStartRequest(Request):
    """Start a pending session (one created ``deferred``). Each field given replaces the one given
    at creation. A session that is not pending (it runs or has ended) is answered as it is, with
    ``started`` false, and the fields are ignored: of two starts, the first wins."""

    session_id: ObjectId
    argv: Argv | None = None
    cwd: str | None = None
    env: Env | None = None
    cols: Dim | None = None
    rows: Dim | None = None


class SessionStartResponse(Response):
    session: SessionInfo
    #: Whether this call started it.
    started: bool


class SessionWriteRequest(Request):
    session_id: ObjectId
    data: Input


class SessionWriteResponse(Response):
    written: int


class SessionResizeRequest(Request):
    session_id: ObjectId
    cols: Dim
    rows: Dim


class SessionResizeResponse(Response):
    pass


class SessionSignalRequest(Request):
    session_id: ObjectId
    #: A name ("SIGINT", "INT") or a number.
    signal: str | int


class SessionSignalResponse(Response):
    pass


class SessionKillRequest(Request):
    """Kill the session's whole process tree (SIGTERM, grace, SIGKILL)."""

    session_id: ObjectId
    grace_s: Grace | None = None


class SessionKillResponse(Response):
    session: SessionInfo


class SessionGetRequest(Request):
    session_id: ObjectId


class SessionGetResponse(Response):
    session: SessionInfo


class SessionListRequest(Request):
    instance_id: str | None = None


class SessionListResponse(Response):
    sessions: list[SessionInfo]


class SessionDeleteRequest(Request):
    """Forget a session; kills its tree first if it still runs."""

    session_id: ObjectId


class SessionDeleteResponse(Response):
    pass


class SessionSubscribeRequest(Request):
    """Replay from ``from_seq`` (None = only new output), then live output until exit.

    Answered by ``SessionOutput``/``SessionLagged`` events, then ``SessionExited`` and
    ``StreamEnd`` when the process has exited and everything up to its last output was sent.
    """

    session_id: ObjectId
    from_seq: Seq | None = None


# ---------------------------------------------------------------------------------------------
# Exec: a process without a PTY (agent tasks).


class ExecStartRequest(Request):
    instance_id: ObjectId
    argv: Argv
    cwd: str | None = None
    env: Env = {}
    #: Bytes written to stdin once started; stdin stays open only if ``keep_stdin_open``.
    stdin: Input | None = None
    keep_stdin_open: bool = False
    #: Give the child a control channel (JSON lines both ways): an fd named by ``AIWG_CONTROL_FD``
    #: in its environment, or (in a container) a socket to connect to at ``AIWG_CONTROL_SOCKET``.
    control: bool = False
    #: The subscriber acknowledges the control messages it has processed (``ExecControlAck``):
    #: hostd stops reading the channel while more than a bound is unacknowledged, so a fast child
    #: waits on its writes instead of its messages being evicted from the ring.
    control_flow: bool = False
    #: Kill the tree after this many seconds; None = no timeout.
    timeout_s: Annotated[float, msgspec.Meta(gt=0)] | None = None
    exec_id: ObjectId | None = None


class ExecStartResponse(Response):
    exec: ExecInfo


class ExecWriteRequest(Request):
    exec_id: ObjectId
    data: Input = b""
    #: Close stdin after writing ``data``.
    eof: bool = False


class ExecWriteResponse(Response):
    written: int


class ExecControlSendRequest(Request):
    """Send one JSON object to the child as a line on its control channel."""

    exec_id: ObjectId
    message: dict[str, object]


class ExecControlSendResponse(Response):
    pass


class ExecControlAckRequest(Request):
    """The subscriber has processed the exec's events up to ``seq`` (``control_flow`` execs)."""

    exec_id: ObjectId
    seq: Seq


class ExecControlAckResponse(Response):
    pass


class ExecCancelRequest(Request):
    exec_id: ObjectId
    grace_s: Grace | None = None


class ExecCancelResponse(Response):
    exec: ExecInfo


class ExecGetRequest(Request):
    exec_id: ObjectId


class ExecGetResponse(Response):
    exec: ExecInfo


class ExecDeleteRequest(Request):
    exec_id: ObjectId


class ExecDeleteResponse(Response):
    pass


class ExecSubscribeRequest(Request):
    """Replay then live: ``ExecOutput``, ``ExecControlMessage``, ``ExecLagged``, then
    ``ExecExited`` and ``StreamEnd``."""

    exec_id: ObjectId
    from_seq: Seq | None = 1


# ---------------------------------------------------------------------------------------------
# Container images: what hostd's podman API socket holds (an advisory catalog).


class ImageListRequest(Request):
    pass


class ImageListResponse(Response):
    """``degraded`` with the ``reason`` (and no images) when podman could not be asked."""

    images: list[ImageInfo] = []
    degraded: bool = False
    reason: str | None = None


# ---------------------------------------------------------------------------------------------
# Stream control and generic replies.


class StreamCancel(Request):
    """End the stream opened by request ``stream_id``; hostd answers with its ``StreamEnd``."""

    stream_id: int


class StreamOpened(Response):
    """First frame of every accepted stream: what the ring holds right now."""

    first_seq: int
    next_seq: int


class StreamEnd(Response):
    reason: Literal["exited", "canceled", "deleted", "shutdown"] = "exited"


class ErrorResponse(Response):
    code: str
    message: str
    details: dict[str, object] = {}


# ---------------------------------------------------------------------------------------------
# Stream events.


class SessionOutput(Event):
    seq: int
    data: bytes


class SessionLagged(Event):
    """Output between the subscriber's position and ``resume_seq`` left the ring unsent."""

    missed_from: int
    resume_seq: int


class SessionExited(Event):
    exit_code: int | None
    signal: int | None
    reason: str
    last_seq: int


class ExecOutput(Event):
    seq: int
    stream: Literal["stdout", "stderr"]
    data: bytes


class ExecControlMessage(Event):
    """One JSON line the child wrote on its control channel."""

    seq: int
    message: dict[str, object]


class ExecLagged(Event):
    missed_from: int
    resume_seq: int


class ExecExited(Event):
    exit_code: int | None
    signal: int | None
    reason: str
    last_seq: int


# ---------------------------------------------------------------------------------------------
# Helper types.

InstanceState = Literal["provisioning", "stopped", "starting", "running", "stopping", "sleeping", "failed", "destroyed"]
#: How an instance sleeps: ``freeze`` stops its processes and keeps their memory (cgroup freezer,
#: podman pause, a suspended VM); ``save`` writes the memory to disk and frees it (a VM's managed save).
SleepForm = Literal["freeze", "save"]
#: What woke an instance or put it to sleep (``idle``, ``operator``, ``exec``, ``session``,
#: ``pty.input``, ``attach``, ``start``, ``stop``, ...).
Cause = Annotated[str, msgspec.Meta(min_length=1, max_length=64, pattern=r"^[a-z][a-z0-9_.-]*$")]


class IdlePolicy(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """When an instance sleeps by itself and how (a loadout's ``idle``, or an instance's own)."""

    #: Idle (no running exec, no attached terminal, no request) this long, it sleeps.
    after_s: Annotated[float, msgspec.Meta(ge=1, le=30 * 86400)]
    sleep: SleepForm = "freeze"
    #: A request that needs the instance wakes it (False: only an operator's wake does).
    wake_on_traffic: bool = True


class SleepDetail(msgspec.Struct, kw_only=True):
    """How a sleeping instance sleeps, since when and why."""

    how: SleepForm
    since: float
    cause: str


class WakeDetail(msgspec.Struct, kw_only=True):
    """The last wake of an instance: why, when, and how long it took."""

    cause: str
    at: float
    took_s: float
    how: SleepForm


EndReason = Literal["exited", "signaled", "killed", "timeout", "canceled", "lost", "spawn_failed"]


class ProviderInfo(msgspec.Struct, kw_only=True):
    """One runtime provider of this hostd, as it stands now."""

    runtime: str
    provider: str
    #: Whether new instances can be provisioned with it right now; ``reason`` says why not.
    available: bool
    reason: str | None = None
    #: What its instances can do (``instance.start``, ``session.pty``, ``exec.control``, ...).
    capabilities: list[str] = []
    #: The provider every instance of this ``runtime`` gets unless the request names another.
    default: bool = False
    #: What the provider found labelled as this hostd's that no instance claims (container or
    #: domain names); reported, never touched.
    strays: list[str] = []


class ResourceLimits(msgspec.Struct, kw_only=True):
    """Limits of one instance; None = no limit of that kind beyond the runtime's defaults."""

    #: CPU time as a number of cores (``0.5`` = half of one).
    cpus: Annotated[float, msgspec.Meta(gt=0, le=1024)] | None = None
    memory_bytes: Annotated[int, msgspec.Meta(ge=4 * 1024 * 1024, le=2**50)] | None = None
    pids: Annotated[int, msgspec.Meta(ge=8, le=4194304)] | None = None


class ContainerDetail(msgspec.Struct, kw_only=True):
    """What only a container instance has: its podman container and image."""

    container_id: str | None = None
    container_name: str
    #: The image as requested, and as resolved: ``<repository>@sha256:<digest>`` of what runs.
    image: str
    image_ref: str | None = None
    #: podman's own word for the container's state (``created``, ``running``, ``exited``, ...).
    status: str | None = None
    pid: int | None = None
    limits: ResourceLimits | None = None
    #: An image hostd made for this container (a fork's commit of its source), removed with it.
    owned_image: str | None = None
    #: Made with a control directory: ``<instance_dir>/control`` bound at ``/run/aiwg`` inside,
    #: where each exec with a control channel gets its socket (False: a container made before
    #: there was one, no channel).
    control: bool = False


class HostDetail(msgspec.Struct, kw_only=True):
    """What only a host-runtime instance has: its supervised main process and its cgroup."""

    pid: int | None = None
    pgid: int | None = None
    cgroup: str | None = None


class VmSpec(msgspec.Struct, kw_only=True):
    """What a VM is given: memory and virtual CPUs."""

    memory_mib: Annotated[int, msgspec.Meta(ge=32, le=1048576)] = 192
    vcpus: Annotated[int, msgspec.Meta(ge=1, le=256)] = 1


class VmDetail(msgspec.Struct, kw_only=True):
    """What only a VM instance has: its libvirt domain and what it boots."""

    uri: str
    domain: str
    uuid: str | None = None
    domain_type: str = "kvm"
    image_ref: str | None = None
    memory_mib: int = 192
    vcpus: int = 1
    #: The guest runs the agent channel's helper (the built guest image does): execs get a
    #: control channel through the domain's ``org.aiwg.agent.0`` port.
    agent_channel: bool = False


class CheckpointInfo(msgspec.Struct, kw_only=True):
    checkpoint_id: str
    #: The instance it was taken of (retired by it), and what it ran on.
    source_instance_id: str
    source_name: str
    runtime: str
    provider: str
    #: VMs: the libvirt domain (name and UUID) the saved state belongs to.
    domain: str | None = None
    uuid: str | None = None
    size_bytes: int = 0
    created_at: float
    #: The warm pool this checkpoint is a slot of (claimed through the pool, not restored directly).
    pool: str | None = None


class PoolTemplate(msgspec.Struct, kw_only=True):
    """What each slot of a pool is made as: an ``InstanceProvisionRequest`` without an identity."""

    runtime: RuntimeKind
    provider: ProviderName | None = None
    image: ImageRef | None = None
    limits: ResourceLimits | None = None
    vm: VmSpec | None = None
    command: Argv | None = None
    loadout: str | None = None
    working_dir: str | None = None


class PoolInfo(msgspec.Struct, kw_only=True):
    """One warm pool as it stands now."""

    pool: str
    runtime: str
    provider: str
    #: ``template``: hostd makes and refills the slots; ``checkpoints``: the slots were given.
    source: str
    #: Slots kept ready (template pools); for a checkpoint pool, how many it was given.
    size: int
    ready: int = 0
    #: Slots being made right now.
    filling: int = 0
    #: Claims served from a ready slot, and claims that found none (since the pool was defined).
    hits: int = 0
    misses: int = 0
    #: Slots made, and attempts that failed (the last one's reason in ``last_error``).
    refills: int = 0
    failures: int = 0
    last_error: str | None = None
    loadout: str | None = None
    template: PoolTemplate | None = None


class InstanceInfo(msgspec.Struct, kw_only=True):
    instance_id: str
    name: str
    state: InstanceState
    instance_dir: str
    working_dir: str
    runtime: str = "host"
    provider: str = "hostd"
    #: What this instance can do (from its provider).
    capabilities: list[str] = []
    labels: dict[str, str] = {}
    command: list[str] | None = None
    loadout: str | None = None
    #: Runtime-specific detail: set for ``runtime == "host"`` only.
    host: HostDetail | None = None
    #: Runtime-specific detail: set for ``runtime == "container"`` only.
    container: ContainerDetail | None = None
    #: Runtime-specific detail: set for ``runtime == "vm"`` only.
    vm: VmDetail | None = None
    created_at: float
    started_at: float | None = None
    stopped_at: float | None = None
    exit_code: int | None = None
    #: Set after a hostd restart: whether hostd re-adopted the running main process.
    adopted: bool | None = None
    #: Human-readable reason for ``failed`` or for what could not be re-adopted.
    note: str | None = None
    sessions: int = 0
    execs: int = 0
    #: While the instance is a ready slot of a warm pool: the pool (see ``InstanceListRequest``).
    pool: str | None = None
    #: How it was made, when not cold: ``warm_pool:<pool>``, ``fork:<source instance id>`` or
    #: ``checkpoint:<checkpoint id>``.
    launched_from: str | None = None
    #: When it sleeps by itself (None: never).
    idle: IdlePolicy | None = None
    #: Set while ``state`` is ``sleeping``.
    sleep: SleepDetail | None = None
    last_wake: WakeDetail | None = None
    #: Sleeps and wakes since it was made, and the seconds it slept (the current sleep not counted).
    sleeps: int = 0
    wakes: int = 0
    asleep_s: float = 0.0


class SessionInfo(msgspec.Struct, kw_only=True):
    session_id: str
    instance_id: str
    argv: list[str]
    cwd: str
    pid: int | None
    cols: int
    rows: int
    #: A pending session (``pending``) reads ``running`` here, which is what a peer that predates
    #: pending sessions makes best sense of (no exit to report); ``pid`` is then None.
    state: Literal["running", "exited"]
    created_at: float
    exited_at: float | None = None
    exit_code: int | None = None
    signal: int | None = None
    end_reason: str | None = None
    #: Sequence numbers still in the ring: [first_seq, next_seq).
    first_seq: int = 1
    next_seq: int = 1
    subscribers: int = 0
    #: Created ``deferred`` and not started yet: nothing runs; ``argv``, ``cwd`` (as hostd resolved
    #: it), ``cols`` and ``rows`` are what it will start with unless the start names others.
    pending: bool = False


class ExecInfo(msgspec.Struct, kw_only=True):
    exec_id: str
    instance_id: str
    argv: list[str]
    cwd: str
    pid: int | None
    state: Literal["running", "exited"]
    control: bool
    created_at: float
    exited_at: float | None = None
    exit_code: int | None = None
    signal: int | None = None
    end_reason: str | None = None
    first_seq: int = 1
    next_seq: int = 1


class ImageInfo(msgspec.Struct, kw_only=True):
    """One image: ``name`` (last path part of the first tag, or the short id), ``reference`` (the
    first tag, or the id), content digest, size and labels."""

    name: str
    reference: str
    digest: str | None = None
    size_bytes: int | None = None
    labels: dict[str, str] = {}


# ---------------------------------------------------------------------------------------------
# Unions: what a client sends, what hostd sends.

ClientFrame = Union[  # noqa: UP007 - one member per line reads as the API index
    HelloRequest,
    PingRequest,
    StatusRequest,
    UpgradeRequest,
    ProviderListRequest,
    InstanceProvisionRequest,
    InstanceStartRequest,
    InstanceStopRequest,
    InstanceDestroyRequest,
    InstanceGetRequest,
    InstanceListRequest,
    InstanceSleepRequest,
    InstanceWakeRequest,
    InstanceIdleSetRequest,
    InstanceActivityRequest,
    CheckpointCreateRequest,
    CheckpointRestoreRequest,
    CheckpointListRequest,
    InstanceForkRequest,
    PoolSetRequest,
    PoolFromCheckpointsRequest,
    PoolDeleteRequest,
    PoolListRequest,
    PoolClaimRequest,
    SessionCreateRequest,
    SessionStartRequest,
    SessionWriteRequest,
    SessionResizeRequest,
    SessionSignalRequest,
    SessionKillRequest,
    SessionGetRequest,
    SessionListRequest,
    SessionDeleteRequest,
    SessionSubscribeRequest,
    ExecStartRequest,
    ExecWriteRequest,
    ExecControlSendRequest,
    ExecControlAckRequest,
    ExecCancelRequest,
    ExecGetRequest,
    ExecDeleteRequest,
    ExecSubscribeRequest,
    ImageListRequest,
    StreamCancel,
]

ServerFrame = Union[  # noqa: UP007
    HelloResponse,
    PingResponse,
    StatusResponse,
    UpgradeResponse,
    ProviderListResponse,
    InstanceProvisionResponse,
    InstanceStartResponse,
    InstanceStopResponse,
    InstanceDestroyResponse,
    InstanceGetResponse,
    InstanceListResponse,
    InstanceSleepResponse,
    InstanceWakeResponse,
    InstanceIdleSetResponse,
    InstanceActivityResponse,
    CheckpointCreateResponse,
    CheckpointRestoreResponse,
    CheckpointListResponse,
    InstanceForkResponse,
    PoolSetResponse,
    PoolFromCheckpointsResponse,
    PoolDeleteResponse,
    PoolListResponse,
    PoolClaimResponse,
    SessionCreateResponse,
    SessionStartResponse,
    SessionWriteResponse,
    SessionResizeResponse,
    SessionSignalResponse,
    SessionKillResponse,
    SessionGetResponse,
    SessionListResponse,
    SessionDeleteResponse,
    ExecStartResponse,
    ExecWriteResponse,
    ExecControlSendResponse,
    ExecControlAckResponse,
    ExecCancelResponse,
    ExecGetResponse,
    ExecDeleteResponse,
    ImageListResponse,
    StreamOpened,
    StreamEnd,
    ErrorResponse,
    SessionOutput,
    SessionLagged,
    SessionExited,
    ExecOutput,
    ExecControlMessage,
    ExecLagged,
    ExecExited,
]

#: Requests answered by a stream of events rather than one response.
STREAM_REQUESTS: tuple[type[Request], ...] = (SessionSubscribeRequest, ExecSubscribeRequest)
