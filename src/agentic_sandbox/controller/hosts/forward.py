"""Forwarding one request to a peer controller and its answer back, streamed both ways.

:meth:`Forwarder.http` speaks HTTP/1.1 to the peer with h11 over trio TCP (or TLS) streams kept
alive in a small pool per peer. The request's head and a body that came whole go out in one write;
a body that comes in pieces is sent chunked as it arrives. The answer's head, then each piece of its
body, is handed to the client as it is read: an SSE stream flows as the peer writes it, and a client
that goes away ends the peer's request (its connection is closed, not reused).

:meth:`Forwarder.websocket` relays the attach WebSocket with trio-websocket as the client side: the
peer's refusal (status, headers, body) is the client's refusal; once accepted, messages go one at a
time in each direction (a slow reader stalls only its own direction), and a close on either side is
relayed with its code and reason.

Errors: :class:`PeerUnreachable` when the peer cannot be reached or broke before the client was
sent anything (the caller tries another controller of that host, or answers 503). A break after
that ends the client's answer where it stands. There is no read timeout: a blocking A2A send or a
stream may rightly wait long; a stalled peer holds only the requests forwarded to it.
"""

from __future__ import annotations

import socket
import ssl
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import urlsplit

import h11
import trio
import trio_websocket

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]
Headers = list[tuple[bytes, bytes]]

#: Idle keep-alive connections kept per peer.
IDLE_PER_PEER = 32
READ_SIZE = 65536
#: The largest attach message relayed (a replay chunk or a keyframe), as the attach socket allows.
MAX_WS_MESSAGE = 16 * 1024 * 1024
#: Headers of one hop only, never passed on (RFC 9110 §7.6.1), and what h11 or the handshake sets.
HOP_BY_HOP = frozenset(
    {
        b"connection",
        b"keep-alive",
        b"proxy-connection",
        b"proxy-authenticate",
        b"proxy-authorization",
        b"te",
        b"trailer",
        b"transfer-encoding",
        b"upgrade",
        b"host",
        b"content-length",
    }
)
#: What is not passed back of an answer's head (its length is: the body is passed whole).
RESPONSE_HOP_BY_HOP = HOP_BY_HOP - {b"content-length"}
WS_HANDSHAKE = HOP_BY_HOP | {
    b"sec-websocket-key",
    b"sec-websocket-version",
    b"sec-websocket-extensions",
    b"sec-websocket-protocol",
    b"sec-websocket-accept",
}


class PeerUnreachable(Exception):
    """The peer could not be reached, or broke before the client was answered anything."""


class _Stale(Exception):
    """A kept-alive connection turned out closed before the peer read the request."""


class _Peer:
    """Where a peer listens, parsed once."""

    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        self.tls = parts.scheme == "https"
        self.host = parts.hostname or "localhost"
        self.port = parts.port or (443 if self.tls else 80)
        self.authority = parts.netloc.encode()
        self.ws_base = ("wss://" if self.tls else "ws://") + parts.netloc


class _Connection:
    def __init__(self, stream: trio.abc.Stream) -> None:
        self.stream = stream
        self.h11 = h11.Connection(h11.CLIENT)
        self.reused = False


def _forwarded(scope: Scope, headers: Headers) -> Headers:
    client = scope.get("client")
    extra = [
        (b"x-forwarded-proto", str(scope.get("scheme", "http")).encode()),
        (b"x-aiwg-hop", b"1"),
    ]
    if client:
        extra.append((b"x-forwarded-for", str(client[0]).encode()))
    return [(k, v) for k, v in headers if k not in HOP_BY_HOP] + extra


class Forwarder:
    """See the module docstring. One per app; :meth:`aclose` at the end."""

    def __init__(self, *, connect_timeout_s: float = 5.0, tls: ssl.SSLContext | None = None) -> None:
        self.connect_timeout_s = connect_timeout_s
        self._tls = tls
        self._peers: dict[str, _Peer] = {}
        self._idle: dict[str, list[_Connection]] = {}

    def _peer(self, url: str) -> _Peer:
        peer = self._peers.get(url)
        if peer is None:
            peer = self._peers[url] = _Peer(url)
        return peer

    def _ssl(self) -> ssl.SSLContext:
        if self._tls is None:
            self._tls = ssl.create_default_context()
        return self._tls

    async def _connect(self, peer: _Peer) -> _Connection:
        try:
            with trio.fail_after(self.connect_timeout_s):
                tcp = await trio.open_tcp_stream(peer.host, peer.port)
                tcp.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, True)
                if not peer.tls:
                    return _Connection(tcp)
                stream = trio.SSLStream(tcp, self._ssl(), server_hostname=peer.host, https_compatible=True)
                await stream.do_handshake()
                return _Connection(stream)
        except (OSError, trio.TooSlowError, trio.BrokenResourceError) as exc:
            raise PeerUnreachable(f"cannot connect to {peer.host}:{peer.port}: {exc or 'timed out'}") from None

    def _take(self, url: str) -> _Connection | None:
        idle = self._idle.get(url)
        while idle:
            conn = idle.pop()
            if conn.h11.our_state is h11.IDLE:
                conn.reused = True
                return conn
        return None

    def _give_back(self, url: str, conn: _Connection) -> None:
        if conn.h11.our_state is h11.DONE and conn.h11.their_state is h11.DONE:
            conn.h11.start_next_cycle()
            idle = self._idle.setdefault(url, [])
            if len(idle) < IDLE_PER_PEER:
                idle.append(conn)
                return
        _close_now(conn.stream)  # not reusable: closed where it stands

    async def aclose(self) -> None:
        for idle in self._idle.values():
            for conn in idle:
                await conn.stream.aclose()
        self._idle.clear()

    # -- HTTP ---------------------------------------------------------------------------------------

    async def http(self, peer_url: str, scope: Scope, receive: Receive, send: Send, headers: Headers) -> None:
        """Forward one HTTP request (see the module docstring)."""
        peer = self._peer(peer_url)
        first = await receive()
        if first["type"] != "http.request":
            return  # the client left before its request was read
        body: bytes = first.get("body", b"")
        more: bool = first.get("more_body", False)
        out = [(b"host", peer.authority), *_forwarded(scope, headers)]
        out.append((b"transfer-encoding", b"chunked") if more else (b"content-length", str(len(body)).encode()))
        target = scope.get("raw_path") or scope["path"].encode()
        if scope.get("query_string"):
            target += b"?" + scope["query_string"]
        request = h11.Request(method=scope["method"], target=target, headers=out)
        conn = self._take(peer_url)
        while True:
            if conn is None:
                conn = await self._connect(peer)
            try:
                data = conn.h11.send(request) or b""
                if body:
                    data += conn.h11.send(h11.Data(data=body)) or b""
                if not more:
                    data += conn.h11.send(h11.EndOfMessage()) or b""
                await conn.stream.send_all(data)
                await self._exchange(conn, receive, send, more)
                return
            except _Stale as exc:
                # A kept-alive connection the peer had closed meanwhile (it restarted, or timed the
                # connection out): the request never reached it, so it goes once more on a new one.
                if more:
                    raise PeerUnreachable(str(exc)) from None
                conn = None
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError, h11.LocalProtocolError) as exc:
                _close_now(conn.stream)
                if not conn.reused or more:
                    raise PeerUnreachable(f"the request could not be sent: {exc}") from None
                conn = None
            finally:
                if conn is not None:
                    self._give_back(peer_url, conn)

    async def _exchange(self, conn: _Connection, receive: Receive, send: Send, more: bool) -> None:
        """The rest of the request's body, then the answer, passed on as it comes; the client's
        disconnect ends both. Raised out of the nursery (never inside it, where trio would wrap it)."""
        failure: Exception | None = None
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_pump_request, conn, receive, more, nursery.cancel_scope)
            try:
                failure = await _pass_answer(conn, send)
            finally:
                nursery.cancel_scope.cancel()
        if failure is not None:
            raise failure

    # -- WebSocket ----------------------------------------------------------------------------------

    async def websocket(self, peer_url: str, scope: Scope, receive: Receive, send: Send, headers: Headers) -> None:
        """Relay one WebSocket (see the module docstring)."""
        peer = self._peer(peer_url)
        event = await receive()
        if event["type"] != "websocket.connect":
            return
        offered = []
        for key, value in headers:
            if key == b"sec-websocket-protocol":
                offered += [p.strip() for p in value.decode("latin-1").split(",") if p.strip()]
        extra = [(k, v) for k, v in _forwarded(scope, headers) if k not in WS_HANDSHAKE]
        target = scope.get("raw_path") or scope["path"].encode()
        if scope.get("query_string"):
            target += b"?" + scope["query_string"]
        url = peer.ws_base + target.decode("latin-1")
        opened = trio_websocket.open_websocket_url(
            url,
            self._ssl() if peer.tls else None,
            subprotocols=offered or None,
            extra_headers=extra,
            max_message_size=MAX_WS_MESSAGE,
            connect_timeout=self.connect_timeout_s,
            disconnect_timeout=self.connect_timeout_s,
            receive_buffer_size=READ_SIZE,
        )
        try:
            async with opened as ws:
                await send({"type": "websocket.accept", "subprotocol": ws.subprotocol, "headers": []})
                await _relay(ws, receive, send)
        except trio_websocket.ConnectionRejected as rejected:
            await _refuse(scope, send, rejected)
        except (OSError, trio.TooSlowError, trio_websocket.HandshakeError) as exc:
            raise PeerUnreachable(f"cannot open the peer's socket {url}: {exc or 'timed out'}") from None


async def _pump_request(conn: _Connection, receive: Receive, more: bool, scope: trio.CancelScope) -> None:
    """Send the rest of a body that came in pieces; then wait for the client's disconnect, which
    ends the exchange."""
    while True:
        event = await receive()
        if event["type"] == "http.disconnect":
            # The client left, or (ASGI says so once the answer was sent) the exchange is over: an
            # answer cut short leaves the connection mid-message, and it is closed, not reused.
            scope.cancel()
            return
        if more:
            chunk = event.get("body", b"")
            more = event.get("more_body", False)
            try:
                data = (conn.h11.send(h11.Data(data=chunk)) or b"") if chunk else b""
                if not more:
                    data += conn.h11.send(h11.EndOfMessage()) or b""
                await conn.stream.send_all(data)
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError, h11.LocalProtocolError):
                _close_now(conn.stream)  # the answer's reader sees it and says what happened
                return


async def _pass_answer(conn: _Connection, send: Send) -> Exception | None:
    """Read the peer's answer and hand it to the client as it comes. What to raise, if it could
    not even begin (None once the client was sent anything)."""
    started = False
    try:
        while True:
            event = conn.h11.next_event()
            if event is h11.NEED_DATA:
                data = await conn.stream.receive_some(READ_SIZE)
                if not data and not started:
                    _close_now(conn.stream)
                    if conn.reused:
                        return _Stale("the kept-alive connection was closed by the peer")
                    return PeerUnreachable("the peer closed the connection before answering")
                conn.h11.receive_data(bytes(data))
            elif isinstance(event, h11.Response):
                kept = [(k, v) for k, v in event.headers if k not in RESPONSE_HOP_BY_HOP]
                await send({"type": "http.response.start", "status": event.status_code, "headers": kept})
                started = True
            elif isinstance(event, h11.Data):
                await send({"type": "http.response.body", "body": bytes(event.data), "more_body": True})
            elif isinstance(event, h11.EndOfMessage):
                await send({"type": "http.response.body", "body": b"", "more_body": False})
                return None
            elif isinstance(event, h11.ConnectionClosed):
                break
            # (an InformationalResponse: nothing to pass on)
    except (trio.BrokenResourceError, trio.ClosedResourceError, OSError, h11.RemoteProtocolError) as exc:
        _close_now(conn.stream)
        if not started:
            return PeerUnreachable(f"the peer broke before answering: {exc}")
    _close_now(conn.stream)
    if started:  # the peer broke mid-answer: end the client's answer where it stands
        await send({"type": "http.response.body", "body": b"", "more_body": False})
        return None
    return PeerUnreachable("the peer closed the connection before answering")


async def _refuse(scope: Scope, send: Send, rejected: trio_websocket.ConnectionRejected) -> None:
    if "websocket.http.response" not in (scope.get("extensions") or {}):
        await send({"type": "websocket.close", "code": 1008})
        return
    kept = [(k.lower(), v) for k, v in rejected.headers if k.lower() not in WS_HANDSHAKE]
    await send({"type": "websocket.http.response.start", "status": rejected.status_code, "headers": kept})
    await send({"type": "websocket.http.response.body", "body": rejected.body or b"", "more_body": False})


async def _relay(ws: trio_websocket.WebSocketConnection, receive: Receive, send: Send) -> None:
    async with trio.open_nursery() as nursery:

        async def client_to_peer() -> None:
            while True:
                event = await receive()
                if event["type"] == "websocket.receive":
                    data = event.get("bytes")
                    try:
                        await ws.send_message(data if data is not None else event.get("text") or "")
                    except trio_websocket.ConnectionClosed:
                        return  # the other direction relays the close
                elif event["type"] == "websocket.disconnect":
                    await ws.aclose(event.get("code", 1000) or 1000, event.get("reason") or None)
                    nursery.cancel_scope.cancel()
                    return

        async def peer_to_client() -> None:
            try:
                while True:
                    message = await ws.get_message()
                    if isinstance(message, bytes):
                        await send({"type": "websocket.send", "bytes": message})
                    else:
                        await send({"type": "websocket.send", "text": message})
            except trio_websocket.ConnectionClosed as closed:
                code = closed.reason.code if closed.reason is not None else 1006
                reason = closed.reason.reason if closed.reason is not None else None
                code = 1011 if code in (1005, 1006) else code  # codes that cannot be sent in a close frame
                await send({"type": "websocket.close", "code": code, "reason": reason or ""})
            nursery.cancel_scope.cancel()

        nursery.start_soon(client_to_peer)
        nursery.start_soon(peer_to_client)


def _close_now(stream: trio.abc.Stream) -> None:
    """Close a connection without waiting (its socket, for a plain TCP stream)."""
    sock = getattr(stream, "socket", None) or getattr(getattr(stream, "transport_stream", None), "socket", None)
    if sock is not None:
        sock.close()
