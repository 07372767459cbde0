"""The attach socket served straight on ASGI, not through quart's WebSocket layer.

Why: quart-trio reads a WebSocket's messages in a task of its own and hands each to the handler
through a channel, and wraps every message both ways with signals; on the keystroke path that is a
pass through trio's scheduler and about a tenth of the controller's work per key. The attach
socket is the one WebSocket whose per-message cost matters, so the app's WebSocket connection class
(:class:`controller.pty.route.WebsocketConnection`) serves its path with :class:`AsgiWebSocket` and
leaves every other WebSocket (the legacy v1 socket) to quart-trio.

:class:`AsgiWebSocket` is the little of a WebSocket the attach socket uses: the request's headers,
subprotocols and query; a refusal before the upgrade (an HTTP answer, where the server supports
ASGI's ``websocket.http.response``, else a close); accept, send, receive (``None`` once the client
is gone) and close.
"""

from __future__ import annotations

from typing import Any
from urllib.parse import parse_qs

import msgspec


class AsgiWebSocket:
    """One WebSocket over the ASGI ``receive`` and ``send`` of its connection."""

    def __init__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        self.scope = scope
        self._receive = receive
        self._send = send
        self.headers = {name.decode("latin-1").lower(): value.decode("latin-1") for name, value in scope["headers"]}
        self.subprotocols: list[str] = list(scope.get("subprotocols") or [])
        query = parse_qs(scope.get("query_string", b"").decode("latin-1"), keep_blank_values=True)
        self.args = {name: values[0] for name, values in query.items()}
        self.closed = False

    async def refuse(self, status: int, body: dict[str, Any], headers: dict[str, str] | None = None) -> None:
        """Answer the upgrade request with ``status`` and a JSON ``body`` instead of accepting it."""
        if "websocket.http.response" not in (self.scope.get("extensions") or {}):
            await self._send({"type": "websocket.close", "code": 1008})
            return
        head = [(b"content-type", b"application/json")]
        head += [(name.lower().encode(), value.encode()) for name, value in (headers or {}).items()]
        await self._send({"type": "websocket.http.response.start", "status": status, "headers": head})
        body_bytes = msgspec.json.encode(body)
        await self._send({"type": "websocket.http.response.body", "body": body_bytes, "more_body": False})

    async def accept(self, subprotocol: str | None) -> None:
        event = await self._receive()
        if event["type"] != "websocket.connect":  # the client left before the upgrade
            self.closed = True
            return
        await self._send({"type": "websocket.accept", "subprotocol": subprotocol, "headers": []})

    async def receive(self) -> str | bytes | None:
        """The next message; None once the client closed or went away."""
        event = await self._receive()
        if event["type"] == "websocket.receive":
            data: str | bytes | None = event.get("bytes")
            return data if data is not None else event.get("text") or ""
        self.closed = True
        return None

    async def send(self, data: str | bytes) -> None:
        if isinstance(data, bytes):
            await self._send({"type": "websocket.send", "bytes": data, "text": None})
        else:
            await self._send({"type": "websocket.send", "bytes": None, "text": data})

    async def close(self, code: int, reason: str = "") -> None:
        if not self.closed:
            self.closed = True
            await self._send({"type": "websocket.close", "code": code, "reason": reason})
