"""The deprecated v1 HITL path, ``/api/v1/hitl/{task_id}``, answered through hitl-prompt/v1.

The migration guide maps it onto input-required plus the hitl-prompt/v1 extension:
:func:`v1_prompt` (``GET``: the prompt the task waits on, ``{task_id, instance_id, state,
prompt}``) and :func:`v1_answer` (``POST {"payload", "prompt_id"?}``: a SendMessage answering it,
the prompt id defaulting to the one the task waits on, returning at once with ``{"task": ...}``).
They take the A2A tokens (an instance's own, or an operator token; a task of an instance the token
may not use is not found), act as if the request activated runtime/v1 and hitl-prompt/v1, and
answer errors as the v1 surface does (problems: 404, 409 for a prompt the task does not wait on,
422 with one ``errors`` item per schema violation). :mod:`controller.v1` routes to them.
"""

from __future__ import annotations

import uuid
from typing import Any

import msgspec

from ..decoding import decode_json
from ..errors import TASK_NOT_FOUND, NotFound
from ..http.responses import base_url, request_body
from ..state import app_state
from ..store import TaskRecord
from ..tasks.model import Message, Part, SendConfiguration, SendMessageRequest
from ..tasks.prompts import ANSWER_KEY, HITL_EXTENSION, PromptId, pending, unknown_prompt
from .caller import Caller
from .card import RUNTIME_EXTENSION
from .edge import authenticate, instance_for


class V1Answer(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """``POST /api/v1/hitl/{task_id}``: the answer, and which prompt (default: the one waited on)."""

    payload: dict[str, Any]
    prompt_id: PromptId | None = None


async def _v1_caller(task_id: str) -> tuple[Caller, TaskRecord]:
    principal = authenticate()  # 401 before anything is looked up
    rec = await app_state().a2a.find_task(task_id)
    if rec is None:
        raise NotFound(TASK_NOT_FOUND, f"no task {task_id[:256]!r}")
    try:
        instance = await instance_for(principal, rec.instance_id)
    except NotFound:
        raise NotFound(TASK_NOT_FOUND, f"no task {task_id[:256]!r}") from None  # not yours: not there
    return Caller(principal, instance, [RUNTIME_EXTENSION, HITL_EXTENSION], base_url()), rec


async def v1_prompt(task_id: str) -> dict[str, Any]:
    caller, rec = await _v1_caller(task_id)
    envelope = pending(rec.state, rec.status)
    if envelope is None:
        raise unknown_prompt("", f"task {rec.id} waits on no prompt (it is {rec.state})")
    return {"task_id": rec.id, "instance_id": caller.instance.id, "state": rec.state, "prompt": envelope}


async def v1_answer(task_id: str) -> dict[str, Any]:
    caller, rec = await _v1_caller(task_id)
    body: V1Answer = decode_json(await request_body(), V1Answer)
    prompt_id = body.prompt_id or (pending(rec.state, rec.status) or {}).get("prompt_id")
    if prompt_id is None:
        raise unknown_prompt("", f"task {rec.id} waits on no prompt (it is {rec.state})")
    message = Message(
        message_id=str(uuid.uuid4()),
        role="ROLE_USER",
        parts=[Part(data=body.payload)],
        task_id=rec.id,
        metadata={ANSWER_KEY: {"prompt_id": prompt_id, "payload": body.payload}},
    )
    req = SendMessageRequest(message=message, configuration=SendConfiguration(return_immediately=True))
    return await app_state().a2a.send_message(caller, req)
