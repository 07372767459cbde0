"""hostd's configuration: one frozen object, built from defaults, environment and flags.

Every setting is one row of :data:`SETTINGS` (proto/settings.py): its ``AIWG_*`` variable, the
values it accepts and one line of doc; its default is the field's. ``from_env`` reads the table,
then checks what relates settings to each other, and raises :class:`ConfigError` with a message that
names the variable; ``agentic-hostd`` prints it and exits non-zero rather than run half-configured.
docs/configuration.md is rendered from the table (``make docs``).

Dev mode (``--dev``) keeps state under ``./.run`` and the socket at ``./.run/hostd.sock``,
allows the invoking user, and does not need root. Production defaults are
``/var/lib/agentic-sandbox`` and ``/run/agentic-sandbox/hostd.sock``.
"""

from __future__ import annotations

import grp
import hashlib
import os
from collections.abc import Mapping
from pathlib import Path

import msgspec

from agentic_sandbox.proto import DEFAULT_MAX_FRAME_BYTES, DEV_STATE_DIR, PROD_HOSTD_SOCKET, dev_hostd_socket, settings
from agentic_sandbox.proto.settings import AbsPath, Choice, Flag, Float, Ids, Int, Setting, Text

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
    """Everything hostd reads from its environment. Units are in the names.

    Each field's variable, accepted values and doc: its row in :data:`SETTINGS` below (rendered
    into docs/configuration.md).
    """

    state_dir: str
    socket_path: str
    socket_mode: int = DEFAULT_SOCKET_MODE
    socket_group: str = ""
    allow_uids: frozenset[int] = frozenset()
    allow_gids: frozenset[int] = frozenset()
    ring_frames: int = DEFAULT_RING_FRAMES
    ring_bytes: int = DEFAULT_RING_BYTES
    ring_memory_bytes: int = DEFAULT_RING_MEMORY_BYTES
    spool_session_bytes: int = DEFAULT_SPOOL_SESSION_BYTES
    spool_total_bytes: int = DEFAULT_SPOOL_TOTAL_BYTES
    fd_store: bool = True
    max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES
    stop_grace_s: float = DEFAULT_STOP_GRACE_S
    wake_timeout_s: float = 60.0
    max_sessions: int = DEFAULT_MAX_SESSIONS
    max_execs: int = DEFAULT_MAX_EXECS
    max_connections: int = DEFAULT_MAX_CONNECTIONS
    cgroup_root: str = ""
    workspace_root: str = ""
    podman_socket: str = ""
    podman_service: bool = False
    podman_root: str = ""
    podman_runroot: str = ""
    podman_storage_driver: str = ""
    container_nofile: int = DEFAULT_CONTAINER_NOFILE
    container_nproc: int = DEFAULT_CONTAINER_NPROC
    libvirt_uri: str = DEFAULT_LIBVIRT_URI
    vm_domain_type: str = "kvm"
    vm_image_dir: str = DEFAULT_VM_IMAGE_DIR
    #: ``--dev``: see the module's doc.
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


PODMAN = "podman"
LIBVIRT = "libvirt (`kvm`: /dev/kvm)"

#: One row per setting of :class:`HostdConfig`, in the order docs/configuration.md lists them.
SETTINGS = settings.SettingsTable(
    "agentic-hostd",
    HostdConfig,
    [
        Setting(
            field="state_dir",
            env="AIWG_STATE_DIR",
            kind=Text(),
            default=f"`{PROD_STATE_DIR}` (`--dev`: `./{DEV_STATE_DIR}`)",
            doc="Root of hostd's state: instances/, spool/, checkpoints/, the state file. Flag: `--state-dir`.",
        ),
        Setting(
            field="socket_path",
            env="AIWG_HOSTD_SOCKET",
            kind=Text(),
            default=f"`{PROD_SOCKET}` (`--dev`: `<state dir>/hostd.sock`)",
            doc="The RPC socket (at most 107 bytes as an absolute path). Flag: `--socket`.",
        ),
        Setting(
            field="socket_mode",
            env="AIWG_HOSTD_SOCKET_MODE",
            kind=Int(maximum=0o777, base=8),
            doc="Mode of the socket file, in octal; never open to other users (no bits of 0o007).",
        ),
        Setting(
            field="socket_group",
            env="AIWG_HOSTD_SOCKET_GROUP",
            kind=Text(),
            doc="Group that owns the socket file; its members are allowed as peers. Must exist on the host.",
        ),
        Setting(
            field="allow_uids",
            env="AIWG_HOSTD_ALLOW_UIDS",
            kind=Ids(),
            default="none (root is always allowed; `--dev`: the invoking user)",
            doc="Peer uids allowed on the socket.",
        ),
        Setting(field="allow_gids", env="AIWG_HOSTD_ALLOW_GIDS", kind=Ids(), doc="Peer gids allowed on the socket."),
        Setting(
            field="ring_frames",
            env="AIWG_RING_FRAMES",
            kind=Int(minimum=16),
            doc="Output frames kept in memory per session and per exec.",
        ),
        Setting(
            field="ring_bytes",
            env="AIWG_RING_BYTES",
            kind=Int(minimum=64 * 1024),
            doc="Output bytes kept in memory per session and per exec.",
        ),
        Setting(
            field="ring_memory_bytes",
            env="AIWG_RING_MEMORY_BYTES",
            kind=Int(minimum=MIB),
            doc="In-memory output of all sessions together; each keeps its share (this / max sessions) "
            "and more while the total allows.",
        ),
        Setting(
            field="spool_session_bytes",
            env="AIWG_SPOOL_SESSION_BYTES",
            kind=Int(),
            doc="Session output older than what memory holds, on disk under `<state dir>/spool`, per "
            "session (0 = no spool: memory only).",
        ),
        Setting(
            field="spool_total_bytes",
            env="AIWG_SPOOL_TOTAL_BYTES",
            kind=Int(),
            doc="The spool of all sessions together (0 = no spool).",
        ),
        Setting(
            field="fd_store",
            env="AIWG_FD_STORE",
            kind=Flag(),
            doc="Under systemd (`NOTIFY_SOCKET` set), keep every running session's terminal in the "
            "service's file descriptor store, and its output on disk as it comes, so that sessions survive "
            "a crash of hostd (docs/hostd-upgrade.md); the unit sets `FileDescriptorStoreMax=`.",
        ),
        Setting(
            field="max_frame_bytes",
            env="AIWG_HOSTD_MAX_FRAME_BYTES",
            kind=Int(minimum=2 * MIB),
            doc="Largest RPC frame accepted or sent.",
        ),
        Setting(
            field="stop_grace_s",
            env="AIWG_STOP_GRACE_S",
            kind=Float(minimum=0, maximum=3600),
            doc="Seconds between SIGTERM and SIGKILL when an instance, session or exec is stopped.",
        ),
        Setting(
            field="wake_timeout_s",
            env="AIWG_WAKE_TIMEOUT_S",
            kind=Float(minimum=0.1, maximum=3600),
            doc="How long a request that needs a sleeping instance waits for it to wake before it fails "
            "with instance.wake_failed (the wake itself goes on).",
        ),
        Setting(
            field="max_sessions",
            env="AIWG_MAX_SESSIONS",
            kind=Int(minimum=1),
            doc=f"Sessions that may run at once ({RETAINED_PER_LIVE} times as many exited ones are kept).",
        ),
        Setting(
            field="max_execs",
            env="AIWG_MAX_EXECS",
            kind=Int(minimum=1),
            doc=f"Execs that may run at once ({RETAINED_PER_LIVE} times as many exited ones are kept).",
        ),
        Setting(
            field="max_connections",
            env="AIWG_MAX_CONNECTIONS",
            kind=Int(minimum=1),
            doc="Concurrent RPC connections.",
        ),
        Setting(
            field="cgroup_root",
            env="AIWG_CGROUP_ROOT",
            kind=AbsPath(also=("off",)),
            needs="cgroup v2, root",
            doc="Parent cgroup v2 directory of instances; empty = auto-detect, `off` = no cgroups.",
        ),
        Setting(
            field="workspace_root",
            env="AIWG_WORKSPACE_ROOT",
            kind=Text(),
            doc="Default working directory of instances without one (an existing directory); "
            "empty = the instance's own directory.",
        ),
        Setting(
            field="podman_socket",
            env="AIWG_PODMAN_SOCKET",
            kind=Text(check=podman_socket_url, rule="a Unix socket path or unix:// URL"),
            needs=PODMAN,
            doc="podman API socket of the image catalog and container instances; empty = no container runtime.",
        ),
        Setting(
            field="podman_service",
            env="AIWG_PODMAN_SERVICE",
            kind=Flag(),
            needs=PODMAN,
            doc="Start `podman system service` on the podman socket when nothing answers there "
            "(and stop it on exit); needs `AIWG_PODMAN_SOCKET`.",
        ),
        Setting(
            field="podman_root",
            env="AIWG_PODMAN_ROOT",
            kind=AbsPath(),
            needs=PODMAN,
            doc="Graph root of the podman service hostd starts; empty = podman's default.",
        ),
        Setting(
            field="podman_runroot",
            env="AIWG_PODMAN_RUNROOT",
            kind=AbsPath(max_chars=MAX_PODMAN_RUNROOT_CHARS),
            needs=PODMAN,
            doc="Run root of the podman service hostd starts; empty = podman's default.",
        ),
        Setting(
            field="podman_storage_driver",
            env="AIWG_PODMAN_STORAGE_DRIVER",
            kind=Text(pattern=r"[^\W_]+", rule="a storage driver name (overlay, vfs, ...)"),
            needs=PODMAN,
            doc="Storage driver of the podman service hostd starts; empty = podman's default.",
        ),
        Setting(
            field="container_nofile",
            env="AIWG_CONTAINER_NOFILE",
            kind=Int(minimum=64),
            needs=PODMAN,
            doc="`nofile` rlimit of every container (soft = hard).",
        ),
        Setting(
            field="container_nproc",
            env="AIWG_CONTAINER_NPROC",
            kind=Int(minimum=16),
            needs=PODMAN,
            doc="`nproc` rlimit of every container (soft = hard).",
        ),
        Setting(
            field="libvirt_uri",
            env="AIWG_LIBVIRT_URI",
            kind=Text(pattern=r"(qemu|test)(\+unix)?://[^\s]*", rule="a qemu:// or test:// libvirt URI, or empty"),
            empty_is_value=True,
            needs=LIBVIRT,
            doc="libvirt connection of the VM runtime; empty = no VM runtime.",
        ),
        Setting(
            field="vm_domain_type",
            env="AIWG_VM_DOMAIN_TYPE",
            kind=Choice(choices=VM_DOMAIN_TYPES),
            default="`kvm` (`--dev`: `qemu`)",
            needs=LIBVIRT,
            doc="libvirt domain type of VMs: `kvm`, or `qemu` (software emulation, slow).",
        ),
        Setting(
            field="vm_image_dir",
            env="AIWG_VM_IMAGE_DIR",
            kind=AbsPath(),
            needs=LIBVIRT,
            doc="Default direct-boot guest image (scripts/build-guest-image.py); outside the state dir, "
            "which QEMU's user cannot reach.",
        ),
    ],
    error=ConfigError,
    unlisted=("dev",),
)


def from_env(env: Mapping[str, str] | None = None, *, dev: bool = False) -> HostdConfig:
    """Build and validate the configuration from ``env`` (default: ``os.environ``)."""
    env = os.environ if env is None else env
    values = SETTINGS.from_env(env)
    default_state_dir = os.path.abspath(DEV_STATE_DIR) if dev else PROD_STATE_DIR
    state_dir = os.path.abspath(values.get("state_dir") or default_state_dir)
    socket_path = os.path.abspath(values.get("socket_path") or (dev_hostd_socket(state_dir) if dev else PROD_SOCKET))
    # sun_path holds 108 bytes including the terminating NUL.
    if len(os.fsencode(socket_path)) > 107:
        raise ConfigError(f"AIWG_HOSTD_SOCKET={socket_path!r} is longer than a Unix socket path may be (107 bytes)")
    values.update(state_dir=state_dir, socket_path=socket_path)

    allow_uids: frozenset[int] = values.get("allow_uids", frozenset())
    allow_gids: frozenset[int] = values.get("allow_gids", frozenset())
    socket_group = values.get("socket_group", "")
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
    values.update(allow_uids=allow_uids, allow_gids=allow_gids)

    mode = values.get("socket_mode", DEFAULT_SOCKET_MODE)
    if mode & 0o007:
        raise ConfigError(f"AIWG_HOSTD_SOCKET_MODE={oct(mode)} would let any local user drive hostd")
    workspace_root = values.get("workspace_root", "")
    if workspace_root:
        if not os.path.isdir(workspace_root):
            raise ConfigError(f"AIWG_WORKSPACE_ROOT={workspace_root!r} is not a directory")
        values["workspace_root"] = os.path.abspath(workspace_root)
    if values.get("podman_service") and not values.get("podman_socket"):
        raise ConfigError("AIWG_PODMAN_SERVICE=1 needs AIWG_PODMAN_SOCKET (where the service listens)")
    # KVM in production; dev mode (and the tests, which run it) emulate: KVM guests hang on some hosts.
    values.setdefault("vm_domain_type", "qemu" if dev else "kvm")
    return HostdConfig(**values, dev=dev)
