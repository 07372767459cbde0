"""agent-output/v1: Claude Code stream-json lines projected as chat events. First the projection of
each kind of line, then the SSE route on a live controller and hostd: an agent writes a recorded
transcript into its task's ``claude-stream`` artifact, in chunks that cut lines, and a client reads
the chat (replay, resume by ``Last-Event-ID``, an unknown command, the deprecation headers)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio
import yaml

from agentic_sandbox.controller.a2a.agentoutput import AGENT_OUTPUT_EXTENSION, parse_last_event_id, project
from tests.controller.a2a.helpers import new_agent
from tests.controller.conftest import LiveController


def said(role: str, *blocks: dict[str, Any]) -> dict[str, Any]:
    return {"type": role, "message": {"content": list(blocks)}}


TRANSCRIPT = [
    {"type": "system", "subtype": "init", "session_id": "s-1", "model": "claude-x", "tools": ["Bash"]},
    said("assistant", {"type": "thinking", "thinking": "hm"}, {"type": "text", "text": "Let me look."}),
    said("assistant", {"type": "tool_use", "id": "t1", "name": "Bash", "input": {"command": "ls"}}),
    said("user", {"type": "tool_result", "tool_use_id": "t1", "content": [{"type": "text", "text": "a.txt"}]}),
    said("user", {"type": "tool_result", "tool_use_id": "t2", "content": "boom", "is_error": True}),
    {
        "type": "result", "subtype": "success", "is_error": False, "result": "Found a.txt",
        "total_cost_usd": 0.01, "usage": {"input_tokens": 5},
    },
]  # fmt: skip


def test_each_kind_of_line_projects_to_its_events() -> None:
    lines = [json.dumps(event) for event in TRANSCRIPT]
    assert project(lines[0]) == [
        ("status", {"role": "system", "kind": "message", "status": "init", "content": "session_id=s-1 model=claude-x"})
    ]
    assert project(lines[1]) == [("delta", {"content": "Let me look.", "role": "assistant", "kind": "message"})]
    call = {"role": "assistant", "kind": "tool_call", "name": "Bash", "tool_id": "t1", "input": {"command": "ls"}}
    assert project(lines[2]) == [("tool_call", call)]
    assert project(lines[3]) == [
        ("tool_result", {"role": "tool", "kind": "tool_result", "tool_id": "t1", "status": "ok", "content": "a.txt"})
    ]
    assert project(lines[4])[0][1]["status"] == "error"
    [(name, done)] = project(lines[5])
    assert name == "done" and done["finish_reason"] == "success" and done["content"] == "Found a.txt"
    assert done["usage"] == {"input_tokens": 5} and done["total_cost_usd"] == 0.01
    assert project("not json") == [("raw", {"role": "system", "kind": "raw", "content": "not json"})]
    assert project('{"type": "stream_event"}')[0][0] == "raw"  # kept, never dropped


def test_last_event_id() -> None:
    assert parse_last_event_id(None) is None and parse_last_event_id("") is None
    resume = parse_last_event_id("t-1-2-17")
    assert resume is not None and (resume.session, resume.seq) == ("t-1-2", 17)
    with pytest.raises(ValueError, match="not"):
        parse_last_event_id("no-number-here")


def writer_agent(tmp_path: Path) -> str:
    """An agent that writes TRANSCRIPT into its claude-stream artifact, cutting a line across two
    chunks, then completes."""
    text = "".join(json.dumps(event) + "\n" for event in TRANSCRIPT)
    cut = len(text) // 2
    path = tmp_path / "writer.py"
    path.write_text(
        "import agentic_sandbox_agent as agent\n"
        "channel = agent.connect(name='writer')\n"
        f"chunks = [{text[:cut]!r}, {text[cut:]!r}]\n"
        "for i, chunk in enumerate(chunks):\n"
        "    channel.artifact('claude-stream', [agent.text_part(chunk)], append=i > 0, last_chunk=i == 1)\n"
        "channel.complete('done')\n"
    )
    return str(path)


async def read_chat(client: httpx.AsyncClient, params: dict[str, str], **headers: str) -> list[dict[str, Any]]:
    frames: list[dict[str, Any]] = []
    async with client.stream("GET", "/api/v1/agent-output/chat", params=params, headers=headers) as response:
        assert response.status_code == 200, await response.aread()
        assert response.headers["content-type"].startswith("text/event-stream")
        assert response.headers["deprecated"] == "true"
        frame: dict[str, Any] = {}
        async for line in response.aiter_lines():
            if line.startswith("id: "):
                frame["id"] = line[4:]
            elif line.startswith("event: "):
                frame["event"] = line[7:]
            elif line.startswith("data: "):
                frame["data"] = json.loads(line[6:])
            elif not line and frame:
                frames.append(frame)
                frame = {}
    return frames


async def test_the_chat_of_a_task_replays_resumes_and_ends_with_it(
    admin: httpx.AsyncClient, controller: LiveController, tmp_path: Path
) -> None:
    manifest = {
        "name": "writer",
        "version": "1",
        "runtime": "host",
        "command": [sys.executable, writer_agent(tmp_path)],
    }
    response = await admin.post("/api/v2/admin/loadouts", json={"name": "writer", "manifest": yaml.safe_dump(manifest)})
    assert response.status_code in (200, 201), response.text
    agent = await new_agent(admin, controller, "writer", loadout="writer")
    card = (await admin.get(f"/agents/{agent.instance_id}/.well-known/agent-card.json")).json()
    ext = next(e for e in card["capabilities"]["extensions"] if e["uri"] == AGENT_OUTPUT_EXTENSION)
    assert ext["params"]["sources"] == ["stream-json"] and ext["params"]["id_format"] == "{session}-{seq}"
    async with agent.client(controller) as client:
        body = {"message": {"messageId": "m1", "role": "ROLE_USER", "parts": [{"text": "go"}]}}
        task = (await client.post("/message:send", json=body)).json()["task"]
        assert task["status"]["state"] == "TASK_STATE_COMPLETED", task
    auth = {"Authorization": f"Bearer {agent.token}"}
    async with httpx.AsyncClient(base_url=controller.url, headers=auth, timeout=30) as client:
        with trio.fail_after(30):
            frames = await read_chat(client, {"command_id": task["id"], "replay": "true"})
        assert [f["event"] for f in frames] == ["status", "delta", "tool_call", "tool_result", "tool_result", "done"]
        assert [f["id"] for f in frames] == [f"{task['id']}-{n}" for n in range(1, 7)]
        assert frames[1]["data"]["content"] == "Let me look." and frames[1]["data"]["session_id"] == task["id"]
        assert [f["data"]["raw_ref"] for f in frames[:2]] == [
            {"command_id": task["id"], "line": 1}, {"command_id": task["id"], "line": 2},
        ]  # fmt: skip
        assert frames[-1]["data"]["content"] == "Found a.txt"
        # Resume after the third event: the rest, once.
        with trio.fail_after(30):
            rest = await read_chat(client, {"command_id": task["id"]}, **{"Last-Event-ID": f"{task['id']}-3"})
        assert [f["id"] for f in rest] == [f"{task['id']}-{n}" for n in (4, 5, 6)]
        # Another session's id, an unknown command on resume: an error event, never a hang.
        for params, last in (({"command_id": task["id"]}, "other-3"), ({"command_id": "gone"}, "gone-1")):
            with trio.fail_after(30):
                [error] = await read_chat(client, params, **{"Last-Event-ID": last})
            assert error["event"] == "error" and error["data"]["code"] == "STREAM_INTERRUPTED"
        # Without replay, a task that already ended has nothing new.
        with trio.fail_after(30):
            assert await read_chat(client, {"command_id": task["id"]}) == []
        missing = await client.get("/api/v1/agent-output/chat", params={"command_id": "nope"})
        assert missing.status_code == 404
        assert (await client.get("/api/v1/agent-output/chat")).status_code == 422
    async with httpx.AsyncClient(base_url=controller.url, timeout=30) as anonymous:
        assert (await anonymous.get("/api/v1/agent-output/chat", params={"command_id": task["id"]})).status_code == 401
