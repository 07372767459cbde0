"""hostd's configuration: one frozen object, built from defaults, environment and flags.

Every setting has one ``AIWG_*`` variable, one flag and one default. ``from_env`` validates and
raises :class:`ConfigError` with a message that names the setting; ``agentic-hostd`` prints it
and exits non-zero rather than run half-configured.

Dev mode (``--dev``) keeps state under ``./.run`` and the socket at ``./.run/hostd.sock``,
allows the invoking user, and does not need root. Production defaults are
``/var/lib/agentic-sandbox`` and ``/run/agentic-sandbox/hostd.sock``.
"""

from __future__ import annotations

import grp
import hashlib
import os
import re
from collections.abc import Mapping
from pathlib import Path

import msgspec

from agentic_sandbox.proto import DEFAULT_MAX_FRAME_BYTES, DEV_STATE_DIR, PROD_HOSTD_SOCKET, dev_hostd_socket

SECONDS = 1.0
MIB = 1024 * 1024

PROD_STATE_DIR = "/var/lib/agentic-sandbox"
PROD_SOCKET = PROD_HOSTD_SOCKET  # the socket paths are proto's (proto/paths.py), shared with every client

DEFAULT_RING_FRAMES = 1000
DEFAULT_RING_BYTES = 4 * MIB
DEFAULT_RING_MEMORY_BYTES = 128 * MIB
DEFAULT_SPOOL_SESSION_BYTES = 256 * MIB
DEFAULT_SPOOL_TOTAL_BYTES = 4096 * MIB
MAX_SPOOL_SEGMENT_BYTES = 4 * MIB
DEFAULT_STOP_GRACE_S = 5 * SECONDS
DEFAULT_SOCKET_MODE = 0o660
DEFAULT_MAX_SESSIONS = 256
DEFAULT_MAX_EXECS = 256
DEFAULT_MAX_CONNECTIONS = 128
#: Explicit container rlimits: podman's own defaults exceed what runc may set here (DESIGN.md §6).
DEFAULT_CONTAINER_NOFILE = 4096
DEFAULT_CONTAINER_NPROC = 4096
#: podman refuses a run root longer than this.
MAX_PODMAN_RUNROOT_CHARS = 50
RETAINED_PER_LIVE = 4
DEFAULT_LIBVIRT_URI = "qemu:///system"
#: Outside the state dir on purpose: QEMU runs as libvirt's own user, which must reach the image,
#: and the state dir is 0700.
DEFAULT_VM_IMAGE_DIR = "/var/cache/agentic-sandbox/guest-image"
VM_DOMAIN_TYPES = ("kvm", "qemu")


class ConfigError(ValueError):
    """A setting is missing or invalid; the message names it."""


class HostdConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """Everything hostd reads from its environment. Units are in the names."""

    #: Root of hostd's state: instances/, state file. AIWG_STATE_DIR
    state_dir: str
    #: The RPC socket. AIWG_HOSTD_SOCKET
    socket_path: str
    #: Mode of the socket file. AIWG_HOSTD_SOCKET_MODE (octal)
    socket_mode: int = DEFAULT_SOCKET_MODE
    #: Group that owns the socket file; its members are allowed as peers. AIWG_HOSTD_SOCKET_GROUP
    socket_group: str = ""
    #: Peer uids allowed on the socket (root is always allowed). AIWG_HOSTD_ALLOW_UIDS
    allow_uids: frozenset[int] = frozenset()
    #: Peer gids allowed on the socket. AIWG_HOSTD_ALLOW_GIDS
    allow_gids: frozenset[int] = frozenset()
    #: Output ring bounds per session/exec. AIWG_RING_FRAMES, AIWG_RING_BYTES
    ring_frames: int = DEFAULT_RING_FRAMES
    ring_bytes: int = DEFAULT_RING_BYTES
    #: In-memory output of all sessions together; each keeps its share (this / max_sessions) and
    #: more while the total allows. AIWG_RING_MEMORY_BYTES
    ring_memory_bytes: int = DEFAULT_RING_MEMORY_BYTES
    #: Session output older than what memory holds, on disk under ``<state_dir>/spool``, per
    #: session and in total (0 = no spool: memory only). AIWG_SPOOL_SESSION_BYTES, AIWG_SPOOL_TOTAL_BYTES
    spool_session_bytes: int = DEFAULT_SPOOL_SESSION_BYTES
    spool_total_bytes: int = DEFAULT_SPOOL_TOTAL_BYTES
    #: Largest frame accepted or sent. AIWG_HOSTD_MAX_FRAME_BYTES
    max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES
    #: SIGTERM → SIGKILL grace for stop/kill. AIWG_STOP_GRACE_S
    stop_grace_s: float = DEFAULT_STOP_GRACE_S
    #: Sessions that may run at once. AIWG_MAX_SESSIONS
    max_sessions: int = DEFAULT_MAX_SESSIONS
    #: Execs that may run at once. AIWG_MAX_EXECS
    max_execs: int = DEFAULT_MAX_EXECS
    #: Concurrent RPC connections. AIWG_MAX_CONNECTIONS
    max_connections: int = DEFAULT_MAX_CONNECTIONS
    #: Parent cgroup v2 directory for instances; "" = auto-detect, "off" = never. AIWG_CGROUP_ROOT
    cgroup_root: str = ""
    #: Default working directory for instances without one ("" = the instance dir). AIWG_WORKSPACE_ROOT
    workspace_root: str = ""
    #: podman API socket (``unix://`` URL) for the image catalog; "" = none. AIWG_PODMAN_SOCKET
    podman_socket: str = ""
    #: Start ``podman system service`` on ``podman_socket`` when nothing answers there (and stop
    #: it on exit). AIWG_PODMAN_SERVICE (``1``/``0``)
    podman_service: bool = False
    #: Storage of the podman service hostd starts ("" = podman's defaults): graph root, run root
    #: (at most 50 characters) and storage driver. AIWG_PODMAN_ROOT, AIWG_PODMAN_RUNROOT, AIWG_PODMAN_STORAGE_DRIVER
    podman_root: str = ""
    podman_runroot: str = ""
    podman_storage_driver: str = ""
    #: nofile / nproc rlimits of every container (soft = hard). AIWG_CONTAINER_NOFILE, AIWG_CONTAINER_NPROC
    container_nofile: int = DEFAULT_CONTAINER_NOFILE
    container_nproc: int = DEFAULT_CONTAINER_NPROC
    #: libvirt connection of the VM runtime ("" = no VM runtime). AIWG_LIBVIRT_URI
    libvirt_uri: str = DEFAULT_LIBVIRT_URI
    #: libvirt domain type of VMs: ``kvm``, or ``qemu`` (software emulation). AIWG_VM_DOMAIN_TYPE
    vm_domain_type: str = "kvm"
    #: Default direct-boot guest image (scripts/build-guest-image.py). AIWG_VM_IMAGE_DIR
    vm_image_dir: str = DEFAULT_VM_IMAGE_DIR
    dev: bool = False

    @property
    def retained_per_live(self) -> int:
        """Exited sessions (and, separately, execs) kept for their exit status and output until
        deleted, per one that may run: past that new ones are refused, never old ones dropped
        behind a caller's back."""
        return RETAINED_PER_LIVE

    @property
    def instances_dir(self) -> Path:
        return Path(self.state_dir) / "instances"

    @property
    def spool_dir(self) -> Path:
        return Path(self.state_dir) / "spool"

    @property
    def spool_segment_bytes(self) -> int:
        """Segments small enough that a bound drops a fraction of a session's history at a time."""
        return max(64 * 1024, min(MAX_SPOOL_SEGMENT_BYTES, self.spool_session_bytes // 8))

    @property
    def guest_image_dir(self) -> Path:
        return Path(self.vm_image_dir)

    @property
    def checkpoints_dir(self) -> Path:
        return Path(self.state_dir) / "checkpoints"

    @property
    def forks_dir(self) -> Path:
        """Memory snapshots of VM forks, for the few seconds between snapshot and restore."""
        return Path(self.state_dir) / "forks"

    @property
    def pools_file(self) -> Path:
        return Path(self.state_dir) / "warm-pools.json"

    @property
    def state_file(self) -> Path:
        return Path(self.state_dir) / "hostd-state.json"

    def tree_id(self, kind: str, ident: str) -> str:
        """The ``AIWG_TREE`` mark of one process tree: ``<namespace>:<kind>:<id>``.

        Ids are only unique per kind (a caller may name a session like an instance), and two
        hostds (tests, a dev hostd beside the system one) may use the same ids: the kind and a
        namespace derived from the state dir keep one tree's sweep from ever touching another's.
        Stable across restarts, so a re-adopted instance is still found by its mark.
        """
        return f"{self.namespace}:{kind}:{ident}"

    @property
    def namespace(self) -> str:
        """What tells this hostd's things from another's (tree marks, container labels, domain
        metadata): a hash of its state dir."""
        return hashlib.sha256(self.state_dir.encode()).hexdigest()[:12]

    def peer_allowed(self, uid: int, gid: int) -> bool:
        return uid == 0 or uid in self.allow_uids or gid in self.allow_gids


def podman_socket_url(socket: str) -> str:
    """``/run/podman.sock`` or ``unix:///run/podman.sock`` -> ``unix:///run/podman.sock``.

    Only Unix sockets: podman-py's ``ssh://`` transport would run an ssh client, and a TCP
    podman API has no authentication.
    """
    if socket.startswith("unix://"):
        socket = socket.removeprefix("unix://")
    elif "://" in socket:
        raise ValueError("only unix:// podman sockets are supported")
    if not socket.startswith("/"):
        raise ValueError("the podman socket must be an absolute path")
    return "unix://" + socket


def _int(env: Mapping[str, str], name: str, default: int, *, base: int = 10, minimum: int = 0) -> int:
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw, base)
    except ValueError:
        raise ConfigError(f"{name}={raw!r} is not an integer") from None
    if value < minimum:
        raise ConfigError(f"{name}={value} must be at least {minimum}")
    return value


def _float(env: Mapping[str, str], name: str, default: float) -> float:
    raw = env.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        raise ConfigError(f"{name}={raw!r} is not a number") from None
    if not 0 <= value <= 3600:
        raise ConfigError(f"{name}={value} must be between 0 and 3600")
    return value


def _bool(env: Mapping[str, str], name: str) -> bool:
    raw = env.get(name, "").strip().lower()
    if raw in ("", "0", "false", "no", "off"):
        return False
    if raw in ("1", "true", "yes", "on"):
        return True
    raise ConfigError(f"{name}={env.get(name)!r} must be 1 or 0")


def _ids(env: Mapping[str, str], name: str) -> frozenset[int]:
    raw = env.get(name, "").replace(",", " ").split()
    try:
        return frozenset(int(x) for x in raw)
    except ValueError:
        raise ConfigError(f"{name}={env.get(name)!r} must be a comma-separated list of numeric ids") from None


def from_env(env: Mapping[str, str] | None = None, *, dev: bool = False) -> HostdConfig:
    """Build and validate the configuration from ``env`` (default: ``os.environ``)."""
    env = os.environ if env is None else env
    if dev:
        state_dir = env.get("AIWG_STATE_DIR") or os.path.abspath(DEV_STATE_DIR)
        socket_path = env.get("AIWG_HOSTD_SOCKET") or dev_hostd_socket(state_dir)
    else:
        state_dir = env.get("AIWG_STATE_DIR") or PROD_STATE_DIR
        socket_path = env.get("AIWG_HOSTD_SOCKET") or PROD_SOCKET
    state_dir = os.path.abspath(state_dir)
    socket_path = os.path.abspath(socket_path)
    # sun_path holds 108 bytes including the terminating NUL.
    if len(os.fsencode(socket_path)) > 107:
        raise ConfigError(f"AIWG_HOSTD_SOCKET={socket_path!r} is longer than a Unix socket path may be (107 bytes)")

    allow_uids = _ids(env, "AIWG_HOSTD_ALLOW_UIDS")
    allow_gids = _ids(env, "AIWG_HOSTD_ALLOW_GIDS")
    socket_group = env.get("AIWG_HOSTD_SOCKET_GROUP", "")
    if socket_group:
        # The group that may open the socket file is the group we let through SO_PEERCRED:
        # one setting, so the two can never disagree.
        try:
            allow_gids |= {grp.getgrnam(socket_group).gr_gid}
        except KeyError:
            raise ConfigError(f"AIWG_HOSTD_SOCKET_GROUP={socket_group!r} is not a group on this host") from None
    if dev:
        # Dev mode serves the user who started it without further configuration.
        allow_uids |= {os.getuid()}

    ring_frames = _int(env, "AIWG_RING_FRAMES", DEFAULT_RING_FRAMES, minimum=16)
    ring_bytes = _int(env, "AIWG_RING_BYTES", DEFAULT_RING_BYTES, minimum=64 * 1024)
    max_frame = _int(env, "AIWG_HOSTD_MAX_FRAME_BYTES", DEFAULT_MAX_FRAME_BYTES, minimum=2 * MIB)
    mode = _int(env, "AIWG_HOSTD_SOCKET_MODE", DEFAULT_SOCKET_MODE, base=8)
    if mode & ~0o777:
        raise ConfigError(f"AIWG_HOSTD_SOCKET_MODE={oct(mode)} is not a permission mode")
    if mode & 0o007:
        raise ConfigError(f"AIWG_HOSTD_SOCKET_MODE={oct(mode)} would let any local user drive hostd")
    cgroup_root = env.get("AIWG_CGROUP_ROOT", "")
    if cgroup_root not in ("", "off") and not os.path.isabs(cgroup_root):
        raise ConfigError(f"AIWG_CGROUP_ROOT={cgroup_root!r} must be an absolute path, empty or 'off'")
    workspace_root = env.get("AIWG_WORKSPACE_ROOT", "")
    if workspace_root and not os.path.isdir(workspace_root):
        raise ConfigError(f"AIWG_WORKSPACE_ROOT={workspace_root!r} is not a directory")
    podman_socket = env.get("AIWG_PODMAN_SOCKET", "")
    if podman_socket:
        try:
            podman_socket = podman_socket_url(podman_socket)
        except ValueError as exc:
            raise ConfigError(f"AIWG_PODMAN_SOCKET={podman_socket!r}: {exc}") from None
    podman_service = _bool(env, "AIWG_PODMAN_SERVICE")
    if podman_service and not podman_socket:
        raise ConfigError("AIWG_PODMAN_SERVICE=1 needs AIWG_PODMAN_SOCKET (where the service listens)")
    podman_root, podman_runroot = env.get("AIWG_PODMAN_ROOT", ""), env.get("AIWG_PODMAN_RUNROOT", "")
    for name, value in (("AIWG_PODMAN_ROOT", podman_root), ("AIWG_PODMAN_RUNROOT", podman_runroot)):
        if value and not os.path.isabs(value):
            raise ConfigError(f"{name}={value!r} must be an absolute path")
    if len(podman_runroot) > MAX_PODMAN_RUNROOT_CHARS:
        raise ConfigError(f"AIWG_PODMAN_RUNROOT={podman_runroot!r} is longer than podman allows (50 characters)")
    storage_driver = env.get("AIWG_PODMAN_STORAGE_DRIVER", "")
    if storage_driver and not storage_driver.isalnum():
        raise ConfigError(f"AIWG_PODMAN_STORAGE_DRIVER={storage_driver!r} is not a storage driver name")

    libvirt_uri = env.get("AIWG_LIBVIRT_URI", DEFAULT_LIBVIRT_URI)
    if libvirt_uri and not re.fullmatch(r"(qemu|test)(\+unix)?://[^\s]*", libvirt_uri):
        raise ConfigError(f"AIWG_LIBVIRT_URI={libvirt_uri!r} must be a qemu:// or test:// libvirt URI, or empty")
    # KVM in production; dev mode (and the tests, which run it) emulate: KVM guests hang on some hosts.
    vm_domain_type = env.get("AIWG_VM_DOMAIN_TYPE") or ("qemu" if dev else "kvm")
    if vm_domain_type not in VM_DOMAIN_TYPES:
        raise ConfigError(f"AIWG_VM_DOMAIN_TYPE={vm_domain_type!r} must be one of {', '.join(VM_DOMAIN_TYPES)}")
    vm_image_dir = env.get("AIWG_VM_IMAGE_DIR") or DEFAULT_VM_IMAGE_DIR
    if not os.path.isabs(vm_image_dir):
        raise ConfigError(f"AIWG_VM_IMAGE_DIR={vm_image_dir!r} must be an absolute path")

    return HostdConfig(
        state_dir=state_dir,
        socket_path=socket_path,
        socket_mode=mode,
        socket_group=socket_group,
        allow_uids=allow_uids,
        allow_gids=allow_gids,
        ring_frames=ring_frames,
        ring_bytes=ring_bytes,
        ring_memory_bytes=_int(env, "AIWG_RING_MEMORY_BYTES", DEFAULT_RING_MEMORY_BYTES, minimum=MIB),
        spool_session_bytes=_int(env, "AIWG_SPOOL_SESSION_BYTES", DEFAULT_SPOOL_SESSION_BYTES),
        spool_total_bytes=_int(env, "AIWG_SPOOL_TOTAL_BYTES", DEFAULT_SPOOL_TOTAL_BYTES),
        max_frame_bytes=max_frame,
        stop_grace_s=_float(env, "AIWG_STOP_GRACE_S", DEFAULT_STOP_GRACE_S),
        max_sessions=_int(env, "AIWG_MAX_SESSIONS", DEFAULT_MAX_SESSIONS, minimum=1),
        max_execs=_int(env, "AIWG_MAX_EXECS", DEFAULT_MAX_EXECS, minimum=1),
        max_connections=_int(env, "AIWG_MAX_CONNECTIONS", DEFAULT_MAX_CONNECTIONS, minimum=1),
        cgroup_root=cgroup_root,
        workspace_root=os.path.abspath(workspace_root) if workspace_root else "",
        podman_socket=podman_socket,
        podman_service=podman_service,
        podman_root=podman_root,
        podman_runroot=podman_runroot,
        podman_storage_driver=storage_driver,
        container_nofile=_int(env, "AIWG_CONTAINER_NOFILE", DEFAULT_CONTAINER_NOFILE, minimum=64),
        container_nproc=_int(env, "AIWG_CONTAINER_NPROC", DEFAULT_CONTAINER_NPROC, minimum=16),
        libvirt_uri=libvirt_uri,
        vm_domain_type=vm_domain_type,
        vm_image_dir=vm_image_dir,
        dev=dev,
    )
