"""How one controller vouches for the caller of a request it forwards to another.

The controller a client called authenticates it (once) and sends the request on with
``x-aiwg-peer: v1.<time>.<caller>.<origin>.<signature>`` instead of the client's credentials:

* ``<time>``: Unix seconds when it was signed; a peer refuses one more than ``max_skew_s`` (30 s)
  away from its own clock, so a captured header is good for that long and no longer;
* ``<caller>``: base64url of the JSON :class:`Principal` (``-``: no valid credentials, as for a
  public path; the peer then serves an anonymous request);
* ``<origin>``: base64url of the origin the client asked at (AgentCards and links name it);
* ``<signature>``: base64url of HMAC-SHA256 with the cluster's secret over the version, the time,
  the request's method and target (path and query as ASGI gives them) and the two fields above.

Only a holder of the secret (a controller that can read the shared database) can make one; the
signature binds it to one method and target, so it cannot be moved to another request. It is not
encryption: between hosts on an untrusted network, serve the controllers over TLS.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import time
from collections.abc import Callable
from typing import Any

import msgspec

from ..auth.tokens import Principal

VERSION = "v1"
ANONYMOUS = "-"
#: How far a signature's time may be from the peer's clock.
MAX_SKEW_S = 30.0


def request_target(scope: dict[str, Any]) -> str:
    """An ASGI request's path and query, as both sides of a forward see it."""
    query: bytes = scope.get("query_string", b"")
    path: str = scope["path"]
    return f"{path}?{query.decode('latin-1')}" if query else path


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


class PeerSigner:
    """Signs and checks ``x-aiwg-peer`` with the cluster's secret (see the module docstring)."""

    def __init__(self, secret: bytes, *, max_skew_s: float = MAX_SKEW_S, clock: Callable[[], float] = time.time):
        self._secret = secret
        self.max_skew_s = max_skew_s
        self._clock = clock

    def _mac(self, stamp: str, method: str, target: str, caller: str, origin: str) -> str:
        message = "\n".join((VERSION, stamp, method, target, caller, origin)).encode("utf-8", "surrogateescape")
        return _b64(hmac.new(self._secret, message, hashlib.sha256).digest())

    def header(self, principal: Principal | None, method: str, target: str, edge_url: str = "") -> str:
        stamp = str(int(self._clock()))
        caller = ANONYMOUS if principal is None else _b64(msgspec.json.encode(principal))
        origin = _b64(edge_url.encode())
        return ".".join((VERSION, stamp, caller, origin, self._mac(stamp, method, target, caller, origin)))

    def verify(self, header: str, method: str, target: str) -> tuple[Principal | None, str] | None:
        """The caller and the client's origin a valid header vouches for; None if it is not valid."""
        parts = header.split(".")
        if len(parts) != 5 or parts[0] != VERSION:
            return None
        _, stamp, caller, origin, mac = parts
        if not hmac.compare_digest(mac.encode(), self._mac(stamp, method, target, caller, origin).encode()):
            return None
        try:
            if abs(self._clock() - int(stamp)) > self.max_skew_s:
                return None
            principal = None if caller == ANONYMOUS else msgspec.json.decode(_unb64(caller), type=Principal)
            return principal, _unb64(origin).decode()
        except (ValueError, binascii.Error, msgspec.DecodeError, UnicodeDecodeError):
            return None  # signed by a peer, yet unreadable: a bug there; refused all the same
