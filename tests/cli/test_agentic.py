"""``agentic``'s entry point: the command line split at ``--`` (in memory), every subcommand bound to
a function, and as a real process the exit statuses: 2 for usage, 1 with one line for a controller
error (sync and async commands alike), never a traceback. The commands themselves against a live
controller: test_tasks.py and test_ptyattach.py."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

import pytest

from agentic_sandbox.cli.agentic import build_parser, parse_args
from tests.hostd_process import ROOT

#: The discard port on loopback: nothing listens there.
NOWHERE = "http://127.0.0.1:9"


def test_everything_after_the_double_dash_is_the_command_to_run() -> None:
    args = parse_args(["session", "new", "alpha", "--cwd", "/w", "--", "bash", "-lc", "x --help", "--"])
    assert (args.command, args.verb, args.instance, args.cwd) == ("session", "new", "alpha", "/w")
    assert args.argv == ["bash", "-lc", "x --help", "--"]
    assert parse_args(["sessions", "alpha"]).argv == []
    assert parse_args(["--url", "http://c", "attach", "alpha", "s1", "--"]).argv == []


def test_every_command_has_a_function() -> None:
    def leaves(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
        subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        if not subs:
            return [path]
        return [leaf for name, child in subs[0].choices.items() for leaf in leaves(child, (*path, name))]

    commands = leaves(build_parser())
    assert {("send",), ("tasks",), ("attach",), ("session", "new")} <= set(commands)
    for command in commands:
        required = {"send": ["i", "t"], "answer": ["i", "t"], "task": ["i", "t"], "attach": ["i", "s"]}
        fleet = {
            ("fleet", "dispatch"): ["--file", "w.json"],
            ("fleet", "inventory"): [],
            ("fleet", "reconcile"): ["--before-revision", "0", "--child-id", "c"],
        }
        argv = [*command, *fleet.get(command, required.get(command[0], ["i"]))]
        assert callable(parse_args(argv).func), command


def _agentic(*argv: str, state: Path, **env: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("AIWG_")}
    return subprocess.run(
        [sys.executable, "-m", "agentic_sandbox.cli.agentic", *argv],
        env={**clean, "PYTHONPATH": str(ROOT), "AIWG_STATE_DIR": str(state), **env},
        capture_output=True,
        text=True,
        timeout=60,
        cwd=state,
        check=False,
    )


@pytest.mark.parametrize("argv", [[], ["no-such-command"], ["tasks"], ["tasks", "alpha", "--limit", "many"]])
def test_a_usage_error_exits_2(tmp_path: Path, argv: list[str]) -> None:
    proc = _agentic(*argv, state=tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert "usage: agentic" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.parametrize(
    ("argv", "env", "line"),
    [
        (["tasks", "alpha"], {}, "agentic: no token: pass --token or --token-file"),
        (
            ["--url", NOWHERE, "--token", "t", "tasks", "alpha"],
            {},
            f"agentic: cannot reach the controller at {NOWHERE}",
        ),
        (["sessions", "alpha"], {"AIWG_CONTROLLER_URL": NOWHERE, "AIWG_TOKEN": "t"}, "agentic: cannot reach"),
        # An async command (under trio): the same one line.
        (["attach", "alpha", "s1"], {"AIWG_CONTROLLER_URL": NOWHERE, "AIWG_TOKEN": "t"}, "agentic: cannot reach"),
    ],
)
def test_a_controller_error_is_one_line_and_exit_1(
    tmp_path: Path, argv: list[str], env: dict[str, str], line: str
) -> None:
    proc = _agentic(*argv, state=tmp_path, **env)
    assert proc.returncode == 1, proc.stderr
    assert proc.stderr.startswith(line) and proc.stderr.count("\n") == 1, proc.stderr
    assert proc.stdout == ""
