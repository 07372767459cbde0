"""Admin libvirt routes (upstream's): capture a pre-enrollment VM checkpoint, restore one, make a
warm pool of checkpoints, hand off one of its slots as a new instance.

Each answers 202 with an operation (:mod:`controller.instances.checkpoints`, :mod:`controller.instances.pools`,
:mod:`controller.instances.provisioning`); a handoff also carries the new instance's A2A token, once, as a
provision does. Every warm pool (of any runtime) is listed by ``/warm-pools`` (``warmpools.py``).
"""

from __future__ import annotations

from quart import Response

from ..auth.tokens import ADMIN_ONLY
from ..decoding import decode_json
from ..http.responses import request_body
from ..http.roles import require_role
from ..models import (
    LibvirtCheckpointRequest,
    LibvirtRestoreRequest,
    LibvirtWarmPoolHandoffRequest,
    LibvirtWarmPoolInitRequest,
)
from ..state import app_state
from .blueprint import admin
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


@admin.post("/libvirt/warm-pools")
@require_role(*ADMIN_ONLY)
async def init_warm_pool() -> Response:
    req = decode_json(await request_body(), LibvirtWarmPoolInitRequest)
    return accepted(await app_state().pools.init_libvirt(req))


@admin.post("/libvirt/warm-pools/<pool>/handoff")
@require_role(*ADMIN_ONLY)
async def handoff_warm_pool(pool: str) -> Response:
    body = await request_body()
    if body.strip():
        decode_json(body, LibvirtWarmPoolHandoffRequest)  # empty: anything in it is refused, named
    op, token = await app_state().instances.handoff(pool)
    return accepted(op, a2a_token=token)
