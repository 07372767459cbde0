"""One task's exec, from its output to its final status: first the pure parts (the outcome of an
exit, the status changes), then :class:`Runner` for real: a hostd process, a host instance, an exec
running a shell script, the runner following it into a store on a real SQLite file.

The task service drives runners end to end (tests/controller/a2a/, tests/controller/tasks/
test_service.py); these cases look at what one runner stores for each kind of exec event."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
import trio

from agentic_sandbox.controller.errors import ControllerError
from agentic_sandbox.controller.store import Append
from agentic_sandbox.controller.tasks.agentevents import AgentLimits
from agentic_sandbox.controller.tasks.prompts import HITL_EXTENSION
from agentic_sandbox.controller.tasks.runner import exit_outcome, status_change
from agentic_sandbox.proto import messages as m
from tests.controller.tasks.rig import Rig, working_task

# -- in memory -------------------------------------------------------------------------------------


def _exited(reason: str = "exited", exit_code: int | None = 0, signal: int | None = None) -> m.ExecExited:
    return m.ExecExited(reason=reason, exit_code=exit_code, signal=signal, last_seq=1)


APP, INFRA, FAILED = "application", "infrastructure", "TASK_STATE_FAILED"


@pytest.mark.parametrize(
    ("exited", "canceled", "outcome"),
    [
        (_exited(), False, ("TASK_STATE_COMPLETED", None, None)),
        (_exited(), True, ("TASK_STATE_CANCELED", "canceled", None)),  # a cancel wins over any exit
        (_exited("canceled", None, 15), False, ("TASK_STATE_CANCELED", "canceled", None)),
        (_exited(exit_code=3), False, ("TASK_STATE_FAILED", "the agent exited with status 3 (exited)", APP)),
        (_exited("timeout", None, 9), False, ("TASK_STATE_FAILED", "the agent was ended by signal 9 (timeout)", APP)),
        (_exited("signaled", None, 11), False, (FAILED, "the agent was ended by signal 11 (signaled)", APP)),
        (_exited("spawn_failed", None), False, ("TASK_STATE_FAILED", "the agent command could not be started", INFRA)),
        (_exited("lost", None), False, ("TASK_STATE_FAILED", "hostd lost the agent process", INFRA)),
    ],
)  # fmt: skip
def test_exit_outcome(exited: m.ExecExited, canceled: bool, outcome: tuple[str, str | None, str | None]) -> None:
    assert exit_outcome(exited, canceled) == outcome


def test_a_status_change_carries_an_agent_message_only_with_text() -> None:
    task = working_task("t1", exec_id="x")
    bare = status_change(task, "TASK_STATE_COMPLETED", None, unless_terminal=True)
    assert bare.body == {"taskId": "t1", "contextId": "c1", "status": {"state": "TASK_STATE_COMPLETED"}}
    assert bare.status is bare.body["status"] and bare.unless_terminal and bare.metadata is None
    said = status_change(task, "TASK_STATE_WORKING", "hi", message_fields={"extensions": ["e"]}, exec_seq=4)
    message = said.body["status"]["message"]
    assert (message["role"], message["parts"], message["taskId"], message["contextId"]) == (
        "ROLE_AGENT", [{"text": "hi"}], "t1", "c1",
    )  # fmt: skip
    assert message["extensions"] == ["e"] and message["messageId"] and said.exec_seq == 4


# -- a real hostd ----------------------------------------------------------------------------------


def _text(artifacts: list[dict[str, Any]], artifact_id: str) -> str:
    [found] = [a for a in artifacts if a["artifactId"] == artifact_id]
    return "".join(p["text"] for p in found["parts"])


async def test_output_becomes_two_artifacts_and_the_exit_the_final_status(rig: Rig) -> None:
    # "é" split across two writes: the stored text is whole, never a replacement character.
    script = r"printf 'a\303'; sleep 0.1; printf '\251b\n'; echo err >&2; exit 3"
    rec, events = await rig.run(script)
    assert rec.state == "TASK_STATE_FAILED"
    assert rec.status["message"]["parts"] == [{"text": "the agent exited with status 3 (exited)"}]
    assert rec.metadata == {"k": "v", "fail_kind": "application", "exit_code": 3}
    artifacts = await rig.store.tasks.artifacts(rec.id)
    assert (_text(artifacts, "stdout"), _text(artifacts, "stderr")) == ("aéb\n", "err\n")
    chunks = [e.body for e in events if e.kind == "artifact"]
    assert chunks[0].get("append") is None  # the first chunk makes the artifact, the others append
    assert all(c["append"] for c in chunks[1:] if c["artifact"]["artifactId"] == "stdout")
    closing = [c for c in chunks if c.get("lastChunk")]
    assert sorted(c["artifact"]["artifactId"] for c in closing) == ["stderr", "stdout"]
    assert events[-1].kind == "status" and rec.last_seq == events[-1].seq
    # The exec was deleted on hostd once the end was stored.
    with pytest.raises(ControllerError) as gone:
        await rig.link.call(m.ExecGetRequest(exec_id=rec.exec_id))  # type: ignore[arg-type]
    assert gone.value.details["hostd_code"] == "exec.not_found"


async def test_a_clean_exit_completes_and_a_canceled_task_is_canceled(rig: Rig) -> None:
    rec, _ = await rig.run("echo done")
    assert rec.state == "TASK_STATE_COMPLETED" and "message" not in rec.status
    assert rec.metadata == {"k": "v", "exit_code": 0}
    rec, _ = await rig.run("exit 0", canceled=True)
    assert rec.state == "TASK_STATE_CANCELED"


BAD_ID = "11111111-2222-4333-8444-555555555555"
PROMPT_ID = "0D6F1C2E-3B4A-4C5D-8E9F-A0B1C2D3E4F5"


async def test_control_lines_become_status_updates_and_a_bad_prompt_is_answered(rig: Rig) -> None:
    fd = '"$AIWG_CONTROL_FD"'
    status = json.dumps({"type": "status", "text": "thinking"})
    bad = json.dumps(
        {"type": "input_request", "prompt_id": BAD_ID, "prompt": "?", "response_schema": {"type": "array"}}
    )
    good = json.dumps(
        {"type": "input_request", "prompt_id": PROMPT_ID, "prompt": "Name?", "response_schema": {"type": "object"}}
    )
    other = json.dumps({"type": "something_else"})
    script = (
        f"printf '%s\\n' '{status}' >&{fd}; printf '%s\\n' '{other}' >&{fd}; "
        f"printf '%s\\n' '{bad}' >&{fd}; read -r -u {fd} reply; echo \"$reply\"; "
        f"printf '%s\\n' '{good}' >&{fd}; sleep 0.2"
    )
    rec, events = await rig.run(script)
    statuses = [e.body["status"] for e in events if e.kind == "status"]
    assert [s["state"] for s in statuses] == ["TASK_STATE_WORKING", "TASK_STATE_INPUT_REQUIRED", "TASK_STATE_COMPLETED"]
    assert statuses[0]["message"]["parts"] == [{"text": "thinking"}]
    envelope = statuses[1]["message"]["metadata"][HITL_EXTENSION]
    assert (envelope["prompt_id"], envelope["prompt"], envelope["response_schema"]) == (
        PROMPT_ID,
        "Name?",
        {"type": "object"},
    )
    assert statuses[1]["message"]["extensions"] == [HITL_EXTENSION]
    reply = json.loads(_text(await rig.store.tasks.artifacts(rec.id), "stdout"))
    assert (reply["type"], reply["prompt_id"]) == ("input_request_invalid", BAD_ID) and "object" in reply["error"]


async def test_output_past_the_bound_is_dropped_and_the_task_says_so(rig: Rig) -> None:
    rec, events = await rig.run("for i in $(seq 1 50); do echo line-$i; sleep 0.005; done", max_output_bytes=40)
    text = _text(await rig.store.tasks.artifacts(rec.id), "stdout")
    assert text.startswith("line-1\n") and len(text) <= 40 and "line-50" not in text
    assert rec.state == "TASK_STATE_COMPLETED" and rec.metadata["output_truncated"] is True
    assert rec.exec_seq >= max(e.body.get("exec_seq", 0) for e in events)


async def test_a_runner_resumes_after_what_was_stored(rig: Rig, tmp_path: Path) -> None:
    """A runner stopped midway (the controller going away) and a new one from the stored row: each
    line is stored once."""
    gate = tmp_path / "gate"
    task = await rig.start(f"echo one; echo two; while [ ! -e {gate} ]; do sleep 0.02; done; echo three")
    with trio.fail_after(20):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(rig.runner(task).run)
            while (
                not (artifacts := await rig.store.tasks.artifacts(task.id))
                or _text(artifacts, "stdout") != "one\ntwo\n"
            ):
                await trio.sleep(0.02)
            nursery.cancel_scope.cancel()  # the exec goes on in hostd
    stored = await rig.store.tasks.get(task.id)
    assert stored is not None and stored.exec_seq > 0
    gate.touch()
    # What the service gives a resumed runner: the artifacts the store has (later chunks append).
    started = {a["artifactId"] for a in await rig.store.tasks.artifacts(task.id)}
    with trio.fail_after(20):
        await rig.runner(stored, started=started).run()
    rec = await rig.store.tasks.get(task.id)
    assert rec is not None and rec.state == "TASK_STATE_COMPLETED"
    assert _text(await rig.store.tasks.artifacts(task.id), "stdout") == "one\ntwo\nthree\n"


async def test_an_exec_hostd_does_not_know_fails_the_task_as_infrastructure(rig: Rig) -> None:
    task = working_task("t-lost", exec_id="x-gone")
    await rig.store.tasks.create(task, Append(kind="message", body={"messageId": "m", "parts": [{"text": "x"}]}))
    with trio.fail_after(20):
        await rig.runner(task).run()
    rec = await rig.store.tasks.get("t-lost")
    assert rec is not None and rec.state == "TASK_STATE_FAILED"
    assert rec.metadata["fail_kind"] == "infrastructure"
    assert rec.status["message"]["parts"][0]["text"].startswith("hostd lost the task's process")


# -- the agent protocol, version 2 -----------------------------------------------------------------

AGENT_PRELUDE = """
import base64, json, os, socket, sys
channel = socket.socket(fileno=int(os.environ["AIWG_CONTROL_FD"]))
lines = channel.makefile("rwb", buffering=0)
def send(**fields):
    lines.write(json.dumps(fields).encode() + b"\\n")
def receive():
    return json.loads(lines.readline())
"""


def agent(tmp_path: Path, body: str) -> str:
    """A bash line that runs ``body`` as a Python agent on its control channel."""
    path = tmp_path / f"agent-{len(list(tmp_path.glob('agent-*')))}.py"
    path.write_text(AGENT_PRELUDE + body)
    return f"exec {sys.executable} {path}"


async def test_an_agent_that_says_hello_gets_its_task_and_its_output_is_a_log(rig: Rig, tmp_path: Path) -> None:
    script = agent(
        tmp_path,
        """
send(type="hello", version=2, agent={"name": "t"})
task = receive()
print("a log line", flush=True)
print("to stderr", file=sys.stderr, flush=True)
send(type="artifact", artifactId="echo", parts=[{"data": task}], lastChunk=True)
send(type="status", state="TASK_STATE_COMPLETED", message={"parts": [{"text": "done"}]})
sys.exit(3)  # the agent ended the task itself: its exit status no longer decides
""",
    )
    rec, events = await rig.run(script)
    assert rec.state == "TASK_STATE_COMPLETED" and rec.status["message"]["parts"] == [{"text": "done"}]
    assert rec.metadata["agent_protocol"] == 2
    artifacts = {a["artifactId"]: a for a in await rig.store.tasks.artifacts(rec.id)}
    task = artifacts["echo"]["parts"][0]["data"]
    assert (task["type"], task["version"], task["taskId"], task["contextId"]) == ("task", 2, rec.id, "c1")
    assert task["message"]["parts"] == [{"text": "go"}] and task["extensions"] == []
    assert set(artifacts) == {"echo"}  # stdout and stderr are no artifacts of its task
    log = (await rig.logs.read(rec.id) or b"").decode()
    assert "a log line\n" in log and "to stderr\n" in log
    kinds = [(e.kind, e.body.get("status", {}).get("state")) for e in events]
    assert ("status", "TASK_STATE_WORKING") in kinds  # the hello, recorded with its version


async def test_refused_lines_are_answered_on_the_channel_and_the_task_goes_on(rig: Rig, tmp_path: Path) -> None:
    script = agent(
        tmp_path,
        """
send(type="hello", version=2)
receive()  # the task
replies = []
send(type="status", state="TASK_STATE_SUBMITTED"); replies.append(receive())
send(type="artifact", artifactId="a", parts=[{"text": "x", "data": 1}]); replies.append(receive())
lines.write(b"this is not json\\n"); replies.append(receive())
send(type="artifact", artifactId="replies", parts=[{"data": replies}])
send(type="message", message={"parts": [{"text": "answer"}]})
send(type="status", state="TASK_STATE_WORKING"); replies.append(receive())
send(type="artifact", artifactId="late", parts=[{"data": replies[-1]}])
""",
    )
    rec, _ = await rig.run(script)
    assert rec.state == "TASK_STATE_COMPLETED" and rec.metadata["answered_with"] == "message"
    assert rec.status["message"]["parts"] == [{"text": "answer"}] and rec.status["message"]["role"] == "ROLE_AGENT"
    artifacts = {a["artifactId"]: a for a in await rig.store.tasks.artifacts(rec.id)}
    replies = artifacts["replies"]["parts"][0]["data"]
    assert [(r["type"], r["event"]) for r in replies] == [
        ("error", "status"),
        ("error", "artifact"),
        ("error", "invalid"),
    ]
    assert "TASK_STATE_SUBMITTED" in replies[0]["error"] and "exactly one of" in replies[1]["error"]
    assert "not a JSON object" in replies[2]["error"]
    assert "late" not in artifacts  # after the end: refused too


async def test_a_flooding_agent_fails_its_task_and_is_killed(rig: Rig, tmp_path: Path) -> None:
    script = agent(
        tmp_path,
        """
send(type="hello", version=2)
receive()
while True:
    send(type="status", text="spam")
""",
    )
    rec, _ = await rig.run(script, limits=AgentLimits(events_per_s=200, burst_s=0.5))
    assert rec.state == "TASK_STATE_FAILED" and rec.metadata["fail_kind"] == "application"
    assert rec.status["message"]["parts"] == [{"text": "the agent sent more than 200 events a second"}]


async def test_many_large_lines_all_arrive_at_the_pace_the_controller_keeps(rig: Rig, tmp_path: Path) -> None:
    # 24 MiB of artifact lines: far more than hostd's ring holds, so only flow control saves them.
    script = agent(
        tmp_path,
        """
send(type="hello", version=2)
receive()
chunk = base64.b64encode(bytes(range(256)) * 1024).decode()  # 256 KiB
for i in range(96):
    part = {"raw": chunk, "filename": "f.bin"}
    send(type="artifact", artifactId="file", parts=[part], append=i > 0, lastChunk=i == 95)
""",
    )
    rec, events = await rig.run(script)
    assert rec.state == "TASK_STATE_COMPLETED"
    assert len([e for e in events if e.kind == "artifact"]) == 96
    [stored] = await rig.store.tasks.artifacts(rec.id)
    [part] = stored["parts"]
    assert part["file"]["size"] == 96 * 256 * 1024 and part["filename"] == "f.bin"
    data = b"".join(rig.files.chunks(rec.id, part["file"]["id"], part["file"]["size"]))
    assert data == bytes(range(256)) * 1024 * 96
