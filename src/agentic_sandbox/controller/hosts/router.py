"""Any controller answers any request: the ASGI layer that sends a request for another host's
instance to a controller of that host.

:class:`Router` wraps the app (``app.asgi_app``). For each HTTP request and WebSocket it finds the
instance the request is about, from its path alone (:func:`instance_ref`): ``/agents/{id}/...``
(the A2A bindings, the AgentCard, the PTY attach socket), ``/api/v2/admin/instances/{id}...``,
an instance's inbox and outbox (``/api/v2/admin/storage/{inbox|outbox}/{id}/...``, kept on its
host), upstream's v1 names of these, or a task (``/api/v2/admin/tasks/{task}/...``,
``/api/v1/ws/missions/{task}``, ``/api/v1/hitl/{task}``, ``/api/v1/agent-output/chat?command_id=``)
whose instance the store names. A request about no instance, about an instance of this host, or
about one the catalog does not know (the app answers its own 404) is served here. So is a
provision (``POST /api/v2/admin/instances``, or v1's ``/agents`` and ``/vms``) placed on this
host; one placed on another host is forwarded there whole (:mod:`controller.hosts.placement`
decides, from the body's ``runtime``, ``host``, ``host_label`` and launch strategy).

Forwarding: the caller is authenticated here, once (:meth:`Authenticator.authenticate`, the bearer
header or the attach socket's ``bearer.`` subprotocol), and carried to the peer in ``x-aiwg-peer``,
signed with the cluster's secret (:mod:`controller.hosts.peerauth`); the caller's credentials are
not sent on. The peer's router checks the signature and serves the request as that caller
(:data:`controller.auth.tokens.FORWARDED`); a request from a peer is never forwarded again. A
signature that does not verify is dropped, with the credentials beside it: the request is served
as an anonymous one (401 wherever a caller is needed) and a warning is logged.

When the instance's host has no live controller, or none answers, the request is not forwarded:
it is served here with :data:`REFUSAL` set, which the app raises before any view runs, so each
surface answers 503 ``host.unavailable`` in its own error format (the attach socket is refused
with 503 here). Nothing is answered from a stale copy.

Costs: a request about this host's instance costs one dict lookup once the instance was seen
(an instance never changes host); the first costs one indexed read.
"""

from __future__ import annotations

import base64
import binascii
import logging
import re
from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from typing import TYPE_CHECKING, Any

import msgspec

from ..auth.tokens import FORWARDED, Authenticator, Forwarded, Principal
from ..errors import ControllerError, Unavailable
from ..models import RUNTIME_ALIASES, RUNTIMES
from ..pty.asgisocket import AsgiWebSocket
from ..store import Store, StoreClosed
from .forward import Forwarder, PeerUnreachable
from .peerauth import PeerSigner, request_target

if TYPE_CHECKING:
    from .registry import HostRegistry

log = logging.getLogger(__name__)

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

PEER_HEADER = b"x-aiwg-peer"
#: Set for a request that cannot be served where it should be: the app raises it first thing.
REFUSAL: ContextVar[ControllerError | None] = ContextVar("aiwg_refusal", default=None)

_INSTANCE_PATHS = re.compile(
    r"^/(?:agents|api/v2/admin/instances|api/v1/sessions|api/v1/vms|api/v1/agents"
    r"|api/v[12](?:/admin)?/storage/(?:inbox|outbox))/(?P<id>[^/]+)(?:/|$)"
)
_TASK_PATHS = re.compile(r"^/(?:api/v2/admin/tasks|api/v1/ws/missions|api/v1/hitl)/(?P<id>[^/]+)(?:/|$)")
_COMMAND_ID = re.compile(rb"(?:^|&)command_id=(?P<id>[^&]+)")
#: Where instances are made (upstream's v1 names answer through the v2 route).
PROVISION_PATHS = frozenset({"/api/v2/admin/instances", "/api/v1/agents", "/api/v1/vms"})
#: Instances (and tasks) whose host was read, kept until this many (then forgotten at once).
CACHE_ENTRIES = 100_000


class _Strategy(msgspec.Struct):
    mode: str | None = None
    asset_ref: str | None = None


class _Options(msgspec.Struct):
    launch_strategy: _Strategy | None = None


class _Placement(msgspec.Struct):
    """The fields of a provision request placement reads (the app checks the whole body)."""

    runtime: str | None = None
    host: str | None = None
    host_label: str | None = None
    runtime_options: _Options | None = None


def instance_ref(scope: Scope) -> tuple[str, str] | None:
    """``("instance", id)`` or ``("task", id)`` for a path about one; None otherwise."""
    path: str = scope["path"]
    match = _INSTANCE_PATHS.match(path)
    if match is not None:
        return "instance", match["id"]
    match = _TASK_PATHS.match(path)
    if match is not None:
        return "task", match["id"]
    if path == "/api/v1/agent-output/chat":
        found = _COMMAND_ID.search(scope.get("query_string", b""))
        if found is not None:
            return "task", found["id"].decode("latin-1")
    return None


def _header(scope: Scope, name: bytes) -> bytes | None:
    for key, value in scope["headers"]:
        if key == name:
            return bytes(value)
    return None


def _bearer_subprotocol(scope: Scope) -> str | None:
    """The attach socket's token offered as a ``bearer.<base64url>`` subprotocol, as a header value."""
    raw = _header(scope, b"sec-websocket-protocol")
    if raw is None:
        return None
    for entry in raw.decode("latin-1").split(","):
        entry = entry.strip()
        if entry.startswith("bearer."):
            token = entry[len("bearer.") :]
            try:
                padded = token + "=" * (-len(token) % 4)
                return "Bearer " + base64.b64decode(padded, altchars=b"-_", validate=True).decode()
            except (binascii.Error, UnicodeDecodeError, ValueError):
                return None
    return None


def _without_credentials(headers: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    """The headers a peer gets: no credentials of the caller's (it gets the signed caller instead)."""
    kept = []
    for key, value in headers:
        if key in (b"authorization", PEER_HEADER):
            continue
        if key == b"sec-websocket-protocol":
            offered = [p.strip() for p in value.split(b",") if not p.strip().startswith(b"bearer.")]
            if not offered:
                continue
            value = b", ".join(offered)
        kept.append((key, value))
    return kept


class Router:
    """See the module docstring."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        registry: HostRegistry,
        store: Store,
        auth: Authenticator,
        forwarder: Forwarder,
        public_url: str | None,
        max_body_bytes: int,
    ) -> None:
        self.app = app
        self.registry = registry
        self.store = store
        self.auth = auth
        self.forwarder = forwarder
        self.public_url = public_url
        self.max_body_bytes = max_body_bytes
        #: Made once the store's cluster secret is read (:meth:`start`); None: one host, nothing forwarded.
        self.signer: PeerSigner | None = None
        self._hosts: dict[str, str | None] = {}
        self._task_instances: dict[str, str] = {}
        self.forwarded = 0

    async def start(self) -> None:
        """Read the cluster's secret (made by the first controller that asks)."""
        self.signer = PeerSigner(await self.store.hosts.secret())

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        kind = scope["type"]
        if kind not in ("http", "websocket"):
            await self.app(scope, receive, send)
            return
        peer = _header(scope, PEER_HEADER)
        if peer is not None and self.signer is not None:
            await self._from_peer(scope, receive, send, peer.decode("latin-1"))
            return
        if kind == "http" and scope["method"] == "POST" and scope["path"].rstrip("/") in PROVISION_PATHS:
            await self._provision(scope, receive, send)
            return
        if self.signer is None:  # one host: everything is served here
            await self.app(scope, receive, send)
            return
        ref = instance_ref(scope)
        host = None if ref is None else await self._host_of(*ref)
        if host is None or host == self.registry.host_id:
            await self.app(scope, receive, send)
            return
        await self._forward(host, scope, receive, send)

    # -- what arrives from a peer ---------------------------------------------------------------

    async def _from_peer(self, scope: Scope, receive: Receive, send: Send, header: str) -> None:
        assert self.signer is not None
        method = "GET" if scope["type"] == "websocket" else scope["method"]
        vouched = self.signer.verify(header, method, request_target(scope))
        if vouched is None:
            client = scope.get("client")
            log.warning(
                "%s %s: a peer signature that does not verify (from %s): served as anonymous",
                method,
                scope["path"],
                client,
            )
            scope = {**scope, "headers": _without_credentials(scope["headers"])}
            await self.app(scope, receive, send)
            return
        principal, edge_url = vouched
        token = FORWARDED.set(Forwarded(principal=principal, edge_url=edge_url or None))
        try:
            await self.app(scope, receive, send)
        finally:
            FORWARDED.reset(token)

    # -- where a request belongs ------------------------------------------------------------------

    async def _host_of(self, kind: str, ref: str) -> str | None:
        """The host of the instance (or the task's instance); None when unknown or not placed."""
        try:
            if kind == "task":
                instance_id = self._task_instances.get(ref)
                if instance_id is None:
                    instance_id = await self.store.tasks.instance_of(ref)
                    if instance_id is None:
                        return None
                    self._remember(self._task_instances, ref, instance_id)
                ref = instance_id
            if ref in self._hosts:
                return self._hosts[ref]
            exists, host = await self.store.instances.host_of(ref)
        except (ControllerError, StoreClosed):
            return None  # the store is away: the app answers (and fails closed) itself
        if exists and host is not None:
            self._remember(self._hosts, ref, host)
        return host

    @staticmethod
    def _remember(cache: dict[str, Any], key: str, value: Any) -> None:
        if len(cache) >= CACHE_ENTRIES:
            cache.clear()
        cache[key] = value

    # -- provisioning -----------------------------------------------------------------------------

    async def _provision(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Place the new instance; serve it here or forward it whole to the chosen host."""
        length = _header(scope, b"content-length")
        if length is not None and (not length.isdigit() or int(length) > self.max_body_bytes):
            await self.app(scope, receive, send)  # the app refuses it (413, 400) as it does any
            return
        body, more = await self._read_body(receive)
        if more:  # over the size bound: the app refuses it (413) as it does any
            await self.app(scope, _replay(body, receive, more=True), send)
            return
        try:
            wanted = msgspec.json.decode(body, type=_Placement)
        except msgspec.DecodeError:
            wanted = None  # the app says what is wrong with it
        host = self.registry.host_id
        # A runtime that is not one (or a body that is not JSON) is the app's to refuse (422, 400).
        if wanted is not None and (wanted.runtime in RUNTIMES or wanted.runtime in RUNTIME_ALIASES):
            try:
                host = await self._place(wanted)
            except ControllerError as exc:
                await self._refused(exc, scope, _replay(body, receive), send)
                return
        if host == self.registry.host_id:
            await self.app(scope, _replay(body, receive), send)
            return
        await self._forward(host, scope, _replay(body, receive), send)

    async def _place(self, wanted: _Placement) -> str | None:
        """The host of a new instance. One made of another stays where that is: a fork on the
        host of the instance it copies (its id or name); a warm pool's slot or a checkpoint on the
        host asked (those are its hostd's), unless the request names one."""
        assert wanted.runtime is not None
        strategy = wanted.runtime_options.launch_strategy if wanted.runtime_options is not None else None
        mode = strategy.mode if strategy is not None else None
        if mode == "fork" and strategy is not None and strategy.asset_ref:
            source = await self.store.instances.get(strategy.asset_ref) or await self.store.instances.get_by_name(
                strategy.asset_ref
            )
            if source is not None and source.host_id is not None:
                return source.host_id
        elif mode in ("warm_pool", "restore") and wanted.host is None:
            return self.registry.host_id
        own = self.registry.own
        closed = own is not None and (own.cordoned or own.draining)
        if wanted.host is None and wanted.host_label is None and not self.registry.several and not closed:
            # One host: no choice to make (unless an operator cordoned it). Its own checks (a
            # provider that is down fails the operation with the provider's reason) say more than
            # placement's "no host offers it" could.
            return self.registry.host_id
        chosen = await self.registry.place(wanted.runtime, host=wanted.host, label=wanted.host_label)
        return chosen.id

    async def _read_body(self, receive: Receive) -> tuple[bytes, bool]:
        chunks: list[bytes] = []
        size = 0
        while True:
            event = await receive()
            if event["type"] != "http.request":
                return b"".join(chunks), False
            chunk = event.get("body", b"")
            chunks.append(chunk)
            size += len(chunk)
            if not event.get("more_body", False):
                return b"".join(chunks), False
            if size > self.max_body_bytes:
                return b"".join(chunks), True

    # -- forwarding -------------------------------------------------------------------------------

    async def _forward(self, host: str | None, scope: Scope, receive: Receive, send: Send) -> None:
        assert self.signer is not None and host is not None
        websocket = scope["type"] == "websocket"
        authorization = _header(scope, b"authorization")
        credentials = authorization.decode("latin-1") if authorization is not None else None
        if credentials is None and websocket:
            credentials = _bearer_subprotocol(scope)
        principal: Principal | None = self.auth.authenticate(credentials)
        method = "GET" if websocket else scope["method"]
        signed = self.signer.header(principal, method, request_target(scope), self._edge_url(scope))
        headers = [*_without_credentials(scope["headers"]), (PEER_HEADER, signed.encode("latin-1"))]
        tried: set[str] = set()
        refreshed = False
        receive = _Recording(receive)  # what a failed attempt read, for the next one (or the refusal)
        while True:
            url = self.registry.peer_for(host, avoid=tried)
            if url is None and not refreshed:
                # The view is a heartbeat old: a host that just came (or a new controller of it) is
                # read now rather than refused.
                refreshed = True
                try:
                    await self.registry.refresh()
                except ControllerError:
                    pass  # the store is away: what the view holds is all there is
                url = self.registry.peer_for(host, avoid=tried)
            if url is None:
                reason = self.registry.why_unreachable(host)
                await self._refused(Unavailable("host.unavailable", reason), scope, receive.again(), send)
                return
            tried.add(url)
            receive = receive.again()
            try:
                if websocket:
                    await self.forwarder.websocket(url, scope, receive, send, headers)
                else:
                    await self.forwarder.http(url, scope, receive, send, headers)
                self.forwarded += 1
                return
            except PeerUnreachable as exc:
                log.warning("host %s: its controller at %s did not answer (%s); trying another", host, url, exc)

    def _edge_url(self, scope: Scope) -> str:
        """The origin the client asked at, as this controller's own ``base_url()`` would say."""
        if self.public_url:
            return self.public_url
        host = _header(scope, b"host")
        if host is None:
            server = scope.get("server") or ("localhost", 80)
            return f"{scope.get('scheme', 'http')}://{server[0]}:{server[1]}"
        scheme = scope.get("scheme", "http")
        scheme = {"ws": "http", "wss": "https"}.get(scheme, scheme)
        return f"{scheme}://{host.decode('latin-1')}"

    async def _refused(self, exc: ControllerError, scope: Scope, receive: Receive, send: Send) -> None:
        """Serve the request here, refused with ``exc`` by the surface it is for."""
        if scope["type"] == "websocket":
            body = {"error": {"code": exc.code, "status": 503, "message": exc.message}}
            await AsgiWebSocket(scope, receive, send).refuse(503, body, {"Retry-After": "1"})
            return
        token = REFUSAL.set(exc)
        try:
            await self.app(scope, receive, send)
        finally:
            REFUSAL.reset(token)


class _Recording:
    """``receive`` that keeps what it handed out, so another attempt (or the app, answering a
    refusal) can read the request from its start. A body too big to keep cannot be read again:
    later readers see the client gone (and the client sees its connection end)."""

    KEEP_BYTES = 1 << 20

    def __init__(self, receive: Receive, events: list[dict[str, Any]] | None = None, *, gone: bool = False) -> None:
        self._receive = receive
        self._events: list[dict[str, Any]] = events if events is not None else []
        self._kept = sum(len(e.get("body", b"")) for e in self._events)
        self._replaying = list(self._events)
        self._gone = gone
        self._whole = True

    async def __call__(self) -> dict[str, Any]:
        if self._gone:
            return {"type": "http.disconnect"}
        if self._replaying:
            return self._replaying.pop(0)
        event = await self._receive()
        if self._whole and event["type"] in ("http.request", "websocket.connect"):
            self._kept += len(event.get("body", b""))
            if self._kept > self.KEEP_BYTES:
                self._whole = False
                self._events.clear()
            else:
                self._events.append(event)
        return event

    def again(self) -> _Recording:
        """The same request, read from its start once more."""
        return _Recording(self._receive, self._events, gone=not self._whole or self._gone)


def _replay(body: bytes, receive: Receive, *, more: bool = False) -> Receive:
    """``receive`` with the body already read given back first (``more``: the rest follows)."""
    given = False

    async def replay() -> dict[str, Any]:
        nonlocal given
        if not given:
            given = True
            return {"type": "http.request", "body": body, "more_body": more}
        return await receive()

    return replay
