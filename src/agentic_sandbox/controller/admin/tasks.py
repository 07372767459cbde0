"""Admin task routes: ``GET /api/v2/admin/tasks/{task_id}/logs``.

An agent that speaks the protocol (docs/agent-protocol.md) writes its stdout and stderr to its
task's log instead of the task's artifacts; this answers that log as ``text/plain`` (UTF-8 with
invalid bytes replaced), at most ``AIWG_AGENT_LOG_BYTES`` of it plus a last line counting what was
dropped. A task that does not exist is 404 ``task.not_found``; a task whose agent logged nothing
answers an empty body. Admin only: a log may hold whatever the agent printed.
"""

from __future__ import annotations

from quart import Response

from ..auth.tokens import ADMIN_ONLY
from ..http.roles import require_role
from ..state import app_state
from ..tasks.service import task_not_found
from .blueprint import admin


@admin.get("/tasks/<task_id>/logs")
@require_role(*ADMIN_ONLY)
async def task_logs(task_id: str) -> Response:
    tasks = app_state().tasks
    if await tasks.store.tasks.get(task_id) is None:
        raise task_not_found(task_id)
    data = await tasks.logs.read(task_id) or b""
    return Response(data.decode("utf-8", "replace"), status=200, content_type="text/plain; charset=utf-8")
