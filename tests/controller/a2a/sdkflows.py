"""What the a2a-sdk 1.x client scenarios share, whichever binding they drive: a2a-sdk is asyncio
only, so each scenario runs in an asyncio loop of its own in a worker thread while the controller
serves on trio in the test's thread."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import httpx
import trio
from a2a.types import (
    CancelTaskRequest,
    Message,
    Part,
    Role,
    SendMessageConfiguration,
    SendMessageRequest,
    SubscribeToTaskRequest,
    TaskState,
)
from a2a.utils.signing import create_signature_verifier
from jwt import PyJWK

from tests.controller.a2a.helpers import Agent


def run_in_asyncio(fn: Callable[[], Awaitable[Any]]) -> Awaitable[Any]:
    return trio.to_thread.run_sync(lambda: asyncio.run(fn()))  # type: ignore[arg-type,return-value]


def user_message(text: str, **fields: Any) -> Message:
    return Message(message_id=str(uuid.uuid4()), role=Role.ROLE_USER, parts=[Part(text=text)], **fields)


async def card_verifier(agent: Agent, http: httpx.AsyncClient) -> Any:
    """a2a-sdk's verifier of the agent's card, with the keys its JWKS publishes."""
    jwks = (await http.get(f"{agent.base}/.well-known/jwks.json")).json()
    keys = {k["kid"]: PyJWK(k) for k in jwks["keys"]}
    return create_signature_verifier(lambda kid, _jku: keys[kid], ["EdDSA"])


async def cancel_a_long_task(client: Any, streaming: bool) -> dict[str, Any]:
    """A long task sent to return immediately, then canceled; streaming, a subscriber follows it
    till it ends. What each step saw: the first answer's state, the subscriber's events, the end."""
    out: dict[str, Any] = {}
    request = SendMessageRequest(
        message=user_message("sleep 30"), configuration=SendMessageConfiguration(return_immediately=True)
    )
    stream = client.send_message(request)
    first = await anext(stream)  # a stream lasts as long as its task: take the Task, then leave
    await stream.aclose()
    long_id = first.task.id if first.HasField("task") else first.status_update.task_id
    out["quick_state"] = TaskState.Name(first.task.status.state) if first.HasField("task") else None
    if streaming:
        seen: list[str] = []

        async def follow() -> None:
            async for event in client.subscribe(SubscribeToTaskRequest(id=long_id)):
                seen.append(event.WhichOneof("payload"))

        follower = asyncio.create_task(follow())
        while not seen:
            await asyncio.sleep(0.02)
        canceled = await client.cancel_task(CancelTaskRequest(id=long_id))
        await asyncio.wait_for(follower, 15)
        out["subscribed"] = seen
    else:
        canceled = await client.cancel_task(CancelTaskRequest(id=long_id))
    out["canceled"] = TaskState.Name(canceled.status.state)
    return out


async def refused_without_runtime(client: Any) -> type[BaseException] | None:
    """What the SDK raises for a send from a client that did not activate runtime/v1 (closed after)."""
    try:
        [e async for e in client.send_message(SendMessageRequest(message=user_message("x")))]
    except Exception as exc:
        return type(exc)
    finally:
        await client.close()
    return None
