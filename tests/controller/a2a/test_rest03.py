"""A2A 0.3 over HTTP+JSON with a raw client: a2a-sdk 0.3's paths answer 0.3's protobuf JSON
(parsed here as strictly as its transport parses it), upstream's ``/v1/`` paths and the standard
paths 0.3's JSON with ``kind``, and the paths both use pick by what the request shows."""

from __future__ import annotations

import json
import uuid
from typing import Any

import httpx
from a2a.compat.v0_3 import a2a_v0_3_pb2 as pb
from a2a.compat.v0_3 import types as t03
from a2a.compat.v0_3.proto_utils import ToProto
from google.protobuf.json_format import MessageToDict, ParseDict

from agentic_sandbox.controller.a2a.card import RUNTIME_EXTENSION
from tests.controller.a2a.helpers import Agent, error_reason, new_agent
from tests.controller.a2a.test_rpc03 import message
from tests.controller.conftest import LiveController

SDK = {"X-A2A-Extensions": RUNTIME_EXTENSION}  # what a2a-sdk 0.3 sends
UPSTREAM = {"A2A-Extensions": RUNTIME_EXTENSION}  # what upstream's clients send


def client_for(agent: Agent, headers: dict[str, str]) -> httpx.AsyncClient:
    return httpx.AsyncClient(
        base_url=agent.base, headers={"Authorization": f"Bearer {agent.token}"} | headers, timeout=15
    )


def proto_send(text: str, *, blocking: bool = True) -> dict[str, Any]:
    """A SendMessageRequest as a2a-sdk 0.3's HTTP+JSON transport makes it."""
    msg = t03.Message(message_id=str(uuid.uuid4()), role=t03.Role.user, parts=[t03.Part(root=t03.TextPart(text=text))])
    config = t03.MessageSendConfiguration(blocking=blocking)
    request = pb.SendMessageRequest(
        request=ToProto.message(msg), configuration=ToProto.message_send_configuration(config)
    )
    body: dict[str, Any] = MessageToDict(request)
    return body


async def sse(client: httpx.AsyncClient, method: str, path: str, **kwargs: Any) -> list[dict[str, Any]]:
    async with client.stream(method, path, **kwargs) as response:
        assert response.status_code == 200, await response.aread()
        return [json.loads(line[6:]) async for line in response.aiter_lines() if line.startswith("data: ")]


async def test_a2a_sdk_paths_answer_protobuf_json(admin: httpx.AsyncClient, controller: LiveController) -> None:
    agent = await new_agent(admin, controller, "rest03-sdk", loadout="shell")
    async with client_for(agent, SDK) as client:
        sent = await client.post("/v1/message:send", json=proto_send("exit 3"))
        assert sent.status_code == 200, sent.text
        task = ParseDict(sent.json(), pb.SendMessageResponse()).task
        assert task.status.state == pb.TASK_STATE_FAILED and task.metadata["fail_kind"] == "application"
        assert task.history[0].role == pb.ROLE_USER and task.history[0].content[0].text == "exit 3"

        events = [
            ParseDict(e, pb.StreamResponse())
            for e in await sse(client, "POST", "/v1/message:stream", json=proto_send("echo hi"))
        ]
        assert events[0].HasField("task") and events[-1].status_update.final is True
        assert events[-1].status_update.status.state == pb.TASK_STATE_COMPLETED

        slow = ParseDict(
            (await client.post("/v1/message:send", json=proto_send("sleep 30", blocking=False))).json(),
            pb.SendMessageResponse(),
        )
        slow_id = slow.task.id
        # Subscribed to (GET, as a2a-sdk 0.3 does), then canceled: the stream ends with it.
        events = []
        async with client.stream("GET", f"/v1/tasks/{slow_id}:subscribe") as stream:
            async for line in stream.aiter_lines():
                if line.startswith("data: "):
                    events.append(ParseDict(json.loads(line[6:]), pb.StreamResponse()))
                    if len(events) == 1:
                        canceled = await client.post(f"/v1/tasks/{slow_id}:cancel", json={"name": f"tasks/{slow_id}"})
                        assert ParseDict(canceled.json(), pb.Task()).status.state == pb.TASK_STATE_CANCELLED
        assert events[0].task.id == slow_id and events[-1].status_update.final is True
        assert events[-1].status_update.status.state == pb.TASK_STATE_CANCELLED
        ended = await client.get(f"/v1/tasks/{slow_id}:subscribe")
        assert ended.status_code == 400 and error_reason(ended) == "UNSUPPORTED_OPERATION"

        card = (await client.get("/v1/card")).json()
        assert t03.AgentCard.model_validate(card).url == agent.base
        # 1.0 asked for on the same path is answered in 1.0.
        one = await client.get(f"/v1/tasks/{slow_id}", headers={"A2A-Version": "1.0"})
        assert one.json()["status"]["state"] == "TASK_STATE_CANCELED"


async def test_shared_paths_answer_who_asks(admin: httpx.AsyncClient, controller: LiveController) -> None:
    agent = await new_agent(admin, controller, "rest03-shared", loadout="echo")
    async with client_for(agent, UPSTREAM) as upstream, client_for(agent, SDK) as sdk:
        # Upstream's paths and shape: 0.3 JSON, kind, lowercase states, fail_kind/terminal_at.
        task = (await upstream.post("/v1/messages:send", json={"message": message("hello")})).json()
        assert task["kind"] == "task" and task["status"]["state"] == "completed"
        assert task["status"]["terminal_at"] == task["status"]["timestamp"]
        task_id = task["id"]
        assert (await upstream.get(f"/v1/tasks/{task_id}")).json()["kind"] == "task"
        # a2a-sdk at the same path: protobuf JSON (X-A2A-Extensions, or an explicit 0.3).
        strict = ParseDict((await sdk.get(f"/v1/tasks/{task_id}")).json(), pb.Task())
        assert strict.id == task_id and strict.status.state == pb.TASK_STATE_COMPLETED
        explicit = await upstream.get(f"/v1/tasks/{task_id}", headers={"A2A-Version": "0.3"})
        assert ParseDict(explicit.json(), pb.Task()).id == task_id

        hook = {"url": "https://hooks.example.com/x", "token": "t"}
        configs = f"/v1/tasks/{task_id}/pushNotificationConfigs"
        made = (await upstream.post(configs, json={"pushNotificationConfig": hook})).json()
        assert made["taskId"] == task_id and made["pushNotificationConfig"]["url"] == hook["url"]
        flat = (await upstream.post(configs, json={"url": "https://hooks.example.com/y"})).json()
        assert flat["pushNotificationConfig"]["url"] == "https://hooks.example.com/y"
        create = pb.CreateTaskPushNotificationConfigRequest(
            parent=f"tasks/{task_id}",
            config_id="sdk-1",
            config=pb.TaskPushNotificationConfig(push_notification_config=pb.PushNotificationConfig(url=hook["url"])),
        )
        by_sdk = ParseDict(
            (await sdk.post(configs, json=MessageToDict(create))).json(), pb.TaskPushNotificationConfig()
        )
        assert by_sdk.name == f"tasks/{task_id}/pushNotificationConfigs/sdk-1"
        listed = ParseDict((await sdk.get(configs)).json(), pb.ListTaskPushNotificationConfigResponse())
        assert len(listed.configs) == 3
        assert len((await upstream.get(configs)).json()["configs"]) == 3
        got = ParseDict((await sdk.get(f"{configs}/sdk-1")).json(), pb.TaskPushNotificationConfig())
        assert got.push_notification_config.id == "sdk-1"
        assert (await sdk.delete(f"{configs}/sdk-1")).status_code == 200
        assert (await upstream.get(f"{configs}/sdk-1")).status_code == 404

        # Upstream's stream path: 0.3 JSON events, the last one final.
        events = await sse(upstream, "POST", "/v1/messages:stream", json={"message": message("streamed")})
        assert events[0]["kind"] == "task" and events[-1]["kind"] == "status-update" and events[-1]["final"] is True
        # The standard paths without A2A-Version: 0.3 too (0.3 JSON), a bare Task or Message.
        standard = (await upstream.post("/message:send", json={"message": message("plain")})).json()
        assert standard["kind"] == "task" and standard["status"]["state"] == "completed"
        listed_tasks = (await upstream.get("/tasks")).json()
        assert {t["kind"] for t in listed_tasks["tasks"]} == {"task"}
