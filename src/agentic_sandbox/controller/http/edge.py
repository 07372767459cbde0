"""HTTP rules every route keeps, whichever surface it belongs to (installed by ``create_app``).

* **OPTIONS under** ``/api/``. Quart answers OPTIONS on every route by itself (200, an empty
  ``text/html`` body) before any view or auth runs. An API route answers as the API instead:
  without a valid bearer token 401 ``auth.unauthorized`` (problem+json, ``WWW-Authenticate``),
  exactly as its other methods would; with one (any role: it only learns the method list) 204 with
  ``Allow``. A path that matches no route stays a 404 problem. Outside ``/api/`` (observability)
  Quart's automatic answer stays.
* **No body, no type.** Quart gives every response ``Content-Type: text/html`` unless told
  otherwise; a response without a body (204, 304, or an empty one) has no representation to
  describe, so the header is dropped. A HEAD response keeps the type of the GET it mirrors.
"""

from __future__ import annotations

from quart import Response, current_app, request
from quart_trio import QuartTrio

from ..errors import Unauthenticated
from ..state import app_state

API_PREFIX = "/api/"
_BODILESS_STATUSES = frozenset({204, 304})


async def _api_options() -> Response | None:
    """before_request: answer OPTIONS on a matched API route; anything else passes through."""
    rule = request.url_rule
    if request.method != "OPTIONS" or rule is None or not request.path.startswith(API_PREFIX):
        return None
    if app_state().auth.authenticate(request.headers.get("Authorization")) is None:
        raise Unauthenticated("auth.unauthorized", "a valid bearer token is required")
    # Each method may be its own rule (``admin.get``, ``admin.put``): ask the map for all of them.
    methods = current_app.url_map.bind("localhost").allowed_methods(request.path)
    response = Response(b"", status=204)
    response.headers["Allow"] = ", ".join(sorted(methods))
    return response


async def _no_type_without_body(response: Response) -> Response:
    """after_request: drop ``Content-Type`` from a response that has no body."""
    if response.status_code in _BODILESS_STATUSES or response.content_length == 0:
        response.headers.pop("Content-Type", None)
    return response


def install_http_edge(app: QuartTrio) -> None:
    app.before_request(_api_options)
    app.after_request(_no_type_without_body)
