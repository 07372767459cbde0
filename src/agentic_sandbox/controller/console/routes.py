"""``/console/``: the web console's page and files, each response under a strict policy.

The console is a static page over the admin, A2A and PTY surfaces: it holds no state and no secret
of its own, the server renders nothing into it but a CSP nonce, and the token a person signs in with
stays in the tab's ``sessionStorage`` (sent as ``Authorization: Bearer``, or as the PTY binding's
``bearer.`` subprotocol entry; never in a URL or a cookie).

``GET /console`` redirects to ``/console/``; ``GET /console/`` is the page (a fresh nonce each time,
``Cache-Control: no-store``); ``GET /console/<name>`` a built file by its exact name (``ETag``,
``If-None-Match`` gets 304, ``Cache-Control: no-cache`` so an upgrade is seen at once). An unknown
name is 404, a console that was never built 503 saying how to build it; both plain text.

Every response under ``/console`` (errors and 405s included: :func:`secure` runs app-wide) carries
:func:`policy` and ``nosniff``, ``no-referrer``, ``DENY`` framing and same-origin isolation.

The policy, and why each part is what it is:

* ``default-src 'none'``, ``script-src 'self'``: scripts only from the console's own files; no
  inline script, no ``eval``, no other host. ``require-trusted-types-for 'script'`` with
  ``trusted-types 'none'``: no string ever reaches an HTML or script sink (the page builds every
  node with ``createElement``/``textContent``; xterm.js never uses ``innerHTML``).
* ``connect-src 'self'``: the APIs and the attach WebSocket of this origin only.
* ``style-src-elem 'self' 'nonce-…'``: stylesheets from the console's files, plus the ``<style>``
  elements xterm.js creates at run time for its renderer (fonts, theme colours, cell sizes). Those
  cannot come from a file, so the page stamps each one it creates with this response's nonce. An
  injected ``<style>`` has no nonce and is refused.
* ``style-src-attr 'unsafe-inline'``: xterm.js colours 24-bit-colour cells with a ``style``
  attribute. A style attribute runs no script and can load nothing (images and fonts are
  ``'self'`` only).
* ``style-src 'self' 'nonce-…'``: the same for browsers that lack the ``-elem``/``-attr`` forms
  (they then draw 24-bit colours in the default colour).
* ``base-uri 'none'``, ``form-action 'none'`` (the sign-in form is handled in script and can never
  be submitted as a navigation, which would put the token in a URL), ``frame-ancestors 'none'``.
"""

from __future__ import annotations

import secrets

from quart import Blueprint, Response, request

from ..state import app_state
from .assets import INDEX, ConsoleAssets

console = Blueprint("console", __name__)

PREFIX = "/console"
HTML = "text/html; charset=utf-8"
TEXT = "text/plain; charset=utf-8"
NONCE_BYTES = 18

SECURITY_HEADERS = {
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "X-Frame-Options": "DENY",
    "Cross-Origin-Opener-Policy": "same-origin",
    "Cross-Origin-Resource-Policy": "same-origin",
}


def policy(nonce: str | None = None) -> str:
    """The Content-Security-Policy of a console response (the page's carries its nonce)."""
    styles = "'self'" + (f" 'nonce-{nonce}'" if nonce else "")
    return "; ".join(
        [
            "default-src 'none'",
            "script-src 'self'",
            f"style-src {styles}",
            f"style-src-elem {styles}",
            "style-src-attr 'unsafe-inline'",
            "connect-src 'self'",
            "img-src 'self'",
            "font-src 'self'",
            "base-uri 'none'",
            "form-action 'none'",
            "frame-ancestors 'none'",
            "require-trusted-types-for 'script'",
            "trusted-types 'none'",
        ]
    )


async def secure(response: Response) -> Response:
    """after_request (app-wide): the headers every response under ``/console`` carries."""
    if request.path == PREFIX or request.path.startswith(PREFIX + "/"):
        response.headers.setdefault("Content-Security-Policy", policy())
        for name, value in SECURITY_HEADERS.items():
            response.headers[name] = value
    return response


def _text(status: int, message: str) -> Response:
    return Response(message + "\n", status=status, content_type=TEXT)


def _built() -> ConsoleAssets | Response:
    """The console's files, or the 503 that says why there are none."""
    assets = app_state().console
    if assets is None:
        return _text(503, "the web console is not loaded")
    if assets.missing is not None:
        return _text(503, assets.missing)
    return assets


@console.get(PREFIX)
async def to_page() -> Response:
    return Response(b"", status=308, headers={"Location": PREFIX + "/"})


@console.get(PREFIX + "/")
async def page() -> Response:
    assets = _built()
    if isinstance(assets, Response):
        return assets
    nonce = secrets.token_urlsafe(NONCE_BYTES)
    response = Response(assets.index(nonce), content_type=HTML)
    response.headers["Content-Security-Policy"] = policy(nonce)
    response.headers["Cache-Control"] = "no-store"
    return response


@console.get(PREFIX + "/<path:name>")
async def asset(name: str) -> Response:
    assets = _built()
    if isinstance(assets, Response):
        return assets
    found = assets.get(name)
    if found is None or name == INDEX:  # the page is served only with its nonce, at /console/
        return _text(404, f"the console has no file {name!r}")
    if found.etag in [tag.strip() for tag in request.headers.get("If-None-Match", "").split(",")]:
        response = Response(b"", status=304)
    else:
        response = Response(found.body, content_type=found.content_type)
    response.headers["ETag"] = found.etag
    response.headers["Cache-Control"] = "no-cache"
    return response
