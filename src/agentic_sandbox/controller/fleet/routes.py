"""fleet-workload/v1 under ``/api/v2/fleet`` (:mod:`controller.fleet.service` holds the rules).

Reads take the operator roles (admin, operator); admission, observations and reconciliation the
admin, upstream's "normal management admin principal". Errors are problem+json, as on the admin
surface.
"""

from __future__ import annotations

from typing import Any

from quart import Blueprint, Response

from ..auth.tokens import ADMIN_ONLY, READ
from ..decoding import decode_json
from ..http.problems import install_problem_handlers
from ..http.responses import json_response, request_body
from ..http.roles import require_role
from ..state import app_state
from .documents import Observation, ReconcileRequest

PREFIX = "/api/v2/fleet"
fleet = Blueprint("fleet", __name__, url_prefix=PREFIX)
install_problem_handlers(fleet)


@fleet.post("/workloads")
@require_role(*ADMIN_ONLY)
async def admit_workload() -> Response:
    document = decode_json(await request_body(), dict[str, Any])
    created, record = await app_state().fleet.admit(document)
    if not created:
        return json_response(record, 200)  # an identical replay
    location = f"{PREFIX}/workloads/{record['lineage']['child_id']}"
    return json_response(record, 202, {"Location": location})


@fleet.get("/workloads")
@require_role(*READ)
async def fleet_inventory() -> Response:
    return json_response(await app_state().fleet.inventory())


@fleet.get("/workloads/<child_id>")
@require_role(*READ)
async def get_workload(child_id: str) -> Response:
    return json_response(await app_state().fleet.get(child_id))


@fleet.post("/workloads/<child_id>/observations")
@require_role(*ADMIN_ONLY)
async def observe_workload(child_id: str) -> Response:
    observation = decode_json(await request_body(), Observation)
    return json_response(await app_state().fleet.observe(child_id, observation))


@fleet.post("/reconcile")
@require_role(*ADMIN_ONLY)
async def reconcile_fleet() -> Response:
    request = decode_json(await request_body(), ReconcileRequest)
    return json_response(await app_state().fleet.reconcile(request))
