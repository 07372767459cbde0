"""``/agents/{instance_id}/sessions/{session_id}/attach``: the upgrade and its checks.

Served on ASGI by :class:`WebsocketConnection` (the app's ``asgi_websocket_class``; why, in
:mod:`controller.pty.asgisocket`). The upgrade is answered with an HTTP error and a JSON body
``{"error": {code, status, message}}``, never upgraded, when a check fails, in this order:

1. subprotocol: ``pty-ws.v1.binary`` if offered, else ``pty-ws.v1``; exactly the chosen one is
   echoed; an offer naming neither is 400 (an absent header is taken as ``pty-ws.v1`` in dev mode
   only);
2. bearer token: ``Authorization: Bearer`` or a ``bearer.<base64url>`` subprotocol entry (never
   the query string); none or unknown is 401, a principal without ``pty:observe`` 403
   (:func:`controller.pty.scopes.pty_scopes`);
3. the session: 404 unless it exists under this instance; 503 when hostd is away;
4. ``?replay_from=N``: a non-negative integer, else 400.

Then the socket is :class:`controller.pty.attach.AttachSocket`'s.
"""

from __future__ import annotations

import base64
import binascii
import re
from typing import Any

from quart import Quart
from quart_trio.asgi import TrioASGIWebsocketConnection

from agentic_sandbox.proto import bind_log_ids

from ..auth.tokens import ROLE_REFUSED, may_use_instance
from ..errors import ControllerError, NotFound
from ..state import state_of
from . import frames as f
from .asgisocket import AsgiWebSocket
from .attach import AttachSocket
from .legacy import SCOPE_KEY as LEGACY_SCOPE_KEY
from .scopes import PTY_OBSERVE, pty_scopes

ATTACH_PATH = re.compile(r"/agents/(?P<instance_id>[^/]+)/sessions/(?P<session_id>[^/]+)/attach")


class WebsocketConnection(TrioASGIWebsocketConnection):
    """Set as ``app.asgi_websocket_class``: the attach path is served here, on ASGI; every other
    WebSocket (the legacy v1 socket, on its own port) as quart-trio serves it."""

    async def __call__(self, receive: Any, send: Any) -> None:
        match = ATTACH_PATH.fullmatch(self.scope["path"])
        if match is None or self.scope.get(LEGACY_SCOPE_KEY):
            await super().__call__(receive, send)
            return
        ws = AsgiWebSocket(dict(self.scope), receive, send)
        await attach(self.app, ws, match["instance_id"], match["session_id"])


def _error(status: int, code: str, message: str) -> dict[str, Any]:
    return {"error": {"code": code, "status": status, "message": message}}


def _authorization(ws: AsgiWebSocket, offered: list[str]) -> str | None:
    header = ws.headers.get("authorization")
    if header:
        return header
    for entry in offered:
        if entry.startswith("bearer."):
            raw = entry[len("bearer.") :]
            try:
                token = base64.urlsafe_b64decode(raw + "=" * (-len(raw) % 4)).decode()
            except (binascii.Error, UnicodeDecodeError, ValueError):
                return None
            return f"Bearer {token}"
    return None


async def attach(app: Quart, ws: AsgiWebSocket, instance_id: str, session_id: str) -> None:
    state = state_of(app)
    bind_log_ids(instance_id=instance_id, session_id=session_id)
    offered = [entry.strip() for entry in ws.subprotocols]
    names = [entry for entry in offered if not entry.startswith("bearer.")]
    if f.BINARY_SUBPROTOCOL in names:
        chosen: str | None = f.BINARY_SUBPROTOCOL
    elif f.JSON_SUBPROTOCOL in names or (not names and state.config.dev):
        chosen = f.JSON_SUBPROTOCOL if names else None
    else:
        supported = f"{f.JSON_SUBPROTOCOL}, {f.BINARY_SUBPROTOCOL}"
        await ws.refuse(400, _error(400, "unsupported_subprotocol", f"offer one of the subprotocols {supported}"))
        return
    principal = state.auth.authenticate(_authorization(ws, offered))
    if principal is None:
        body = _error(401, "unauthenticated", "a valid bearer token is required")
        await ws.refuse(401, body, {"WWW-Authenticate": "Bearer"})
        return
    if principal.role == ROLE_REFUSED:  # a client certificate not on the allow-list
        await ws.refuse(403, _error(403, "forbidden", f"the client certificate {principal.label!r} is not allowed"))
        return
    if not may_use_instance(principal, instance_id):
        # Another instance's token learns nothing of this one, not even that it exists.
        await ws.refuse(404, _error(404, "instance.not_found", f"no instance {instance_id!r}"))
        return
    scopes = pty_scopes(principal, instance_id)
    if PTY_OBSERVE not in scopes:
        await ws.refuse(403, _error(403, "forbidden", "the token lacks pty:observe on this instance"))
        return
    try:
        info = await state.sessions.get(instance_id, session_id)
    except NotFound as exc:
        await ws.refuse(404, _error(404, exc.code, exc.message))
        return
    except ControllerError as exc:
        await ws.refuse(503, _error(503, exc.code, exc.message), {"Retry-After": "1"})
        return
    replay_from: int | None = None
    raw = ws.args.get("replay_from")
    if raw is not None:
        if not raw.isdigit() or len(raw) > 19:
            await ws.refuse(400, _error(400, "invalid_request", "replay_from must be a non-negative integer"))
            return
        replay_from = int(raw)
    await ws.accept(chosen)
    if ws.closed:
        return
    sock = AttachSocket(
        ws,
        info,
        scopes,
        binary=chosen == f.BINARY_SUBPROTOCOL,
        replay_from=replay_from,
        link=state.link,
        rooms=state.rooms,
        sessions=state.sessions,
        ping_interval_s=state.config.pty_ping_interval_s,
        ping_timeout_s=state.config.pty_ping_timeout_s,
    )
    await sock.run()
