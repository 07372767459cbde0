"""The controller's configuration: one frozen object from defaults, an optional TOML file and ``AIWG_*``.

Precedence (lowest first): defaults, the TOML file (``--config FILE``; keys are the field names
below, unknown keys are refused), then one environment variable per setting: one row of
:data:`SETTINGS` (proto/settings.py) each, rendered into docs/configuration.md (``make docs``).
``load_config`` validates everything and raises :class:`ConfigError` naming the offending key;
``agentic-controller`` prints it and exits non-zero rather than run half-configured.

Dev mode (``--dev``) keeps state under ``./.run`` and looks for hostd at ``./.run/hostd.sock``
(the same defaults as ``agentic-hostd --dev``). Production defaults are
``/var/lib/agentic-sandbox-controller`` and ``/run/agentic-sandbox/hostd.sock``.

An invalid ``AIWG_V1_SUNSET_DATE`` is the one setting that does not stop the start: the v1
compatibility contract says to log a warning and keep the default date.
"""

from __future__ import annotations

import ipaddress
import logging
import os
import re
import socket
import tomllib
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import msgspec

from agentic_sandbox.proto import DEV_STATE_DIR, PROD_HOSTD_SOCKET, dev_hostd_socket, settings
from agentic_sandbox.proto.settings import (
    Choice,
    Flag,
    Float,
    HostPort,
    Int,
    Kind,
    Setting,
    SettingError,
    Text,
    split_host_port,
)

log = logging.getLogger(__name__)

SECONDS = 1.0
MIB = 1024 * 1024

PROD_STATE_DIR = "/var/lib/agentic-sandbox-controller"

DEFAULT_LISTEN = "127.0.0.1:8122"
DEFAULT_V1_SUNSET = "Sun, 09 May 2027 00:00:00 GMT"
DEFAULT_HOSTD_CALL_TIMEOUT_S = 10 * SECONDS
DEFAULT_HOSTD_CONNECT_TIMEOUT_S = 2 * SECONDS
DEFAULT_HOSTD_PING_INTERVAL_S = 1 * SECONDS
DEFAULT_HOSTD_RECONNECT_MAX_S = 1 * SECONDS
DEFAULT_MAX_REQUEST_BYTES = 16 * MIB
DEFAULT_OPERATION_RETENTION_S = 24 * 3600 * SECONDS
DEFAULT_KEEP_ALIVE_TIMEOUT_S = 5 * SECONDS
DEFAULT_EVENT_RING_SIZE = 4096
DEFAULT_LOG_RING_SIZE = 4096
DEFAULT_WATCH_INTERVAL_S = 2 * SECONDS
DEFAULT_SSE_KEEPALIVE_S = 15 * SECONDS
DEFAULT_MAX_STREAM_FOLLOWERS = 64
DEFAULT_GRPC_MAX_CALLS = 100


class ConfigError(ValueError):
    """A setting is missing or invalid; the message names it."""


class ControllerConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """Everything the controller reads at start. Units are in the names; secrets are masked in repr.

    Each field's variable, accepted values and doc: its row in :data:`SETTINGS` below (rendered
    into docs/configuration.md); a TOML file's keys are the field names.
    """

    listen: str = DEFAULT_LISTEN
    tls_cert: str | None = None
    tls_key: str | None = None
    tls_client_auth: str = "none"
    tls_client_ca: str | None = None
    mtls_admin_allowlist: tuple[str, ...] = ()
    allow_plaintext: bool = False
    state_dir: str
    secrets_dir: str | None = None
    hostd_socket: str
    hostd_call_timeout_s: float = DEFAULT_HOSTD_CALL_TIMEOUT_S
    hostd_connect_timeout_s: float = DEFAULT_HOSTD_CONNECT_TIMEOUT_S
    hostd_ping_interval_s: float = DEFAULT_HOSTD_PING_INTERVAL_S
    hostd_reconnect_max_s: float = DEFAULT_HOSTD_RECONNECT_MAX_S
    admin_token: str | None = None
    admin_token_file: str
    operator_token: str | None = None
    operator_tokens_file: str | None = None
    v1_sunset: str = DEFAULT_V1_SUNSET
    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES
    keep_alive_timeout_s: float = DEFAULT_KEEP_ALIVE_TIMEOUT_S
    operation_retention_s: float = DEFAULT_OPERATION_RETENTION_S
    storage_dir: str
    loadouts_dir: str
    event_ring_size: int = DEFAULT_EVENT_RING_SIZE
    log_ring_size: int = DEFAULT_LOG_RING_SIZE
    watch_interval_s: float = DEFAULT_WATCH_INTERVAL_S
    sse_keepalive_s: float = DEFAULT_SSE_KEEPALIVE_S
    max_stream_followers: int = DEFAULT_MAX_STREAM_FOLLOWERS
    public_url: str | None = None
    legacy_pty_listen: str | None = None
    grpc_listen: str | None = None
    grpc_max_calls: int = DEFAULT_GRPC_MAX_CALLS
    pty_ping_interval_s: float = 30.0
    pty_ping_timeout_s: float = 90.0
    conformance_mode: bool = False
    conformance_fleet_size: int = 1
    task_retention_s: float = 7 * 24 * 3600.0
    task_retention_per_instance: int = 100_000
    agent_events_per_s: float = 5000.0
    agent_max_file_bytes: int = 256 * MIB
    agent_log_bytes: int = 1 * MIB
    agent_cancel_grace_s: float = 5.0
    idempotency_ttl_s: float = 86400.0
    idempotency_max_entries: int = 100_000
    push_allow_private: bool = False
    push_timeout_s: float = 10.0
    push_retry_s: float = 300.0
    push_backoff_s: float = 0.5
    push_max_queue: int = 1024
    warm_pools: dict[str, int] = {}
    database_url: str | None = None
    database_pool_min: int = 1
    database_pool_max: int = 10
    database_timeout_s: float = 5.0
    lease_ttl_s: float = 2.0
    notify_poll_s: float = 1.0
    advertise_url: str | None = None
    host_labels: dict[str, str] = {}
    host_heartbeat_s: float = 2.0
    host_timeout_s: float = 10.0
    host_max_instances: int = 0
    card_urls: str = "edge"
    #: ``--dev`` (or ``dev = true`` in the file): see the module's doc.
    dev: bool = False

    def __repr__(self) -> str:
        fields = []
        for name in self.__struct_fields__:
            value = getattr(self, name)
            if name in ("admin_token", "operator_token", "database_url") and value is not None:
                value = "***"  # a database URL may hold its password
            fields.append(f"{name}={value!r}")
        return f"ControllerConfig({', '.join(fields)})"

    @property
    def database_path(self) -> Path:
        return Path(self.state_dir) / "controller.db"

    @property
    def listen_host_port(self) -> tuple[str, int]:
        return _split_listen(self.listen, "listen")

    @property
    def scheme(self) -> str:
        return "https" if self.tls_cert else "http"

    @property
    def v1_sunset_datetime(self) -> datetime:
        return parse_imf_fixdate(self.v1_sunset)


# -- IMF-fixdate (RFC 9110 §5.6.7) --------------------------------------------------------------

_DAYS = ("Mon", "Tue", "Wed", "Thu", "Fri", "Sat", "Sun")
_MONTHS = ("Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec")
_IMF_RE = re.compile(
    r"^(?P<day>Mon|Tue|Wed|Thu|Fri|Sat|Sun), (?P<d>\d{2}) (?P<mon>"
    + "|".join(_MONTHS)
    + r") (?P<y>\d{4}) (?P<H>\d{2}):(?P<M>\d{2}):(?P<S>\d{2}) GMT$"
)


def parse_imf_fixdate(value: str) -> datetime:
    """Parse ``Sun, 09 May 2027 00:00:00 GMT`` strictly (the weekday must match); ValueError if not."""
    match = _IMF_RE.match(value)
    if match is None:
        raise ValueError(f"{value!r} is not an IMF-fixdate like {DEFAULT_V1_SUNSET!r}")
    when = datetime(
        int(match["y"]),
        _MONTHS.index(match["mon"]) + 1,
        int(match["d"]),
        int(match["H"]),
        int(match["M"]),
        int(match["S"]),
        tzinfo=UTC,
    )
    if _DAYS[when.weekday()] != match["day"]:
        raise ValueError(f"{value!r}: {when.date()} is a {_DAYS[when.weekday()]}, not a {match['day']}")
    return when


# -- loading -------------------------------------------------------------------------------------


def _split_listen(value: str, key: str) -> tuple[str, int]:
    try:
        return split_host_port(value)
    except ValueError:
        raise ConfigError(f"{key}={value!r} must be host:port (port 0-65535)") from None


def _read_file(path: str | os.PathLike[str]) -> dict[str, Any]:
    try:
        with open(path, "rb") as fh:
            return tomllib.load(fh)
    except OSError as exc:
        raise ConfigError(f"config file {os.fspath(path)!r}: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {os.fspath(path)!r} is not valid TOML: {exc}") from None


#: Most slots one warm pool keeps ready (hostd's bound).
MAX_POOL_SLOTS = 64


def _warm_pools(raw: Any, source: str) -> dict[str, int]:
    """``loadout=size,...`` (env) or a table of sizes (TOML): loadout names, sizes 0..64."""
    if isinstance(raw, str):
        pairs: list[tuple[str, Any]] = []
        for item in filter(None, (part.strip() for part in raw.split(","))):
            name, sep, size = item.partition("=")
            if not sep:
                raise SettingError(f"{source}: {item!r} is not loadout=size")
            pairs.append((name.strip(), size.strip()))
    elif isinstance(raw, dict):
        pairs = list(raw.items())
    else:
        raise SettingError(f"{source} must be loadout=size,... or a table")
    pools: dict[str, int] = {}
    for name, size in pairs:
        if not re.match(r"^[a-z][a-z0-9-]{1,62}$", str(name)):
            raise SettingError(f"{source}: {name!r} is not a loadout name")
        try:
            count = int(size)
        except (TypeError, ValueError):
            raise SettingError(f"{source}: the size of {name!r} is not an integer") from None
        if not 0 <= count <= MAX_POOL_SLOTS or isinstance(size, bool):
            raise SettingError(f"{source}: the size of {name!r} must be between 0 and {MAX_POOL_SLOTS}")
        if name in pools:
            raise SettingError(f"{source}: {name!r} is named twice")
        pools[str(name)] = count
    return pools


class WarmPools(Kind[dict[str, int]]):
    """``loadout=size,...`` (env) or a table of sizes (TOML)."""

    def parse(self, raw: object, source: str) -> dict[str, int]:
        return _warm_pools(raw, source)

    def accepts(self) -> str:
        return f"loadout=size,... (TOML: a table), sizes 0-{MAX_POOL_SLOTS}"

    def show(self, value: dict[str, int]) -> str:
        return ",".join(f"{name}={size}" for name, size in value.items())


#: A host label's key and value (as Kubernetes spells them, shorter).
LABEL_KEY = re.compile(r"^[a-z0-9]([a-z0-9._/-]{0,61}[a-z0-9])?$")
LABEL_VALUE = re.compile(r"^[A-Za-z0-9]([A-Za-z0-9._-]{0,61}[A-Za-z0-9])?$|^$")


class HostLabels(Kind[dict[str, str]]):
    """``key=value,...`` (env) or a table of strings (TOML)."""

    def parse(self, raw: object, source: str) -> dict[str, str]:
        if isinstance(raw, str):
            pairs = []
            for item in filter(None, (part.strip() for part in raw.split(","))):
                key, sep, value = item.partition("=")
                if not sep:
                    raise SettingError(f"{source}: {item!r} is not key=value")
                pairs.append((key.strip(), value.strip()))
        elif isinstance(raw, dict):
            pairs = [(str(k), v) for k, v in raw.items()]
        else:
            raise SettingError(f"{source} must be key=value,... or a table")
        labels: dict[str, str] = {}
        for key, value in pairs:
            if not isinstance(value, str) or not LABEL_KEY.match(key) or not LABEL_VALUE.match(value):
                raise SettingError(f"{source}: {key}={value!r} is not a label (lowercase key, plain value)")
            if key in labels:
                raise SettingError(f"{source}: {key!r} is named twice")
            labels[key] = value
        return labels

    def accepts(self) -> str:
        return "key=value,... (TOML: a table of strings)"

    def show(self, value: dict[str, str]) -> str:
        return ",".join(f"{key}={v}" for key, v in value.items())


class NameList(Kind[tuple[str, ...]]):
    """``name,...`` (env) or an array of strings (TOML): names without spaces, each once."""

    def parse(self, raw: object, source: str) -> tuple[str, ...]:
        if isinstance(raw, str):
            items: list[object] = [part.strip() for part in raw.split(",") if part.strip()]
        elif isinstance(raw, list):
            items = list(raw)
        else:
            raise SettingError(f"{source} must be name,... or an array of strings")
        names: list[str] = []
        for item in items:
            if not isinstance(item, str) or not item or any(ch.isspace() for ch in item) or len(item) > 256:
                raise SettingError(f"{source}: {item!r} is not a certificate name")
            if item in names:
                raise SettingError(f"{source}: {item!r} is named twice")
            names.append(item)
        return tuple(names)

    def accepts(self) -> str:
        return "name,... (TOML: an array of strings)"

    def show(self, value: tuple[str, ...]) -> str:
        return ",".join(value)


HOUR = 3600 * SECONDS
DAY = 24 * HOUR
#: The bounds of a hostd link's timers.
LINK_S = Float(minimum=0.01, maximum=HOUR)
#: The bounds of a timer that paces a stream or a socket.
PACE_S = Float(minimum=0.05, maximum=HOUR)

#: One row per setting of :class:`ControllerConfig`, in the order docs/configuration.md lists them.
SETTINGS = settings.SettingsTable(
    "agentic-controller",
    ControllerConfig,
    [
        Setting(
            field="listen",
            env="AIWG_LISTEN",
            kind=HostPort(),
            doc="Where to serve (one port for every surface: API, console, A2A).",
        ),
        Setting(
            field="tls_cert",
            env="AIWG_TLS_CERT",
            kind=Text(),
            doc="PEM certificate to serve HTTPS with; needs `AIWG_TLS_KEY` (both or neither). Unset = HTTP.",
        ),
        Setting(
            field="tls_key",
            env="AIWG_TLS_KEY",
            kind=Text(),
            doc="PEM private key of `AIWG_TLS_CERT`.",
        ),
        Setting(
            field="tls_client_auth",
            env="AIWG_TLS_CLIENT_AUTH",
            kind=Choice(choices=("none", "optional", "required")),
            doc="Client certificates (mTLS) on the HTTPS listener: `none`; `optional` (a certificate, if "
            "presented, must be signed by `AIWG_TLS_CLIENT_CA`; without one, bearer tokens decide); `required` "
            "(no connection without one). A presented certificate wins over a bearer token: one named in "
            "`AIWG_MTLS_ADMIN_ALLOWLIST` is the admin role, any other is refused (403) (docs/tls.md).",
        ),
        Setting(
            field="tls_client_ca",
            env="AIWG_TLS_CLIENT_CA",
            kind=Text(),
            doc="PEM bundle of the CAs whose client certificates are trusted; needs `AIWG_TLS_CLIENT_AUTH`.",
        ),
        Setting(
            field="mtls_admin_allowlist",
            env="AIWG_MTLS_ADMIN_ALLOWLIST",
            kind=NameList(),
            doc="Client certificate names (subject CN, or a DNS or URI subject alternative name) that are "
            "the admin role.",
        ),
        Setting(
            field="allow_plaintext",
            env="AIWG_ALLOW_PLAINTEXT",
            kind=Flag(),
            doc="Serve plain HTTP (and the legacy ws:// PTY port, and gRPC without TLS) on a non-loopback "
            "address; without it such a start is refused (for a TLS-terminating proxy in front).",
        ),
        Setting(
            field="state_dir",
            env="AIWG_STATE_DIR",
            kind=Text(),
            default=f"`{PROD_STATE_DIR}` (`--dev`: `./{DEV_STATE_DIR}`)",
            doc="Controller state: the SQLite database, the admin token file.",
        ),
        Setting(
            field="secrets_dir",
            env="AIWG_SECRETS_DIR",
            kind=Text(),
            default="unset (upstream's `SECRETS_DIR` sets it too)",
            doc="Upstream's secrets layout: `admin.token` (the admin token file) and `operator-tokens.toml` "
            "(operator tokens, reloaded on SIGHUP) are read from here (docs/upstream-deployment.md).",
        ),
        Setting(
            field="hostd_socket",
            env="AIWG_HOSTD_SOCKET",
            kind=Text(),
            default=f"`{PROD_HOSTD_SOCKET}` (`--dev`: `<state dir>/hostd.sock`)",
            doc="hostd's RPC socket (at most 107 bytes as an absolute path).",
        ),
        Setting(
            field="hostd_call_timeout_s",
            env="AIWG_HOSTD_CALL_TIMEOUT_S",
            kind=LINK_S,
            doc="Deadline of one hostd call; past it the HTTP request fails with 503.",
        ),
        Setting(
            field="hostd_connect_timeout_s",
            env="AIWG_HOSTD_CONNECT_TIMEOUT_S",
            kind=LINK_S,
            doc="Deadline of connecting to hostd and saying Hello.",
        ),
        Setting(
            field="hostd_ping_interval_s",
            env="AIWG_HOSTD_PING_INTERVAL_S",
            kind=LINK_S,
            doc="How often the link pings hostd to notice a hung peer.",
        ),
        Setting(
            field="hostd_reconnect_max_s",
            env="AIWG_HOSTD_RECONNECT_MAX_S",
            kind=LINK_S,
            doc="Cap of the backoff between reconnects to hostd.",
        ),
        Setting(
            field="admin_token",
            env="AIWG_ADMIN_TOKEN",
            kind=Text(),
            doc="Admin bearer token (at least 16 characters); unset = read from `AIWG_ADMIN_TOKEN_FILE`.",
        ),
        Setting(
            field="admin_token_file",
            env="AIWG_ADMIN_TOKEN_FILE",
            kind=Text(),
            default="`<secrets dir>/admin.token`, else `<state dir>/admin-token`",
            doc="File holding the admin token when `AIWG_ADMIN_TOKEN` is unset (`--dev` writes a fresh one); "
            "not needed when `operator-tokens.toml` names an admin token.",
        ),
        Setting(
            field="operator_token",
            env="AIWG_OPERATOR_TOKEN",
            kind=Text(),
            doc="Operator-role bearer token (at least 16 characters, not the admin token); unset = no operator role.",
        ),
        Setting(
            field="operator_tokens_file",
            env="AIWG_OPERATOR_TOKENS_FILE",
            kind=Text(),
            default="`<secrets dir>/operator-tokens.toml` (none without a secrets dir)",
            doc="Upstream's token file: `[[tokens]]` tables of `token` (or `token_sha256`, its hex SHA-256) and "
            '`role = "admin" | "operator"`; read at start if it exists and again on SIGHUP.',
        ),
        Setting(
            field="v1_sunset",
            env="AIWG_V1_SUNSET_DATE",
            kind=Text(),
            doc="IMF-fixdate of the `Sunset` header of /api/v1/ responses; an invalid one is logged and "
            "the default kept.",
        ),
        Setting(
            field="max_request_bytes",
            env="AIWG_MAX_REQUEST_BYTES",
            kind=Int(minimum=1024),
            doc="Largest request body accepted (413 above).",
        ),
        Setting(
            field="keep_alive_timeout_s",
            env="AIWG_KEEP_ALIVE_TIMEOUT_S",
            kind=PACE_S,
            doc="An idle keep-alive HTTP connection is closed after this long.",
        ),
        Setting(
            field="operation_retention_s",
            env="AIWG_OPERATION_RETENTION_S",
            kind=Float(minimum=0, maximum=365 * DAY),
            doc="How long ended operations stay readable.",
        ),
        Setting(
            field="storage_dir",
            env="AIWG_STORAGE_DIR",
            kind=Text(),
            default="`<state dir>/storage`",
            doc="Root of the agentshare tree (global/, inbox/, outbox/).",
        ),
        Setting(
            field="loadouts_dir",
            env="AIWG_LOADOUTS_DIR",
            kind=Text(),
            default="`<state dir>/loadouts`",
            doc="Operator-added loadout manifests.",
        ),
        Setting(
            field="event_ring_size",
            env="AIWG_EVENT_RING_SIZE",
            kind=Int(minimum=16, maximum=1_000_000),
            doc="Events held for /events (snapshot and resume).",
        ),
        Setting(
            field="log_ring_size",
            env="AIWG_LOG_RING_SIZE",
            kind=Int(minimum=16, maximum=1_000_000),
            doc="Log records held for /logs.",
        ),
        Setting(
            field="watch_interval_s",
            env="AIWG_WATCH_INTERVAL_S",
            kind=PACE_S,
            doc="How often hostd is polled for instance exits and sessions.",
        ),
        Setting(
            field="sse_keepalive_s",
            env="AIWG_SSE_KEEPALIVE_S",
            kind=PACE_S,
            doc="Keep-alive comment interval of the server-sent event streams (and HTTP/2 ping interval of the "
            "gRPC port's idle connections).",
        ),
        Setting(
            field="max_stream_followers",
            env="AIWG_MAX_STREAM_FOLLOWERS",
            kind=Int(minimum=1, maximum=10_000),
            doc="Concurrent followers of /events and of /logs, each (429 above).",
        ),
        Setting(
            field="public_url",
            env="AIWG_PUBLIC_URL",
            kind=Text(),
            doc="Base URL clients reach the controller at, an http(s) origin (AgentCard URLs); "
            "unset = the request's host.",
        ),
        Setting(
            field="legacy_pty_listen",
            env="AIWG_LEGACY_PTY_LISTEN",
            kind=HostPort(empty_ok=True),
            doc="Where to serve the legacy v1 PTY WebSocket (upstream's port 8121); unset or empty = not served.",
        ),
        Setting(
            field="grpc_listen",
            env="AIWG_GRPC_LISTEN",
            kind=HostPort(empty_ok=True),
            doc="Where to serve the A2A gRPC binding (TLS with `AIWG_TLS_CERT`/`AIWG_TLS_KEY` when set); "
            "unset or empty = not served.",
        ),
        Setting(
            field="grpc_max_calls",
            env="AIWG_GRPC_MAX_CALLS",
            kind=Int(minimum=1, maximum=10_000),
            doc="gRPC calls served at once, each on a thread of its own (a stream for as long as it is open); "
            "more are refused RESOURCE_EXHAUSTED.",
        ),
        Setting(
            field="pty_ping_interval_s",
            env="AIWG_PTY_PING_INTERVAL_S",
            kind=PACE_S,
            doc="A PTY attach socket is sent an app-level `ping` this often.",
        ),
        Setting(
            field="pty_ping_timeout_s",
            env="AIWG_PTY_PING_TIMEOUT_S",
            kind=Float(minimum=0.1, maximum=HOUR),
            doc="A PTY attach socket silent this long (no frame, no `pong`) is closed (1011) and its role freed.",
        ),
        Setting(
            field="conformance_mode",
            env="AIWG_CONFORMANCE_MODE",
            kind=Flag(),
            doc="A2A conformance mode: required-extension enforcement off, and the conformance instance "
            "on the echo loadout registered at start.",
        ),
        Setting(
            field="conformance_fleet_size",
            env="AIWG_CONFORMANCE_FLEET_SIZE",
            kind=Int(minimum=1, maximum=16),
            doc="Conformance mode: how many conformance instances (upstream's ids `00000000-0000-7000-8000-"
            "<index+1, 12 digits>`), their runtimes cycling host, container, VM (loadouts echo, busybox, tiny-vm).",
        ),
        Setting(
            field="task_retention_s",
            env="AIWG_TASK_RETENTION_S",
            kind=Float(minimum=0, maximum=10 * 365 * DAY),
            doc="How long ended A2A tasks (with their events and artifacts) stay.",
        ),
        Setting(
            field="task_retention_per_instance",
            env="AIWG_TASK_RETENTION_PER_INSTANCE",
            kind=Int(minimum=0, maximum=1_000_000_000),
            doc="Ended A2A tasks kept per instance at most (the oldest beyond it are pruned, as past "
            "AIWG_TASK_RETENTION_S); 0: no cap.",
        ),
        Setting(
            field="agent_events_per_s",
            env="AIWG_AGENT_EVENTS_PER_S",
            kind=Float(minimum=1, maximum=1_000_000),
            doc="Control-channel lines a task's agent may send a second, sustained (bursts of 5 s of it); "
            "past that its task fails and its process tree is killed.",
        ),
        Setting(
            field="agent_max_file_bytes",
            env="AIWG_AGENT_MAX_FILE_BYTES",
            kind=Int(minimum=1024, maximum=1 << 40),
            doc="Bytes of `raw` artifact parts (files) one task's agent may return; past that its task fails.",
        ),
        Setting(
            field="agent_log_bytes",
            env="AIWG_AGENT_LOG_BYTES",
            kind=Int(minimum=0, maximum=1 << 34),
            doc="stdout and stderr kept per task once its agent said `hello` (the rest is counted, not kept).",
        ),
        Setting(
            field="agent_cancel_grace_s",
            env="AIWG_AGENT_CANCEL_GRACE_S",
            kind=Float(minimum=0, maximum=3600),
            doc="How long an agent that speaks the protocol has to end a canceled task before its tree is killed.",
        ),
        Setting(
            field="idempotency_ttl_s",
            env="AIWG_IDEMPOTENCY_TTL",
            kind=Float(minimum=1, maximum=365 * DAY),
            doc="How long an `Idempotency-Key` entry replays its first response.",
        ),
        Setting(
            field="idempotency_max_entries",
            env="AIWG_IDEMPOTENCY_MAX_ENTRIES",
            kind=Int(minimum=1, maximum=10_000_000),
            doc="Most idempotency entries kept (the oldest go first).",
        ),
        Setting(
            field="push_allow_private",
            env="AIWG_PUSH_ALLOW_PRIVATE",
            kind=Flag(),
            doc="Push webhooks may be on loopback, private, link-local or reserved addresses "
            "(local receivers, conformance runs).",
        ),
        Setting(
            field="push_timeout_s",
            env="AIWG_PUSH_TIMEOUT_S",
            kind=Float(minimum=0.05, maximum=300),
            doc="One push delivery attempt (connect, send, answer) takes at most this.",
        ),
        Setting(
            field="push_retry_s",
            env="AIWG_PUSH_RETRY_S",
            kind=Float(minimum=0, maximum=7 * DAY),
            doc="A push event is retried (exponential backoff with jitter) for at most this long, then dropped.",
        ),
        Setting(
            field="push_backoff_s",
            env="AIWG_PUSH_BACKOFF_S",
            kind=Float(minimum=0.01, maximum=HOUR),
            doc="The first push retry waits about this long; each next one twice as long (up to 30 s).",
        ),
        Setting(
            field="push_max_queue",
            env="AIWG_PUSH_MAX_QUEUE",
            kind=Int(minimum=1, maximum=1_000_000),
            doc="Undelivered events a push config holds; older ones are dropped beyond it.",
        ),
        Setting(
            field="database_url",
            env="AIWG_DATABASE_URL",
            kind=Text(),
            default="unset (SQLite in the state dir)",
            doc="`postgresql://user:password@host:port/db`: keep the controller's state in PostgreSQL, "
            "shared by every controller given the same URL (docs/postgresql.md). Unset = the embedded "
            "SQLite file `<state dir>/controller.db`, for one controller.",
        ),
        Setting(
            field="database_pool_min",
            env="AIWG_DATABASE_POOL_MIN",
            kind=Int(minimum=0, maximum=1000),
            doc="PostgreSQL connections the controller keeps open when idle.",
        ),
        Setting(
            field="database_pool_max",
            env="AIWG_DATABASE_POOL_MAX",
            kind=Int(minimum=1, maximum=1000),
            doc="PostgreSQL connections the controller opens at most (plus one that listens for "
            "notifications); count them against the server's `max_connections` for every controller.",
        ),
        Setting(
            field="database_timeout_s",
            env="AIWG_DATABASE_TIMEOUT_S",
            kind=Float(minimum=0.1, maximum=HOUR),
            doc="How long a call waits for a PostgreSQL connection (and the start for the server) before "
            "it fails with 503.",
        ),
        Setting(
            field="lease_ttl_s",
            env="AIWG_LEASE_TTL_S",
            kind=Float(minimum=0.2, maximum=HOUR),
            doc="How long a controller's claim on a task's exec stream or a push config lasts unless renewed "
            "(renewed four times as often): a controller that dies is replaced after about this long.",
        ),
        Setting(
            field="notify_poll_s",
            env="AIWG_NOTIFY_POLL_S",
            kind=Float(minimum=0.05, maximum=HOUR),
            doc="With PostgreSQL: how often a controller checks the store for what another controller "
            "wrote, besides its notifications (the fallback that keeps it correct when one is missed).",
        ),
        Setting(
            field="advertise_url",
            env="AIWG_ADVERTISE_URL",
            kind=Text(),
            default="`http://<AIWG_LISTEN>` (a wildcard address: this machine's host name)",
            doc="With PostgreSQL: the origin other controllers reach this one at, to forward requests for "
            "this host's instances (docs/hosts.md).",
        ),
        Setting(
            field="host_labels",
            env="AIWG_HOST_LABELS",
            kind=HostLabels(),
            doc="Labels of this host (`zone=a,gpu=yes`), which a provision request may ask for "
            "(`host_label`); every controller of a host should say the same.",
        ),
        Setting(
            field="host_heartbeat_s",
            env="AIWG_HOST_HEARTBEAT_S",
            kind=Float(minimum=0.05, maximum=HOUR),
            doc="How often a controller says in the store that it and its host are alive (with the "
            "host's runtimes and capacity).",
        ),
        Setting(
            field="host_timeout_s",
            env="AIWG_HOST_TIMEOUT_S",
            kind=Float(minimum=0.1, maximum=DAY),
            doc="A host none of whose controllers said it is alive for this long is `unavailable`: "
            "its instances answer 503 and nothing is placed on it.",
        ),
        Setting(
            field="host_max_instances",
            env="AIWG_HOST_MAX_INSTANCES",
            kind=Int(minimum=0, maximum=1_000_000),
            doc="Instances placement puts on this host at most (0: no bound; memory decides).",
        ),
        Setting(
            field="card_urls",
            env="AIWG_CARD_URLS",
            kind=Choice(choices=("edge", "host")),
            doc="Which controller an AgentCard's interface URLs name: `edge`, the one the client asked "
            "(or `AIWG_PUBLIC_URL`); `host`, a controller of the instance's own host (`AIWG_ADVERTISE_URL`).",
        ),
        Setting(
            field="warm_pools",
            env="AIWG_WARM_POOLS",
            kind=WarmPools(),
            doc="Warm pools: loadout name -> slots hostd keeps ready (`busybox=2,tiny-vm=1`).",
        ),
    ],
    error=ConfigError,
    unlisted=("dev",),
)


def load_config(
    path: str | os.PathLike[str] | None = None, env: Mapping[str, str] | None = None, *, dev: bool = False
) -> ControllerConfig:
    """Build and validate the configuration; ``env`` defaults to ``os.environ``."""
    env = os.environ if env is None else env
    values: dict[str, Any] = {}
    if path is not None:
        data = _read_file(path)
        dev = dev or bool(data.pop("dev", False))
        values.update(SETTINGS.from_mapping(data, os.fspath(path)))
    values.update(upstream_settings(env))  # upstream's variables; ours win where both are set
    values.update(SETTINGS.from_env(env))

    state_dir = os.path.abspath(values.get("state_dir") or (DEV_STATE_DIR if dev else PROD_STATE_DIR))
    values["state_dir"] = state_dir
    values.setdefault("hostd_socket", dev_hostd_socket(state_dir) if dev else PROD_HOSTD_SOCKET)
    values["hostd_socket"] = os.path.abspath(values["hostd_socket"])
    if len(os.fsencode(values["hostd_socket"])) > 107:
        raise ConfigError(f"AIWG_HOSTD_SOCKET={values['hostd_socket']!r} is longer than a Unix socket path may be")
    secrets_dir = values.get("secrets_dir")
    if secrets_dir:
        values["secrets_dir"] = secrets_dir = os.path.abspath(secrets_dir)
        values.setdefault("admin_token_file", os.path.join(secrets_dir, "admin.token"))
        values.setdefault("operator_tokens_file", os.path.join(secrets_dir, "operator-tokens.toml"))
    values.setdefault("admin_token_file", os.path.join(state_dir, "admin-token"))
    values.setdefault("storage_dir", os.path.join(state_dir, "storage"))
    values.setdefault("loadouts_dir", os.path.join(state_dir, "loadouts"))

    tls_cert, tls_key = values.get("tls_cert"), values.get("tls_key")
    if bool(tls_cert) != bool(tls_key):
        raise ConfigError("AIWG_TLS_CERT and AIWG_TLS_KEY must be given together")
    for name, tls_path in (("AIWG_TLS_CERT", tls_cert), ("AIWG_TLS_KEY", tls_key)):
        if tls_path and not os.path.isfile(tls_path):
            raise ConfigError(f"{name}={tls_path!r} is not a readable file")
    _check_client_auth(values)
    _refuse_plaintext(values)
    for name in ("admin_token", "operator_token"):
        token = values.get(name)
        if token is not None and len(token) < 16:
            raise ConfigError(f"{SETTINGS[name].env} must be at least 16 characters")
    if values.get("admin_token") and values.get("admin_token") == values.get("operator_token"):
        raise ConfigError("AIWG_OPERATOR_TOKEN must differ from AIWG_ADMIN_TOKEN")
    url = values.get("database_url")
    if url is not None and not re.match(r"^postgres(ql)?://", url):
        raise ConfigError("AIWG_DATABASE_URL must be a postgresql:// URL (unset: SQLite in the state dir)")
    if values.get("database_pool_min", 1) > values.get("database_pool_max", 10):
        raise ConfigError("AIWG_DATABASE_POOL_MIN must not be above AIWG_DATABASE_POOL_MAX")
    for field, example in (("public_url", "https://host:8122"), ("advertise_url", "http://10.0.0.2:8122")):
        origin = values.get(field)
        if origin is not None:
            if not re.match(r"^https?://[^/\s]+$", origin.rstrip("/")):
                raise ConfigError(f"{SETTINGS[field].env}={origin!r} must be an http(s) origin like {example}")
            values[field] = origin.rstrip("/")
    if values.get("host_timeout_s", 10.0) <= values.get("host_heartbeat_s", 2.0):
        raise ConfigError("AIWG_HOST_TIMEOUT_S must be longer than AIWG_HOST_HEARTBEAT_S")

    sunset = values.get("v1_sunset", DEFAULT_V1_SUNSET)
    try:
        parse_imf_fixdate(sunset)
    except ValueError as exc:
        log.warning("AIWG_V1_SUNSET_DATE ignored, keeping %s: %s", DEFAULT_V1_SUNSET, exc)
        values["v1_sunset"] = DEFAULT_V1_SUNSET

    try:
        return ControllerConfig(**values, dev=dev)
    except (TypeError, msgspec.ValidationError) as exc:  # pragma: no cover - guarded above
        raise ConfigError(str(exc)) from None


#: Upstream's variables (its CI starts its server with these alone), as our settings' fields.
UPSTREAM_SECRETS_DIR = "SECRETS_DIR"
UPSTREAM_LISTEN_ADDR = "LISTEN_ADDR"


def upstream_settings(env: Mapping[str, str]) -> dict[str, Any]:
    """What upstream's ``LISTEN_ADDR`` and ``SECRETS_DIR`` say, as settings (``AIWG_*`` override them).

    ``LISTEN_ADDR=host:P`` is upstream's port layout: its gRPC port P (ours: the A2A gRPC binding),
    the legacy WebSocket port P+1 (the v1 PTY socket) and the HTTP port P+2 (every HTTP surface)."""
    values: dict[str, Any] = {}
    secrets = env.get(UPSTREAM_SECRETS_DIR)
    if secrets:
        values["secrets_dir"] = secrets
    listen = env.get(UPSTREAM_LISTEN_ADDR)
    if listen:
        host, port = _split_listen(listen, UPSTREAM_LISTEN_ADDR)
        if not 1 <= port <= 65533:
            raise ConfigError(f"{UPSTREAM_LISTEN_ADDR}={listen!r}: its port P must be 1-65533 (HTTP is on P+2)")
        shown = f"[{host}]" if ":" in host else host
        values["grpc_listen"] = f"{shown}:{port}"
        values["legacy_pty_listen"] = f"{shown}:{port + 1}"
        values["listen"] = f"{shown}:{port + 2}"
    return values


def _check_client_auth(values: dict[str, Any]) -> None:
    mode = values.get("tls_client_auth", "none")
    ca = values.get("tls_client_ca")
    if mode == "none":
        if ca or values.get("mtls_admin_allowlist"):
            raise ConfigError(
                "AIWG_TLS_CLIENT_CA and AIWG_MTLS_ADMIN_ALLOWLIST need AIWG_TLS_CLIENT_AUTH=optional|required"
            )
        return
    if not values.get("tls_cert"):
        raise ConfigError(f"AIWG_TLS_CLIENT_AUTH={mode} needs HTTPS: set AIWG_TLS_CERT and AIWG_TLS_KEY")
    if not ca:
        raise ConfigError(f"AIWG_TLS_CLIENT_AUTH={mode} needs AIWG_TLS_CLIENT_CA (the CAs of the client certificates)")
    if not os.path.isfile(ca):
        raise ConfigError(f"AIWG_TLS_CLIENT_CA={ca!r} is not a readable file")


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False  # a host name other than localhost: it may resolve anywhere


def _refuse_plaintext(values: dict[str, Any]) -> None:
    """Plain HTTP, ws:// or gRPC without TLS on a non-loopback address: only when allowed outright."""
    if values.get("allow_plaintext"):
        return
    tls = bool(values.get("tls_cert"))
    listeners = [("listen", values.get("listen", DEFAULT_LISTEN), tls)]
    listeners.append(("legacy_pty_listen", values.get("legacy_pty_listen"), False))  # upstream's port is ws://
    listeners.append(("grpc_listen", values.get("grpc_listen"), tls))
    for field, where, secure in listeners:
        if not where or secure:
            continue
        host, _ = _split_listen(where, field)
        if not is_loopback(host) and field == "legacy_pty_listen":
            raise ConfigError(
                f"AIWG_LEGACY_PTY_LISTEN={where!r}: the legacy v1 PTY port is plain ws://, refused on a "
                "non-loopback address: set AIWG_LEGACY_PTY_LISTEN= (empty: not served), or AIWG_ALLOW_PLAINTEXT=1"
            )
        if not is_loopback(host):
            raise ConfigError(
                f"{SETTINGS[field].env}={where!r} would serve without TLS on a non-loopback address: "
                "set AIWG_TLS_CERT and AIWG_TLS_KEY, or AIWG_ALLOW_PLAINTEXT=1 (behind a TLS-terminating proxy)"
            )


def advertised_url(config: ControllerConfig, bound: str | None = None) -> str:
    """The origin other controllers reach this one at: ``AIWG_ADVERTISE_URL``, else the address it
    listens on (``bound``, the URL the server bound, which knows the port of ``AIWG_LISTEN=...:0``;
    else ``AIWG_LISTEN``); a wildcard address becomes this machine's host name, which the other
    hosts must resolve."""
    if config.advertise_url:
        return config.advertise_url
    scheme = "https" if config.tls_cert else "http"
    where = config.listen
    if bound:
        scheme, _, where = bound.partition("://")
    host, port = split_host_port(where.rstrip("/"))
    if host in ("0.0.0.0", "::", ""):
        host = socket.gethostname()
    elif ":" in host:
        host = f"[{host}]"
    return f"{scheme}://{host}:{port}"
