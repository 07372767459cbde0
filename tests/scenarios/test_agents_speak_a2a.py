"""Unmodified a2a-sdk AgentExecutors hosted in instances, driven by the a2a-sdk client over all
bindings: a live hostd and controller, a loadout running ``python -m agentic_sandbox_agent.a2a``,
the agent protocol v2 on the instance's control channel. Every part kind, state, chunked artifact,
a Message answer, a follow-up, cancel, a file past what a line holds (fetched by its URL), the
agent's log read by the admin; then the same agent in a container instance, and a shell agent in a
real QEMU VM over the guest's agent channel.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import sys
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
import yaml
from a2a.client import ClientConfig, create_client
from a2a.types import (
    CancelTaskRequest,
    GetTaskRequest,
    Message,
    Part,
    Role,
    SendMessageConfiguration,
    SendMessageRequest,
)
from google.protobuf import json_format

from agentic_sandbox.controller.a2a.card import RUNTIME_EXTENSION
from agentic_sandbox.controller.config import load_config
from tests.controller.a2a.grpcclient import grpc_config, interceptors
from tests.controller.a2a.helpers import Agent, new_agent
from tests.controller.conftest import LiveController, LiveHostd, controller_env, serve_controller, wait_operation
from tests.libvirt_service import guest_image, libvirt_system
from tests.podman_service import PodmanStorage

EXECUTORS = Path(__file__).resolve().parent.parent / "agent" / "agents" / "a2a_executors.py"
BINDINGS = {"jsonrpc": [], "http-json": ["HTTP+JSON"], "grpc": ["GRPC"]}
#: Where the container image holds the executors.
INSIDE = f"/opt/agents/{EXECUTORS.name}"


@pytest.fixture
async def controller(hostd: LiveHostd, tmp_path: Path) -> AsyncIterator[LiveController]:
    """The conftest's controller with the gRPC binding on: every binding is driven here."""
    env = controller_env(tmp_path / "controller", hostd.socket_path, AIWG_GRPC_LISTEN="127.0.0.1:0")
    async with serve_controller(load_config(env=env)) as live:
        yield live


def run_in_asyncio(fn: Callable[[], Awaitable[Any]]) -> Awaitable[Any]:
    return trio.to_thread.run_sync(lambda: asyncio.run(fn()))  # type: ignore[arg-type,return-value]


async def add_loadout(admin: httpx.AsyncClient, name: str, command: list[str], **fields: Any) -> None:
    manifest = {"name": name, "version": "1", "runtime": "host", "command": command, **fields}
    response = await admin.post("/api/v2/admin/loadouts", json={"name": name, "manifest": yaml.safe_dump(manifest)})
    assert response.status_code in (200, 201), response.text


async def executor_agent(admin: httpx.AsyncClient, controller: LiveController, executor: str) -> Agent:
    """A host instance whose tasks run ``executor`` of the test executors through the adapter."""
    name = f"a2a-{executor.lower()}"
    await add_loadout(admin, name, [sys.executable, "-m", "agentic_sandbox_agent.a2a", f"{EXECUTORS}:{executor}"])
    return await new_agent(admin, controller, name, loadout=name)


def user_message(*parts: Part, **fields: Any) -> Message:
    return Message(message_id=str(uuid.uuid4()), role=Role.ROLE_USER, parts=list(parts), **fields)


def as_json(obj: Any) -> dict[str, Any]:
    return json_format.MessageToDict(obj)


async def client_for(agent: Agent, http: httpx.AsyncClient, binding: str, streaming: bool) -> Any:
    if binding == "grpc":  # token and runtime/v1 as gRPC metadata, through the SDK's interceptors
        config = grpc_config(http, streaming=streaming)
        return await create_client(
            agent.base, client_config=config, interceptors=interceptors(agent.token, RUNTIME_EXTENSION)
        )
    config = ClientConfig(httpx_client=http, streaming=streaming, supported_protocol_bindings=BINDINGS[binding])
    return await create_client(agent.base, client_config=config)


def headers(agent: Agent) -> dict[str, str]:
    return {"Authorization": f"Bearer {agent.token}", "A2A-Extensions": RUNTIME_EXTENSION}


async def send(client: Any, message: Message, **config: Any) -> list[dict[str, Any]]:
    request = SendMessageRequest(message=message, configuration=SendMessageConfiguration(**config))
    return [as_json(event) async for event in client.send_message(request)]


@pytest.mark.parametrize("streaming", [False, True], ids=["send", "stream"])
@pytest.mark.parametrize("binding", sorted(BINDINGS))
async def test_every_part_kind_and_state_from_an_unmodified_executor(
    admin: httpx.AsyncClient, controller: LiveController, binding: str, streaming: bool
) -> None:
    agent = await executor_agent(admin, controller, "PartsExecutor")
    raw = b"\x00\x01\x02 input file"

    async def scenario() -> dict[str, Any]:
        async with httpx.AsyncClient(headers=headers(agent), timeout=30) as http:
            client = await client_for(agent, http, binding, streaming)
            events = await send(
                client,
                user_message(
                    Part(text="hi there"),
                    Part(raw=raw, filename="in.bin", media_type="application/octet-stream"),
                    Part(data=json_format.ParseDict({"n": 1}, Part().data), media_type="application/json"),
                ),
            )
            task_id = events[0].get("task", {}).get("id") or events[-1]["statusUpdate"]["taskId"]
            task = as_json(await client.get_task(GetTaskRequest(id=task_id)))
            await client.close()
            return {"events": events, "task": task}

    out = await run_in_asyncio(scenario)
    task = out["task"]
    assert task["status"]["state"] == "TASK_STATE_COMPLETED"
    assert task["status"]["message"]["parts"] == [{"text": "done"}, {"data": {"ok": True}}]
    assert task["metadata"]["agentProtocol"] == 2
    artifacts = {a["artifactId"]: a for a in task["artifacts"]}
    assert "stdout" not in artifacts and "stderr" not in artifacts  # the agent spoke the protocol
    seen = artifacts["context"]["parts"][0]["data"]
    assert seen["taskId"] == task["id"] and seen["contextId"] == task["contextId"] and seen["text"] == "hi there"
    assert seen["extensions"] == [RUNTIME_EXTENSION]
    assert [p["kind"] for p in seen["parts"]] == ["text", "raw", "data"]
    assert seen["parts"][1] == {
        "kind": "raw", "filename": "in.bin", "mediaType": "application/octet-stream",
        "sha256": hashlib.sha256(raw).hexdigest(),
    }  # fmt: skip
    kinds = artifacts["kinds"]
    assert kinds["name"] == "all the kinds" and kinds["extensions"] == ["https://example.com/ext/v1"]
    assert kinds["metadata"]["origin"] == "test"
    text, blob, url, data = kinds["parts"]
    assert text == {"text": "plain text", "mediaType": "text/markdown", "metadata": {"lang": "en"}}
    assert base64.b64decode(blob["raw"]) == b"\x00\x01binary\xff" and blob["filename"] == "blob.bin"
    assert (url["url"], url["filename"], url["mediaType"]) == ("https://example.com/f.pdf", "f.pdf", "application/pdf")
    assert data["data"] == {"answer": 42, "list": [1, "two", None, True]}
    assert artifacts["stream"]["parts"] == [{"text": "chunk 1 chunk 2 chunk 3"}]  # appended chunks, one text
    if streaming:
        members = [next(iter(e)) for e in out["events"]]
        assert members[0] == "task" and members[-1] == "statusUpdate"
        chunks = [e["artifactUpdate"] for e in out["events"] if "artifactUpdate" in e]
        stream = [c for c in chunks if c["artifact"]["artifactId"] == "stream"]
        assert [c.get("append", False) for c in stream] == [False, True, True] and stream[-1]["lastChunk"]
        states = [e["statusUpdate"]["status"]["state"] for e in out["events"] if "statusUpdate" in e]
        assert states[-1] == "TASK_STATE_COMPLETED" and "TASK_STATE_WORKING" in states
    else:
        assert [next(iter(e)) for e in out["events"]] == ["task"]


@pytest.mark.parametrize("binding", sorted(BINDINGS))
async def test_follow_up_message_answer_cancel_and_the_other_states(
    admin: httpx.AsyncClient, controller: LiveController, binding: str
) -> None:
    agents = {
        name: await executor_agent(admin, controller, name)
        for name in ("InputExecutor", "MessageExecutor", "SlowExecutor", "RejectExecutor", "AuthExecutor")
    }

    async def scenario() -> dict[str, Any]:
        out: dict[str, Any] = {}
        for name, agent in agents.items():
            async with httpx.AsyncClient(headers=headers(agent), timeout=30) as http:
                client = await client_for(agent, http, binding, streaming=False)
                if name == "InputExecutor":
                    [first] = await send(client, user_message(Part(text="start")))
                    task = first["task"]
                    out["asked"] = task["status"]
                    [second] = await send(client, user_message(Part(text="Ada"), task_id=task["id"]))
                    out["greeted"] = second["task"]
                elif name == "MessageExecutor":
                    out["answer"] = await send(client, user_message(Part(text="ping")))
                elif name == "SlowExecutor":
                    [started] = await send(client, user_message(Part(text="go")), return_immediately=True)
                    task_id = started["task"]["id"]
                    for _ in range(200):
                        got = as_json(await client.get_task(GetTaskRequest(id=task_id)))
                        if got["status"].get("message"):
                            break
                        await asyncio.sleep(0.05)
                    out["canceled"] = as_json(await client.cancel_task(CancelTaskRequest(id=task_id)))
                elif name == "RejectExecutor":
                    out["rejected"] = (await send(client, user_message(Part(text="no"))))[0]["task"]
                else:
                    [first] = await send(client, user_message(Part(text="who")))
                    out["auth"] = first["task"]["status"]
                    [second] = await send(client, user_message(Part(text="token"), task_id=first["task"]["id"]))
                    out["authorized"] = second["task"]["status"]
                await client.close()
        return out

    out = await run_in_asyncio(scenario)
    assert out["asked"]["state"] == "TASK_STATE_INPUT_REQUIRED"
    assert out["asked"]["message"]["parts"] == [{"text": "What is your name?"}]
    greeted = out["greeted"]
    assert greeted["status"]["state"] == "TASK_STATE_COMPLETED"
    greeting = next(a for a in greeted["artifacts"] if a["artifactId"] == "greeting")
    assert greeting["parts"][0] == {"text": "hello Ada"}
    assert [next(iter(e)) for e in out["answer"]] == ["message"]  # a Message, not a task
    assert out["answer"][0]["message"]["parts"] == [{"text": "echo: ping"}]
    assert out["answer"][0]["message"]["role"] == "ROLE_AGENT"
    canceled = out["canceled"]["status"]
    assert canceled["state"] == "TASK_STATE_CANCELED"
    assert canceled["message"]["parts"] == [{"text": "stopped on request"}]  # the executor's cancel() said so
    assert out["rejected"]["status"]["state"] == "TASK_STATE_REJECTED"
    assert out["rejected"]["status"]["message"]["parts"] == [{"text": "will not do it"}]
    assert out["auth"]["state"] == "TASK_STATE_AUTH_REQUIRED"
    assert out["auth"]["message"]["parts"] == [{"url": "https://auth.example.com/login"}]
    assert out["authorized"]["state"] == "TASK_STATE_COMPLETED"


async def test_a_file_past_a_line_is_one_file_fetched_by_its_url(
    admin: httpx.AsyncClient, controller: LiveController
) -> None:
    agent = await executor_agent(admin, controller, "BigFileExecutor")
    async with agent.client(controller) as client:
        response = await client.post("/message:send", json={"message": message("big")})
        task = response.json()["task"]
        assert task["status"]["state"] == "TASK_STATE_COMPLETED", task
        digest = task["status"]["message"]["parts"][0]["text"]
        [big] = [a for a in task["artifacts"] if a["artifactId"] == "big"]
        [part] = big["parts"]
        assert part["filename"] == "big.bin" and part["mediaType"] == "application/octet-stream"
        assert part["metadata"]["size"] == 1_500_000
        assert part["url"].startswith(f"{agent.base}/tasks/{task['id']}/files/")
        fetched = await client.get(part["url"])
        assert fetched.status_code == 200 and fetched.headers["content-type"] == "application/octet-stream"
        assert fetched.headers["content-disposition"].startswith('attachment; filename="big.bin"')
        assert hashlib.sha256(fetched.content).hexdigest() == digest
        async with httpx.AsyncClient(headers={"Authorization": f"Bearer {agent.token}"}) as plain:
            assert (await plain.get(part["url"])).content == fetched.content  # a plain GET, no A2A headers
        # Only with the agent's token, and only files its tasks hold.
        assert (await client.get(part["url"], headers={"Authorization": "Bearer nope"})).status_code == 401
        assert (await client.get(f"{agent.base}/tasks/{task['id']}/files/..%2F..%2Fetc")).status_code == 404
        other = await executor_agent(admin, controller, "MessageExecutor")
        stranger = part["url"].replace(agent.instance_id, other.instance_id)
        async with other.client(controller) as theirs:
            assert (await theirs.get(stranger)).status_code == 404


async def test_the_agents_output_is_its_log_read_by_the_admin(
    admin: httpx.AsyncClient, controller: LiveController, tmp_path: Path
) -> None:
    script = tmp_path / "agent.py"
    script.write_text(
        "import agentic_sandbox_agent as agent, sys\n"
        "channel = agent.connect(name='logger')\n"
        "print('step one', flush=True)\n"
        "print('warning: two', file=sys.stderr, flush=True)\n"
        "channel.complete('logged')\n"
    )
    await add_loadout(admin, "logger", [sys.executable, str(script)])
    agent = await new_agent(admin, controller, "logger", loadout="logger")
    async with agent.client(controller) as client:
        task = (await client.post("/message:send", json={"message": message("go")})).json()["task"]
    assert task["status"]["state"] == "TASK_STATE_COMPLETED" and "artifacts" not in task
    logs = await admin.get(f"/api/v2/admin/tasks/{task['id']}/logs")
    assert logs.status_code == 200 and logs.headers["content-type"].startswith("text/plain")
    assert "step one\n" in logs.text and "warning: two\n" in logs.text
    assert (await admin.get(f"/api/v2/admin/tasks/{uuid.uuid4()}/logs")).status_code == 404
    async with httpx.AsyncClient(base_url=controller.url, headers={"Authorization": f"Bearer {agent.token}"}) as a:
        assert (await a.get(f"/api/v2/admin/tasks/{task['id']}/logs")).status_code in (401, 403)


def message(text: str, **fields: Any) -> dict[str, Any]:
    return {"messageId": str(uuid.uuid4()), "role": "ROLE_USER", "parts": [{"text": text}], **fields}


# -- a container instance ----------------------------------------------------------------------------


@pytest.fixture
async def python_podman(
    short_dir: Path, tmp_path: Path, podman_storage: PodmanStorage
) -> AsyncIterator[tuple[httpx.AsyncClient, LiveController]]:
    """A hostd with its own podman service on the test storage, which holds the Python agent image,
    and a controller on it."""
    from tests.podman_service import python_agent_image

    image = python_agent_image(podman_storage, EXECUTORS)
    live = LiveHostd(short_dir, env=podman_storage.hostd_env(short_dir / "podman.sock"))
    await live.start()
    try:
        env = controller_env(tmp_path / "controller", live.socket_path, AIWG_GRPC_LISTEN="127.0.0.1:0")
        config = load_config(env=env)
        async with serve_controller(config) as controller, controller.client() as client:
            manifest = {
                "name": "a2a-container", "version": "1", "runtime": "docker", "image": image,
                "command": ["python3", "-m", "agentic_sandbox_agent.a2a", f"{INSIDE}:RoutingExecutor"],
            }  # fmt: skip
            body = {"name": "a2a-container", "manifest": yaml.safe_dump(manifest)}
            response = await client.post("/api/v2/admin/loadouts", json=body)
            assert response.status_code in (200, 201), response.text
            yield client, controller
    finally:
        await live.close()


async def routed_scenarios(agent: Agent, binding: str) -> dict[str, Any]:
    """Every kind of exchange with RoutingExecutor (the first word picks the executor), through the
    a2a-sdk client: parts, a follow-up, a Message answer, cancel."""

    async def scenario() -> dict[str, Any]:
        out: dict[str, Any] = {}
        async with httpx.AsyncClient(headers=headers(agent), timeout=60) as http:
            client = await client_for(agent, http, binding, streaming=False)
            events = await send(client, user_message(Part(text="parts please")))
            task_id = events[0].get("task", {}).get("id") or events[-1]["statusUpdate"]["taskId"]
            out["parts"] = as_json(await client.get_task(GetTaskRequest(id=task_id)))
            asked = await send(client, user_message(Part(text="ask")))
            asked_id = asked[0].get("task", {}).get("id") or asked[-1]["statusUpdate"]["taskId"]
            out["asked"] = as_json(await client.get_task(GetTaskRequest(id=asked_id)))["status"]
            await send(client, user_message(Part(text="Grace"), task_id=asked_id))
            out["greeted"] = as_json(await client.get_task(GetTaskRequest(id=asked_id)))
            out["answer"] = await send(client, user_message(Part(text="answer me")))
            [started] = await send(client, user_message(Part(text="slow")), return_immediately=True)
            slow_id = started.get("task", {}).get("id") or started["statusUpdate"]["taskId"]
            for _ in range(400):
                if as_json(await client.get_task(GetTaskRequest(id=slow_id)))["status"].get("message"):
                    break
                await asyncio.sleep(0.05)
            out["canceled"] = as_json(await client.cancel_task(CancelTaskRequest(id=slow_id)))["status"]
            await client.close()
        return out

    return dict(await run_in_asyncio(scenario))


def check_routed(out: dict[str, Any], kind: str) -> None:
    parts = out["parts"]
    assert parts["status"]["state"] == "TASK_STATE_COMPLETED", parts
    assert parts["metadata"]["agentProtocol"] == 2 and parts["metadata"]["runtime.kind"] == kind
    kinds = next(a for a in parts["artifacts"] if a["artifactId"] == "kinds")
    assert [next(k for k in ("text", "raw", "url", "data") if k in p) for p in kinds["parts"]] == [
        "text", "raw", "url", "data",
    ]  # fmt: skip
    assert out["asked"]["state"] == "TASK_STATE_INPUT_REQUIRED"
    greeting = next(a for a in out["greeted"]["artifacts"] if a["artifactId"] == "greeting")
    assert out["greeted"]["status"]["state"] == "TASK_STATE_COMPLETED" and greeting["parts"][0] == {
        "text": "hello Grace"
    }
    assert [next(iter(e)) for e in out["answer"]] == ["message"]
    assert out["answer"][0]["message"]["parts"] == [{"text": "echo: answer me"}]
    assert out["canceled"]["state"] == "TASK_STATE_CANCELED"
    assert out["canceled"]["message"]["parts"] == [{"text": "stopped on request"}]


async def container_agent(admin: httpx.AsyncClient, controller: LiveController, name: str) -> Agent:
    """A container instance running the test executors (the ``a2a-container`` loadout)."""
    response = await admin.post(
        "/api/v2/admin/instances", json={"name": name, "runtime": "container", "loadout": "a2a-container"}
    )
    assert response.status_code == 202, response.text
    op = await wait_operation(admin, response.json()["id"], timeout=120)
    assert op["state"] == "succeeded", op
    instance_id = op["result"]["instance_id"]
    return Agent(instance_id, response.json()["a2a_token"], f"{controller.url}/agents/{instance_id}")


@pytest.mark.podman
@pytest.mark.parametrize("binding", sorted(BINDINGS))
async def test_an_unmodified_executor_in_a_container_instance(
    python_podman: tuple[httpx.AsyncClient, LiveController], binding: str
) -> None:
    admin, controller = python_podman
    agent = await container_agent(admin, controller, "boxed")
    check_routed(await routed_scenarios(agent, binding), "container")


async def test_the_same_scenarios_on_a_host_instance(admin: httpx.AsyncClient, controller: LiveController) -> None:
    agent = await executor_agent(admin, controller, "RoutingExecutor")
    for binding in sorted(BINDINGS):
        check_routed(await routed_scenarios(agent, binding), "host")


# -- a VM instance ------------------------------------------------------------------------------------

#: A busybox shell agent for the tiny guest (it has no Python): the protocol on fd 3 with echo and read.
VM_AGENT = r"""
echo '{"type": "hello", "version": 2}' >&3
read -r task <&3
echo "the task line: $task"
echo '{"type": "artifact", "artifactId": "task", "parts": [{"data": '"$task"'}]}' >&3
part='{"text": "'"$(uname -r)"'", "mediaType": "text/plain"}'
echo '{"type": "artifact", "artifactId": "kernel", "parts": ['"$part"'], "lastChunk": true}' >&3
echo '{"type": "status", "state": "TASK_STATE_INPUT_REQUIRED", "message": {"parts": [{"text": "and then?"}]}}' >&3
read -r follow <&3
echo '{"type": "artifact", "artifactId": "follow-up", "parts": [{"data": '"$follow"'}]}' >&3
echo '{"type": "status", "state": "TASK_STATE_COMPLETED", "message": {"parts": [{"text": "done in a VM"}]}}' >&3
"""


@pytest.fixture
async def vm_controller(
    short_dir: Path, tmp_path: Path, libvirt_system: str, guest_image: Path
) -> AsyncIterator[tuple[httpx.AsyncClient, LiveController]]:
    live = LiveHostd(short_dir, env={"AIWG_LIBVIRT_URI": libvirt_system, "AIWG_VM_IMAGE_DIR": str(guest_image)})
    await live.start()
    try:
        config = load_config(env=controller_env(tmp_path / "controller", live.socket_path))
        async with serve_controller(config) as controller, controller.client() as client:
            manifest = {"name": "vm-agent", "version": "1", "runtime": "qemu", "command": ["/bin/sh", "-c", VM_AGENT]}
            response = await client.post(
                "/api/v2/admin/loadouts", json={"name": "vm-agent", "manifest": yaml.safe_dump(manifest)}
            )
            assert response.status_code in (200, 201), response.text
            yield client, controller
    finally:
        await live.close()


async def test_a_shell_agent_in_a_vm_instance_over_the_agent_channel(
    vm_controller: tuple[httpx.AsyncClient, LiveController],
) -> None:
    admin, controller = vm_controller
    response = await admin.post(
        "/api/v2/admin/instances", json={"name": "vm1", "runtime": "qemu", "loadout": "vm-agent", "start": True}
    )
    assert response.status_code == 202, response.text
    op = await wait_operation(admin, response.json()["id"], timeout=120)
    assert op["state"] == "succeeded", op
    instance_id = op["result"]["instance_id"]
    agent = Agent(instance_id, response.json()["a2a_token"], f"{controller.url}/agents/{instance_id}")
    view = (await admin.get(f"/api/v2/admin/instances/{instance_id}")).json()
    assert "exec.control" in view["capabilities"]

    async def scenario() -> dict[str, Any]:
        async with httpx.AsyncClient(headers=headers(agent), timeout=120) as http:
            client = await client_for(agent, http, "jsonrpc", streaming=False)
            [first] = await send(client, user_message(Part(text="hello VM")))
            [second] = await send(client, user_message(Part(text="finish"), task_id=first["task"]["id"]))
            await client.close()
            return {"first": first["task"], "second": second["task"]}

    out = await run_in_asyncio(scenario)
    first, second = out["first"], out["second"]
    assert first["status"]["state"] == "TASK_STATE_INPUT_REQUIRED", first
    assert first["status"]["message"]["parts"] == [{"text": "and then?"}]
    assert second["status"]["state"] == "TASK_STATE_COMPLETED", second
    assert second["status"]["message"]["parts"] == [{"text": "done in a VM"}]
    assert second["metadata"]["agentProtocol"] == 2 and second["metadata"]["runtime.kind"] == "vm"
    artifacts = {a["artifactId"]: a for a in second["artifacts"]}
    task_line = artifacts["task"]["parts"][0]["data"]
    assert task_line["type"] == "task" and task_line["message"]["parts"] == [{"text": "hello VM"}]
    assert artifacts["kernel"]["parts"][0]["text"].endswith("cloud-amd64")
    follow_up = artifacts["follow-up"]["parts"][0]["data"]
    assert follow_up["type"] == "message" and follow_up["message"]["parts"] == [{"text": "finish"}]
    # A VM's output arrives when its process has ended (qemu-guest-agent), after the task did.
    with trio.fail_after(60):
        while "the task line: " not in (await admin.get(f"/api/v2/admin/tasks/{second['id']}/logs")).text:
            await trio.sleep(0.2)
    await admin.post(f"/api/v2/admin/instances/{instance_id}/destroy")


__all__ = ["guest_image", "libvirt_system"]  # fixtures this module uses


async def test_cancel_asks_the_agent_first_then_kills_one_that_does_not_end(
    admin: httpx.AsyncClient, controller: LiveController, tmp_path: Path
) -> None:
    script = tmp_path / "stubborn.py"
    script.write_text(
        "import json, os, socket, sys\n"
        "channel = socket.socket(fileno=int(os.environ['AIWG_CONTROL_FD'])).makefile('rwb', buffering=0)\n"
        'channel.write(b\'{"type": "hello", "version": 2}\\n\')\n'
        "for line in channel:\n"
        "    print('heard', json.loads(line)['type'], flush=True)  # and does nothing about it\n"
    )
    await add_loadout(admin, "stubborn", [sys.executable, str(script)])
    agent = await new_agent(admin, controller, "stubborn", loadout="stubborn")
    async with agent.client(controller) as client:
        body = {"message": message("work"), "configuration": {"returnImmediately": True}}
        task = (await client.post("/message:send", json=body)).json()["task"]
        with trio.fail_after(10):
            while (await client.get(f"/tasks/{task['id']}")).json()["metadata"].get("agentProtocol") != 2:
                await trio.sleep(0.05)
        started = trio.current_time()
        canceled = (await client.post(f"/tasks/{task['id']}:cancel", timeout=30)).json()
        waited = trio.current_time() - started
    assert canceled["status"]["state"] == "TASK_STATE_CANCELED", canceled
    assert 4.0 <= waited < 15  # the grace (AIWG_AGENT_CANCEL_GRACE_S, 5 s), then its tree was killed
    log = (await admin.get(f"/api/v2/admin/tasks/{task['id']}/logs")).text
    assert "heard task\n" in log and "heard cancel\n" in log


async def test_claude_code_through_its_adapter_and_its_chat_projection(
    admin: httpx.AsyncClient, controller: LiveController
) -> None:
    # The real CLI needs credentials and the network: a recorded transcript played by a stand-in.
    agents = EXECUTORS.parent
    fake = f"{sys.executable} {agents / 'fake_claude.py'}"
    transcript = agents.parent / "transcripts" / "success.jsonl"
    command = [
        "/usr/bin/env", f"AIWG_CLAUDE_COMMAND={fake}", f"FAKE_CLAUDE_TRANSCRIPT={transcript}",
        sys.executable, "-m", "agentic_sandbox_agent.claude",
    ]  # fmt: skip
    await add_loadout(admin, "claude-fake", command)
    agent = await new_agent(admin, controller, "claude-fake", loadout="claude-fake")
    async with agent.client(controller) as client:
        body = {"message": message("Write notes/out.md"), "metadata": {"return_files": True}}
        task = (await client.post("/message:send", json=body, timeout=60)).json()["task"]
    assert task["status"]["state"] == "TASK_STATE_COMPLETED", task
    assert task["metadata"]["claude.session_id"] and task["metadata"]["agentProtocol"] == 2
    artifacts = {a["artifactId"]: a for a in task["artifacts"]}
    stream = "".join(p["text"] for p in artifacts["claude-stream"]["parts"])
    assert stream == transcript.read_text()  # the raw stream, kept as the CLI printed it
    assert any(name.startswith("tool-result-") for name in artifacts)
    files = [a for a in artifacts.values() if a["artifactId"].startswith("file-")]
    assert files and files[0]["parts"][0]["filename"] == "out.md"
    auth = {"Authorization": f"Bearer {agent.token}"}
    async with httpx.AsyncClient(base_url=controller.url, headers=auth, timeout=30) as client:
        params = {"command_id": task["id"], "replay": "true"}
        async with client.stream("GET", "/api/v1/agent-output/chat", params=params) as response:
            events = [line[7:] async for line in response.aiter_lines() if line.startswith("event: ")]
    assert events[0] == "status" and events[-1] == "done"
    assert {"delta", "tool_call", "tool_result"} <= set(events)


# -- misbehaving agents -----------------------------------------------------------------------------

BAD_AGENTS = {
    # name: (what it does after hello, what its task's status says)
    "flood": ("while True:\n    send(type='status', text='spam')\n", "more than 100 events a second"),
    "hog": (
        "chunk = base64.b64encode(b'x' * 262144).decode()\n"
        "for i in range(8):\n"
        "    send(type='artifact', artifactId='big', parts=[{'raw': chunk}], append=i > 0)\n"
        "time.sleep(30)\n",
        "files add up to more than 1048576 bytes (artifact 'big')",
    ),
    "liar": (  # every line refused, the task goes on and ends as the agent ends it
        "lines.write(b'not json\\n'); receive()\n"
        'lines.write(b\'{"type": "status", "state": "TASK_STATE_SUBMITTED"}\\n\'); receive()\n'
        "lines.write(b'x' * (2 * 1024 * 1024) + b'\\n'); receive()\n"
        "send(type='status', state='TASK_STATE_COMPLETED', message={'parts': [{'text': 'survived'}]})\n"
        "send(type='status', state='TASK_STATE_WORKING')\n"
        "time.sleep(1)\n",
        "survived",
    ),
}
PRELUDE = (
    "import base64, json, os, socket, time\n"
    "lines = socket.socket(fileno=int(os.environ['AIWG_CONTROL_FD'])).makefile('rwb', buffering=0)\n"
    "def send(**fields):\n    lines.write(json.dumps(fields).encode() + b'\\n')\n"
    "def receive():\n    return json.loads(lines.readline())\n"
    "send(type='hello', version=2)\nreceive()\n"
)


@pytest.fixture
async def strict_controller(
    hostd: LiveHostd, tmp_path: Path
) -> AsyncIterator[tuple[httpx.AsyncClient, LiveController]]:
    """A controller with tight agent limits: 100 events a second, 1 MiB of files a task."""
    env = controller_env(
        tmp_path / "strict", hostd.socket_path, AIWG_AGENT_EVENTS_PER_S="100", AIWG_AGENT_MAX_FILE_BYTES="1048576"
    )
    async with serve_controller(load_config(env=env)) as controller, controller.client() as client:
        yield client, controller


async def test_misbehaving_agents_fail_their_own_tasks_and_nothing_else(
    strict_controller: tuple[httpx.AsyncClient, LiveController], tmp_path: Path
) -> None:
    admin, controller = strict_controller
    agents = {}
    for name, (body, _) in BAD_AGENTS.items():
        script = tmp_path / f"{name}.py"
        script.write_text(PRELUDE + body)
        await add_loadout(admin, name, [sys.executable, str(script)])
        agents[name] = await new_agent(admin, controller, name, loadout=name)
    await add_loadout(admin, "steady", ["/bin/sh", "-c", "sleep 2; echo steady"])
    steady = await new_agent(admin, controller, "steady", loadout="steady")
    results: dict[str, dict[str, Any]] = {}

    async def run(name: str, agent: Agent) -> None:
        async with agent.client(controller) as client:
            response = await client.post("/message:send", json={"message": message(name)}, timeout=60)
            results[name] = response.json()["task"]

    with trio.fail_after(60):
        async with trio.open_nursery() as nursery:
            for name, agent in {**agents, "steady": steady}.items():
                nursery.start_soon(run, name, agent)
    for name in ("flood", "hog"):
        status = results[name]["status"]
        assert status["state"] == "TASK_STATE_FAILED", (name, status)
        assert BAD_AGENTS[name][1] in status["message"]["parts"][0]["text"]
        assert results[name]["metadata"]["failKind"] == "application"
    liar = results["liar"]
    assert liar["status"]["state"] == "TASK_STATE_COMPLETED" and liar["status"]["message"]["parts"] == [
        {"text": "survived"}
    ]
    steady_task = results["steady"]
    assert steady_task["status"]["state"] == "TASK_STATE_COMPLETED"
    assert steady_task["artifacts"][0]["parts"] == [{"text": "steady\n"}]
    assert (await admin.get("/readyz")).status_code == 200  # the controller and its hostd carry on
