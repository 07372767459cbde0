"""The A2A operations, once: both bindings (HTTP+JSON in ``rest``, JSON-RPC in ``jsonrpc``) read
their request into these typed parameters and call the same function.

Each takes the :class:`~controller.a2a.edge.Caller` its binding's edge produced and returns the
A2A JSON result (a dict) or, for the streaming operations, the body of an SSE stream.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Annotated, Any

import msgspec

from ..errors import UNSUPPORTED_OPERATION, InvalidState
from ..push.configs import ConfigRef, ListParams, PushConfigIn, convert
from ..push.configs import view as push_view
from ..push.target import parse_url, resolve
from ..state import app_state
from ..store import TaskRecord, TaskSnapshot
from ..tasks.model import Id, Metadata, SendMessageRequest
from ..tasks.service import ListQuery
from . import tenancy
from .discovery import signed_card
from .edge import Caller
from .sse import Framing, task_events
from .views import read_snapshot, task_view

HistoryLength = Annotated[int, msgspec.Meta(ge=0, le=10000)]


class GetTaskParams(msgspec.Struct, rename="camel", kw_only=True):
    id: Id
    history_length: HistoryLength | None = None
    tenant: str | None = None


class TaskIdParams(msgspec.Struct, rename="camel", kw_only=True):
    id: Id
    metadata: Metadata | None = None
    tenant: str | None = None


async def view(caller: Caller, task: TaskRecord | str, *, history_length: int | None = None) -> dict[str, Any]:
    """The Task as the caller sees it: read at one point of its timeline (given an id), or in the
    state an operation left it (given its row; what happened since shows in artifacts only)."""
    task_id = task if isinstance(task, str) else task.id
    snap = await read_snapshot(app_state().store, caller.instance.id, task_id, history_length)
    if not isinstance(task, str):
        snap.record = task
    return shown_view(caller, snap)


def shown_view(caller: Caller, snap: TaskSnapshot) -> dict[str, Any]:
    return task_view(snap, caller.instance, disclose_host=caller.discloses_host, prompts=caller.sees_prompts)


async def send(caller: Caller, req: SendMessageRequest) -> Any:
    """The task service's send, with the configuration's inline push config (if any) made for
    the task: checked before the send, delivering from the task's start (a new task) or from
    the message sent (a follow-up)."""
    state = app_state()
    config = req.configuration
    if config is None or config.task_push_notification_config is None:
        return await state.tasks.send(caller.instance, req, prompts_active=caller.sees_prompts)
    push = convert(config.task_push_notification_config, PushConfigIn)
    await resolve(parse_url(push.url), allow_private=state.config.push_allow_private)
    from_seq = 0
    if req.message.task_id is not None:
        from_seq = (await state.tasks.get(caller.instance.id, req.message.task_id)).last_seq
    plain = msgspec.structs.replace(config, task_push_notification_config=None)
    rec = await state.tasks.send(
        caller.instance, msgspec.structs.replace(req, configuration=plain), prompts_active=caller.sees_prompts
    )
    await state.push.create(caller.instance.id, rec.id, push, from_seq=from_seq, extensions=caller.extensions)
    return rec


async def send_message(caller: Caller, req: SendMessageRequest) -> dict[str, Any]:
    tasks = app_state().tasks
    rec = await send(caller, tenancy.apply(caller.extensions, req))
    config = req.configuration
    if config is None or not config.return_immediately:
        rec = await tasks.wait_settled(rec.id)
    history = config.history_length if config is not None else None
    return {"task": await view(caller, rec, history_length=history)}


async def send_streaming_message(
    caller: Caller, req: SendMessageRequest, framing: Framing | None = None
) -> tuple[dict[str, Any], AsyncIterator[bytes]]:
    """The stream of the task the message went to, and what names it (``taskId``, and
    ``fromCreation``: a new task streams from its creation, a follow-up from the task as it stands)
    so that idempotency/v1 can attach a repeat to the same stream (:func:`attach_stream`)."""
    rec = await send(caller, tenancy.apply(caller.extensions, req))
    stream = {"taskId": rec.id, "fromCreation": req.message.task_id is None}
    return stream, attach_stream(caller, stream, framing)


def attach_stream(caller: Caller, stream: dict[str, Any], framing: Framing | None = None) -> AsyncIterator[bytes]:
    return task_events(caller, stream["taskId"], from_creation=stream["fromCreation"], framing=framing)


async def get_task(caller: Caller, params: GetTaskParams) -> dict[str, Any]:
    return await view(caller, params.id, history_length=params.history_length)


async def list_tasks(caller: Caller, query: ListQuery) -> dict[str, Any]:
    page = await app_state().tasks.list(caller.instance.id, query)
    history = 0 if query.history_length is None else query.history_length
    store, tasks = app_state().store, []
    for rec in page.tasks:
        snap = await store.tasks.snapshot(rec.id, history, artifacts=query.include_artifacts)
        if snap is not None:  # else purged since the page was read (the page is this instance's)
            tasks.append(shown_view(caller, snap))
    return {
        "tasks": tasks,
        "nextPageToken": page.next_page_token,
        "pageSize": page.page_size,
        "totalSize": page.total_size,
    }


async def cancel_task(caller: Caller, params: TaskIdParams) -> dict[str, Any]:
    rec = await app_state().tasks.cancel(caller.instance.id, params.id)
    return await view(caller, rec)


async def subscribe_to_task(
    caller: Caller, params: TaskIdParams, framing: Framing | None = None
) -> AsyncIterator[bytes]:
    rec = await app_state().tasks.get(caller.instance.id, params.id)
    if rec.terminal:
        raise InvalidState(UNSUPPORTED_OPERATION, f"task {rec.id} is {rec.state}: there is nothing to subscribe to")
    return task_events(caller, rec.id, from_creation=False, framing=framing)


async def create_push_config(caller: Caller, task_id: str, cfg: PushConfigIn) -> dict[str, Any]:
    state = app_state()
    rec = await state.tasks.get(caller.instance.id, task_id)
    # Delivery starts with the task's next event (the config is for what happens from now on).
    made = await state.push.create(caller.instance.id, rec.id, cfg, from_seq=rec.last_seq, extensions=caller.extensions)
    return push_view(made)


async def get_push_config(caller: Caller, ref: ConfigRef) -> dict[str, Any]:
    state = app_state()
    await state.tasks.get(caller.instance.id, ref.task_id)
    return push_view(await state.push.configs.get(ref.task_id, ref.id))


async def list_push_configs(caller: Caller, params: ListParams) -> dict[str, Any]:
    state = app_state()
    await state.tasks.get(caller.instance.id, params.task_id)
    recs, next_token = await state.push.configs.list(params)
    return {"configs": [push_view(rec) for rec in recs], "nextPageToken": next_token}


async def delete_push_config(caller: Caller, ref: ConfigRef) -> dict[str, Any]:
    state = app_state()
    await state.tasks.get(caller.instance.id, ref.task_id)
    await state.push.delete(ref.task_id, ref.id)
    return {}


async def extended_agent_card(caller: Caller) -> dict[str, Any]:
    return await signed_card(caller.instance)
