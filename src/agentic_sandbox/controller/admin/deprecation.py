"""``GET /deprecation/v1-counters``: v1 hits per route template, the v1→v2 map and the Sunset date."""

from __future__ import annotations

from quart import Response

from ..auth.tokens import READ
from ..http.responses import json_response
from ..http.roles import require_role
from ..state import app_state
from ..v1 import PATH_MAP
from .blueprint import admin


@admin.get("/deprecation/v1-counters")
@require_role(*READ)
async def v1_counters() -> Response:
    state = app_state()
    sunset = state.config.v1_sunset_datetime.strftime("%Y-%m-%dT%H:%M:%SZ")
    return json_response({"counters": state.metrics.v1_counts(), "path_map": PATH_MAP, "sunset": sunset})
