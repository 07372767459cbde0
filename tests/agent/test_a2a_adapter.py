"""agentic_sandbox_agent.a2a: unmodified a2a-sdk AgentExecutors run as agents, over a real channel.

Each test starts ``python -m agentic_sandbox_agent.a2a a2a_executors:<Class>`` (the executors are
in tests/agent/agents/a2a_executors.py, written as for any a2a-sdk server) as a real process,
plays the controller on a real socketpair, and validates every line against the protocol's schema.
"""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.agent.harness import AGENTS, Agent, user_message

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def start(tmp_path: Path) -> Iterator[Any]:
    started: list[Agent] = []

    def start(executor: str, **kwargs: Any) -> Agent:
        argv = ["-m", "agentic_sandbox_agent.a2a", executor if ":" in executor else f"a2a_executors:{executor}"]
        agent = Agent(argv, tmp_path, **kwargs)
        started.append(agent)
        return agent

    yield start
    for agent in started:
        agent.close()


def state_of(line: dict[str, Any]) -> str:
    assert line["type"] == "status", line
    return line["state"]


def texts(line: dict[str, Any]) -> list[str]:
    return [part["text"] for part in line["message"]["parts"] if "text" in part]


def check_agent_message(message: dict[str, Any], agent: Agent | None = None) -> None:
    assert message["role"] == "ROLE_AGENT" and message["messageId"]
    if agent is not None and "taskId" in message:
        assert message["taskId"] == agent.task_id and message["contextId"] == agent.context_id


def test_a_task_with_every_part_kind(start: Any) -> None:
    agent = start("PartsExecutor")
    hello = agent.read()
    assert hello == {"type": "hello", "version": 2, "agent": {"name": "a2a_executors:PartsExecutor"}}
    raw = bytes(range(256))
    message = user_message(
        {"text": "hi"},
        {"raw": base64.b64encode(raw).decode(), "filename": "in.bin", "mediaType": "application/x-in"},
        {"data": {"q": 1}},
    )
    agent.send_task(message, extensions=["urn:ext:one", "urn:ext:two"], metadata={"m": 1, "deep": {"x": [1, 2.5]}})
    lines = agent.read_all()
    assert agent.wait() == 0, agent.stderr()

    # The Task enqueued first is TASK_STATE_SUBMITTED: the controller made the task, nothing is sent.
    assert state_of(lines[0]) == "TASK_STATE_WORKING" and texts(lines[0]) == ["starting"]
    check_agent_message(lines[0]["message"], agent)

    context = lines[1]
    assert context["artifactId"] == "context" and context["name"] == "context"
    assert context["parts"][0]["data"] == {
        "taskId": agent.task_id,
        "contextId": agent.context_id,
        "text": "hi",
        "extensions": ["urn:ext:one", "urn:ext:two"],
        "metadata": {"m": 1, "deep": {"x": [1, 2.5]}},
        "hadTask": False,
        "parts": [
            {"kind": "text", "filename": "", "mediaType": ""},
            {
                "kind": "raw",
                "filename": "in.bin",
                "mediaType": "application/x-in",
                "sha256": hashlib.sha256(raw).hexdigest(),
            },
            {"kind": "data", "filename": "", "mediaType": ""},
        ],
    }

    kinds = lines[2]
    assert kinds == {
        "type": "artifact",
        "artifactId": "kinds",
        "name": "all the kinds",
        "metadata": {"origin": "test"},
        "extensions": ["https://example.com/ext/v1"],
        "parts": [
            {"text": "plain text", "mediaType": "text/markdown", "metadata": {"lang": "en"}},
            {
                "raw": base64.b64encode(b"\x00\x01binary\xff").decode(),
                "filename": "blob.bin",
                "mediaType": "application/octet-stream",
            },
            {
                "url": "https://example.com/f.pdf",
                "filename": "f.pdf",
                "mediaType": "application/pdf",
                "metadata": {"n": 2},
            },
            {"data": {"answer": 42, "list": [1, "two", None, True]}, "mediaType": "application/json"},
        ],
        "append": False,
        "lastChunk": False,
    }

    stream = lines[3:6]
    assert [line["artifactId"] for line in stream] == ["stream"] * 3
    assert [(line["append"], line["lastChunk"]) for line in stream] == [(False, False), (True, False), (True, True)]
    assert "".join(line["parts"][0]["text"] for line in stream) == "chunk 1 chunk 2 chunk 3"

    assert lines[6] == {"type": "status", "state": "TASK_STATE_WORKING", "metadata": {"progress": 0.5}}
    assert state_of(lines[7]) == "TASK_STATE_COMPLETED"
    assert lines[7]["message"]["parts"] == [{"text": "done"}, {"data": {"ok": True}}]
    check_agent_message(lines[7]["message"], agent)
    assert len(lines) == 8


def test_input_required_then_a_follow_up_runs_execute_again(start: Any) -> None:
    agent = start("InputExecutor")
    agent.hello_and_task(text="greet me")
    assert state_of(agent.read()) == "TASK_STATE_WORKING"
    asking = agent.read()
    assert state_of(asking) == "TASK_STATE_INPUT_REQUIRED" and texts(asking) == ["What is your name?"]
    check_agent_message(asking["message"], agent)
    agent.send({"type": "message", "message": user_message(text="Ada")})
    lines = agent.read_all()
    assert agent.wait() == 0, agent.stderr()
    assert [line["type"] for line in lines] == ["status", "artifact", "status"]
    assert state_of(lines[0]) == "TASK_STATE_WORKING"
    greeting = lines[1]
    assert greeting["parts"][0] == {"text": "hello Ada"}
    # The second context carries the task as the first turn's events built it, same ids.
    seen = greeting["parts"][1]["data"]
    assert seen["taskId"] == agent.task_id and seen["messageTaskId"] == agent.task_id
    assert seen["historyLength"] >= 2  # the first message, the question, the follow-up
    assert lines[2] == {"type": "status", "state": "TASK_STATE_COMPLETED"}


def test_a_follow_up_before_the_task_waits_for_its_turn(start: Any) -> None:
    agent = start("InputExecutor")
    assert agent.read()["type"] == "hello"
    early = {"type": "message", "message": user_message(text="Grace")}
    task = {
        "type": "task",
        "version": 2,
        "taskId": agent.task_id,
        "contextId": agent.context_id,
        "message": user_message(text="greet me"),
        "extensions": [],
    }
    agent.send_many(early, task)
    lines = agent.read_all()
    assert [line.get("state") for line in lines if line["type"] == "status"] == [
        "TASK_STATE_WORKING",
        "TASK_STATE_INPUT_REQUIRED",
        "TASK_STATE_WORKING",
        "TASK_STATE_COMPLETED",
    ]
    (greeting,) = [line for line in lines if line["type"] == "artifact"]
    assert greeting["parts"][0] == {"text": "hello Grace"}
    assert agent.wait() == 0


def test_auth_required_then_a_follow_up(start: Any) -> None:
    agent = start("AuthExecutor")
    agent.hello_and_task(text="log me in")
    auth = agent.read()
    assert state_of(auth) == "TASK_STATE_AUTH_REQUIRED"
    assert auth["message"]["parts"] == [{"url": "https://auth.example.com/login"}]
    agent.send({"type": "message", "message": user_message(text="done logging in")})
    (done,) = agent.read_all()
    assert state_of(done) == "TASK_STATE_COMPLETED" and texts(done) == ["authorized"]
    assert agent.wait() == 0


@pytest.mark.parametrize(
    ("executor", "state", "text"),
    [
        ("FailExecutor", "TASK_STATE_FAILED", "could not do it"),
        ("RejectExecutor", "TASK_STATE_REJECTED", "will not do it"),
    ],
)
def test_failed_and_rejected(start: Any, executor: str, state: str, text: str) -> None:
    agent = start(executor)
    agent.hello_and_task(text="x")
    (line,) = agent.read_all()
    assert state_of(line) == state and texts(line) == [text]
    check_agent_message(line["message"])
    assert agent.wait() == 0  # the task's end is its status; the agent itself did fine


def test_a_direct_message_answer(start: Any) -> None:
    agent = start("MessageExecutor")
    agent.hello_and_task(text="hello")
    (line,) = agent.read_all()
    assert line["type"] == "message"
    assert line["message"]["parts"] == [{"text": "echo: hello"}]
    check_agent_message(line["message"])
    assert agent.wait() == 0


def test_an_exception_in_execute_fails_the_task(start: Any) -> None:
    agent = start("RaisingExecutor")
    agent.hello_and_task(text="x")
    lines = agent.read_all()
    assert lines == [
        {"type": "status", "state": "TASK_STATE_WORKING"},
        {"type": "status", "state": "TASK_STATE_FAILED", "text": "RuntimeError: kaboom"},
    ]
    assert agent.wait() == 1
    assert "RuntimeError: kaboom" in agent.stderr()


def test_cancel_calls_the_executors_cancel_then_stops_execute(start: Any) -> None:
    agent = start("SlowExecutor")
    agent.hello_and_task(text="x")
    assert texts(agent.read()) == ["working for a long time"]
    agent.send({"type": "cancel", "reason": "enough"})
    (line,) = agent.read_all()
    assert state_of(line) == "TASK_STATE_CANCELED" and texts(line) == ["stopped on request"]
    assert agent.wait() == 0
    assert "execute was cancelled" in agent.stderr()


def test_cancel_when_the_executor_cannot(start: Any) -> None:
    agent = start("SlowNoCancelExecutor")
    agent.hello_and_task(text="x")
    assert state_of(agent.read()) == "TASK_STATE_WORKING"
    agent.send({"type": "cancel"})
    assert agent.read_all() == [{"type": "status", "state": "TASK_STATE_CANCELED"}]
    assert agent.wait() == 0
    assert "cancel() raised" in agent.stderr() and "NotImplementedError" in agent.stderr()


def test_cancel_while_waiting_for_input(start: Any) -> None:
    agent = start("WaitingCancelExecutor")
    agent.hello_and_task(text="x")
    assert state_of(agent.read()) == "TASK_STATE_WORKING"
    assert state_of(agent.read()) == "TASK_STATE_INPUT_REQUIRED"
    agent.send({"type": "cancel", "reason": "changed my mind"})
    (line,) = agent.read_all()
    assert state_of(line) == "TASK_STATE_CANCELED" and texts(line) == ["canceled while waiting"]
    assert agent.wait() == 0, agent.stderr()


def test_a_large_raw_part_is_sent_in_chunks(start: Any) -> None:
    agent = start("BigFileExecutor")
    agent.hello_and_task(text="x")
    lines = agent.read_all()
    assert agent.wait() == 0, agent.stderr()
    chunks = [line for line in lines if line["type"] == "artifact"]
    assert len(chunks) >= 3
    assert all(line["artifactId"] == "big" for line in chunks)
    assert [line["append"] for line in chunks] == [False] + [True] * (len(chunks) - 1)
    assert [line["lastChunk"] for line in chunks] == [False] * (len(chunks) - 1) + [True]
    assert chunks[0]["name"] == "big" and all("name" not in line for line in chunks[1:])
    # The controller continues a file only with an appended line's first part: one chunk a line.
    assert all(len(line["parts"]) == 1 for line in chunks)
    data = b""
    for line in chunks:
        for part in line["parts"]:
            piece = base64.b64decode(part["raw"])
            assert len(piece) <= 512 * 1024
            assert part["filename"] == "big.bin" and part["mediaType"] == "application/octet-stream"
            data += piece
    assert len(data) == 1_500_000
    assert texts(lines[-1]) == [hashlib.sha256(data).hexdigest()]


def test_a_task_object_sends_its_artifacts_then_its_status(start: Any) -> None:
    agent = start("TaskObjectExecutor")
    agent.hello_and_task(text="x")
    artifact, status = agent.read_all()
    assert artifact == {
        "type": "artifact",
        "artifactId": "whole",
        "name": "whole",
        "parts": [{"text": "all at once"}],
        "append": False,
        "lastChunk": True,
    }
    assert state_of(status) == "TASK_STATE_COMPLETED" and texts(status) == ["finished"]
    assert agent.wait() == 0


@pytest.mark.parametrize(
    ("spec", "error"),
    [
        ("a2a_executors:Missing", "AttributeError"),
        ("no_such_module:Executor", "ModuleNotFoundError"),
        ("a2a_executors:NotAnExecutor", "is not an AgentExecutor"),
    ],
)
def test_an_executor_that_does_not_load_fails_the_task(start: Any, spec: str, error: str) -> None:
    agent = start(spec)
    agent.hello_and_task(text="x")
    (line,) = agent.read_all()
    assert state_of(line) == "TASK_STATE_FAILED"
    assert line["text"].startswith(f"cannot load {spec}: ") and error in line["text"]
    assert agent.wait() == 1


def test_a_file_path_names_the_module(start: Any, tmp_path: Path) -> None:
    agent = start(f"{AGENTS / 'a2a_executors.py'}:MessageExecutor", cwd=tmp_path)
    agent.hello_and_task(text="from a path")
    (line,) = agent.read_all()
    assert line["message"]["parts"] == [{"text": "echo: from a path"}]
    assert agent.wait() == 0


def test_without_a_channel_the_answer_goes_to_stdout(start: Any) -> None:
    agent = start("MessageExecutor", channel=False, protocol=None, stdin=b"offline")
    assert agent.wait() == 0, agent.stderr()
    assert agent.stdout() == b"echo: offline\n"


def test_without_a_channel_a_failed_task_is_the_exit_status(start: Any) -> None:
    agent = start("FailExecutor", channel=False, protocol=None, stdin=b"offline")
    assert agent.wait() == 1
    assert "could not do it" in agent.stderr()
