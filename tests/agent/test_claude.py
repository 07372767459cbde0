"""agentic_sandbox_agent.claude: Claude Code's stream-json output as A2A events, from recorded runs.

The adapter runs as a real process (``python -m agentic_sandbox_agent.claude``) on a real
socketpair, the test playing the controller (tests/agent/harness.py validates every line against
the protocol's schema). The real CLI needs credentials and the network, so ``AIWG_CLAUDE_COMMAND``
points at tests/agent/agents/fake_claude.py, which replays a transcript of tests/agent/transcripts/.
"""

from __future__ import annotations

import base64
import json
import mimetypes
import os
import shlex
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.agent.harness import AGENT_SRC, AGENTS, Agent, check_stdlib_only
from tests.agent.test_helper import python_3_9

pytestmark = pytest.mark.timeout(60)

ADAPTER = AGENT_SRC / "agentic_sandbox_agent" / "claude.py"
TRANSCRIPTS = Path(__file__).resolve().parent / "transcripts"
PROMPT = "Write notes about this directory"
WORKING, COMPLETED, FAILED, CANCELED = (f"TASK_STATE_{s}" for s in ("WORKING", "COMPLETED", "FAILED", "CANCELED"))
STREAM = "claude-stream"
BASH_ID = "toolu_01Bq5nVd8sKx2LrT9mWfYe3H"
WRITE_ID = "toolu_01Wm3kQz7pRv5TxN8cYbLd2F"
SESSION = "4f8e2c1a-7b3d-4e9f-a6c2-1d5b8e0f3a72"


class Run:
    """The adapter, its fake Claude Code, and where they work."""

    def __init__(self, agent: Agent, work: Path, argv_file: Path, marker: Path) -> None:
        self.agent = agent
        self.work = work
        self.argv_file = argv_file
        self.marker = marker

    def claude_argv(self) -> list[str]:
        """The arguments the fake CLI got."""
        argv: list[str] = json.loads(self.argv_file.read_text())
        return argv


@pytest.fixture
def start(tmp_path: Path) -> Iterator[Any]:
    started: list[Agent] = []

    def start(
        transcript: str | Path, *args: str, env: dict[str, str] | None = None, python: str = sys.executable
    ) -> Run:
        work = tmp_path / f"work-{len(started)}"
        work.mkdir()
        argv_file, marker = tmp_path / f"argv-{len(started)}.json", tmp_path / f"sigterm-{len(started)}"
        child_env = {
            "AIWG_CLAUDE_COMMAND": shlex.join([sys.executable, str(AGENTS / "fake_claude.py")]),
            "FAKE_CLAUDE_TRANSCRIPT": str(TRANSCRIPTS / transcript),
            "FAKE_CLAUDE_ARGV": str(argv_file),
            "FAKE_CLAUDE_TERM_MARKER": str(marker),
            **(env or {}),
        }
        agent = Agent(["-m", "agentic_sandbox_agent.claude", *args], tmp_path, cwd=work, env=child_env, python=python)
        started.append(agent)
        return Run(agent, work, argv_file, marker)

    yield start
    for agent in started:
        agent.close()


def run_task(run: Run, text: str = PROMPT, **task: Any) -> list[dict[str, Any]]:
    run.agent.hello_and_task(text=text, **task)
    return run.agent.read_all()


def summary(lines: list[dict[str, Any]]) -> list[tuple[str, str]]:
    return [(line["type"], line["state"] if line["type"] == "status" else line["artifactId"]) for line in lines]


def stream_lines(lines: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [line for line in lines if line["type"] == "artifact" and line["artifactId"] == STREAM]


def stream_text(lines: list[dict[str, Any]]) -> str:
    return "".join(part["text"] for line in stream_lines(lines) for part in line["parts"])


def check_stream_flags(lines: list[dict[str, Any]]) -> None:
    """Created by its first line, appended to by the others, closed by the last; ndjson parts."""
    stream = stream_lines(lines)
    assert stream[0]["name"] == STREAM and stream[0]["append"] is False
    assert all("name" not in line and line["append"] is True for line in stream[1:])
    assert [line["lastChunk"] for line in stream] == [False] * (len(stream) - 1) + [True]
    for line in stream:
        (part,) = line["parts"]
        assert part["mediaType"] == "application/x-ndjson"


def texts_of(status: dict[str, Any]) -> list[Any]:
    return [part.get("text", part.get("data")) for part in status["message"]["parts"]]


def test_a_successful_run_event_by_event(start: Any) -> None:
    run = start("success.jsonl")
    lines = run_task(run)
    assert run.agent.wait() == 0, run.agent.stderr()
    assert summary(lines) == [
        ("artifact", STREAM),  # init
        ("status", WORKING),
        ("artifact", STREAM),  # thinking only: nothing more
        ("artifact", STREAM),  # text
        ("status", WORKING),
        ("artifact", STREAM),  # Bash
        ("status", WORKING),
        ("artifact", STREAM),  # its result
        ("artifact", f"tool-result-{BASH_ID}"),
        ("artifact", STREAM),  # Write
        ("status", WORKING),
        ("artifact", STREAM),  # its result
        ("artifact", f"tool-result-{WRITE_ID}"),
        ("artifact", STREAM),  # the last text
        ("status", WORKING),
        ("artifact", STREAM),  # result: the last part
        ("status", COMPLETED),
    ]
    # The raw stream, kept whole: each line of the transcript is one part, byte for byte.
    transcript = (TRANSCRIPTS / "success.jsonl").read_text(encoding="utf-8")
    assert stream_text(lines) == transcript
    assert [line["parts"][0]["text"] for line in stream_lines(lines)] == transcript.splitlines(keepends=True)
    check_stream_flags(lines)

    init, text, bash, write, last_text, completed = (line for line in lines if line["type"] == "status")
    assert init == {
        "type": "status",
        "state": WORKING,
        "text": f"Claude Code session {SESSION} started (model claude-sonnet-4-5-20250929)",
        "metadata": {"claude.session_id": SESSION, "claude.model": "claude-sonnet-4-5-20250929"},
    }
    assert texts_of(text) == ["I'll look at what the directory holds first, then write the notes — in `notes/out.md`."]
    assert text["message"]["role"] == "ROLE_AGENT" and text["message"]["messageId"]
    assert texts_of(bash) == [
        {
            "kind": "tool_call",
            "name": "Bash",
            "tool_id": BASH_ID,
            "input": {"command": "ls -la", "description": "List the files in the working directory"},
        }
    ]
    (call,) = texts_of(write)
    assert call["name"] == "Write" and call["tool_id"] == WRITE_ID and call["input"]["file_path"] == "notes/out.md"
    assert texts_of(last_text) == [
        "I wrote the notes to `notes/out.md`: the directory holds a README and a `src/` folder."
    ]

    bash_result = next(line for line in lines if line.get("artifactId") == f"tool-result-{BASH_ID}")
    assert bash_result == {
        "type": "artifact",
        "artifactId": f"tool-result-{BASH_ID}",
        "parts": [
            {
                "text": "total 16\ndrwxr-xr-x 3 agent agent 4096 Oct 14 09:12 .\n"
                "drwxr-xr-x 5 agent agent 4096 Oct 14 09:12 ..\n"
                "-rw-r--r-- 1 agent agent  412 Oct 14 09:12 README.md\n"
                "drwxr-xr-x 2 agent agent 4096 Oct 14 09:12 src"
            }
        ],
        "name": "Bash result",
        "metadata": {"tool_id": BASH_ID, "tool_name": "Bash", "is_error": False},
        "append": False,
        "lastChunk": True,
    }
    write_result = next(line for line in lines if line.get("artifactId") == f"tool-result-{WRITE_ID}")
    assert write_result["name"] == "Write result"
    assert write_result["parts"] == [{"text": "File created successfully at: notes/out.md"}]
    assert write_result["metadata"] == {"tool_id": WRITE_ID, "tool_name": "Write", "is_error": False}

    result = json.loads(transcript.splitlines()[-1])
    assert completed == {
        "type": "status",
        "state": COMPLETED,
        "text": "I wrote the notes to `notes/out.md`: the directory holds a README and a `src/` folder.",
        "metadata": {
            "claude.session_id": SESSION,
            "claude.num_turns": 4,
            "claude.duration_ms": 18342,
            "claude.total_cost_usd": 0.0417306,
            "claude.usage": result["usage"],
        },
    }
    assert run.claude_argv() == ["-p", PROMPT, "--output-format", "stream-json", "--verbose"]
    assert (run.work / "notes" / "out.md").exists()  # written, but not asked for: not returned
    stderr = run.agent.stderr()
    assert "fake claude: replaying success.jsonl" in stderr  # the CLI's stderr goes to the logs


@pytest.mark.parametrize("asked", ["flag", "metadata"])
def test_the_files_it_wrote_are_returned_when_asked(start: Any, asked: str) -> None:
    extra = ["--", "--model", "opus", "--max-turns", "5"]
    if asked == "flag":
        run = start("success.jsonl", "--return-files", *extra)
        lines = run_task(run)
    else:
        run = start("success.jsonl", *extra)
        lines = run_task(run, metadata={"return_files": True})
    assert run.agent.wait() == 0, run.agent.stderr()
    assert run.claude_argv() == [
        "-p",
        PROMPT,
        "--output-format",
        "stream-json",
        "--verbose",
        "--model",
        "opus",
        "--max-turns",
        "5",
    ]
    # After the stream's last part, before the task ends.
    assert summary(lines)[-3:] == [("artifact", STREAM), ("artifact", "file-1"), ("status", COMPLETED)]
    (file,) = [line for line in lines if line.get("artifactId") == "file-1"]
    write = json.loads((TRANSCRIPTS / "success.jsonl").read_text().splitlines()[5])
    content = write["message"]["content"][0]["input"]["content"].encode()
    assert (run.work / "notes" / "out.md").read_bytes() == content
    media_type = mimetypes.guess_type("out.md")[0] or "application/octet-stream"
    assert file == {
        "type": "artifact",
        "artifactId": "file-1",
        "parts": [{"raw": base64.b64encode(content).decode(), "filename": "out.md", "mediaType": media_type}],
        "name": "out.md",
        "metadata": {"path": str(run.work / "notes" / "out.md")},
        "append": False,
        "lastChunk": True,
    }


def test_a_file_that_is_gone_is_skipped(start: Any, tmp_path: Path) -> None:
    # The same run, slowly, with a second file written that is removed before the run ends.
    lines = (TRANSCRIPTS / "success.jsonl").read_text().splitlines(keepends=True)
    write = json.loads(lines[5])
    write["message"]["content"].append(
        {"type": "tool_use", "id": "toolu_02", "name": "Write", "input": {"file_path": "gone.txt", "content": "x"}}
    )
    lines[5] = json.dumps(write) + "\n"
    transcript = tmp_path / "gone.jsonl"
    transcript.write_text("".join(lines))
    run = start(transcript, "--return-files", env={"FAKE_CLAUDE_DELAY": "0.3"})
    run.agent.hello_and_task(text=PROMPT)
    gone = run.work / "gone.txt"
    while not gone.exists():
        run.agent.read()
    gone.unlink()
    got = run.agent.read_all()
    assert run.agent.wait() == 0, run.agent.stderr()
    assert [line["artifactId"] for line in got if line.get("artifactId", "").startswith("file-")] == ["file-1"]
    assert got[-1]["state"] == COMPLETED
    assert f"not returning {run.work / 'gone.txt'}" in run.agent.stderr()


def test_max_turns_fails_the_task(start: Any) -> None:
    run = start("max_turns.jsonl", "--return-files")
    lines = run_task(run)
    assert run.agent.wait() == 1, run.agent.stderr()
    transcript = (TRANSCRIPTS / "max_turns.jsonl").read_text()
    assert stream_text(lines) == transcript
    check_stream_flags(lines)
    # One assistant event with a text and a tool call: the text first.
    statuses = [line for line in lines if line["type"] == "status"]
    assert texts_of(statuses[1]) == ["Let me search the docs for the retry policy."]
    assert texts_of(statuses[2])[0]["name"] == "mcp__docs__search"
    search = next(line for line in lines if line.get("artifactId") == "tool-result-toolu_01Ja7cN3vLq8XmT5pWbRd6Ks")
    assert search["name"] == "mcp__docs__search result"
    assert search["parts"] == [  # a list content: its text blocks, a line each
        {
            "text": "docs/retries.md: Retries back off exponentially, from 1 s to 60 s.\n"
            "docs/config.md: RETRY_MAX sets the number of attempts."
        }
    ]
    edit = next(line for line in lines if line.get("artifactId") == "tool-result-toolu_01Yb2mK8rVt4QzN6cXwPa9Ld")
    assert edit["metadata"] == {"tool_id": "toolu_01Yb2mK8rVt4QzN6cXwPa9Ld", "tool_name": "Edit", "is_error": True}
    assert not any(line.get("artifactId", "").startswith("file-") for line in lines)  # the only edit failed
    failed = lines[-1]
    assert failed["state"] == FAILED
    assert failed["text"] == "Claude Code ended with error_max_turns after 3 turns"
    assert failed["metadata"]["claude.num_turns"] == 3
    assert failed["metadata"]["claude.session_id"] == "b2d94e17-0c6a-4f38-8e51-7a3c9d2f6b04"


def test_an_error_result_fails_the_task_with_its_text(start: Any) -> None:
    run = start("api_error.jsonl")
    lines = run_task(run)
    assert run.agent.wait() == 1
    assert lines[-1]["state"] == FAILED
    assert lines[-1]["text"] == "Claude Code ended with an error: Invalid API key · Please run /login"
    assert stream_text(lines) == (TRANSCRIPTS / "api_error.jsonl").read_text()


def test_an_exit_without_a_result_fails_the_task(start: Any) -> None:
    run = start("no_result.jsonl", env={"FAKE_CLAUDE_EXIT": "3"})
    lines = run_task(run)
    assert run.agent.wait() == 1
    transcript = (TRANSCRIPTS / "no_result.jsonl").read_text()
    assert not transcript.endswith("\n")  # it died in the middle of a line
    assert stream_text(lines) == transcript  # that line too (not JSON: streamed, not projected)
    check_stream_flags(lines)
    stream = stream_lines(lines)
    assert stream[-2]["parts"][0]["text"] == transcript.splitlines()[-1]
    assert stream[-1]["parts"] == [{"text": "", "mediaType": "application/x-ndjson"}]  # nothing else closes it
    failed = lines[-1]
    assert failed == {
        "type": "status",
        "state": FAILED,
        "text": "Claude Code exited with status 3 without a result; its stderr ends with:\n"
        "fake claude: replaying no_result.jsonl\nfake claude: the transcript is over",
    }


@pytest.mark.parametrize("how", ["flag", "env"])
def test_a_cli_that_cannot_start_fails_the_task(start: Any, how: str) -> None:
    if how == "flag":
        run = start("success.jsonl", "--claude", "/nonexistent/claude")
        cli = "/nonexistent/claude"
    else:
        run = start("success.jsonl", env={"AIWG_CLAUDE_COMMAND": "no-such-claude-cli --debug"})
        cli = "no-such-claude-cli --debug"
    lines = run_task(run)
    assert run.agent.wait() == 1
    (failed,) = lines
    assert failed["state"] == FAILED
    assert failed["text"].startswith(f"cannot start Claude Code ({cli}): [Errno 2] No such file or directory")


def test_cancel_stops_the_cli_and_cancels_the_task(start: Any) -> None:
    run = start("success.jsonl", env={"FAKE_CLAUDE_DELAY": "0.5"})
    run.agent.hello_and_task(text=PROMPT)
    while run.agent.read()["type"] != "status":  # the session started
        pass
    run.agent.send({"type": "cancel", "reason": "a client canceled the task"})
    lines = run.agent.read_all()
    assert run.agent.wait() == 1
    assert lines[-1] == {"type": "status", "state": CANCELED, "text": "a client canceled the task"}
    assert all(line["type"] != "status" or line["state"] != COMPLETED for line in lines)
    # The fake got SIGTERM, as the leader of its own process group.
    marker = run.marker.read_text().split()
    assert marker[0] == "SIGTERM" and marker[3] == marker[-1]
    check_stream_flags(run.agent.lines)  # what was streamed is closed
    assert "the task was canceled" in run.agent.stderr()


def test_a_cli_that_stays_after_its_result_is_stopped(start: Any) -> None:
    env = {"FAKE_CLAUDE_LINGER": "60", "AIWG_CLAUDE_EXIT_GRACE_S": "0.5"}
    run = start("success.jsonl", env=env)
    lines = run_task(run)
    assert run.agent.wait() == 0, run.agent.stderr()
    assert lines[-1]["state"] == COMPLETED  # its result stands
    assert run.marker.read_text().startswith("SIGTERM")
    assert "it still runs 0.5 s after its result" in run.agent.stderr()


def test_a_prompt_like_an_option_stays_the_prompt(start: Any) -> None:
    run = start("api_error.jsonl")
    run_task(run, text="--help me with this")
    assert run.agent.wait() == 1
    assert run.claude_argv()[:2] == ["-p", " --help me with this"]


def test_lines_too_long_for_the_channel_are_cut(start: Any, tmp_path: Path) -> None:
    max_line = 20000  # AIWG_AGENT_MAX_LINE: the same cutting as at 1 MiB, with small lines
    output = 'é\x01"\\ 😀 line\n' * 4000  # escapes and multibyte characters: 1 to 6 bytes each
    big = "x" * 50000
    events = [
        {"type": "system", "subtype": "init", "session_id": "s", "model": "m"},
        {
            "type": "assistant",
            "message": {
                "content": [
                    {"type": "text", "text": "t" * 30000},
                    {"type": "tool_use", "id": "toolu_w", "name": "Write", "input": {"file_path": "b", "content": big}},
                ]
            },
        },
        {
            "type": "user",
            "message": {"content": [{"type": "tool_result", "tool_use_id": "toolu_w", "content": output}]},
        },
        {"type": "result", "subtype": "success", "is_error": False, "result": "done"},
    ]
    transcript = tmp_path / "long.jsonl"
    transcript.write_text("".join(json.dumps(event, ensure_ascii=False) + "\n" for event in events), encoding="utf-8")
    run = start(transcript, env={"AIWG_AGENT_MAX_LINE": str(max_line)})
    lines = run_task(run)
    assert run.agent.wait() == 0, run.agent.stderr()
    for line in lines:
        encoded = json.dumps(line, ensure_ascii=False, separators=(",", ":")).encode()
        assert len(encoded) + 1 <= max_line
    assert stream_text(lines) == transcript.read_text(encoding="utf-8")
    check_stream_flags(lines)
    assert len(stream_lines(lines)) > len(events)
    result = [line for line in lines if line.get("artifactId") == "tool-result-toolu_w"]
    assert len(result) > 1
    assert "".join(line["parts"][0]["text"] for line in result) == output
    assert [line["append"] for line in result] == [False] + [True] * (len(result) - 1)
    assert [line["lastChunk"] for line in result] == [False] * (len(result) - 1) + [True]
    assert result[0]["name"] == "Write result" and all("metadata" not in line for line in result[1:])
    statuses = [line for line in lines if line["type"] == "status"]
    (text,) = texts_of(statuses[1])
    assert text.startswith("tttt") and text.endswith(
        "[truncated here: the whole text is in the claude-stream artifact]"
    )
    (call,) = texts_of(statuses[2])
    assert call["truncated"] is True and call["input"]["file_path"] == "b"
    assert call["input"]["content"].endswith("[... 45904 more characters]")
    assert lines[-1]["state"] == COMPLETED


def test_the_adapter_uses_only_the_standard_library_and_python_3_9_syntax() -> None:
    check_stdlib_only(ADAPTER, "agentic_sandbox_agent.claude", helper_import=True)


@pytest.mark.skipif(python_3_9() is None, reason="no python3.9 here")
def test_the_adapter_on_python_3_9(start: Any) -> None:
    python = python_3_9()
    assert python is not None
    run = start("success.jsonl", "--return-files", python=python)
    lines = run_task(run)
    assert run.agent.wait() == 0, run.agent.stderr()
    assert summary(lines)[-2:] == [("artifact", "file-1"), ("status", COMPLETED)]
    assert stream_text(lines) == (TRANSCRIPTS / "success.jsonl").read_text()
    assert os.path.exists(run.work / "notes" / "out.md")
