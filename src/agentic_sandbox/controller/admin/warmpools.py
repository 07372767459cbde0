"""Admin warm pool routes: every pool hostd keeps (of containers or VMs), with its counters.

``GET /warm-pools`` and ``GET /warm-pools/{pool}`` (admin and operator): hostd's ``PoolList``,
asked on every call (503 while hostd cannot answer, 501 ``capability.unsupported`` from a hostd
without warm pools). Pools are configured with ``AIWG_WARM_POOLS`` or made of checkpoints with
``POST /libvirt/warm-pools`` (``libvirt.py``).
"""

from __future__ import annotations

from quart import Response

from agentic_sandbox.proto import messages as m

from ..auth.tokens import READ
from ..http.responses import json_response
from ..http.roles import require_role
from ..models import WarmPoolList, WarmPoolView
from ..state import app_state
from .blueprint import admin


def pool_view(pool: m.PoolInfo, configured: bool) -> WarmPoolView:
    return WarmPoolView(
        pool=pool.pool,
        runtime=pool.runtime,
        provider=pool.provider,
        source=pool.source,
        size=pool.size,
        ready=pool.ready,
        filling=pool.filling,
        hits=pool.hits,
        misses=pool.misses,
        refills=pool.refills,
        failures=pool.failures,
        loadout=pool.loadout,
        last_error=pool.last_error,
        configured=configured,
    )


@admin.get("/warm-pools")
@require_role(*READ)
async def list_warm_pools() -> Response:
    pools = app_state().pools
    items = [pool_view(p, p.pool in pools.configured) for p in await pools.list()]
    return json_response(WarmPoolList(items=items))


@admin.get("/warm-pools/<pool>")
@require_role(*READ)
async def get_warm_pool(pool: str) -> Response:
    pools = app_state().pools
    return json_response(pool_view(await pools.get(pool), pool in pools.configured))
