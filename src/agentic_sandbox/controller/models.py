"""JSON shapes of the admin surface (instances, operations), after ``contracts/admin-api.openapi.yaml``.

Input Structs forbid unknown fields so a typo is a 422 naming the field, not a silently ignored
setting. Output Structs omit unset optional fields (the contract types them as non-nullable).
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated, Any, Literal

import msgspec

from agentic_sandbox.proto.messages import IdlePolicy, SleepForm

from .loadouts.service import RuntimeOptions

RUNTIMES = ("qemu", "docker", "host", "container")
#: ``container`` is runtime/v1's kind name for what the contract calls ``docker``: accepted as an
#: alias on input, stored and shown as ``docker``.
Runtime = Literal["qemu", "docker", "host", "container"]
RUNTIME_ALIASES = {"container": "docker"}
InstanceStateName = Literal[
    "provisioning", "stopped", "starting", "running", "stopping", "sleeping", "failed", "destroying", "destroyed"
]
INSTANCE_STATES: tuple[str, ...] = InstanceStateName.__args__  # type: ignore[attr-defined]

InstanceName = Annotated[str, msgspec.Meta(pattern=r"^[a-z][a-z0-9-]{1,62}$")]
Short = Annotated[str, msgspec.Meta(min_length=1, max_length=256)]
Path = Annotated[str, msgspec.Meta(min_length=1, max_length=4096)]
Labels = Annotated[
    dict[Annotated[str, msgspec.Meta(min_length=1, max_length=256)], Annotated[str, msgspec.Meta(max_length=4096)]],
    msgspec.Meta(max_length=256),
]


class Resources(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """Resource limits of a container instance (an extension of the contract's request)."""

    cpus: Annotated[float, msgspec.Meta(gt=0, le=1024)] | None = None
    memory_bytes: Annotated[int, msgspec.Meta(ge=4 * 1024 * 1024, le=2**50)] | None = None
    pids: Annotated[int, msgspec.Meta(ge=8, le=4194304)] | None = None


class ProvisionRequest(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """``InstanceProvisionRequest``; fields other runtimes use are accepted and checked there."""

    name: InstanceName
    runtime: Runtime
    provider: Short | None = None
    #: Provider-neutral launch intent (``LoadoutRuntimeOptions``): see :mod:`controller.instances.launch`.
    runtime_options: RuntimeOptions | None = None
    loadout: Short | None = None
    profile: Short | None = None
    image: Short | None = None
    agentshare: bool = False
    mounts: list[Path] = []
    network: Short | None = None
    #: None: the runtime's default (host: provisioned stopped; docker: started, as ``docker run``).
    start: bool | None = None
    working_dir: Path | None = None
    ssh_key: Path | None = None
    labels: Labels = {}
    resources: Resources | None = None
    #: Placement (several hosts on one store, docs/hosts.md): the host (its id or name) or a label
    #: it must carry (``key`` or ``key=value``); placement picks one otherwise.
    host: Short | None = None
    host_label: Short | None = None
    #: When it sleeps by itself (docs/sleep.md); None: as its loadout says (else never).
    idle: IdlePolicy | None = None


class SleepRequest(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """``POST /instances/{id}/sleep``: how (None: as its idle policy says, else ``freeze``)."""

    how: SleepForm | None = None


class IdleRequest(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """``PUT /instances/{id}/idle``: the instance's idle policy (null: it never sleeps by itself)."""

    idle: IdlePolicy | None


Uuid = Annotated[str, msgspec.Meta(pattern=r"^[0-9a-fA-F]{8}(-[0-9a-fA-F]{4}){3}-[0-9a-fA-F]{12}$")]
CheckpointId = Annotated[str, msgspec.Meta(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")]


class LibvirtCheckpointRequest(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """Upstream's ``LibvirtCheckpointRequest``: ``vm`` names a running qemu instance (id or name)."""

    vm: Short
    checkpoint_id: CheckpointId
    #: Must be true: a checkpoint is captured before any secret enters the guest.
    pre_enrollment: Literal[True]


class LibvirtRestoreRequest(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """Upstream's ``LibvirtRestoreRequest``: ``name`` is the source domain (or instance) name the
    checkpoint holds, checked; ``instance_id`` the new instance's id (a UUID; generated if absent)."""

    name: Short
    instance_id: (
        Annotated[
            str, msgspec.Meta(pattern=r"^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$")
        ]
        | None
    ) = None


PoolName = Annotated[str, msgspec.Meta(min_length=1, max_length=128, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")]


class LibvirtWarmPoolInitRequest(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """Upstream's ``LibvirtWarmPoolInitRequest``: distinct pre-enrollment checkpoints become the
    slots of pool ``pool`` (each claimed once: a save image restores only under its own UUID)."""

    checkpoint_ids: Annotated[list[CheckpointId], msgspec.Meta(min_length=1, max_length=64)]
    pool: PoolName


class LibvirtWarmPoolHandoffRequest(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """Upstream's ``LibvirtWarmPoolHandoffRequest``: empty (the slot supplies its domain)."""


class WarmPoolView(msgspec.Struct, omit_defaults=True, kw_only=True):
    """One warm pool as served (``GET /warm-pools``): hostd's ``PoolInfo``."""

    pool: str
    runtime: str
    provider: str
    source: str
    size: int
    ready: int
    filling: int
    hits: int
    misses: int
    refills: int
    failures: int
    loadout: str | None = None
    last_error: str | None = None
    #: Whether this controller's configuration (``AIWG_WARM_POOLS``) names it.
    configured: bool


class WarmPoolList(msgspec.Struct, kw_only=True):
    items: list[WarmPoolView]


class ReprovisionRequest(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """The ``reprovision`` body: the loadout to apply (omitted: the current one)."""

    loadout: Short | None = None


class HostDaemon(msgspec.Struct, kw_only=True):
    status: Literal["available", "unavailable"]
    label: str


class InstanceView(msgspec.Struct, omit_defaults=True, kw_only=True):
    """``Instance`` as served."""

    id: str
    name: str
    runtime: str
    state: str
    agent_card_url: str
    created_at: str
    provider: str | None = None
    capabilities: list[str] = []
    loadout: str | None = None
    source: str | None = None
    cwd: str | None = None
    operation_status: str | None = None
    transport: str | None = None
    transport_posture: str | None = None
    host_daemon: HostDaemon | None = None
    labels: dict[str, str] = {}
    image: str | None = None
    image_ref: str | None = None
    #: What the instance's provider reports about it (hostd's runtime detail), when hostd was asked.
    provider_state: dict[str, Any] | None = None
    #: The host it runs on and that host's state (``available``, ``unavailable``: its calls answer 503).
    host_id: str | None = None
    host_state: str | None = None
    #: While it sleeps: ``how`` (``freeze``, ``save``), ``since`` (RFC 3339) and ``cause``.
    sleep: dict[str, Any] | None = None
    #: Its idle policy (``after_s``, ``sleep``, ``wake_on_traffic``), when it has one.
    idle: dict[str, Any] | None = None


class InstanceList(msgspec.Struct, kw_only=True, omit_defaults=True):
    items: list[InstanceView]
    #: Only on a paged answer (``limit`` given): the next page's ``page_token``, "" on the last page.
    next_page_token: str | None = None


class OperationView(msgspec.Struct, omit_defaults=True, kw_only=True):
    """``OperationStatus`` as served."""

    id: str
    kind: str
    state: str
    created_at: str
    started_at: str | None = None
    completed_at: str | None = None
    result: dict[str, Any] | None = None
    error: dict[str, Any] | None = None


def iso(ts: float) -> str:
    """RFC 3339 UTC with milliseconds, e.g. ``2026-05-09T14:01:00.000Z``."""
    return datetime.fromtimestamp(ts, UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


class HostControllerView(msgspec.Struct, omit_defaults=True, kw_only=True):
    id: str
    url: str
    started_at: str
    heartbeat_at: str
    #: Heard from within ``AIWG_HOST_TIMEOUT_S``: requests for the host's instances may go to it.
    alive: bool


class HostInstances(msgspec.Struct, omit_defaults=True, kw_only=True):
    total: int
    by_state: dict[str, int]


class HostView(msgspec.Struct, omit_defaults=True, kw_only=True):
    """A host of the store (``GET /api/v2/admin/hosts``, docs/hosts.md)."""

    id: str
    name: str
    boot_id: str
    #: ``available`` while some controller of it reported within ``AIWG_HOST_TIMEOUT_S``, else ``unavailable``.
    state: Literal["available", "unavailable"]
    cordoned: bool
    draining: bool
    labels: dict[str, str]
    runtimes: list[str]
    capacity: dict[str, int]
    instances: HostInstances
    controllers: list[HostControllerView]
    registered_at: str
    heartbeat_at: str


class HostList(msgspec.Struct, kw_only=True):
    items: list[HostView]
