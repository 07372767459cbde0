"""``agentic fleet``: its arguments (the verbs against a live controller are in
tests/scenarios/test_fleet_restart.py)."""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import pytest

from agentic_sandbox.cli.agentic import parse_args
from agentic_sandbox.cli.fleet import duration


@pytest.mark.parametrize(("text", "seconds"), [("5s", 5.0), ("500ms", 0.5), ("1m", 60.0), ("2", 2.0), ("0.5s", 0.5)])
def test_watch_durations(text: str, seconds: float) -> None:
    assert duration(text) == seconds


@pytest.mark.parametrize("text", ["", "5h", "-1s", "10ms", "soon"])
def test_a_bad_duration_is_refused(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError):
        duration(text)


def test_reconcile_takes_the_previous_revision_and_the_expected_children() -> None:
    args = parse_args(["fleet", "reconcile", "--before-revision", "12", "--child-id", "a", "--child-id", "b"])
    assert (args.before_revision, args.child_ids) == (12, ["a", "b"])


def test_a_file_that_is_not_json_is_one_line_and_exit_1(tmp_path: Path) -> None:
    bad = tmp_path / "w.json"
    bad.write_text("{nope")
    argv = [sys.executable, "-m", "agentic_sandbox.cli.agentic", "--url", "http://127.0.0.1:9", "--token", "t" * 20]
    done = subprocess.run([*argv, "fleet", "dispatch", "--file", str(bad)], capture_output=True, text=True, timeout=30)
    assert done.returncode == 1 and done.stderr.startswith("agentic: ") and "is not JSON" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
