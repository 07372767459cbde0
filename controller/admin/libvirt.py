"""Admin libvirt routes (upstream's): capture a pre-enrollment VM checkpoint, restore one.

Both answer 202 with an operation (:mod:`controller.checkpoints`). Warm pools are not here yet.
"""

from __future__ import annotations

from quart import Response

from ..auth import ADMIN_ONLY, require_role
from ..decoding import decode_json
from ..http import request_body
from ..models import LibvirtCheckpointRequest, LibvirtRestoreRequest
from ..state import app_state
from . import admin
from .views import accepted


@admin.post("/libvirt/checkpoints")
@require_role(*ADMIN_ONLY)
async def create_checkpoint() -> Response:
    req = decode_json(await request_body(), LibvirtCheckpointRequest)
    return accepted(await app_state().checkpoints.capture(req))


@admin.post("/libvirt/checkpoints/<checkpoint_id>/restore")
@require_role(*ADMIN_ONLY)
async def restore_checkpoint(checkpoint_id: str) -> Response:
    req = decode_json(await request_body(), LibvirtRestoreRequest)
    return accepted(await app_state().checkpoints.restore(checkpoint_id, req))
