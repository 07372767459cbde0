"""Tasks as A2A v1.0 JSON, with the runtime/v1 metadata every Task carries.

``runtime.*`` keys are never stored: they are added here, to every Task of every operation and
binding, equal to the card's params (``runtime.instance_id``, ``runtime.kind``,
``runtime.provider``). ``runtime.host`` is added only where policy allows (operator callers, see
:attr:`controller.a2a.edge.Caller.discloses_host`) and is then the host's name; otherwise absent.
A hitl-prompt/v1 envelope on the status is shown only to callers that activated the extension.
"""

from __future__ import annotations

import socket
from typing import Any

from ..store import InstanceRecord, Store, TaskRecord
from ..tasks.prompts import shown
from .card import runtime_params

#: History a Task carries when the request does not say (``historyLength`` unset).
DEFAULT_HISTORY = 100


def runtime_metadata(instance: InstanceRecord, *, disclose_host: bool) -> dict[str, Any]:
    params = runtime_params(instance)
    out: dict[str, Any] = {"runtime.instance_id": params["instance_id"], "runtime.kind": params["runtime"]}
    if "provider" in params:
        out["runtime.provider"] = params["provider"]
    if "capabilities" in params:
        out["runtime.capabilities"] = list(params["capabilities"])
    if disclose_host:
        host = socket.gethostname()
        if host:
            out["runtime.host"] = host[:256]
    return out


async def task_view(
    store: Store,
    rec: TaskRecord,
    instance: InstanceRecord,
    *,
    disclose_host: bool,
    prompts: bool,
    history_length: int | None = None,
    include_artifacts: bool = True,
) -> dict[str, Any]:
    """The Task; ``prompts``: the caller activated hitl-prompt/v1 (else a prompt envelope is left out)."""
    task: dict[str, Any] = {"id": rec.id, "contextId": rec.context_id, "status": shown(rec.status, prompts)}
    limit = DEFAULT_HISTORY if history_length is None else history_length
    artifacts, history = await store.tasks.contents(rec.id, limit)
    if include_artifacts and artifacts:
        task["artifacts"] = artifacts
    if history:
        task["history"] = history
    task["metadata"] = {**rec.metadata, **runtime_metadata(instance, disclose_host=disclose_host)}
    return task
