"""v1 compatibility: the v1 admin paths answer through the v2 handlers, with deprecation headers.

Each v1 route translates its own path into the v2 path of the migration guide's map (``/agents``
and ``/vms`` → ``/instances``, the rest keep their shape under ``/api/v2/admin``), matches it against
the app's URL map and calls the admin view found there, in the same request (same auth, same body,
same query). So v1 and v2 can never drift apart.

Every response to a path under ``/api/v1/`` (404s included) carries ``Sunset`` (configured date),
``Deprecated: true`` and ``Link: <guide>; rel="successor-version"``; a matched request also counts in
``aiwg_v1_path_requests_total{path}`` under its route template (``/api/v1/vms/{id}``), never the raw
path.

Three v1 paths answer through the A2A surface instead (the guide's semantic and transport shifts):
``POST /api/v1/sessions/{id}/dispatch`` is ``messages:send`` of instance ``{id}`` (the body an A2A
SendMessageRequest, the answer its Task), ``GET /api/v1/ws/missions/{id}`` is the SSE event
stream (subscribe) of task ``{id}``, found on whichever instance holds it, and
``GET|POST /api/v1/hitl/{id}`` reads and answers the hitl-prompt/v1 prompt task ``{id}`` waits on
(:mod:`controller.a2a.v1hitl`). They take the A2A tokens and answer with the deprecation headers;
their errors, like every v1 error, are problems.
"""

from __future__ import annotations

import re
from typing import Any

from quart import Blueprint, Response, current_app, request
from werkzeug.exceptions import NotFound
from werkzeug.routing import BaseConverter

from .http.problems import install_problem_handlers
from .state import app_state

V1_PREFIX = "/api/v1"
V2_PREFIX = "/api/v2/admin"
MIGRATION_GUIDE = "https://agentic-sandbox.aiwg.io/v2-migration-guide"
SUCCESSOR_LINK = f'<{MIGRATION_GUIDE}>; rel="successor-version"'

#: The migration guide's v1 → v2 map (reported by ``/deprecation/v1-counters``).
PATH_MAP: dict[str, str] = {
    "/api/v1/agents": "/api/v2/admin/instances",
    "/api/v1/vms": "/api/v2/admin/instances",
    "/api/v1/operations/{id}": "/api/v2/admin/operations/{id}",
    "/api/v1/storage/{scope}/{path}": "/api/v2/admin/storage/{scope}/{path}",
    "/api/v1/container-images": "/api/v2/admin/container-images",
    "/api/v1/sessions/{id}/dispatch": "/agents/{id}/v1/messages:send",
    "/api/v1/ws/missions/{id}": "/agents/{id}/v1/tasks/{tid}/subscribe",
    "/api/v1/hitl/{id}": "input-required + hitl-prompt/v1 extension",
    "ws://host:8121/sessions/{id}": "wss://host/agents/{id}/sessions/{sid}/attach",
}

v1 = Blueprint("v1", __name__, url_prefix=V1_PREFIX)
install_problem_handlers(v1)


class _RestConverter(BaseConverter):
    """The rest of the path, slashes included, handed on unchanged for the v2 rule to judge."""

    regex = r"[\s\S]+"  # "." would stop at a decoded newline and miss the route
    part_isolating = False
    weight = 200


@v1.record_once
def _register_converter(state: Any) -> None:
    state.app.url_map.converters.setdefault("v1rest", _RestConverter)


def to_v2_path(path: str) -> str:
    rest = path[len(V1_PREFIX) :]
    for old in ("/agents", "/vms"):
        if rest == old or rest.startswith(old + "/"):
            rest = "/instances" + rest[len(old) :]
            break
    return V2_PREFIX + rest


async def _through_v2(**_params: Any) -> Any:
    """Find the admin view serving the v2 twin of this path and let it answer."""
    adapter = current_app.url_map.bind("localhost", url_scheme=request.scheme)
    endpoint, args = adapter.match(to_v2_path(request.path), method=request.method)
    if not endpoint.startswith("admin."):
        raise NotFound()
    return await current_app.ensure_async(current_app.view_functions[endpoint])(**args)


_ROUTES: list[tuple[str, list[str]]] = [
    ("/agents", ["GET", "POST"]),
    ("/vms", ["GET", "POST"]),
    ("/vms/<id>", ["GET", "DELETE"]),
    ("/vms/<id>/<verb>", ["POST"]),
    ("/operations/<id>", ["GET"]),
    ("/storage/<scope>/<v1rest:path>", ["GET", "PUT", "DELETE"]),
    ("/container-images", ["GET"]),
]
for _rule, _methods in _ROUTES:
    v1.add_url_rule(
        _rule,
        endpoint="v1" + re.sub(r"[^a-z0-9]+", "_", _rule),
        view_func=_through_v2,
        methods=_methods,
        merge_slashes=False,
        strict_slashes=False,
    )


@v1.post("/sessions/<instance_id>/dispatch")
async def dispatch(instance_id: str) -> Any:
    from .a2a import rest

    return await rest.send_message(instance_id)


@v1.get("/ws/missions/<task_id>")
async def mission_stream(task_id: str) -> Any:
    from .a2a import rest
    from .a2a.edge import authenticate
    from .errors import TASK_NOT_FOUND
    from .errors import NotFound as TaskMissing

    authenticate()  # 401 before anything is looked up
    rec = await app_state().a2a.find_task(task_id)
    if rec is None:
        raise TaskMissing(TASK_NOT_FOUND, f"no mission {task_id[:256]!r}")
    return await rest.subscribe(rec.instance_id, task_id)


@v1.get("/agent-output/chat")
async def agent_output_chat() -> Any:
    """agent-output/v1: a task's Claude Code stream as a chat (:mod:`controller.a2a.agentoutput`);
    ``command_id`` is the task id, read with a token that may read its instance."""
    from .a2a import agentoutput
    from .a2a.edge import authenticate, begin
    from .a2a.sse import sse_response
    from .errors import TASK_NOT_FOUND, ValidationFailed
    from .errors import NotFound as TaskMissing

    authenticate()  # 401 before anything is looked up
    command_id = request.args.get("command_id", "")
    if not command_id:
        raise ValidationFailed([{"field": "command_id", "message": "the task to project", "code": "required"}])
    try:
        resume = agentoutput.parse_last_event_id(request.headers.get("Last-Event-ID"))
    except ValueError as exc:
        raise ValidationFailed([{"field": "Last-Event-ID", "message": str(exc), "code": "format"}]) from None
    state = app_state()
    rec = await state.a2a.find_task(command_id)
    if rec is None:
        if resume is not None:  # a resume of an expired command ends at once, never hangs
            response = Response(agentoutput.error_frame(f"command {command_id[:256]} is gone"), status=200)
            response.content_type = "text/event-stream"
            return response
        raise TaskMissing(TASK_NOT_FOUND, f"no command {command_id[:256]!r}")
    caller = await begin(rec.instance_id, legacy_path=True, enforce_extensions=False)
    body = agentoutput.chat(
        state.tasks.store,
        state.tasks.hub,
        rec.id,
        session=request.args.get("session_id") or rec.id,
        resume=resume,
        replay=request.args.get("replay", "").lower() in ("1", "true"),
        keepalive_s=state.config.sse_keepalive_s,
    )
    return sse_response(caller, body)


@v1.route("/hitl/<task_id>", methods=["GET", "POST"])
async def hitl(task_id: str) -> Any:
    from .a2a import v1hitl

    if request.method == "GET":
        return await v1hitl.v1_prompt(task_id)
    return await v1hitl.v1_answer(task_id)


_PARAM_RE = re.compile(r"<(?:[^:<>]+:)?([^<>]+)>")


def route_label(rule: str) -> str:
    """``/api/v1/storage/<scope>/<v1rest:path>`` → ``/api/v1/storage/{scope}/{path}``."""
    return _PARAM_RE.sub(r"{\1}", rule)


@v1.after_app_request
async def _deprecation_headers(response: Response) -> Response:
    if request.path == V1_PREFIX or request.path.startswith(V1_PREFIX + "/"):
        state = app_state()
        response.headers["Sunset"] = state.config.v1_sunset
        response.headers["Deprecated"] = "true"
        response.headers["Link"] = SUCCESSOR_LINK
        if request.url_rule is not None and request.blueprint == "v1":
            state.metrics.count_v1(route_label(request.url_rule.rule))
    return response
