"""The controller's configuration: one frozen object from defaults, an optional TOML file and ``AIWG_*``.

Precedence (lowest first): defaults, the TOML file (``--config FILE``; keys are the field names
below, unknown keys are refused), then one environment variable per setting. ``load_config``
validates everything and raises :class:`ConfigError` naming the offending key;
``agentic-controller`` prints it and exits non-zero rather than run half-configured.

Dev mode (``--dev``) keeps state under ``./.run`` and looks for hostd at ``./.run/hostd.sock``
(the same defaults as ``agentic-hostd --dev``). Production defaults are
``/var/lib/agentic-sandbox-controller`` and ``/run/agentic-sandbox/hostd.sock``.

An invalid ``AIWG_V1_SUNSET_DATE`` is the one setting that does not stop the start: the v1
compatibility contract says to log a warning and keep the default date.
"""

from __future__ import annotations

import logging
import os
import re
import tomllib
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import msgspec

from agentic_sandbox.proto import DEV_STATE_DIR, PROD_HOSTD_SOCKET, dev_hostd_socket

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


class ConfigError(ValueError):
    """A setting is missing or invalid; the message names it."""


class ControllerConfig(msgspec.Struct, frozen=True, forbid_unknown_fields=True, kw_only=True):
    """Everything the controller reads at start. Units are in the names; secrets are masked in repr."""

    #: host:port to serve on (one port for every surface). AIWG_LISTEN
    listen: str = DEFAULT_LISTEN
    #: PEM certificate and key; both or neither. AIWG_TLS_CERT, AIWG_TLS_KEY
    tls_cert: str | None = None
    tls_key: str | None = None
    #: Controller state: SQLite database, dev admin token. AIWG_STATE_DIR
    state_dir: str
    #: hostd's RPC socket. AIWG_HOSTD_SOCKET
    hostd_socket: str
    #: Deadline of one hostd call; past it the HTTP request fails with 503. AIWG_HOSTD_CALL_TIMEOUT_S
    hostd_call_timeout_s: float = DEFAULT_HOSTD_CALL_TIMEOUT_S
    #: Deadline of connect + Hello. AIWG_HOSTD_CONNECT_TIMEOUT_S
    hostd_connect_timeout_s: float = DEFAULT_HOSTD_CONNECT_TIMEOUT_S
    #: How often the link pings hostd to notice a hung peer. AIWG_HOSTD_PING_INTERVAL_S
    hostd_ping_interval_s: float = DEFAULT_HOSTD_PING_INTERVAL_S
    #: Cap of the reconnect backoff. AIWG_HOSTD_RECONNECT_MAX_S
    hostd_reconnect_max_s: float = DEFAULT_HOSTD_RECONNECT_MAX_S
    #: Admin bearer token (AIWG_ADMIN_TOKEN); else read from admin_token_file (AIWG_ADMIN_TOKEN_FILE,
    #: default <state_dir>/admin-token, written with a fresh token in dev mode).
    admin_token: str | None = None
    admin_token_file: str
    #: Optional operator-role bearer token. AIWG_OPERATOR_TOKEN
    operator_token: str | None = None
    #: IMF-fixdate for the Sunset header of /api/v1/ responses. AIWG_V1_SUNSET_DATE
    v1_sunset: str = DEFAULT_V1_SUNSET
    #: Largest request body accepted (413 above). AIWG_MAX_REQUEST_BYTES
    max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES
    #: An idle keep-alive HTTP connection is closed after this long. AIWG_KEEP_ALIVE_TIMEOUT_S
    keep_alive_timeout_s: float = DEFAULT_KEEP_ALIVE_TIMEOUT_S
    #: How long ended operations stay readable. AIWG_OPERATION_RETENTION_S
    operation_retention_s: float = DEFAULT_OPERATION_RETENTION_S
    #: Root of the agentshare tree (global/, inbox/, outbox/). AIWG_STORAGE_DIR
    storage_dir: str
    #: Operator-added loadout manifests. AIWG_LOADOUTS_DIR
    loadouts_dir: str
    #: Events held for /events (snapshot and resume). AIWG_EVENT_RING_SIZE
    event_ring_size: int = DEFAULT_EVENT_RING_SIZE
    #: Log records held for /logs. AIWG_LOG_RING_SIZE
    log_ring_size: int = DEFAULT_LOG_RING_SIZE
    #: How often hostd is polled for instance exits and sessions. AIWG_WATCH_INTERVAL_S
    watch_interval_s: float = DEFAULT_WATCH_INTERVAL_S
    #: Keep-alive comment interval of the SSE streams. AIWG_SSE_KEEPALIVE_S
    sse_keepalive_s: float = DEFAULT_SSE_KEEPALIVE_S
    #: Concurrent followers of /events and of /logs, each (429 above). AIWG_MAX_STREAM_FOLLOWERS
    max_stream_followers: int = DEFAULT_MAX_STREAM_FOLLOWERS
    #: Base URL clients reach the controller at (AgentCard URLs); None = the request's host. AIWG_PUBLIC_URL
    public_url: str | None = None
    #: host:port of the legacy v1 PTY WebSocket (upstream's 8121); None = not served. AIWG_LEGACY_PTY_LISTEN
    legacy_pty_listen: str | None = None
    #: A PTY attach socket is sent an app-level ``ping`` this often. AIWG_PTY_PING_INTERVAL_S
    pty_ping_interval_s: float = 30.0
    #: A PTY attach socket silent this long (no frame, no ``pong``) is closed (1011) and its role
    #: freed. AIWG_PTY_PING_TIMEOUT_S
    pty_ping_timeout_s: float = 90.0
    #: A2A conformance mode (upstream's): required-extension enforcement off and the instance
    #: CONFORMANCE_INSTANCE_ID on the echo loadout registered at start. AIWG_CONFORMANCE_MODE
    conformance_mode: bool = False
    #: How long ended A2A tasks (with their events and artifacts) stay. AIWG_TASK_RETENTION_S
    task_retention_s: float = 7 * 24 * 3600.0
    #: How long an idempotency/v1 entry replays its first response. AIWG_IDEMPOTENCY_TTL
    idempotency_ttl_s: float = 86400.0
    #: Most idempotency/v1 entries kept (the oldest go first). AIWG_IDEMPOTENCY_MAX_ENTRIES
    idempotency_max_entries: int = 100_000
    #: Push webhooks may be on loopback, private, link-local or reserved addresses (local
    #: receivers, conformance runs). AIWG_PUSH_ALLOW_PRIVATE
    push_allow_private: bool = False
    #: One push delivery attempt (connect, send, answer) takes at most this. AIWG_PUSH_TIMEOUT_S
    push_timeout_s: float = 10.0
    #: A push event is retried (exponential backoff with jitter) for at most this long, then
    #: dropped. AIWG_PUSH_RETRY_S
    push_retry_s: float = 300.0
    #: The first retry waits about this long; each next one twice as long (up to 30 s). AIWG_PUSH_BACKOFF_S
    push_backoff_s: float = 0.5
    #: Undelivered events a push config holds; older ones are dropped beyond it. AIWG_PUSH_MAX_QUEUE
    push_max_queue: int = 1024
    #: Warm pools: loadout name -> slots hostd keeps ready (``busybox=2,tiny-vm=1``; TOML: a table).
    #: AIWG_WARM_POOLS
    warm_pools: dict[str, int] = {}
    dev: bool = False

    def __repr__(self) -> str:
        fields = []
        for name in self.__struct_fields__:
            value = getattr(self, name)
            if name in ("admin_token", "operator_token") and value is not None:
                value = "***"
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

_ENV = {
    "listen": "AIWG_LISTEN",
    "tls_cert": "AIWG_TLS_CERT",
    "tls_key": "AIWG_TLS_KEY",
    "state_dir": "AIWG_STATE_DIR",
    "hostd_socket": "AIWG_HOSTD_SOCKET",
    "hostd_call_timeout_s": "AIWG_HOSTD_CALL_TIMEOUT_S",
    "hostd_connect_timeout_s": "AIWG_HOSTD_CONNECT_TIMEOUT_S",
    "hostd_ping_interval_s": "AIWG_HOSTD_PING_INTERVAL_S",
    "hostd_reconnect_max_s": "AIWG_HOSTD_RECONNECT_MAX_S",
    "admin_token": "AIWG_ADMIN_TOKEN",
    "admin_token_file": "AIWG_ADMIN_TOKEN_FILE",
    "operator_token": "AIWG_OPERATOR_TOKEN",
    "v1_sunset": "AIWG_V1_SUNSET_DATE",
    "max_request_bytes": "AIWG_MAX_REQUEST_BYTES",
    "operation_retention_s": "AIWG_OPERATION_RETENTION_S",
    "keep_alive_timeout_s": "AIWG_KEEP_ALIVE_TIMEOUT_S",
    "storage_dir": "AIWG_STORAGE_DIR",
    "loadouts_dir": "AIWG_LOADOUTS_DIR",
    "public_url": "AIWG_PUBLIC_URL",
    "event_ring_size": "AIWG_EVENT_RING_SIZE",
    "log_ring_size": "AIWG_LOG_RING_SIZE",
    "watch_interval_s": "AIWG_WATCH_INTERVAL_S",
    "sse_keepalive_s": "AIWG_SSE_KEEPALIVE_S",
    "max_stream_followers": "AIWG_MAX_STREAM_FOLLOWERS",
    "legacy_pty_listen": "AIWG_LEGACY_PTY_LISTEN",
    "pty_ping_interval_s": "AIWG_PTY_PING_INTERVAL_S",
    "pty_ping_timeout_s": "AIWG_PTY_PING_TIMEOUT_S",
    "conformance_mode": "AIWG_CONFORMANCE_MODE",
    "task_retention_s": "AIWG_TASK_RETENTION_S",
    "idempotency_ttl_s": "AIWG_IDEMPOTENCY_TTL",
    "idempotency_max_entries": "AIWG_IDEMPOTENCY_MAX_ENTRIES",
    "push_allow_private": "AIWG_PUSH_ALLOW_PRIVATE",
    "push_timeout_s": "AIWG_PUSH_TIMEOUT_S",
    "push_retry_s": "AIWG_PUSH_RETRY_S",
    "push_backoff_s": "AIWG_PUSH_BACKOFF_S",
    "push_max_queue": "AIWG_PUSH_MAX_QUEUE",
    "warm_pools": "AIWG_WARM_POOLS",
}
_FLOATS = {
    "hostd_call_timeout_s": (0.01, 3600.0),
    "hostd_connect_timeout_s": (0.01, 3600.0),
    "hostd_ping_interval_s": (0.01, 3600.0),
    "hostd_reconnect_max_s": (0.01, 3600.0),
    "operation_retention_s": (0.0, 365 * 24 * 3600.0),
    "keep_alive_timeout_s": (0.05, 3600.0),
    "task_retention_s": (0.0, 10 * 365 * 24 * 3600.0),
    "pty_ping_interval_s": (0.05, 3600.0),
    "pty_ping_timeout_s": (0.1, 3600.0),
    "watch_interval_s": (0.05, 3600.0),
    "sse_keepalive_s": (0.05, 3600.0),
    "idempotency_ttl_s": (1.0, 365 * 24 * 3600.0),
    "push_timeout_s": (0.05, 300.0),
    "push_retry_s": (0.0, 7 * 24 * 3600.0),
    "push_backoff_s": (0.01, 3600.0),
}
_INTS = {
    "event_ring_size": (16, 1_000_000),
    "log_ring_size": (16, 1_000_000),
    "max_stream_followers": (1, 10_000),
    "idempotency_max_entries": (1, 10_000_000),
    "push_max_queue": (1, 1_000_000),
}


def _split_listen(value: str, key: str) -> tuple[str, int]:
    host, sep, port = value.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ConfigError(f"{key}={value!r} must be host:port (port 0-65535)")
    return host.strip("[]"), int(port)


def _read_file(path: str | os.PathLike[str]) -> dict[str, Any]:
    try:
        with open(path, "rb") as fh:
            data = tomllib.load(fh)
    except OSError as exc:
        raise ConfigError(f"config file {os.fspath(path)!r}: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config file {os.fspath(path)!r} is not valid TOML: {exc}") from None
    unknown = sorted(set(data) - set(ControllerConfig.__struct_fields__) - {"dev"})
    if unknown:
        raise ConfigError(f"config file {os.fspath(path)!r}: unknown key {unknown[0]!r}")
    return data


#: Most slots one warm pool keeps ready (hostd's bound).
MAX_POOL_SLOTS = 64


def _warm_pools(raw: Any, source: str) -> dict[str, int]:
    """``loadout=size,...`` (env) or a table of sizes (TOML): loadout names, sizes 0..64."""
    if isinstance(raw, str):
        pairs: list[tuple[str, Any]] = []
        for item in filter(None, (part.strip() for part in raw.split(","))):
            name, sep, size = item.partition("=")
            if not sep:
                raise ConfigError(f"{source}: {item!r} is not loadout=size")
            pairs.append((name.strip(), size.strip()))
    elif isinstance(raw, dict):
        pairs = list(raw.items())
    else:
        raise ConfigError(f"{source} must be loadout=size,... or a table")
    pools: dict[str, int] = {}
    for name, size in pairs:
        if not re.match(r"^[a-z][a-z0-9-]{1,62}$", str(name)):
            raise ConfigError(f"{source}: {name!r} is not a loadout name")
        try:
            count = int(size)
        except (TypeError, ValueError):
            raise ConfigError(f"{source}: the size of {name!r} is not an integer") from None
        if not 0 <= count <= MAX_POOL_SLOTS or isinstance(size, bool):
            raise ConfigError(f"{source}: the size of {name!r} must be between 0 and {MAX_POOL_SLOTS}")
        if name in pools:
            raise ConfigError(f"{source}: {name!r} is named twice")
        pools[str(name)] = count
    return pools


def _coerce(key: str, raw: Any, source: str) -> Any:
    """Turn a TOML value or an env string into the field's type, naming ``source`` on error."""
    if key == "warm_pools":
        return _warm_pools(raw, source)
    if key in _FLOATS:
        low, high = _FLOATS[key]
        try:
            value = float(raw)
        except (TypeError, ValueError):
            raise ConfigError(f"{source}={raw!r} is not a number") from None
        if not low <= value <= high:
            raise ConfigError(f"{source}={value} must be between {low} and {high}")
        return value
    if key in _INTS:
        low_i, high_i = _INTS[key]
        try:
            number = int(raw)
        except (TypeError, ValueError):
            raise ConfigError(f"{source}={raw!r} is not an integer") from None
        if not low_i <= number <= high_i:
            raise ConfigError(f"{source}={number} must be between {low_i} and {high_i}")
        return number
    if key in ("conformance_mode", "push_allow_private"):
        if isinstance(raw, bool):
            return raw
        if str(raw).lower() in ("1", "true", "yes", "on"):
            return True
        if str(raw).lower() in ("0", "false", "no", "off"):
            return False
        raise ConfigError(f"{source}={raw!r} must be 1 or 0")
    if key == "max_request_bytes":
        try:
            value = int(raw)
        except (TypeError, ValueError):
            raise ConfigError(f"{source}={raw!r} is not an integer") from None
        if value < 1024:
            raise ConfigError(f"{source}={value} must be at least 1024")
        return value
    if not isinstance(raw, str):
        raise ConfigError(f"{source}={raw!r} must be a string")
    return raw


def load_config(
    path: str | os.PathLike[str] | None = None, env: Mapping[str, str] | None = None, *, dev: bool = False
) -> ControllerConfig:
    """Build and validate the configuration; ``env`` defaults to ``os.environ``."""
    env = os.environ if env is None else env
    values: dict[str, Any] = {}
    if path is not None:
        for key, raw in _read_file(path).items():
            if key == "dev":
                dev = dev or bool(raw)
                continue
            values[key] = _coerce(key, raw, f"{key} (in {os.fspath(path)})")
    for key, var in _ENV.items():
        raw = env.get(var)
        if raw is not None and raw != "":
            values[key] = _coerce(key, raw, var)

    state_dir = os.path.abspath(values.get("state_dir") or (DEV_STATE_DIR if dev else PROD_STATE_DIR))
    values["state_dir"] = state_dir
    values.setdefault("hostd_socket", dev_hostd_socket(state_dir) if dev else PROD_HOSTD_SOCKET)
    values["hostd_socket"] = os.path.abspath(values["hostd_socket"])
    if len(os.fsencode(values["hostd_socket"])) > 107:
        raise ConfigError(f"AIWG_HOSTD_SOCKET={values['hostd_socket']!r} is longer than a Unix socket path may be")
    values.setdefault("admin_token_file", os.path.join(state_dir, "admin-token"))
    values.setdefault("storage_dir", os.path.join(state_dir, "storage"))
    values.setdefault("loadouts_dir", os.path.join(state_dir, "loadouts"))

    _split_listen(values.get("listen", DEFAULT_LISTEN), "AIWG_LISTEN")
    if values.get("legacy_pty_listen"):
        _split_listen(values["legacy_pty_listen"], "AIWG_LEGACY_PTY_LISTEN")
    tls_cert, tls_key = values.get("tls_cert"), values.get("tls_key")
    if bool(tls_cert) != bool(tls_key):
        raise ConfigError("AIWG_TLS_CERT and AIWG_TLS_KEY must be given together")
    for name, tls_path in (("AIWG_TLS_CERT", tls_cert), ("AIWG_TLS_KEY", tls_key)):
        if tls_path and not os.path.isfile(tls_path):
            raise ConfigError(f"{name}={tls_path!r} is not a readable file")
    for name in ("admin_token", "operator_token"):
        token = values.get(name)
        if token is not None and len(token) < 16:
            raise ConfigError(f"{_ENV[name]} must be at least 16 characters")
    if values.get("admin_token") and values.get("admin_token") == values.get("operator_token"):
        raise ConfigError("AIWG_OPERATOR_TOKEN must differ from AIWG_ADMIN_TOKEN")
    public_url = values.get("public_url")
    if public_url is not None:
        if not re.match(r"^https?://[^/\s]+$", public_url.rstrip("/")):
            raise ConfigError(f"AIWG_PUBLIC_URL={public_url!r} must be an http(s) origin like https://host:8122")
        values["public_url"] = public_url.rstrip("/")

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
