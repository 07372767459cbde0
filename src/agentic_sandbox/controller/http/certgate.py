"""The client certificate gate: a presented certificate not on the admin allow-list is refused.

In front of every HTTP and WebSocket surface when ``AIWG_TLS_CLIENT_AUTH`` is on (the ASGI app's
outermost layer, so it holds for requests another controller would serve too). A verified
certificate decides who the caller is, before any bearer token (upstream's precedence,
:mod:`controller.auth.mtls`): on the allow-list it is the admin and passes; any other is answered
403 here, on every path but the public ones (health, metrics, discovery), which stay open to any
caller as they are without mTLS. No certificate: the request passes and its token decides.
"""

from __future__ import annotations

from typing import Any

import msgspec

from ..auth.mtls import CLIENT_CERT

Scope = dict[str, Any]

#: Paths anyone may ask, certificate or not (upstream's unauthenticated paths, and ours).
PUBLIC_PATHS = frozenset(
    {
        "/health",
        "/healthz",
        "/healthz/http",
        "/healthz/libvirt",
        "/readyz",
        "/metrics",
        "/openapi.json",
        "/api/v2/admin/openapi.json",
        "/mcp",
        "/api/v1/bootstrap-enrollment/consume",
        "/api/v2/celld/effects",
    }
)
PUBLIC_SUFFIXES = ("/.well-known/agent-card.json", "/.well-known/jwks.json", "/v1/card")


def is_public(path: str) -> bool:
    return path in PUBLIC_PATHS or path.endswith(PUBLIC_SUFFIXES)


class CertificateGate:
    """ASGI middleware; ``admins`` are the allow-listed certificate names."""

    def __init__(self, app: Any, admins: frozenset[str]) -> None:
        self.app = app
        self.admins = admins

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        certificate = CLIENT_CERT.get()
        if (
            certificate is None
            or scope["type"] not in ("http", "websocket")
            or certificate.allowed(self.admins)
            or is_public(scope.get("path", ""))
        ):
            await self.app(scope, receive, send)
            return
        body = msgspec.json.encode(
            {
                "type": "https://agentic-sandbox.aiwg.io/errors/auth.forbidden",
                "title": "Forbidden",
                "status": 403,
                "code": "auth.forbidden",
                "detail": f"the client certificate {certificate.label!r} is not allowed here "
                "(not on AIWG_MTLS_ADMIN_ALLOWLIST); a bearer token does not replace it",
            }
        )
        head = [(b"content-type", b"application/problem+json"), (b"content-length", str(len(body)).encode())]
        if scope["type"] == "http":
            await send({"type": "http.response.start", "status": 403, "headers": head})
            await send({"type": "http.response.body", "body": body, "more_body": False})
            return
        event = await receive()
        if event["type"] != "websocket.connect":
            return
        if "websocket.http.response" in (scope.get("extensions") or {}):
            await send({"type": "websocket.http.response.start", "status": 403, "headers": head})
            await send({"type": "websocket.http.response.body", "body": body, "more_body": False})
        else:
            await send({"type": "websocket.close", "code": 1008})
