"""An a2a-sdk 0.3 client against one instance: run by ``test_v03_clients.py`` with the Python of a
venv of its own (a2a-sdk 0.3 and 1.x cannot share an interpreter), so it imports nothing of ours.

``python a2a03_driver.py BASE TOKEN TRANSPORT`` (TRANSPORT: ``JSONRPC`` or ``HTTP+JSON``) connects
as a new user of a2a-sdk 0.3 would: the card from the instance's base URL (A2ACardResolver), its
signature checked with a2a-sdk 0.3's own verifier against the instance's JWKS, a client from the
card (ClientFactory, the transport chosen from the card's 0.3 fields). The instance runs the test
executors' RoutingExecutor (the first word picks the scenario). It prints one JSON object: what
each operation returned, as a2a-sdk 0.3's models dump it, for the test to check.
"""

from __future__ import annotations

import asyncio
import json
import sys
import uuid
from typing import Any

import httpx
from a2a.client import A2ACardResolver, ClientConfig, ClientFactory
from a2a.client.errors import A2AClientHTTPError, A2AClientJSONRPCError
from a2a.types import (
    GetTaskPushNotificationConfigParams,
    Message,
    MessageSendConfiguration,
    Part,
    PushNotificationAuthenticationInfo,
    PushNotificationConfig,
    Role,
    TaskIdParams,
    TaskPushNotificationConfig,
    TaskQueryParams,
    TextPart,
)
from a2a.utils.signing import create_signature_verifier
from jwt import PyJWK

RUNTIME_EXTENSION = "https://agentic-sandbox.aiwg.io/extensions/runtime/v1"


def dump(obj: Any) -> Any:
    if isinstance(obj, tuple):
        return [dump(item) for item in obj]
    if obj is None or isinstance(obj, str | int | float | bool | list | dict):
        return obj
    return obj.model_dump(mode="json", by_alias=True, exclude_none=True)


def text(words: str, **fields: Any) -> Message:
    return Message(message_id=str(uuid.uuid4()), role=Role.user, parts=[Part(root=TextPart(text=words))], **fields)


async def collect(stream: Any) -> list[Any]:
    return [dump(event) async for event in stream]


def task_of(events: list[Any]) -> dict[str, Any]:
    """The Task of a send's events (``[task, update]`` pairs, a task from a blocking send)."""
    first = events[0]
    task: dict[str, Any] = first[0] if isinstance(first, list) else first
    return task


async def wait_working(client: Any, task_id: str) -> None:
    """Until the slow executor has said it works (so that a cancel finds it running). (a2a-sdk 0.3's
    HTTP+JSON transport reads a status without a message as one with an empty message.)"""
    for _ in range(400):
        task = await client.get_task(TaskQueryParams(id=task_id))
        if task.status.message is not None and task.status.message.parts:
            return
        await asyncio.sleep(0.05)


async def scenarios(base: str, token: str, transport: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    headers = {"Authorization": f"Bearer {token}"}
    async with httpx.AsyncClient(headers=headers, timeout=60) as http:
        jwks = (await http.get(f"{base}/.well-known/jwks.json")).json()
        keys = {k["kid"]: PyJWK(k) for k in jwks["keys"]}
        verifier = create_signature_verifier(lambda kid, _jku: keys[kid], ["EdDSA"])
        card = await A2ACardResolver(http, base).get_agent_card(signature_verifier=verifier)
        out["card"] = dump(card)

        def client(**config: Any) -> Any:
            settings = ClientConfig(httpx_client=http, supported_transports=[transport], **config)
            return ClientFactory(settings).create(card, extensions=[RUNTIME_EXTENSION])

        blocking, streaming = client(streaming=False), client(streaming=True)
        # A blocking send, a streamed one, a read.
        out["send"] = await collect(blocking.send_message(text("parts please")))
        out["stream"] = await collect(streaming.send_message(text("parts again")))
        out["get"] = dump(await blocking.get_task(TaskQueryParams(id=task_of(out["stream"])["id"], history_length=5)))
        # input-required, then a follow-up in the same task.
        out["ask"] = await collect(blocking.send_message(text("ask")))
        asked = task_of(out["ask"])
        out["follow"] = await collect(blocking.send_message(text("Grace", task_id=asked["id"])))
        # The agent answers with a Message (no task), blocking and streamed.
        out["answer"] = await collect(blocking.send_message(text("answer me")))
        out["answer_stream"] = await collect(streaming.send_message(text("answer me too")))
        # A slow task: resubscribe to it, cancel it (the subscription ends with the cancel).
        started = await collect(
            blocking.send_message(text("slow"), configuration=MessageSendConfiguration(blocking=False))
        )
        slow_id = task_of(started)["id"]
        await wait_working(blocking, slow_id)
        resubscribed = streaming.resubscribe(TaskIdParams(id=slow_id))
        first = dump(await anext(resubscribed))
        out["cancel"] = dump(await blocking.cancel_task(TaskIdParams(id=slow_id)))
        out["resubscribe"] = [first, *await collect(resubscribed)]
        # Push notification configs.
        config = PushNotificationConfig(
            id="cfg-1",
            url="https://hooks.example.com/a2a",
            token="tok",
            authentication=PushNotificationAuthenticationInfo(schemes=["Bearer"], credentials="secret"),
        )
        made = await blocking.set_task_callback(
            TaskPushNotificationConfig(task_id=slow_id, push_notification_config=config)
        )
        out["push_set"] = dump(made)
        got = await blocking.get_task_callback(
            GetTaskPushNotificationConfigParams(id=slow_id, push_notification_config_id="cfg-1")
        )
        out["push_get"] = dump(got)
        # The extended card (agent/getAuthenticatedExtendedCard, GET /v1/card).
        out["extended_card"] = dump(await blocking.get_card(signature_verifier=verifier))
        # Errors as a2a-sdk 0.3 reports them.
        try:
            await blocking.get_task(TaskQueryParams(id="01930000-0000-7000-8000-000000000000"))
        except A2AClientJSONRPCError as exc:
            out["not_found"] = {"code": exc.error.code, "message": exc.error.message}
        except A2AClientHTTPError as exc:
            out["not_found"] = {"status": exc.status_code}
        for each in (blocking, streaming):
            await each.close()
    return out


def main() -> None:
    base, token, transport = sys.argv[1:4]
    result = asyncio.run(scenarios(base, token, transport))
    sys.stdout.write(json.dumps(result))


if __name__ == "__main__":
    main()
