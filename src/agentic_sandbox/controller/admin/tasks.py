"""Admin task routes: ``GET /api/v2/admin/tasks`` and ``GET /api/v2/admin/tasks/{task_id}/logs``.

The list is every instance's A2A tasks, newest status first (ties by id), as a compact summary
(:class:`~.views.TaskSummary`: ids, state, times; the task itself is the A2A surface's), with
``total_size`` (how many match the filters, from the store's kept counts where it can). Filters:
``instance_id``, ``state`` (A2A ``TASK_STATE_*`` names, as ListTasks takes them), ``context_id``;
``limit`` (default :data:`~.paging.DEFAULT_PAGE_SIZE`) and ``page_token`` (see :mod:`.paging`).
Operator tokens see every instance's tasks; an instance's own A2A token only its instance's.

An agent that speaks the protocol (docs/agent-protocol.md) writes its stdout and stderr to its
task's log instead of the task's artifacts; this answers that log as ``text/plain`` (UTF-8 with
invalid bytes replaced), at most ``AIWG_AGENT_LOG_BYTES`` of it plus a last line counting what was
dropped. A task that does not exist is 404 ``task.not_found``; a task whose agent logged nothing
answers an empty body. Admin only: a log may hold whatever the agent printed.
"""

from __future__ import annotations

from quart import Response, g, request

from ..auth.tokens import ADMIN_ONLY, READ
from ..errors import ValidationFailed
from ..http.responses import json_response
from ..http.roles import require_role
from ..state import app_state
from ..tasks.service import TASK_STATES, task_not_found
from .blueprint import admin
from .paging import DEFAULT_PAGE_SIZE, decode_token, encode_token, narrowed_to, page_size
from .views import TaskList, task_summary


@admin.get("/tasks")
@require_role(*READ, own_instance=True)
async def list_tasks() -> Response:
    args = request.args
    filters = {"instance_id": args.get("instance_id"), "state": args.get("state"), "context_id": args.get("context_id")}
    if filters["state"] is not None and filters["state"] not in TASK_STATES:
        message = f"must be one of {', '.join(TASK_STATES)}"
        raise ValidationFailed([{"field": "state", "message": message, "code": "enum"}])
    limit = page_size(args.get("limit"), default=DEFAULT_PAGE_SIZE)
    after = decode_token(args.get("page_token"), "tasks", filters)
    own = narrowed_to(g.principal)
    if own is not None and filters["instance_id"] not in (None, own):
        return json_response(TaskList(items=[], next_page_token="", total_size=0))  # another instance's: none
    records, total = await app_state().tasks.store.tasks.page(
        own or filters["instance_id"],
        context_id=filters["context_id"],
        state=filters["state"],
        status_after=None,
        after=after,
        limit=limit + 1,
    )
    more = len(records) > limit
    records = records[:limit]
    token = encode_token("tasks", filters, (records[-1].status_at, records[-1].id)) if more else ""
    return json_response(
        TaskList(items=[task_summary(rec) for rec in records], next_page_token=token, total_size=total)
    )


@admin.get("/tasks/<task_id>/logs")
@require_role(*ADMIN_ONLY)
async def task_logs(task_id: str) -> Response:
    tasks = app_state().tasks
    if await tasks.store.tasks.get(task_id) is None:
        raise task_not_found(task_id)
    data = await tasks.logs.read(task_id) or b""
    return Response(data.decode("utf-8", "replace"), status=200, content_type="text/plain; charset=utf-8")
