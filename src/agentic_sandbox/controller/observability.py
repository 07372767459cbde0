"""Surface 3, observability (no auth): ``/healthz``, ``/readyz``, ``/metrics``, the OpenAPI document.

* ``/healthz`` (and upstream's ``/healthz/http`` and ``/health``): ``{"status": "alive"}`` while
  the process serves.
* ``/healthz/libvirt``: 200 ``{"status": "ok"}`` while hostd's libvirt provider can take a VM, else
  503 with the reason (upstream's probe).
* ``/readyz``: 200 ``{"ready": true}`` while the hostd link is up and, with PostgreSQL, the
  database answers (within :data:`READY_DATABASE_TIMEOUT_S`); else 503 ``{"ready": false,
  "reason": ...}``. It follows both, so it recovers by itself.
* ``/metrics``: Prometheus text from the app's own registry; the instance, session and warm pool
  figures are refreshed from hostd at scrape time when hostd is reachable (a scrape never fails
  because hostd is away: ``aiwg_hostd_up`` says so; the pools keep their last figures).
* ``/openapi.json`` and ``/api/v2/admin/openapi.json``: ``controller/openapi.yaml`` (package data)
  as JSON, loaded once per app.
"""

from __future__ import annotations

import logging
from importlib import resources

import trio
import yaml
from quart import Blueprint, Response

from agentic_sandbox.proto import messages as m

from .errors import ControllerError, Unavailable
from .http.responses import json_response
from .instances.pools import CAPABILITY as WARM_POOLS
from .metrics import CONTENT_TYPE
from .state import app_state

log = logging.getLogger(__name__)

observability = Blueprint("observability", __name__)

SCRAPE_HOSTD_TIMEOUT_S = 1.0
READY_DATABASE_TIMEOUT_S = 1.0


@observability.get("/healthz")
@observability.get("/healthz/http")  # upstream's CI liveness probe
@observability.get("/health")
async def healthz() -> Response:
    return json_response({"status": "alive"})


@observability.get("/healthz/libvirt")
async def healthz_libvirt() -> Response:
    """Upstream's libvirt probe: whether hostd's libvirt provider can take a VM now."""
    try:
        with trio.fail_after(SCRAPE_HOSTD_TIMEOUT_S):
            providers = await app_state().runtimes.providers()
    except (ControllerError, trio.TooSlowError) as exc:
        reason = exc.message if isinstance(exc, ControllerError) else "hostd did not answer"
        return json_response({"status": "unavailable", "reason": reason}, 503)
    libvirt = next((p for p in providers if p.provider == "libvirt"), None)
    if libvirt is None:
        return json_response({"status": "unavailable", "reason": "hostd offers no libvirt provider"}, 503)
    if not libvirt.available:
        return json_response({"status": "unavailable", "reason": libvirt.reason or "unavailable"}, 503)
    return json_response({"status": "ok"})


@observability.get("/readyz")
async def readyz() -> Response:
    state = app_state()
    link = state.link
    if not link.ready:
        return json_response({"ready": False, "reason": link.reason or "hostd is not reachable"}, 503)
    if state.store is not None and state.store.shared:
        reason = f"the database did not answer within {READY_DATABASE_TIMEOUT_S:g} s"
        with trio.move_on_after(READY_DATABASE_TIMEOUT_S):
            try:
                await state.store.db.ping()
                reason = ""
            except Unavailable as exc:
                reason = exc.message
        if reason:
            return json_response({"ready": False, "reason": reason}, 503)
    return json_response({"ready": True})


@observability.get("/metrics")
async def metrics() -> Response:
    state = app_state()
    if state.link.ready:
        with trio.move_on_after(SCRAPE_HOSTD_TIMEOUT_S):
            try:
                await state.instances.reconcile()
                status: m.StatusResponse = await state.link.call(m.StatusRequest(), timeout=SCRAPE_HOSTD_TIMEOUT_S)
                state.metrics.open_sessions.set(status.sessions_running)
                if any(WARM_POOLS in p.capabilities for p in status.providers):
                    listing = await state.link.call(m.PoolListRequest(), timeout=SCRAPE_HOSTD_TIMEOUT_S)
                    state.metrics.set_warm_pools(listing.pools)
            except ControllerError as exc:
                log.debug("metrics scrape could not refresh from hostd: %s", exc)
    try:
        state.metrics.set_instances(await state.instances.count_by_state())
    except Unavailable as exc:  # the database is away: the scrape still answers, with the last counts
        log.debug("metrics scrape could not count instances: %s", exc)
    return Response(state.metrics.render(), status=200, content_type=CONTENT_TYPE)


def _load_openapi() -> dict | None:
    try:
        text = resources.files("agentic_sandbox.controller").joinpath("openapi.yaml").read_text(encoding="utf-8")
    except FileNotFoundError:
        return None
    return yaml.safe_load(text)


@observability.get("/openapi.json")
@observability.get("/api/v2/admin/openapi.json")
async def openapi() -> Response:
    state = app_state()
    if state.openapi is None:
        state.openapi = await trio.to_thread.run_sync(_load_openapi)
    if state.openapi is None:
        return json_response({"error": "the OpenAPI document is not packaged"}, 404)
    return json_response(state.openapi)
