"""``agentic send | tasks | task`` as a child process against a live controller and hostd."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import httpx
import trio

from tests.controller.a2a.helpers import new_agent
from tests.controller.conftest import ADMIN_TOKEN, LiveController, admin, controller, hostd, short_dir  # noqa: F401  (the live fixtures)
from tests.hostd_process import ROOT


async def agentic(*argv: str, env: dict[str, str]) -> tuple[int, str, str]:
    result = await trio.run_process(
        [sys.executable, "-m", "cli.agentic", *argv],
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
