"""The agent side of a task (controller/tasks/agentio.py): what the agent command gets, and the
control channel both ways, with an agent written against docs/writing-an-agent.md's protocol only."""

from __future__ import annotations

import json
import sys
import textwrap
import uuid
from typing import Any

import httpx
import trio

from tests.controller.a2a.helpers import new_agent
from tests.controller.conftest import LiveController

#: An agent in Python, knowing only the documented protocol: it says what it got on stdin and in
#: its environment, reports a status on the control channel, echoes every follow-up's text, and
#: ends on a follow-up saying "bye".
AGENT = textwrap.dedent(
    """
    import json, os, socket, sys
    first = sys.stdin.read()
    print("first:", first, "task:", os.environ["AIWG_TASK_ID"], flush=True)
    control = socket.socket(fileno=int(os.environ["AIWG_CONTROL_FD"]))
    channel = control.makefile("rwb", buffering=0)
    channel.write(json.dumps({"type": "status", "text": "ready for more"}).encode() + b"\\n")
    for line in channel:
        message = json.loads(line)
        if message.get("type") != "message":
            continue
        text = "".join(p.get("text", "") for p in message["message"]["parts"])
        print("follow-up:", text, flush=True)
        if text == "bye":
            break
    """
)


def message(text: str, **fields: Any) -> dict[str, Any]:
    return {"messageId": str(uuid.uuid4()), "role": "ROLE_USER", "parts": [{"text": text}], **fields}


async def test_follow_ups_reach_the_running_agent_on_its_control_channel(
    admin: httpx.AsyncClient, controller: LiveController
) -> None:
    manifest = {
        "name": "ctl-agent",
        "version": "1",
        "runtime": "host",
        "command": [sys.executable, "-c", AGENT],
    }
    created = await admin.post("/api/v2/admin/loadouts", json={"name": "ctl-agent", "manifest": json.dumps(manifest)})
    assert created.status_code in (200, 201), created.text
    agent = await new_agent(admin, controller, "agentio", loadout="ctl-agent")
    async with agent.client(controller) as client:
        body = {"message": message("hello"), "configuration": {"returnImmediately": True}}
        task = (await client.post("/message:send", json=body)).json()["task"]
        tid = task["id"]

        async def status_text() -> str:
            status = (await client.get(f"/tasks/{tid}")).json()["status"]
            return "".join(p["text"] for p in (status.get("message") or {}).get("parts", []))

        with trio.fail_after(15):
            while await status_text() != "ready for more":
                await trio.sleep(0.05)
        follow = {"message": message("more please", taskId=tid), "configuration": {"returnImmediately": True}}
        response = await client.post("/message:send", json=follow)
        assert response.status_code == 200, response.text
        mismatch = await client.post("/message:send", json={"message": message("x", taskId=tid, contextId="other")})
        assert mismatch.status_code == 400
        done = await client.post("/message:send", json={"message": message("bye", taskId=tid)})
        final = done.json()["task"]
    assert final["status"]["state"] == "TASK_STATE_COMPLETED", final
    out = "".join(p["text"] for a in final["artifacts"] if a["artifactId"] == "stdout" for p in a["parts"])
    assert out.splitlines() == [f"first: hello task: {tid}", "follow-up: more please", "follow-up: bye"]
    texts = ["".join(p.get("text", "") for p in m["parts"]) for m in final["history"]]
    assert texts == ["hello", "more please", "bye"]  # every inbound message, in order
