"""Admin operation polling: ``GET /operations/{id}`` (404 once purged or never made)."""

from __future__ import annotations

from quart import Response

from ..auth import READ, require_role
from ..http import json_response
from ..operations import to_view
from ..problems import not_found
from ..state import app_state
from . import admin


@admin.get("/operations/<op_id>")
@require_role(*READ)
async def get_operation(op_id: str) -> Response:
    op = await app_state().operations.get(op_id)
    if op is None:
        raise not_found("operation.not_found", f"no operation with id {op_id!r} (ended ones are kept for a day)")
    return json_response(to_view(op))
