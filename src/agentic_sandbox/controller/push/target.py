"""Where a webhook URL points, checked: the address found here is the one delivery connects to.

A URL is parsed (``http`` or ``https``, a host, no credentials), its host resolved once, and every
address it resolves to must be public (not loopback, private, link-local, multicast, reserved,
unspecified) unless the operator allows private targets. :class:`Target` keeps the address
chosen, and the sender connects to that address itself (sending the name as ``Host`` and as TLS
SNI), so a name that resolves differently the second time (DNS rebinding) cannot move a delivery
to an address that was never checked.
"""

from __future__ import annotations

import ipaddress
import socket
from dataclasses import dataclass
from urllib.parse import urlsplit

import trio

from ..errors import ValidationFailed

INVALID_URL = "push.invalid_url"
MAX_URL = 2048


def url_error(message: str) -> ValidationFailed:
    return ValidationFailed([{"field": "url", "message": message, "code": "invalid"}], message, code=INVALID_URL)


@dataclass(frozen=True)
class Url:
    scheme: str
    host: str
    port: int
    path: str  # with the query

    @property
    def host_header(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        default = 443 if self.scheme == "https" else 80
        return host if self.port == default else f"{host}:{self.port}"


@dataclass(frozen=True)
class Target:
    url: Url
    address: str


def parse_url(raw: str) -> Url:
    if not raw or len(raw) > MAX_URL:
        raise url_error(f"url must be 1 to {MAX_URL} characters")
    try:
        parts = urlsplit(raw)
        port = parts.port
    except ValueError as exc:
        raise url_error(f"url is not a URL: {exc}") from None
    if parts.scheme not in ("http", "https"):
        raise url_error("url must be http or https")
    if not parts.hostname:
        raise url_error("url has no host")
    if parts.username is not None or parts.password is not None:
        raise url_error("url must not carry credentials (use authentication)")
    if any(ord(c) < 0x21 or ord(c) == 0x7F for c in raw):
        raise url_error("url holds whitespace or control characters")
    path = parts.path or "/"
    if parts.query:
        path += "?" + parts.query
    default = 443 if parts.scheme == "https" else 80
    return Url(parts.scheme, parts.hostname, port or default, path)


def forbidden(address: str) -> bool:
    ip = ipaddress.ip_address(address)
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return not ip.is_global or ip.is_multicast or ip.is_reserved or ip.is_unspecified


async def resolve(url: Url, *, allow_private: bool) -> Target:
    """The address to deliver to (the first one resolved), after checking every one resolved."""
    try:
        infos = await trio.socket.getaddrinfo(url.host, url.port, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError) as exc:
        raise url_error(f"url's host {url.host!r} does not resolve: {exc}") from None
    addresses = [str(info[4][0]) for info in infos]
    if not addresses:
        raise url_error(f"url's host {url.host!r} does not resolve")
    if not allow_private:
        bad = next((a for a in addresses if forbidden(a)), None)
        if bad is not None:
            raise url_error(
                f"url's host {url.host!r} resolves to {bad}, a loopback, private, link-local, multicast or"
                " reserved address (AIWG_PUSH_ALLOW_PRIVATE=1 allows them)"
            )
    return Target(url, addresses[0])
