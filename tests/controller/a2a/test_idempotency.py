"""idempotency/v1 end to end (AC-1..AC-4): a real hostd, the controller on loopback, httpx, SQLite.

Each test provisions a host instance on the echo loadout and sends ``SendMessage`` with the
extension activated; the task count of the instance tells whether a request ran again.
"""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import trio

from agentic_sandbox.controller.a2a.card import IDEMPOTENCY_EXTENSION, RUNTIME_EXTENSION
from agentic_sandbox.controller.config import load_config
from tests.controller.a2a.helpers import Agent, error_reason, new_agent
from tests.controller.conftest import LiveController, LiveHostd, controller_env, serve_controller

ACTIVATED = {"A2A-Extensions": f"{RUNTIME_EXTENSION}, {IDEMPOTENCY_EXTENSION}"}
ERRORS = json.loads(
    (Path(__file__).parents[3] / "contracts/upstream/extensions/idempotency/v1/error-codes.json").read_text()
)
ERROR_CODES = {e["code"]: e for e in ERRORS["errors"]}


def uuid7() -> str:
    """A UUIDv7 (Python 3.11 has no uuid.uuid7): 48-bit ms timestamp, version 7, RFC variant."""
    value = (time.time_ns() // 1_000_000) << 80
    value |= int.from_bytes(uuid.uuid4().bytes, "big") & ((1 << 80) - 1)
    value = (value & ~(0xF << 76)) | (0x7 << 76)
    value = (value & ~(0x3 << 62)) | (0x2 << 62)
    return str(uuid.UUID(int=value))


def body(text: str, message_id: str, **extra: Any) -> dict[str, Any]:
    message = {"messageId": message_id, "role": "ROLE_USER", "parts": [{"text": text}]}
    return {"message": message, **extra}


async def task_count(client: httpx.AsyncClient) -> int:
    count: int = (await client.get("/tasks")).json()["totalSize"]
    return count


def info(response: httpx.Response) -> dict[str, str]:
    details = response.json()["error"]["details"]
    metadata: dict[str, str] = next(d for d in details if d["@type"].endswith("ErrorInfo"))["metadata"]
    return metadata


async def test_repeat_replays_collision_is_422_and_malformed_ids_are_refused(
    admin: httpx.AsyncClient, controller: LiveController
) -> None:
    agent = await new_agent(admin, controller, "idem", loadout="echo")
    async with agent.client(controller, **ACTIVATED) as client:
        # AC-1: the same id and the same request (keys in another order: equal under JCS).
        message_id = uuid7()
        first = await client.post("/message:send", json=body("hello", message_id))
        assert first.status_code == 200, first.text
        assert "idempotent-replayed" not in first.headers  # omitted on a miss, never "false"
        assert first.headers["a2a-extensions"] == ACTIVATED["A2A-Extensions"]
        again_body = json.dumps(body("hello", message_id), sort_keys=True, indent=1)
        again = await client.post("/message:send", content=again_body, headers={"Content-Type": "application/json"})
        assert again.status_code == first.status_code and again.content == first.content
        assert again.headers["idempotent-replayed"] == "true"
        assert again.headers["a2a-extensions"] == ACTIVATED["A2A-Extensions"]
        assert await task_count(client) == 1  # no second task
        # The /v1/ path is the same binding: the same entry.
        legacy = await client.post("/v1/messages:send", json=body("hello", message_id))
        assert legacy.content == first.content and legacy.headers["idempotent-replayed"] == "true"

        # AC-2: the same id, another request: 422 with both hashes; the entry stays.
        other = await client.post("/message:send", json=body("goodbye", message_id))
        assert other.status_code == ERROR_CODES["IDEMPOTENCY_KEY_REUSED_WITH_DIFFERENT_PAYLOAD"]["http_status"]
        assert error_reason(other) == "IDEMPOTENCY_KEY_REUSED_WITH_DIFFERENT_PAYLOAD"
        meta = info(other)
        assert meta["message_id"] == message_id
        assert set(ERROR_CODES["IDEMPOTENCY_KEY_REUSED_WITH_DIFFERENT_PAYLOAD"]["data_fields"]) <= set(meta)
        for key in ("original_request_hash", "submitted_request_hash"):
            assert len(meta[key]) == 64 and meta[key] == meta[key].lower()
        assert meta["original_request_hash"] != meta["submitted_request_hash"]
        replay = await client.post("/message:send", json=body("hello", message_id))
        assert replay.content == first.content and replay.headers["idempotent-replayed"] == "true"
        assert await task_count(client) == 1

        # Malformed ids: refused before any side effect.
        for bad in ("1", "retry-1", "00000000-0000-0000-0000-000000000000", str(uuid.uuid1()), "{" + uuid7() + "}"):
            refused = await client.post("/message:send", json=body("x", bad))
            assert refused.status_code == ERROR_CODES["IDEMPOTENCY_MESSAGE_ID_MALFORMED"]["http_status"], bad
            assert error_reason(refused) == "IDEMPOTENCY_MESSAGE_ID_MALFORMED"
            assert info(refused)["message_id"] == bad
        assert await task_count(client) == 1
        # A UUIDv4 (128 random bits in RFC 9562 form) is accepted.
        v4 = await client.post("/message:send", json=body("v4", str(uuid.uuid4())))
        assert v4.status_code == 200 and await task_count(client) == 2

    # Without the activation the extension is off: a repeated id runs again, any id shape goes.
    async with agent.client(controller) as plain:
        for _ in range(2):
            response = await plain.post("/message:send", json=body("hello", message_id))
            assert response.status_code == 200 and "idempotent-replayed" not in response.headers
            assert response.headers["a2a-extensions"] == RUNTIME_EXTENSION
        assert (await plain.post("/message:send", json=body("x", "retry-1"))).status_code == 200
        assert await task_count(plain) == 5


async def test_jsonrpc_replays_the_first_response_with_its_id(
    admin: httpx.AsyncClient, controller: LiveController
) -> None:
    agent = await new_agent(admin, controller, "idem-rpc", loadout="echo")
    message_id = uuid7()

    def call(call_id: int, text: str, mid: str = message_id) -> dict[str, Any]:
        return {"jsonrpc": "2.0", "id": call_id, "method": "SendMessage", "params": body(text, mid)}

    async with agent.client(controller, **ACTIVATED) as client:
        first = await client.post("", json=call(1, "hello"))
        assert first.json()["result"]["task"]["status"]["state"] == "TASK_STATE_COMPLETED"
        again = await client.post("", json=call(2, "hello"))
        assert again.content == first.content and again.json()["id"] == 1  # the cached response, its id
        assert again.headers["idempotent-replayed"] == "true"
        collision = (await client.post("", json=call(3, "other"))).json()
        assert collision["id"] == 3
        assert (
            collision["error"]["code"] == ERROR_CODES["IDEMPOTENCY_KEY_REUSED_WITH_DIFFERENT_PAYLOAD"]["jsonrpc_code"]
        )
        [error_info] = [d for d in collision["error"]["data"] if d["@type"].endswith("ErrorInfo")]
        assert error_info["metadata"]["message_id"] == message_id
        malformed = (await client.post("", json=call(4, "x", "7"))).json()
        assert malformed["error"]["code"] == ERROR_CODES["IDEMPOTENCY_MESSAGE_ID_MALFORMED"]["jsonrpc_code"]
        # The HTTP+JSON binding keeps entries of its own (its response differs).
        rest = await client.post("/message:send", json=body("hello", message_id))
        assert rest.status_code == 200 and "idempotent-replayed" not in rest.headers
        assert await task_count(client) == 2

    card = (await admin.get(f"/agents/{agent.instance_id}/.well-known/agent-card.json")).json()
    [ext] = [e for e in card["capabilities"]["extensions"] if e["uri"] == IDEMPOTENCY_EXTENSION]
    assert ext["required"] is True
    assert ext["params"] == {
        "ttl_seconds": 86400,
        "canonicalization": "jcs-rfc8785",
        "hash_algorithm": "sha-256",
        "max_cache_entries": 100000,
    }
    metrics = (await admin.get("/metrics")).text
    assert 'aiwg_idempotency_hit_total{operation="SendMessage"} 1.0' in metrics
    assert 'aiwg_idempotency_collision_total{operation="SendMessage"} 1.0' in metrics
    assert 'aiwg_idempotency_miss_total{operation="SendMessage"} 2.0' in metrics


async def test_entries_survive_a_restart_expire_and_are_bounded(hostd: LiveHostd, short_dir: Path) -> None:
    state_dir = short_dir / "ctl"
    env = controller_env(state_dir, hostd.socket_path, AIWG_IDEMPOTENCY_MAX_ENTRIES="2")
    message_id = uuid7()
    async with serve_controller(load_config(env=env)) as live, live.client() as admin:
        agent = await new_agent(admin, live, "idem-restart", loadout="echo")
        async with agent.client(live, **ACTIVATED) as client:
            first = await client.post("/message:send", json=body("kept", message_id))
            assert first.status_code == 200
        card = (await admin.get(f"/agents/{agent.instance_id}/.well-known/agent-card.json")).json()
        [ext] = [e for e in card["capabilities"]["extensions"] if e["uri"] == IDEMPOTENCY_EXTENSION]
        assert ext["params"]["max_cache_entries"] == 2

    # AC-4: a new controller on the same database replays byte for byte.
    async with serve_controller(load_config(env=env)) as live:
        agent = Agent(agent.instance_id, agent.token, f"{live.url}/agents/{agent.instance_id}")
        async with agent.client(live, **ACTIVATED) as client:
            replay = await client.post("/message:send", json=body("kept", message_id))
            assert replay.status_code == 200 and replay.content == first.content
            assert replay.headers["idempotent-replayed"] == "true"
            # The bound: two more entries push the oldest (the first) out; it runs again.
            for text in ("two", "three"):
                assert (await client.post("/message:send", json=body(text, uuid7()))).status_code == 200
            evicted = await client.post("/message:send", json=body("kept", message_id))
            assert evicted.status_code == 200 and "idempotent-replayed" not in evicted.headers
            assert evicted.json()["task"]["id"] != first.json()["task"]["id"]
            assert await task_count(client) == 4

    # AC-3: after the TTL a repeat is a new request (new task, no replay header).
    ttl_env = {**env, "AIWG_IDEMPOTENCY_TTL": "1"}
    async with serve_controller(load_config(env=ttl_env)) as live:
        agent = Agent(agent.instance_id, agent.token, f"{live.url}/agents/{agent.instance_id}")
        async with agent.client(live, **ACTIVATED) as client:
            short_id = uuid7()
            before = await client.post("/message:send", json=body("brief", short_id))
            replayed = await client.post("/message:send", json=body("brief", short_id))
            assert replayed.headers.get("idempotent-replayed") == "true"
            await trio.sleep(1.2)  # past the one-second TTL (not a timed assertion: it waits out the TTL)
            after = await client.post("/message:send", json=body("brief", short_id))
            assert after.status_code == 200 and "idempotent-replayed" not in after.headers
            assert after.json()["task"]["id"] != before.json()["task"]["id"]


async def stream_events(client: httpx.AsyncClient, path: str, payload: dict[str, Any]) -> tuple[httpx.Response, list]:
    """A stream's response (head) and its ``data:`` events, parsed."""
    async with client.stream("POST", path, json=payload) as response:
        events = [json.loads(line[6:]) async for line in response.aiter_lines() if line.startswith("data: ")]
    return response, events


async def test_a_repeated_stream_attaches_to_the_first_tasks_stream(
    admin: httpx.AsyncClient, controller: LiveController, tmp_path: Path
) -> None:
    agent = await new_agent(admin, controller, "idem-stream", loadout="shell")
    gate = tmp_path / "gate"
    script = f"echo one; while [ ! -e {gate} ]; do sleep 0.05; done; echo two"
    message_id = uuid7()
    async with agent.client(controller, **ACTIVATED) as client:
        # The first stream and a repeat of it while the task runs: one task, the same events.
        async with trio.open_nursery() as nursery:
            seen: dict[str, list[dict[str, Any]]] = {}

            async def follow(name: str) -> None:
                response, events = await stream_events(client, "/message:stream", body(script, message_id))
                assert response.status_code == 200
                seen[name] = events
                seen[name + ":replayed"] = [{"header": response.headers.get("idempotent-replayed")}]

            nursery.start_soon(follow, "first")
            with trio.fail_after(15):
                while await task_count(client) == 0:
                    await trio.sleep(0.02)
            nursery.start_soon(follow, "repeat")
            await trio.sleep(0.3)
            gate.touch()
        assert await task_count(client) == 1
        assert seen["first:replayed"] == [{"header": None}] and seen["repeat:replayed"] == [{"header": "true"}]
        assert seen["repeat"] == seen["first"]  # replayed from the task's creation, then followed live
        assert seen["first"][-1]["statusUpdate"]["status"]["state"] == "TASK_STATE_COMPLETED"
        # After the end, a repeat replays the whole stream again.
        response, again = await stream_events(client, "/v1/messages:stream", body(script, message_id))
        assert response.headers["idempotent-replayed"] == "true" and again == seen["first"]
        # The same id with another request: 422 before any stream.
        other = await client.post("/message:stream", json=body("echo other", message_id))
        assert other.status_code == 422 and error_reason(other) == "IDEMPOTENCY_KEY_REUSED_WITH_DIFFERENT_PAYLOAD"
        # A stream is not a send: the same id on message:send is a request of its own.
        sent = await client.post("/message:send", json=body(script, message_id))
        assert sent.status_code == 200 and "idempotent-replayed" not in sent.headers
        assert await task_count(client) == 2

        # JSON-RPC: the replay carries the first call's id.
        rpc_id = uuid7()

        def call(call_id: int) -> dict[str, Any]:
            return {"jsonrpc": "2.0", "id": call_id, "method": "SendStreamingMessage", "params": body("echo r", rpc_id)}

        _, events = await stream_events(client, "", call(7))
        repeat, replayed = await stream_events(client, "", call(8))
        assert repeat.headers["idempotent-replayed"] == "true" and replayed == events
        assert {e["id"] for e in replayed} == {7}
        assert await task_count(client) == 3

    metrics = (await admin.get("/metrics")).text
    assert 'aiwg_idempotency_hit_total{operation="SendStreamingMessage"} 3.0' in metrics


async def test_error_outcomes_are_kept_and_concurrent_repeats_wait_for_the_first(
    admin: httpx.AsyncClient, controller: LiveController
) -> None:
    agent = await new_agent(admin, controller, "idem-errors", loadout="shell")
    async with agent.client(controller, **ACTIVATED) as client:
        # An error answer is the request's outcome (the spec: 4xx and 5xx are cached too).
        missing = body("x", uuid7(), configuration={"returnImmediately": True})
        missing["message"]["taskId"] = "no-such-task"
        first = await client.post("/message:send", json=missing)
        assert first.status_code == 404 and "idempotent-replayed" not in first.headers
        again = await client.post("/message:send", json=missing)
        assert again.status_code == 404 and again.content == first.content
        assert again.headers["idempotent-replayed"] == "true"
        rpc = {"jsonrpc": "2.0", "id": 1, "method": "SendMessage", "params": missing}
        rpc_first = await client.post("", json=rpc)
        rpc_again = await client.post("", json={**rpc, "id": 2})
        assert rpc_first.json()["error"]["code"] == -32001
        assert rpc_again.content == rpc_first.content and rpc_again.headers["idempotent-replayed"] == "true"
        stream_missing = await client.post("/message:stream", json=missing)
        stream_again = await client.post("/message:stream", json=missing)
        assert stream_missing.status_code == stream_again.status_code == 404
        assert stream_again.headers["idempotent-replayed"] == "true"

        # Two blocking sends of one id at once: one task; the second waits and replays the first.
        message_id = uuid7()
        answers: list[httpx.Response] = []

        async def send() -> None:
            answers.append(await client.post("/message:send", json=body("sleep 0.5; echo once", message_id)))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(send)
            nursery.start_soon(send)
        assert [a.status_code for a in answers] == [200, 200] and answers[0].content == answers[1].content
        assert sorted(a.headers.get("idempotent-replayed", "") for a in answers) == ["", "true"]
        assert await task_count(client) == 1
