"""Records the store tests write: an instance row and a task row with plain defaults."""

from __future__ import annotations

import time
from typing import Any

from agentic_sandbox.controller.store import InstanceRecord, TaskRecord


def instance(iid: str, name: str, **kw: object) -> InstanceRecord:
    now = time.time()
    fields: dict[str, object] = {"runtime": "host", "state": "running", "created_at": now, "updated_at": now}
    fields.update(kw)
    return InstanceRecord(id=iid, name=name, **fields)  # type: ignore[arg-type]


def task(task_id: str, now: float, status: dict[str, Any] | None = None, **kw: Any) -> TaskRecord:
    status = status or {"state": "TASK_STATE_SUBMITTED"}
    fields: dict[str, Any] = {
        "instance_id": "i1",
        "context_id": "c1",
        "metadata": {"k": "v"},
        "last_at": now,
        "created_at": now,
        "status_at": now,
    }
    fields.update(kw)
    return TaskRecord(id=task_id, state=status["state"], status=status, **fields)
