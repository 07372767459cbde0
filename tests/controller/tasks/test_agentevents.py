"""The agent protocol v2 as task changes: each line an agent may send, checked, and what it becomes;
files on a real directory (joined chunks, inline while small, on disk past that, replayed chunks
written at their offset); the event budget; the state of a task resumed after a restart. Every
line sent here is valid against docs/schemas/agent-protocol-v2.json unless it is meant not to be."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from agentic_sandbox.controller.store.tasks import fold_artifact
from agentic_sandbox.controller.tasks.agentevents import (
    AgentEvents,
    AgentLimits,
    Fault,
    Refused,
)
from agentic_sandbox.controller.tasks.files import INLINE_BYTES, TaskFiles
from tests.controller.tasks.rig import working_task

SCHEMA = json.loads((Path(__file__).parents[3] / "docs" / "schemas" / "agent-protocol-v2.json").read_text())
VALIDATOR = jsonschema.Draft202012Validator(SCHEMA)


def line(**fields: Any) -> dict[str, Any]:
    """A line as an agent writes it, checked against the published schema."""
    VALIDATOR.validate(fields)
    return fields


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


@pytest.fixture
def events(tmp_path: Path) -> AgentEvents:
    return AgentEvents(working_task("t1", exec_id="x"), TaskFiles(tmp_path / "files"), AgentLimits(), [])


def test_hello_says_the_version_to_speak_once(events: AgentEvents) -> None:
    assert events.hello(line(type="hello", version=2, agent={"name": "a", "version": "1"})) == 2
    assert events.hello({"type": "hello", "version": 7}) == 2  # a newer agent: we speak ours
    assert events.hello({"type": "hello", "version": 1}) == 0
    events.speaks = 2  # the runner sets it once the agent has its task
    assert events.hello(line(type="hello", version=2)) == 0  # a second hello changes nothing
    with pytest.raises(Refused, match="hello"):
        events.hello({"type": "hello", "version": "two"})


@pytest.mark.parametrize(
    "state",
    [
        "TASK_STATE_WORKING",
        "TASK_STATE_INPUT_REQUIRED",
        "TASK_STATE_AUTH_REQUIRED",
        "TASK_STATE_COMPLETED",
        "TASK_STATE_FAILED",
        "TASK_STATE_CANCELED",
        "TASK_STATE_REJECTED",
    ],
)
def test_a_status_of_every_state_an_agent_may_set(events: AgentEvents, state: str) -> None:
    parts = [{"text": "hi"}, {"data": {"k": 1}, "metadata": {"m": True}}]
    change = events.status(line(type="status", state=state, message={"parts": parts}, metadata={"x": 1}), 5)
    message = change.body["status"]["message"]
    assert change.status is change.body["status"] and change.status["state"] == state
    assert (message["role"], message["taskId"], message["contextId"], message["parts"]) == (
        "ROLE_AGENT", "t1", "c1", parts,
    )  # fmt: skip
    assert message["messageId"] and change.exec_seq == 5 and change.unless_terminal
    assert change.metadata == {"k": "v", "x": 1}
    assert events.ended == (
        state not in {"TASK_STATE_WORKING", "TASK_STATE_INPUT_REQUIRED", "TASK_STATE_AUTH_REQUIRED"}
    )


def test_a_status_in_version_1s_form_and_a_bare_one(events: AgentEvents) -> None:
    said = events.status(line(type="status", text="x" * 70_000), 1)
    assert said.status == {"state": "TASK_STATE_WORKING", "message": said.status["message"]}
    assert said.status["message"]["parts"] == [{"text": "x" * 65536}]  # version 1's bound
    assert events.status(line(type="status"), 2).status == {"state": "TASK_STATE_WORKING"}


@pytest.mark.parametrize(
    ("bad", "why"),
    [
        ({"state": "TASK_STATE_SUBMITTED"}, "not a state an agent may set"),
        ({"state": "TASK_STATE_BOGUS"}, "not a state an agent may set"),
        ({"message": {"parts": []}}, "parts"),
        ({"message": {"parts": [{"text": "a", "raw": "YQ=="}]}}, "exactly one of text, raw, url, data"),
        ({"message": {"parts": [{}]}}, "it has none"),
        ({"message": {"parts": [{"raw": "not base64!"}]}}, "not valid base64"),
        ({"message": {"parts": [{"text": "a"}], "role": "ROLE_USER"}}, "role"),
        ({"text": ""}, "text"),
        ({"metadata": []}, "metadata"),
    ],
)
def test_a_bad_status_is_refused_naming_what(events: AgentEvents, bad: dict[str, Any], why: str) -> None:
    with pytest.raises(Refused, match=why):
        events.status({"type": "status", **bad}, 1)
    assert not events.ended


def test_after_the_task_ended_every_event_is_refused(events: AgentEvents) -> None:
    events.status(line(type="status", state="TASK_STATE_COMPLETED"), 1)
    with pytest.raises(Refused, match="the task has ended"):
        events.status(line(type="status", state="TASK_STATE_WORKING"), 2)
    with pytest.raises(Refused, match="the task has ended"):
        events.reply(line(type="message", message={"parts": [{"text": "late"}]}), 3)


def test_a_reply_completes_the_task_with_the_message(events: AgentEvents) -> None:
    change = events.reply(line(type="message", message={"messageId": "m-1", "parts": [{"text": "42"}]}), 3)
    assert change.status is not None and change.status["state"] == "TASK_STATE_COMPLETED"
    assert change.status["message"]["messageId"] == "m-1" and change.status["message"]["parts"] == [{"text": "42"}]
    assert change.metadata == {"k": "v", "answered_with": "message"} and events.ended


async def test_an_artifact_of_every_part_kind(events: AgentEvents) -> None:
    parts = [
        {"text": "hello", "metadata": {"lang": "en"}},
        {"raw": b64(b"\x00\x01"), "filename": "a.bin", "mediaType": "application/octet-stream"},
        {"url": "https://example.org/x.png", "filename": "x.png", "mediaType": "image/png"},
        {"data": {"rows": [1, 2]}, "mediaType": "application/json"},
    ]
    sent = line(
        type="artifact", artifactId="a1", name="out", description="d", parts=parts,
        metadata={"m": 1}, extensions=["urn:x"], lastChunk=True,
    )  # fmt: skip
    change = await events.artifact(sent, 9)
    shown = change.body["artifact"]
    assert change.body["lastChunk"] is True and "append" not in change.body and change.exec_seq == 9
    assert shown == {
        "artifactId": "a1", "name": "out", "description": "d", "extensions": ["urn:x"], "parts": parts,
        "metadata": {"m": 1},
    }  # fmt: skip
    assert change.artifact is not None and change.artifact["parts"] == parts  # small: inline as sent
    assert change.artifact["metadata"] is shown["metadata"]  # one dict: the timeline stamp lands on both


async def test_a_file_in_chunks_is_one_part_inline_then_on_disk(events: AgentEvents, tmp_path: Path) -> None:
    chunk = bytes(range(256)) * 512  # 128 KiB
    meta = {"filename": "big.bin", "mediaType": "application/octet-stream"}
    stored: dict[str, Any] | None = None
    for index in range(5):
        sent = line(
            type="artifact", artifactId="f", parts=[{"raw": b64(chunk), **meta}], append=index > 0, lastChunk=index == 4
        )
        change = await events.artifact(sent, index)
        assert change.body["artifact"]["parts"] == [{"raw": b64(chunk), **meta}]  # the stream sees each chunk
        assert change.artifact is not None
        stored = fold_artifact(stored, change.artifact, change.append)
        [part] = stored["parts"]
        size = (index + 1) * len(chunk)
        if size <= INLINE_BYTES:
            assert part == {"raw": b64(chunk * (index + 1)), **meta}
        else:
            assert part == {"file": {"id": part["file"]["id"], "size": size}, **meta}
    assert stored is not None
    file_id = stored["parts"][0]["file"]["id"]
    assert (tmp_path / "files" / "t1" / file_id).read_bytes() == chunk * 5
    assert b"".join(events.files.chunks("t1", file_id, 5 * len(chunk))) == chunk * 5
    assert events.file_bytes == 5 * len(chunk)


async def test_raw_in_either_base64_alphabet_with_or_without_padding(events: AgentEvents) -> None:
    data = b"\xfb\xff\xfe"  # "+//+" in the standard alphabet, "-__-" in the URL-safe one
    for raw in ("+//+", "-__-", base64.b64encode(b"ab").decode().rstrip("=")):
        change = await events.artifact(line(type="artifact", artifactId=f"a{raw}", parts=[{"raw": raw}]), 1)
        assert change.artifact is not None
    assert events.file_bytes == 3 + 3 + 2
    with pytest.raises(Refused, match="not valid base64"):
        await events.artifact({"type": "artifact", "artifactId": "b", "parts": [{"raw": "ab*c"}]}, 2)
    assert base64.b64decode("+//+") == data


async def test_a_new_file_or_another_name_starts_a_new_part(events: AgentEvents) -> None:
    first = await events.artifact(line(type="artifact", artifactId="f", parts=[{"raw": b64(b"a"), "filename": "1"}]), 1)
    other = line(type="artifact", artifactId="f", parts=[{"raw": b64(b"b"), "filename": "2"}], append=True)
    second = await events.artifact(other, 2)
    assert first.artifact is not None and second.artifact is not None
    folded = fold_artifact(fold_artifact(None, first.artifact, False), second.artifact, True)
    assert folded["parts"] == [{"raw": b64(b"a"), "filename": "1"}, {"raw": b64(b"b"), "filename": "2"}]


async def test_a_resumed_task_continues_its_file_where_the_store_left_it(tmp_path: Path) -> None:
    files = TaskFiles(tmp_path / "files")
    task = working_task("t1", exec_id="x")
    big = b"x" * (INLINE_BYTES + 1)
    before = AgentEvents(task, files, AgentLimits(), [])
    change = await before.artifact(line(type="artifact", artifactId="f", parts=[{"raw": b64(big)}]), 1)
    assert change.artifact is not None
    stored = fold_artifact(None, change.artifact, False)
    # A restarted controller: the same chunk again (replayed), then the next one.
    after = AgentEvents(task, files, AgentLimits(), [stored])
    replayed = await after.artifact(line(type="artifact", artifactId="f", parts=[{"raw": b64(b"y")}], append=True), 2)
    assert replayed.artifact is not None
    [part] = fold_artifact(stored, replayed.artifact, True)["parts"]
    assert part["file"]["size"] == len(big) + 1
    assert (tmp_path / "files" / "t1" / part["file"]["id"]).read_bytes() == big + b"y"
    small = AgentEvents(task, files, AgentLimits(), [{"artifactId": "s", "parts": [{"raw": b64(b"ab")}]}])
    grown = await small.artifact(line(type="artifact", artifactId="s", parts=[{"raw": b64(b"c")}], append=True), 3)
    assert grown.artifact is not None and grown.artifact["parts"] == [{"raw": b64(b"abc"), "_joins": True}]


async def test_files_over_the_limit_are_a_fault(tmp_path: Path) -> None:
    events = AgentEvents(working_task("t1", exec_id="x"), TaskFiles(tmp_path), AgentLimits(max_file_bytes=1000), [])
    await events.artifact(line(type="artifact", artifactId="f", parts=[{"raw": b64(b"a" * 600)}]), 1)
    with pytest.raises(Fault, match=r"more than 1000 bytes \(artifact 'g'\)"):
        await events.artifact(line(type="artifact", artifactId="g", parts=[{"raw": b64(b"a" * 600)}]), 2)


def test_a_flood_of_events_is_a_fault(tmp_path: Path) -> None:
    limits = AgentLimits(events_per_s=10, burst_s=2)
    events = AgentEvents(working_task("t1", exec_id="x"), TaskFiles(tmp_path), limits, [])
    for _ in range(20):
        events.count()  # the burst
    with pytest.raises(Fault, match="more than 10 events a second"):
        events.count()
