"""agentic_sandbox_agent, the standard-library helper: an agent using it, run as a real process.

The test plays the controller on the other end of a real socketpair (tests/agent/harness.py) and
validates every line the agent writes against docs/schemas/agent-protocol-v2.json. The agent is
tests/agent/agents/helper_agent.py; its task's first line names the scenario.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import json
import mimetypes
import os
import shutil
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.agent.harness import AGENT_SRC, Agent, check_stdlib_only, user_message

pytestmark = pytest.mark.timeout(60)

HELPER = AGENT_SRC / "agentic_sandbox_agent" / "__init__.py"
PROMPT_ID = "6f1b3c1e-0a0b-4c4d-8e8f-000000000001"


@pytest.fixture
def start(tmp_path: Path) -> Iterator[Any]:
    started: list[Agent] = []

    def start(**kwargs: Any) -> Agent:
        agent = Agent(["helper_agent.py"], tmp_path, **kwargs)
        started.append(agent)
        return agent

    yield start
    for agent in started:
        agent.close()


def run_scenario(start: Any, scenario: str, **task: Any) -> tuple[Agent, list[dict[str, Any]]]:
    """Start the agent, hand it the task, read every line it writes up to EOF."""
    agent = start()
    if "message" not in task:
        task["text"] = scenario
    agent.hello_and_task(**task)
    return agent, agent.read_all()


def statuses(lines: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [line for line in lines if line["type"] == "status"]


def artifacts(lines: list[dict[str, Any]], artifact_id: str) -> list[dict[str, Any]]:
    return [line for line in lines if line["type"] == "artifact" and line["artifactId"] == artifact_id]


def reassemble(lines: list[dict[str, Any]]) -> bytes:
    return b"".join(base64.b64decode(part["raw"]) for line in lines for part in line["parts"])


def test_hello_comes_first_and_each_state_is_sent(start: Any) -> None:
    agent = start()
    hello = agent.read()  # before the task was even sent
    assert hello == {"type": "hello", "version": 2, "agent": {"name": "helper-agent", "version": "1.0"}}
    agent.send_task(text="states")
    lines = agent.read_all()
    assert [line["state"] for line in lines] == [
        "TASK_STATE_WORKING",
        "TASK_STATE_WORKING",
        "TASK_STATE_INPUT_REQUIRED",
        "TASK_STATE_AUTH_REQUIRED",
        "TASK_STATE_FAILED",
        "TASK_STATE_CANCELED",
        "TASK_STATE_REJECTED",
        "TASK_STATE_FAILED",
        "TASK_STATE_COMPLETED",
    ]
    assert lines[0] == {"type": "status", "state": "TASK_STATE_WORKING", "text": "plain working"}
    assert lines[1] == {"type": "status", "state": "TASK_STATE_WORKING", "metadata": {"step": 1}}
    assert lines[2]["message"]["parts"] == [{"text": "what now?"}]
    assert lines[3]["message"]["parts"] == [{"url": "https://auth.example.com"}]
    for line in lines[2:4]:
        assert line["message"]["role"] == "ROLE_AGENT" and line["message"]["messageId"]
    assert lines[5] == {"type": "status", "state": "TASK_STATE_CANCELED"}
    assert lines[-1]["text"] == "completed"
    assert agent.wait() == 0  # it ended completed
    assert "refused locally: not a state an agent may set" in agent.stderr()


def test_artifacts_carry_every_part_kind(start: Any) -> None:
    agent, lines = run_scenario(start, "parts")
    (kinds,) = artifacts(lines, "kinds")
    assert kinds == {
        "type": "artifact",
        "artifactId": "kinds",
        "parts": [
            {"text": "some text", "mediaType": "text/plain", "metadata": {"lang": "en"}},
            {
                "raw": base64.b64encode(b"\x00\xffbytes").decode(),
                "filename": "b.bin",
                "mediaType": "application/octet-stream",
            },
            {"url": "https://example.com/x.png", "filename": "x.png", "mediaType": "image/png", "metadata": {"n": 1}},
            {"data": {"k": [1, 2, {"z": None}]}, "mediaType": "application/json"},
            {"text": "a bare string"},
            {"raw": base64.b64encode(b"raw bytes in a dict").decode(), "filename": "d.bin"},
        ],
        "name": "kinds",
        "description": "one of each",
        "metadata": {"origin": "helper"},
        "extensions": ["https://example.com/ext"],
        "append": False,
        "lastChunk": False,
    }
    streamed = [line for line in lines if line.get("name") == "streamed"]
    (first,) = streamed
    follow = artifacts(lines, first["artifactId"])
    assert [(line["append"], line["lastChunk"]) for line in follow] == [(False, False), (True, True)]
    assert [line["parts"][0]["text"] for line in follow] == ["part one, ", "part two"]
    (data,) = artifacts(lines, "data")
    assert data["parts"] == [{"data": {"answer": 42}, "mediaType": "application/json"}]
    assert data["metadata"] == {"m": True}
    (refused,) = artifacts(lines, "refused-locally")
    assert "exactly one of text, raw, url, data" in refused["parts"][0]["text"]
    (too_long,) = artifacts(lines, "too-long-refused")
    assert "at most 1048576" in too_long["parts"][0]["text"]
    assert not artifacts(lines, "too-long") and not artifacts(lines, "bad")
    assert lines[-1] == {"type": "status", "state": "TASK_STATE_COMPLETED"}
    assert agent.wait() == 0


def test_send_file_streams_chunks_that_reassemble(start: Any, tmp_path: Path) -> None:
    chunk = 256 * 1024
    content = os.urandom(1_300_000)  # 5 chunks, the last a short one
    path = tmp_path / "report.txt"
    path.write_bytes(content)
    spec = {"path": str(path), "chunk": chunk, "bytes": 2 * chunk}  # bytes: exactly 2 chunks
    agent, lines = run_scenario(start, "files", message=user_message({"text": "files"}, {"data": spec}))
    assert agent.wait() == 0, agent.stderr()
    blob = bytes(i % 256 for i in range(2 * chunk))
    expect = {
        "from-path": (content, "report.txt", "text/plain", 5),
        "from-bytes": (blob, "blob.dat", "application/x-test", 2),
        "from-io": (blob, "io.dat", mimetypes.guess_type("io.dat")[0] or "application/octet-stream", 2),
        "empty": (b"", "empty.txt", "text/plain", 1),
    }
    for artifact_id, (data, filename, media_type, count) in expect.items():
        chunks = artifacts(lines, artifact_id)
        assert len(chunks) == count, artifact_id
        assert reassemble(chunks) == data, artifact_id
        assert [line["append"] for line in chunks] == [False] + [True] * (count - 1)
        assert [line["lastChunk"] for line in chunks] == [False] * (count - 1) + [True]
        for line in chunks:
            (part,) = line["parts"]
            assert len(base64.b64decode(part["raw"])) <= chunk
            assert part["filename"] == filename and part["mediaType"] == media_type
        assert chunks[0].get("name") == filename and all("name" not in line for line in chunks[1:])
    assert artifacts(lines, "from-path")[0]["metadata"] == {"source": "path"}
    (reads,) = artifacts(lines, "reads")
    assert reads["parts"][0]["data"]["largestRead"] == chunk  # never the whole file at once
    assert statuses(lines)[-1]["text"] == hashlib.sha256(blob).hexdigest()


def test_the_task_is_read_with_its_parts_files_and_data(start: Any) -> None:
    raw = os.urandom(1000)
    message = user_message(
        {"text": "received"},
        {"text": "second line"},
        {"raw": base64.b64encode(raw).decode(), "filename": "in.bin", "mediaType": "application/x-in"},
        {"url": "https://example.com/doc.pdf", "filename": "doc.pdf", "metadata": {"size": 3}},
        {"data": {"x": [1, 2]}},
    )
    message["metadata"] = {"client": "test"}
    agent, lines = run_scenario(start, "received", message=message, extensions=["urn:ext:a"], metadata={"req": 1})
    (report,) = artifacts(lines, "received")
    got = report["parts"][0]["data"]
    assert got["taskId"] == agent.task_id and got["contextId"] == agent.context_id
    assert got["extensions"] == ["urn:ext:a"] and got["metadata"] == {"req": 1}
    assert got["text"] == "received | second line"
    assert got["data"] == [{"x": [1, 2]}]
    assert got["parts"] == 5
    assert got["files"] == [
        {
            "filename": "in.bin",
            "mediaType": "application/x-in",
            "metadata": {},
            "sha256": hashlib.sha256(raw).hexdigest(),
            "url": None,
        },
        {
            "filename": "doc.pdf",
            "mediaType": None,
            "metadata": {"size": 3},
            "sha256": None,
            "url": "https://example.com/doc.pdf",
        },
    ]
    assert statuses(lines) == [{"type": "status", "state": "TASK_STATE_COMPLETED"}]  # run() completed it
    assert agent.wait() == 0


def test_reply_answers_with_a_message(start: Any) -> None:
    agent, lines = run_scenario(start, "reply")
    (line,) = lines  # a reply ends the task: run() adds no status
    assert line["type"] == "message"
    assert line["message"]["parts"] == [{"text": "direct answer"}, {"data": {"n": 1}}]
    assert line["message"]["role"] == "ROLE_AGENT" and line["message"]["messageId"]
    assert line["message"]["metadata"] == {"r": 1}
    assert agent.wait() == 0


def test_ask_waits_for_its_answer_and_keeps_other_events(start: Any) -> None:
    agent = start()
    agent.hello_and_task(text="ask")
    request = agent.read()
    assert request == {
        "type": "input_request",
        "prompt": "Deploy?",
        "response_schema": {"type": "object", "required": ["ok"], "properties": {"ok": {"type": "boolean"}}},
        "prompt_id": PROMPT_ID,
        "deadline": "2999-01-01T00:00:00Z",
    }
    follow_up = {"type": "message", "message": user_message(text="meanwhile")}
    answer = {
        "type": "input_response",
        "prompt_id": PROMPT_ID,
        "payload": {"ok": True},
        "message": user_message({"data": {"ok": True}}, {"text": "yes, go"}),
    }
    # The follow-up arrives while ask() waits: kept for next_event(). The answer and the follow-up
    # handed over again (at least once delivery) are dropped.
    agent.send_many(follow_up, answer, answer, follow_up)
    lines = agent.read_all()
    (got,) = artifacts(lines, "answer")
    assert got["parts"][0]["data"] == {"payload": {"ok": True}, "answeredBy": "yes, go"}
    (seen,) = artifacts(lines, "follow-up")
    assert seen["parts"][0]["text"] == "follow-up: meanwhile"
    assert lines[-1] == {"type": "status", "state": "TASK_STATE_COMPLETED"}
    assert agent.wait() == 0, agent.stderr()


def test_ask_raises_when_the_request_is_refused(start: Any) -> None:
    agent = start()
    agent.hello_and_task(text="ask-invalid")
    request = agent.read()
    assert request["type"] == "input_request"
    error = "input_request: response_schema must have a type"
    agent.send({"type": "input_request_invalid", "error": error, "prompt_id": request["prompt_id"]})
    assert agent.read_all() == [{"type": "status", "state": "TASK_STATE_FAILED", "text": f"AskError: {error}"}]
    assert agent.wait() == 1


def test_events_arrive_in_order_and_junk_is_skipped(start: Any) -> None:
    agent = start()
    agent.hello_and_task(text="events")
    assert agent.read()["text"] == "listening"
    hello_again = user_message(text="hello")
    agent.send_task(text="events")  # the task handed over again: ignored
    agent.send({"type": "error", "error": "artifact: parts[0] has two kinds", "event": "artifact"})
    agent.send_raw(b'{"type": "from_the_future", "x": 1}\n')  # unknown type: an Event all the same
    agent.send_raw(b"not json\n[1, 2]\n\n")  # not JSON objects: skipped
    too_long = json.dumps({"type": "message", "message": user_message(text="x" * (1024 * 1024 + 10))})
    agent.send_raw(too_long.encode() + b"\n")  # longer than 1 MiB: skipped
    agent.send({"type": "message", "message": hello_again})
    agent.send({"type": "message", "message": hello_again})  # the same message again: dropped
    agent.send({"type": "input_request_invalid", "error": "input_request: no"})
    agent.send({"type": "message", "message": user_message(text="stop")})
    lines = agent.read_all()
    got = [line["parts"][0]["data"] for line in lines if line["type"] == "artifact"]
    assert [(event["type"], event["class"]) for event in got] == [
        ("error", "Refused"),
        ("from_the_future", "Event"),
        ("message", "FollowUp"),
        ("input_request_invalid", "InputRequestInvalid"),
        ("message", "FollowUp"),
    ]
    assert got[0]["line"]["event"] == "artifact"
    assert got[2]["line"]["message"]["parts"] == [{"text": "hello"}]
    assert lines[-1] == {"type": "status", "state": "TASK_STATE_COMPLETED"}
    assert agent.wait() == 0
    assert "longer than" in agent.stderr() and "not JSON" in agent.stderr()


def test_a_follow_up_before_the_task_is_kept_for_after(start: Any) -> None:
    agent = start()
    assert agent.read()["type"] == "hello"
    early = {"type": "message", "message": user_message(text="early")}
    task = {
        "type": "task",
        "version": 2,
        "taskId": agent.task_id,
        "contextId": agent.context_id,
        "message": user_message(text="events"),
        "extensions": [],
    }
    agent.send_many(early, task)
    assert agent.read()["text"] == "listening"
    agent.send({"type": "message", "message": user_message(text="stop")})
    lines = agent.read_all()
    got = [line["parts"][0]["data"]["line"]["message"]["parts"][0]["text"] for line in lines[:-1]]
    assert got == ["early", "stop"]
    assert agent.wait() == 0


def test_cancel_sets_the_flag_and_calls_back(start: Any) -> None:
    agent = start()
    agent.hello_and_task(text="cancel")
    assert agent.read()["text"] == "working until canceled"
    cancel = {"type": "cancel", "reason": "the user asked"}
    agent.send_many(cancel, cancel)  # the second: nothing more happens
    assert agent.read_all() == [{"type": "status", "state": "TASK_STATE_CANCELED", "text": "the user asked"}]
    assert agent.wait() == 0
    stderr = agent.stderr()
    assert stderr.count("on_cancel('the user asked')") == 1
    assert "saw cancel: the user asked" in stderr


def test_cancel_while_asking(start: Any) -> None:
    agent = start()
    agent.hello_and_task(text="ask-canceled")
    assert agent.read()["type"] == "input_request"
    agent.send({"type": "cancel"})
    assert agent.read_all() == [{"type": "status", "state": "TASK_STATE_CANCELED"}]
    assert agent.wait() == 0


def test_an_exception_fails_the_task(start: Any) -> None:
    agent, lines = run_scenario(start, "raises")
    assert lines == [
        {"type": "status", "state": "TASK_STATE_WORKING", "text": "about to fail"},
        {"type": "status", "state": "TASK_STATE_FAILED", "text": "ValueError: boom"},
    ]
    assert agent.wait() == 1
    assert "Traceback" in agent.stderr()


def test_writes_from_several_threads_stay_whole_lines(start: Any) -> None:
    agent, lines = run_scenario(start, "threads")  # the harness parses and validates each line
    for n in range(4):
        mine = artifacts(lines, f"t{n}")
        assert [line["parts"][0]["text"].split(" ")[3] for line in mine] == [str(i) for i in range(100)]
    assert agent.wait() == 0


def test_the_channel_closing_before_the_task(start: Any) -> None:
    agent = start()
    assert agent.read()["type"] == "hello"
    agent.sock.shutdown(socket.SHUT_RDWR)
    assert agent.wait() != 0
    assert "ChannelClosed" in agent.stderr()


def test_without_a_channel_stdin_in_and_stdout_out(start: Any) -> None:
    agent = start(channel=False, protocol=None, stdin=b"offline\nsecond line")
    assert agent.wait() == 0, agent.stderr()
    assert agent.stdout() == b'artifact text\n{"k": 1}\nfile bytes\ncompleted text\n'
    stderr = agent.stderr()
    assert f"task {agent.task_id} in {agent.context_id}, protocol 0" in stderr
    assert "progress goes to stderr" in stderr
    assert "NoChannel" in stderr and "no events" in stderr


def test_without_a_channel_a_failure_is_the_exit_status(start: Any) -> None:
    agent = start(channel=False, protocol="2", stdin=b"offline-fail")
    assert agent.wait() == 1
    assert agent.stdout() == b""
    assert "it went wrong" in agent.stderr()


def test_a_version_1_controller_gets_version_1_lines(start: Any) -> None:
    agent = start(protocol=None, stdin=b"v1")  # a channel, but no AIWG_AGENT_PROTOCOL: no hello, no task line
    assert agent.read() == {"type": "status", "text": "v1 progress, protocol 1"}
    request = agent.read()
    assert request["type"] == "input_request"
    agent.send(
        {
            "type": "input_response",
            "prompt_id": request["prompt_id"],
            "payload": {"name": "Ada"},
            "message": user_message({"data": {"name": "Ada"}}),
        }
    )
    assert agent.read_all() == []
    assert agent.wait() == 0
    assert agent.stdout() == b"hello Ada\ndone\n"


@functools.cache
def python_3_9() -> str | None:
    """A Python 3.9 to run the helper on, where this machine has one that works."""
    candidates = [str(path) for path in sorted(Path.home().glob(".pyenv/versions/3.9*/bin/python3.9"))]
    candidates.append(shutil.which("python3.9") or "")  # last: it may be a shim that runs nothing
    for candidate in filter(None, candidates):
        check = [candidate, "-c", "import sys; assert sys.version_info[:2] == (3, 9)"]
        if subprocess.run(check, capture_output=True, timeout=30).returncode == 0:
            return candidate
    return None


@pytest.mark.skipif(python_3_9() is None, reason="no python3.9 here")
def test_the_helper_on_python_3_9(start: Any, tmp_path: Path) -> None:
    python = python_3_9()
    assert python is not None
    agent = start(python=python)
    agent.hello_and_task(text="ask")
    request = agent.read()
    answer = {
        "type": "input_response",
        "prompt_id": request["prompt_id"],
        "payload": {"ok": False},
        "message": user_message(text="no"),
    }
    agent.send_many({"type": "message", "message": user_message(text="later")}, answer)
    lines = agent.read_all()
    assert [line["type"] for line in lines] == ["artifact", "artifact", "status"]
    assert agent.wait() == 0, agent.stderr()
    blob = tmp_path / "blob.bin"
    blob.write_bytes(os.urandom(700_000))
    spec = {"path": str(blob), "chunk": 100_000, "bytes": 1000}
    agent = start(python=python)
    agent.hello_and_task(message=user_message({"text": "files"}, {"data": spec}))
    lines = agent.read_all()
    assert agent.wait() == 0, agent.stderr()
    assert reassemble(artifacts(lines, "from-path")) == blob.read_bytes()


def test_the_helper_uses_only_the_standard_library_and_python_3_9_syntax() -> None:
    check_stdlib_only(HELPER, "agentic_sandbox_agent", helper_import=False)
