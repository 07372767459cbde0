"""Admin operation polling: ``GET /operations/{id}`` (404 once purged or never made)."""

from __future__ import annotations

from quart import Response

from ..auth.tokens import READ
from ..http.responses import json_response
from ..http.roles import require_role
from ..state import app_state
from .blueprint import admin
from .views import operation_view


@admin.get("/operations/<op_id>")
@require_role(*READ)
async def get_operation(op_id: str) -> Response:
    return json_response(operation_view(await app_state().operations.require(op_id)))
