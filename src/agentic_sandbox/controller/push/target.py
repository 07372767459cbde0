"""Where a webhook URL points, checked: the address found here is the one delivery connects to.

A URL is parsed (``http`` or ``https``, a host, no credentials), its host resolved once, and every
address it resolves to must be public (not loopback, private, link-local, multicast, reserved,
unspecified) unless the operator allows private targets. :class:`Target` keeps the address
chosen, and the sender connects to that address itself (sending the name as ``Host`` and as TLS
SNI), so a name that resolves differently the second time (DNS rebinding) cannot move a delivery
to an address that was never checked.

When a config is made only what cannot change is judged (:func:`check_literal`): the URL's form, and
a host that is an address literal (or ``localhost``, RFC 6761's loopback names). A name is not
resolved then: DNS can be down for a moment, and a config must not be lost to it; delivery resolves
and checks it every time it connects (and retries when it does not resolve).
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


def check_literal(raw: str, *, allow_private: bool) -> Url:
    """``raw`` parsed, refused if its host is a forbidden address literal or a loopback name."""
    url = parse_url(raw)
    if allow_private:
        return url
    host = url.host.lower().rstrip(".")
    if host == "localhost" or host.endswith(".localhost"):
        raise url_error(f"url's host {url.host!r} is loopback (AIWG_PUSH_ALLOW_PRIVATE=1 allows it)")
    try:
        literal = forbidden(host.split("%", 1)[0])  # an IPv6 zone id is no part of the address
    except ValueError:
        return url  # a name: checked where it matters, at delivery
    if literal:
        raise url_error(
            f"url's host {url.host!r} is a loopback, private, link-local, multicast or reserved address"
            " (AIWG_PUSH_ALLOW_PRIVATE=1 allows them)"
        )
    return url


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
