"""``agentic send | tasks | task`` as a child process against a live controller and hostd."""

from __future__ import annotations

import contextlib
import os
import sys
import time
from pathlib import Path

import httpx
import ptyprocess
import trio

from tests.controller.a2a.helpers import new_agent
from tests.controller.conftest import ADMIN_TOKEN, LiveController, admin, controller, hostd, short_dir  # noqa: F401  (the live fixtures)
from tests.hostd_process import ROOT


async def agentic(*argv: str, env: dict[str, str]) -> tuple[int, str, str]:
    result = await trio.run_process(
        [sys.executable, "-m", "agentic_sandbox.cli.agentic", *argv],
        env={**os.environ, "PYTHONPATH": str(ROOT), **env},
        capture_stdout=True,
        capture_stderr=True,
        check=False,
        cwd=ROOT,
    )
    return result.returncode, result.stdout.decode(), result.stderr.decode()


async def test_send_streams_output_and_exits_with_the_outcome(
    admin: httpx.AsyncClient,  # noqa: F811  (the fixtures imported above)
    controller: LiveController,  # noqa: F811
    tmp_path: Path,
) -> None:
    agent = await new_agent(admin, controller, "cli-shell", loadout="shell")
    env = {"AIWG_CONTROLLER_URL": controller.url, "AIWG_TOKEN": agent.token}
    code, out, err = await agentic("send", agent.instance_id, "echo to-out; echo to-err >&2", env=env)
    assert code == 0, err
    assert out == "to-out\n"
    assert "to-err" in err and "[completed]" in err
    code, out, err = await agentic("send", agent.instance_id, "exit 7", env=env)
    assert code == 7 and "[failed]" in err

    listed = await agentic("tasks", agent.instance_id, env=env)
    assert listed[0] == 0 and listed[1].count("\n") == 3  # a header and two tasks
    task_id = listed[1].splitlines()[1].split()[0]
    code, out, _ = await agentic("task", agent.instance_id, task_id, env=env)
    assert code == 0 and task_id in out

    # A token from a file; a name looked up with an operator token.
    token_file = tmp_path / "token"
    token_file.write_text(ADMIN_TOKEN + "\n")
    code, out, _ = await agentic(
        "--token-file", str(token_file), "tasks", "cli-shell", env={"AIWG_CONTROLLER_URL": controller.url}
    )
    assert code == 0 and task_id in out

    # Errors are one line, never a traceback.
    code, _, err = await agentic("task", agent.instance_id, "no-such-task", env=env)
    assert code == 1 and "NOT_FOUND" in err and "Traceback" not in err
    code, _, err = await agentic(
        "tasks", agent.instance_id, env={"AIWG_CONTROLLER_URL": controller.url, "AIWG_TOKEN": "wrong"}
    )
    assert code == 1 and "UNAUTHENTICATED" in err
    code, _, err = await agentic(
        "tasks", agent.instance_id, env={"AIWG_CONTROLLER_URL": "http://127.0.0.1:9", "AIWG_TOKEN": "x"}
    )
    assert code == 1 and "cannot reach" in err


async def test_send_asks_the_agents_question_and_answer_answers_it(
    admin: httpx.AsyncClient,  # noqa: F811
    controller: LiveController,  # noqa: F811
) -> None:
    """hitl-prompt/v1 with the prompt loadout: --answer, a refused answer, ``agentic answer`` later."""
    agent = await new_agent(admin, controller, "cli-prompt", loadout="prompt")
    env = {"AIWG_CONTROLLER_URL": controller.url, "AIWG_TOKEN": agent.token}
    code, out, err = await agentic("send", agent.instance_id, "Your name?", "--answer", '{"answer": "Ada"}', env=env)
    assert code == 0, err
    assert out == "asked: Your name?\nanswered: Ada\n"
    assert "[input_required] Your name?" in err and "[completed]" in err

    # A refused answer shows what is wrong; without a terminal the command stops there.
    code, _, err = await agentic("send", agent.instance_id, "Name?", "--answer", '{"answer": 7}', env=env)
    assert code == 1 and "/answer:" in err and "Traceback" not in err
    # No answer at hand: it says how to answer later.
    code, _, err = await agentic("send", agent.instance_id, "Later?", env=env)
    assert code == 1 and f"agentic answer {agent.instance_id} " in err
    task_id = err.split(f"agentic answer {agent.instance_id} ")[1].split()[0]
    code, out, _ = await agentic("task", agent.instance_id, task_id, env=env)
    assert code == 0 and "prompt   Later?" in out and '"answer"' in out
    code, _, err = await agentic("answer", agent.instance_id, task_id, '{"answer": "Bob", "shout": true}', env=env)
    assert code == 0 and "[working]" in err, err
    with trio.fail_after(15):
        while "answered: BOB" not in (await agentic("task", agent.instance_id, task_id, env=env))[1]:
            await trio.sleep(0.1)
    code, _, err = await agentic("answer", agent.instance_id, task_id, '{"answer": "x"}', env=env)
    assert code == 1 and "waits for no answer" in err
    code, _, err = await agentic("send", agent.instance_id, "x", "--answer", "[1]", env=env)
    assert code == 2 and "not a JSON object" in err


async def test_send_asks_at_a_terminal(
    admin: httpx.AsyncClient,  # noqa: F811
    controller: LiveController,  # noqa: F811
) -> None:
    """At a terminal (a real PTY) the question is asked field by field, and asked again when refused."""
    agent = await new_agent(admin, controller, "cli-tty", loadout="prompt")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "AIWG_CONTROLLER_URL": controller.url, "AIWG_TOKEN": agent.token}

    def session() -> str:
        proc = ptyprocess.PtyProcess.spawn(
            [sys.executable, "-m", "agentic_sandbox.cli.agentic", "send", agent.instance_id, "Who?"],
            env=env,
            cwd=str(ROOT),
        )
        seen = b""

        def until(marker: bytes) -> None:
            nonlocal seen
            deadline = time.monotonic() + 20
            while marker not in seen:
                assert time.monotonic() < deadline, seen
                try:
                    seen += proc.read(4096)
                except EOFError:
                    raise AssertionError(seen) from None

        until(b"answer (string): ")
        proc.write(b"\n")  # required: asked again
        until(b"answer is required")
        until(b"answer (string): ")
        proc.write(b"Ada\n")
        until(b"shout (boolean, optional): ")
        proc.write(b"maybe\n")
        until(b"not a boolean")
        proc.write(b"y\n")
        until(b"[completed]")
        # The rest, to the end: a stream that begins after the task ended shows the Task (its
        # status line) first and then the output it holds.
        with contextlib.suppress(EOFError):
            while True:
                seen += proc.read(4096)
        proc.wait()
        assert proc.exitstatus == 0, seen
        return seen.decode(errors="replace")

    seen = await trio.to_thread.run_sync(session)
    assert "? Who?" in seen and "answered: ADA" in seen
