"""Admin host routes: the hosts of a shared store, cordon and drain (docs/hosts.md).

``GET /hosts`` and ``GET /hosts/{id}`` (admin and operator): each host as its controllers last
reported it, its state (``available`` while one of them reported within ``AIWG_HOST_TIMEOUT_S``),
its instances in the catalog by state and its controllers. ``POST /hosts/{id}/cordon`` and
``/uncordon`` (no new placements), ``/drain`` and ``/undrain`` (no new placements, no new tasks or
sessions on its instances) answer the host as it is after (admin and operator).
``DELETE /hosts/{id}`` (admin) forgets a host that is unavailable and holds no instance: 409 while
it is available or holds one, unless ``force=true``, which forgets its instances' catalog rows
(and their credentials) with it: a host gone for good, whose instances no controller can reach.
"""

from __future__ import annotations

import time

from quart import Response, request

from ..auth.tokens import ADMIN_ONLY, OPERATE, READ
from ..errors import InvalidState, NotFound
from ..http.responses import json_response
from ..http.roles import require_role
from ..models import HostControllerView, HostInstances, HostList, HostView
from ..state import app_state
from ..store import ControllerRecord, HostRecord, InstanceRecord
from .blueprint import admin
from .views import iso

FLAGS = {
    "cordon": {"cordoned": True},
    "uncordon": {"cordoned": False},
    "drain": {"draining": True},
    "undrain": {"draining": False},
}


def host_view(
    rec: HostRecord, counts: dict[str, int], controllers: list[ControllerRecord], *, now: float, timeout_s: float
) -> HostView:
    return HostView(
        id=rec.id,
        name=rec.name,
        boot_id=rec.boot_id,
        state="available" if rec.heard(now, timeout_s) else "unavailable",
        cordoned=rec.cordoned,
        draining=rec.draining,
        labels=dict(rec.labels),
        runtimes=list(rec.runtimes),
        capacity={
            "cpus": rec.capacity.cpus,
            "memory_bytes": rec.capacity.memory_bytes,
            "memory_available_bytes": rec.capacity.memory_available_bytes,
            "max_instances": rec.capacity.max_instances,
        },
        instances=HostInstances(total=sum(counts.values()), by_state=dict(sorted(counts.items()))),
        controllers=[
            HostControllerView(
                id=c.id,
                url=c.url,
                started_at=iso(c.started_at),
                heartbeat_at=iso(c.heartbeat_at),
                alive=c.heard(now, timeout_s),
            )
            for c in controllers
            if c.host_id == rec.id
        ],
        registered_at=iso(rec.registered_at),
        heartbeat_at=iso(rec.heartbeat_at),
    )


async def _views(only: str | None = None) -> list[HostView]:
    state = app_state()
    store, timeout_s = state.hosts.store, state.hosts.timeout_s
    hosts = await store.hosts.list()
    if only is not None:
        hosts = [h for h in hosts if h.id == only]
        if not hosts:
            raise NotFound("host.not_found", f"no host {only!r}")
    counts = await store.hosts.instance_counts()
    controllers = await store.hosts.controllers()
    now = time.time()
    return [host_view(h, counts.get(h.id, {}), controllers, now=now, timeout_s=timeout_s) for h in hosts]


@admin.get("/hosts")
@require_role(*READ)
async def list_hosts() -> Response:
    return json_response(HostList(items=await _views()))


@admin.get("/hosts/<host_id>")
@require_role(*READ)
async def get_host(host_id: str) -> Response:
    return json_response((await _views(host_id))[0])


@admin.post("/hosts/<host_id>/<any(cordon, uncordon, drain, undrain):verb>")
@require_role(*OPERATE)
async def flag_host(host_id: str, verb: str) -> Response:
    state = app_state()
    rec = await state.hosts.store.hosts.set_flags(host_id, **FLAGS[verb])
    if rec is None:
        raise NotFound("host.not_found", f"no host {host_id!r}")
    if rec.id == state.hosts.host_id:
        state.hosts.own = rec  # this host's controllers hear of it at their next heartbeat; this one now
    await state.hosts.refresh()
    return json_response((await _views(host_id))[0])


@admin.delete("/hosts/<host_id>")
@require_role(*ADMIN_ONLY)
async def forget_host(host_id: str) -> Response:
    """Forget a host that is unavailable; with ``force=true`` its instances' catalog rows too (a host
    gone for good: its instances cannot be decommissioned through it any more)."""
    state = app_state()
    view = (await _views(host_id))[0]
    if view.state == "available":
        raise InvalidState("host.available", f"host {host_id} is available: stop its controllers first")
    force = request.args.get("force", "false").lower() in ("true", "1", "yes")
    if view.instances.total and not force:
        raise InvalidState(
            "host.not_empty",
            f"host {host_id} holds {view.instances.total} instance(s) in the catalog: decommission them, "
            "or forget them with the host (force=true)",
        )
    for rec in await _instances_of(host_id):
        await state.hosts.store.instances.delete(rec.id)
        await state.credentials.forget(rec.id)
        state.events.instance_removed(rec.id, name=rec.name, operation_id=None, reason="host_forgotten")
    await state.hosts.store.hosts.forget(host_id)
    return Response(b"", status=204)


async def _instances_of(host_id: str) -> list[InstanceRecord]:
    return [rec for rec in await app_state().hosts.store.instances.list(host_id=host_id) if rec.host_id == host_id]
