"""hitl-prompt/v1 end to end (CF-1..CF-4, CF-6): real hostd, the controller on loopback, httpx.

The agents are shell scripts (the ``shell`` loadout runs the message as a script) that write an
``input_request`` line on their control channel and read the answer back with ``read -u``, or the
built-in ``prompt`` loadout. What is emitted is checked against upstream's vendored schemas and
examples (``contracts/upstream/extensions/hitl-prompt/v1``).
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
from a2a.types import SendMessageRequest, TaskState
from google.protobuf.json_format import MessageToDict
from google.protobuf.struct_pb2 import Struct

from agentic_sandbox.controller.a2a.card import RUNTIME_EXTENSION
from agentic_sandbox.controller.tasks.prompts import HITL_EXTENSION
from tests.contracts import hitl_file, validate_hitl
from tests.controller.a2a.helpers import Agent, error_reason, new_agent, process_agent
from tests.controller.a2a.test_rest import message, settled, text_of
from tests.controller.a2a.test_sdk_client import run_in_asyncio, sdk_client, user_message
from tests.controller.a2a.test_sse import read_stream
from tests.controller.conftest import (
    ControllerProcess,
    LiveController,
    LiveHostd,
    controller_env,
)

ACTIVE = {"A2A-Extensions": f"{RUNTIME_EXTENSION}, {HITL_EXTENSION}"}
#: The schema of upstream's example prompt (approved: boolean, comment: string, nothing else).
EXAMPLE_PROMPT = hitl_file("examples/prompt-event.json")["status"]["message"]["metadata"][HITL_EXTENSION]
SCHEMA = EXAMPLE_PROMPT["response_schema"]
#: Upstream's example of an invalid answer, and what it says the 422 lists.
INVALID_EXAMPLE = hitl_file("examples/invalid-response-422.json")


def ask_script(prompt: str = "Approve?", schema: dict[str, Any] = SCHEMA, times: int = 1, **fields: Any) -> str:
    """A shell agent that asks ``times`` times and prints each answer line it reads."""
    request = json.dumps({"type": "input_request", "prompt": prompt, "response_schema": schema, **fields})
    return (
        f"for i in $(seq {times}); do\n"
        f"  printf '%s\\n' '{request}' >&\"$AIWG_CONTROL_FD\"\n"
        '  read -r -u "$AIWG_CONTROL_FD" line || exit 3\n'
        '  echo "got: $line"\n'
        "done\n"
    )


def answer(task_id: str, prompt_id: str, payload: dict[str, Any], **fields: Any) -> dict[str, Any]:
    metadata = {"hitl_response_for": {"prompt_id": prompt_id, "payload": payload}}
    return {"message": message("answer", taskId=task_id, metadata=metadata), **fields}


def envelope_of(task: dict[str, Any]) -> dict[str, Any]:
    status = task["status"]
    assert status["state"] == "TASK_STATE_INPUT_REQUIRED", status
    found: dict[str, Any] = status["message"]["metadata"][HITL_EXTENSION]
    return found


def validation_errors(response: httpx.Response) -> list[dict[str, str]]:
    details = response.json()["error"]["details"]
    [extra] = [d for d in details if d["@type"].endswith("hitl-prompt/v1/ValidationErrors")]
    errors: list[dict[str, str]] = extra["validation_errors"]
    return errors


async def read_sse(client: httpx.AsyncClient, method: str, path: str, **kw: Any) -> list[dict[str, Any]]:
    async with client.stream(method, path, **kw) as response:
        return await read_stream(response)


async def waiting(client: httpx.AsyncClient, script: str, path: str = "/message:send") -> dict[str, Any]:
    """Start a task with ``script`` and return it once it waits for input (a blocking send)."""
    response = await client.post(path, json={"message": message(script)})
    assert response.status_code == 200, response.text
    task: dict[str, Any] = response.json()["task"]
    assert task["status"]["state"] == "TASK_STATE_INPUT_REQUIRED", task
    return task


async def test_prompt_envelope_answers_409_422_and_resume(admin: httpx.AsyncClient, controller: LiveController) -> None:
    agent = await new_agent(admin, controller, "hitl", loadout="shell")
    async with agent.client(controller, **ACTIVE) as client, agent.client(controller) as plain:
        task = await waiting(client, ask_script(times=2))
        assert client.headers["A2A-Extensions"] == (await client.get(f"/tasks/{task['id']}")).headers["a2a-extensions"]
        # The envelope, per upstream's schema: a UUID prompt_id, the prompt, the agent's schema.
        envelope = envelope_of(task)
        validate_hitl("envelope", envelope)
        assert uuid.UUID(envelope["prompt_id"]).version == 4
        assert envelope == {"prompt_id": envelope["prompt_id"], "prompt": "Approve?", "response_schema": SCHEMA}
        status_message = task["status"]["message"]
        assert status_message["role"] == "ROLE_AGENT" and status_message["parts"] == [{"text": "Approve?"}]
        assert status_message["extensions"] == [HITL_EXTENSION]
        # Only callers that activated the extension see it.
        bare = (await plain.get(f"/tasks/{task['id']}")).json()
        assert bare["status"]["state"] == "TASK_STATE_INPUT_REQUIRED"
        assert bare["status"]["message"]["parts"] == [{"text": "Approve?"}]
        assert HITL_EXTENSION not in bare["status"]["message"]["metadata"]  # the timeline position stays
        assert "extensions" not in bare["status"]["message"]

        # CF-3: a payload the schema refuses is 422 with the validation errors; the task still waits.
        bad = INVALID_EXAMPLE["request"]["metadata"]["hitl_response_for"]["payload"]
        refused = await client.post("/message:send", json=answer(task["id"], envelope["prompt_id"], bad))
        assert refused.status_code == INVALID_EXAMPLE["response"]["httpStatus"] == 422, refused.text
        assert error_reason(refused) == "HITL_RESPONSE_INVALID"
        expected = INVALID_EXAMPLE["response"]["jsonrpcError"]["data"]["validation_errors"]
        errors = validation_errors(refused)
        assert sorted((e["path"], e["keyword"]) for e in errors) == sorted((e["path"], e["keyword"]) for e in expected)
        assert all(e["message"] for e in errors)
        violations = next(d for d in refused.json()["error"]["details"] if d["@type"].endswith("BadRequest"))
        assert {v["field"] for v in violations["fieldViolations"]} == {"/approved", "/extra_unknown_field"}
        assert (await client.get(f"/tasks/{task['id']}")).json()["status"]["state"] == "TASK_STATE_INPUT_REQUIRED"

        # 409: a prompt id the task does not wait on.
        unknown = await client.post("/message:send", json=answer(task["id"], str(uuid.uuid4()), {"approved": True}))
        assert unknown.status_code == 409 and error_reason(unknown) == "HITL_ALREADY_ANSWERED_OR_UNKNOWN"
        # An answer without activating the extension is refused, naming it.
        inactive = await plain.post("/message:send", json=answer(task["id"], envelope["prompt_id"], {"approved": True}))
        assert inactive.status_code == 400 and error_reason(inactive) == "EXTENSION_SUPPORT_REQUIRED"
        assert HITL_EXTENSION in inactive.json()["error"]["message"]
        # An answer that names no task, or breaks response.schema.json's shape, is 400.
        no_task = answer(task["id"], envelope["prompt_id"], {"approved": True})
        del no_task["message"]["taskId"]
        assert (await client.post("/message:send", json=no_task)).status_code == 400
        extra_key = answer(task["id"], envelope["prompt_id"], {"approved": True})
        extra_key["message"]["metadata"]["hitl_response_for"]["extra"] = 1
        assert (await client.post("/message:send", json=extra_key)).status_code == 400

        # CF-1, CF-2: a valid answer (the /v1/ path, returnImmediately) is taken; the task works on.
        ok = answer(task["id"], envelope["prompt_id"], {"approved": True}, configuration={"returnImmediately": True})
        accepted = await client.post("/v1/messages:send", json=ok)
        assert accepted.status_code == 200, accepted.text
        assert accepted.json()["task"]["status"]["state"] != "TASK_STATE_INPUT_REQUIRED"
        # ... and answering it again is 409, whatever the task does meanwhile.
        again = await client.post("/message:send", json=answer(task["id"], envelope["prompt_id"], {"approved": True}))
        assert again.status_code == 409 and error_reason(again) == "HITL_ALREADY_ANSWERED_OR_UNKNOWN"

        # The agent asks again (a new prompt id); the answer reaches it and it ends.
        second = await settled(client, task["id"])
        envelope2 = envelope_of(second)
        assert envelope2["prompt_id"] != envelope["prompt_id"]
        done = await client.post("/message:send", json=answer(task["id"], envelope2["prompt_id"], {"approved": False}))
        final = done.json()["task"]
        assert final["status"]["state"] == "TASK_STATE_COMPLETED", final
        lines = [json.loads(line.removeprefix("got: ")) for line in text_of(final, "stdout").splitlines()]
        assert [(line["type"], line["prompt_id"], line["payload"]) for line in lines] == [
            ("input_response", envelope["prompt_id"], {"approved": True}),
            ("input_response", envelope2["prompt_id"], {"approved": False}),
        ]
        assert lines[0]["message"]["metadata"]["hitl_response_for"]["prompt_id"] == envelope["prompt_id"]
        # The answers are in the task's history; answering an ended task is 409.
        history = (await client.get(f"/tasks/{task['id']}")).json()["history"]
        assert [m["metadata"]["hitl_response_for"]["payload"] for m in history[1:]] == [
            {"approved": True},
            {"approved": False},
        ]
        late = await client.post("/message:send", json=answer(task["id"], envelope2["prompt_id"], {"approved": True}))
        assert late.status_code == 409


async def test_card_declares_the_extension(admin: httpx.AsyncClient, controller: LiveController) -> None:
    agent = await new_agent(admin, controller, "hitl-card", loadout="prompt")
    card = (await admin.get(f"/agents/{agent.instance_id}/.well-known/agent-card.json")).json()
    [ext] = [e for e in card["capabilities"]["extensions"] if e["uri"] == HITL_EXTENSION]
    # required: false and params: {} (the spec's), both left out of a signed card (see card.py).
    assert "required" not in ext and "params" not in ext and ext["description"]
    async with agent.client(controller, **ACTIVE) as client:
        response = await client.get("/tasks")
        assert response.headers["a2a-extensions"] == ACTIVE["A2A-Extensions"]


async def test_an_input_request_that_cannot_be_a_prompt_is_refused_to_the_agent(
    admin: httpx.AsyncClient, controller: LiveController
) -> None:
    agent = await new_agent(admin, controller, "hitl-bad", loadout="shell")
    cases = [
        {"prompt": "", "response_schema": {"type": "object"}},
        {"prompt": "x", "response_schema": {"type": "string"}},
        {"prompt": "x", "response_schema": {"type": "object", "properties": {"a": {"type": "nope"}}}},
        {"prompt": "x", "response_schema": {"type": "object", "$ref": "http://198.51.100.1/s.json"}},
        {"prompt": "x", "response_schema": {"type": "object"}, "deadline": "2001-01-01T00:00:00Z"},
        {"prompt": "x", "response_schema": {"type": "object"}, "prompt_id": "not-a-uuid"},
        {"prompt": "x", "response_schema": {"type": "object"}, "allowed_responders": ["anyone"]},
    ]
    script = ""
    for case in cases:
        line = json.dumps({"type": "input_request", **case})
        script += f'printf \'%s\\n\' \'{line}\' >&"$AIWG_CONTROL_FD"; read -r -u "$AIWG_CONTROL_FD" r; echo "$r"\n'
    async with agent.client(controller, **ACTIVE) as client:
        response = await client.post("/message:send", json={"message": message(script)})
        task = response.json()["task"]
        assert task["status"]["state"] == "TASK_STATE_COMPLETED", task  # it never waited
        replies = [json.loads(line) for line in text_of(task, "stdout").splitlines()]
        assert [r["type"] for r in replies] == ["input_request_invalid"] * len(cases)
        assert all(r["error"].startswith("input_request: ") for r in replies)
        assert "deadline" in replies[4]["error"] and replies[5]["prompt_id"] == "not-a-uuid"


async def test_jsonrpc_binding(admin: httpx.AsyncClient, controller: LiveController) -> None:
    agent = await new_agent(admin, controller, "hitl-rpc", loadout="shell")

    def call(call_id: int, params: dict[str, Any]) -> dict[str, Any]:
        return {"jsonrpc": "2.0", "id": call_id, "method": "SendMessage", "params": params}

    async with agent.client(controller, **ACTIVE) as client:
        first = (await client.post("", json=call(1, {"message": message(ask_script())}))).json()
        task = first["result"]["task"]
        envelope = envelope_of(task)
        validate_hitl("envelope", envelope)
        bad = INVALID_EXAMPLE["request"]["metadata"]["hitl_response_for"]["payload"]
        refused = (await client.post("", json=call(2, answer(task["id"], envelope["prompt_id"], bad)))).json()
        expected = INVALID_EXAMPLE["response"]["jsonrpcError"]
        assert refused["id"] == 2 and refused["error"]["code"] == expected["code"] == -32011
        assert refused["error"]["message"].startswith(expected["message"])
        [extra] = [d for d in refused["error"]["data"] if d["@type"].endswith("ValidationErrors")]
        assert extra["extension"] == expected["data"]["extension"] and extra["prompt_id"] == envelope["prompt_id"]
        assert {e["path"] for e in extra["validation_errors"]} == {"/approved", "/extra_unknown_field"}
        unknown = (await client.post("", json=call(3, answer(task["id"], str(uuid.uuid4()), {})))).json()
        assert unknown["error"]["code"] == -32010
        assert unknown["error"]["message"].startswith("hitl_already_answered_or_unknown")
        ok = (await client.post("", json=call(4, answer(task["id"], envelope["prompt_id"], {"approved": True})))).json()
        assert ok["result"]["task"]["status"]["state"] == "TASK_STATE_COMPLETED", ok
        again = (await client.post("", json=call(5, answer(task["id"], envelope["prompt_id"], {})))).json()
        assert again["error"]["code"] == -32010


async def test_streams_end_at_the_prompt_and_a_reconnect_replays_it(
    admin: httpx.AsyncClient, controller: LiveController
) -> None:
    """CF-6: the stream closes at INPUT_REQUIRED; a new subscription carries the same prompt
    (prompt_id and response_schema), and an answer is then accepted and streamed on."""
    agent = await new_agent(admin, controller, "hitl-sse", loadout="shell")
    async with agent.client(controller, **ACTIVE) as client:
        events = await read_sse(client, "POST", "/message:stream", json={"message": message(ask_script())})
        assert "task" in events[0]
        last = events[-1]["statusUpdate"]
        assert last["status"]["state"] == "TASK_STATE_INPUT_REQUIRED"
        envelope = last["status"]["message"]["metadata"][HITL_EXTENSION]
        validate_hitl("envelope", envelope)
        task_id = last["taskId"]

        replay = await read_sse(client, "GET", f"/tasks/{task_id}:subscribe")
        [only] = replay  # the Task as it stands, and the stream ends: it waits for input
        again = envelope_of(only["task"])
        assert (again["prompt_id"], again["response_schema"]) == (envelope["prompt_id"], envelope["response_schema"])

        # The answer sent as a stream: the task goes on from where it stands, to its end.
        body = answer(task_id, envelope["prompt_id"], {"approved": True})
        rest = await read_sse(client, "POST", "/v1/messages:stream", json=body)
        states = [(e.get("task") or e.get("statusUpdate", {})).get("status", {}).get("state") for e in rest]
        # The Task as it stands (the answer taken: working, or done already), then on to its end.
        assert states[0] in ("TASK_STATE_WORKING", "TASK_STATE_COMPLETED"), rest
        assert states[-1] == "TASK_STATE_COMPLETED", rest

    # Without the activation the stream shows the prompt's text, not its envelope.
    async with agent.client(controller) as plain:
        events = await read_sse(plain, "POST", "/message:stream", json={"message": message(ask_script())})
        status = events[-1]["statusUpdate"]["status"]
        assert status["state"] == "TASK_STATE_INPUT_REQUIRED" and HITL_EXTENSION not in status["message"]["metadata"]
        await plain.post(f"/tasks/{events[-1]['statusUpdate']['taskId']}:cancel")


async def test_resume_latency(admin: httpx.AsyncClient, controller: LiveController) -> None:
    """CF-4: from an answer to the task out of INPUT_REQUIRED, p95 at most 1 s over 20 prompts."""
    agent = await new_agent(admin, controller, "hitl-fast", loadout="shell")
    schema = {"type": "object", "required": ["n"], "properties": {"n": {"type": "integer"}}}
    trials = 20
    async with agent.client(controller, **ACTIVE) as client:
        task = await waiting(client, ask_script("n?", schema, times=trials))
        latencies = []
        for n in range(trials):
            envelope = envelope_of(task)
            started = time.perf_counter()
            body = answer(task["id"], envelope["prompt_id"], {"n": n}, configuration={"returnImmediately": True})
            response = await client.post("/message:send", json=body)
            latencies.append(time.perf_counter() - started)
            assert response.json()["task"]["status"]["state"] == "TASK_STATE_WORKING"
            task = await settled(client, task["id"])
        assert task["status"]["state"] == "TASK_STATE_COMPLETED"
        latencies.sort()
        assert latencies[int(0.95 * trials) - 1] <= 1.0, latencies


async def test_prompt_loadout(admin: httpx.AsyncClient, controller: LiveController) -> None:
    agent: Agent = await new_agent(admin, controller, "hitl-loadout", loadout="prompt")
    async with agent.client(controller, **ACTIVE) as client:
        task = await waiting(client, "Your name?")
        envelope = envelope_of(task)
        assert envelope["prompt"] == "Your name?"
        refused = await client.post("/message:send", json=answer(task["id"], envelope["prompt_id"], {"answer": ""}))
        assert refused.status_code == 422 and validation_errors(refused)[0]["path"] == "/answer"
        done = await client.post(
            "/message:send", json=answer(task["id"], envelope["prompt_id"], {"answer": "Ada", "shout": True})
        )
        final = done.json()["task"]
        assert final["status"]["state"] == "TASK_STATE_COMPLETED", final
        assert text_of(final, "stdout") == "asked: Your name?\nanswered: ADA\n"


async def test_a_waiting_task_and_an_accepted_answer_survive_controller_sigkills(
    hostd: LiveHostd, tmp_path: Path
) -> None:
    """A task waiting for input when the controller is killed still waits, with its prompt, after the
    restart, and an answer then reaches the agent. An answer accepted while hostd cannot take it
    (stopped) waits in the agent outbox, through another SIGKILL, and reaches the agent after."""
    env = controller_env(tmp_path / "c", hostd.socket_path)
    async with trio.open_nursery() as nursery:
        first = ControllerProcess(env)
        url = await first.start(nursery)
        agent = await process_agent(url, "hitl-durable", "shell")
        instance_id = agent.instance_id
        async with agent.client(LiveController(url, None, None), **ACTIVE) as client:  # type: ignore[arg-type]
            task = await waiting(client, ask_script(times=2))
        envelope = envelope_of(task)
        await first.stop(signal.SIGKILL)

        second = ControllerProcess(env)
        url = await second.start(nursery)
        agent.base = f"{url}/agents/{instance_id}"
        async with agent.client(LiveController(url, None, None), **ACTIVE) as client:  # type: ignore[arg-type]
            again = (await client.get(f"/tasks/{task['id']}")).json()
            assert envelope_of(again) == envelope  # still waiting, the same prompt
            response = await client.post(
                "/message:send", json=answer(task["id"], envelope["prompt_id"], {"approved": True})
            )
            assert response.status_code == 200, response.text
            second_envelope = envelope_of(response.json()["task"])  # the agent had it: it asks again
            os.kill(hostd.pid, signal.SIGSTOP)
            try:
                with trio.fail_after(15):
                    while (await client.get(f"{url}/readyz")).status_code != 503:
                        await trio.sleep(0.05)
                body = answer(
                    task["id"],
                    second_envelope["prompt_id"],
                    {"approved": False},
                    configuration={"returnImmediately": True},
                )
                accepted = await client.post("/message:send", json=body)
                assert accepted.status_code == 200, accepted.text
                assert accepted.json()["task"]["status"]["state"] == "TASK_STATE_WORKING"
                await second.stop(signal.SIGKILL)
            finally:
                os.kill(hostd.pid, signal.SIGCONT)
        with sqlite3.connect(Path(env["AIWG_STATE_DIR"]) / "controller.db") as db:
            [(waiting_body,)] = db.execute("SELECT body FROM agent_outbox WHERE task_id = ?", (task["id"],))
        assert json.loads(waiting_body)["payload"] == {"approved": False}  # not handed over yet

        third = ControllerProcess(env)
        url = await third.start(nursery)
        agent.base = f"{url}/agents/{instance_id}"
        async with agent.client(LiveController(url, None, None), **ACTIVE) as client:  # type: ignore[arg-type]
            final = await settled(client, task["id"])
        assert final["status"]["state"] == "TASK_STATE_COMPLETED", final
        payloads = [json.loads(line.removeprefix("got: "))["payload"] for line in text_of(final, "stdout").splitlines()]
        assert payloads == [{"approved": True}, {"approved": False}]
        assert await third.stop() == 0, third.output()
        nursery.cancel_scope.cancel()


async def sdk_answers(agent: Agent, bindings: list[str]) -> dict[str, Any]:
    """The a2a-sdk client: send to the prompt loadout, read the prompt off the Task, answer it."""
    out: dict[str, Any] = {}
    headers = {"Authorization": f"Bearer {agent.token}", **ACTIVE}
    async with httpx.AsyncClient(headers=headers, timeout=30) as http:
        client = await sdk_client(agent, http, bindings, streaming=False)
        [event] = [e async for e in client.send_message(SendMessageRequest(message=user_message("Name?")))]
        task = event.task
        out["state"] = TaskState.Name(task.status.state)
        envelope = MessageToDict(task.status.message.metadata)[HITL_EXTENSION]
        out["envelope"] = envelope
        metadata = Struct()
        metadata.update({"hitl_response_for": {"prompt_id": envelope["prompt_id"], "payload": {"answer": "sdk"}}})
        reply = user_message("here", task_id=task.id, metadata=metadata)
        [done] = [e async for e in client.send_message(SendMessageRequest(message=reply))]
        out["final"] = TaskState.Name(done.task.status.state)
        out["stdout"] = "".join(p.text for a in done.task.artifacts for p in a.parts if a.artifact_id == "stdout")
        await client.close()
    return out


@pytest.mark.parametrize("bindings", [[], ["HTTP+JSON"]], ids=["jsonrpc-default", "http-json"])
async def test_sdk_client_sees_and_answers_a_prompt(
    admin: httpx.AsyncClient, controller: LiveController, bindings: list[str]
) -> None:
    agent = await new_agent(admin, controller, f"hitl-sdk-{len(bindings)}", loadout="prompt")
    out = await run_in_asyncio(lambda: sdk_answers(agent, bindings))
    assert out["state"] == "TASK_STATE_INPUT_REQUIRED"
    validate_hitl("envelope", out["envelope"])
    assert out["envelope"]["prompt"] == "Name?"
    assert out["final"] == "TASK_STATE_COMPLETED" and out["stdout"] == "asked: Name?\nanswered: sdk\n"
