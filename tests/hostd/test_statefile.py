"""hostd's state file (hostd.statefile) on a real directory: what is written reads back, the file
and its directory are private, and a write that fails (even one cut short) is logged and leaves the
previous file whole. Corrupt, version-1 and newer files: tests/hostd/test_instances.py."""

from __future__ import annotations

import logging
import stat
from pathlib import Path

import pytest

from agentic_sandbox.hostd import statefile
from agentic_sandbox.hostd.statefile import PersistedInstance
from agentic_sandbox.proto import messages as m
from tests.hostd.sizelimit import run_capped


def instance(instance_id: str, **env: str) -> PersistedInstance:
    info = m.InstanceInfo(
        instance_id=instance_id,
        name=f"name-{instance_id}",
        state="running",
        instance_dir=f"/state/instances/{instance_id}",
        working_dir="/work",
        host=m.HostDetail(pid=42, pgid=42, cgroup="/sys/fs/cgroup/x"),
        created_at=1.5,
    )
    return PersistedInstance(info=info, env=env, detail={"main_create_time": 12.25})


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_no_file_is_no_instances(tmp_path: Path) -> None:
    assert statefile.read(tmp_path / "hostd-state.json") is None


def test_what_is_written_reads_back_in_a_private_file_and_dir(tmp_path: Path) -> None:
    path = tmp_path / "state" / "hostd-state.json"
    written = [instance("a", TOKEN="x"), instance("b")]
    statefile.write(path, written)
    assert statefile.read(path) == written
    assert mode(path) == 0o600 and mode(path.parent) == 0o700
    assert [p.name for p in path.parent.iterdir()] == ["hostd-state.json"]  # no temporary file left
    statefile.write(path, [])
    assert statefile.read(path) == []


def test_a_rewrite_makes_an_open_file_and_dir_private_again(tmp_path: Path) -> None:
    """A state dir an operator created 0755, or a file copied in 0644, holds env values: tightened."""
    path = tmp_path / "state" / "hostd-state.json"
    path.parent.mkdir(mode=0o755)
    path.write_text("{}")
    path.chmod(0o644)
    statefile.write(path, [instance("a")])
    assert mode(path) == 0o600 and mode(path.parent) == 0o700


def test_a_failed_write_is_logged_not_raised(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    blocker = tmp_path / "state"
    blocker.write_text("a file where the state dir should be")
    with caplog.at_level(logging.ERROR, logger=statefile.__name__):
        statefile.write(blocker / "hostd-state.json", [instance("a")])
    assert "cannot write state file" in caplog.text


def test_a_write_cut_short_leaves_the_previous_file_whole(tmp_path: Path) -> None:
    """A short write (disk full, size limit) fails the write: never a truncated file renamed in."""
    path = tmp_path / "hostd-state.json"
    statefile.write(path, [instance("a")])
    before = path.read_bytes()
    big = "x" * 4096
    result = run_capped(
        f"""
        from pathlib import Path
        from agentic_sandbox.hostd import statefile
        from tests.hostd.test_statefile import instance
        statefile.write(Path({str(path)!r}), [instance("a"), instance("b", BIG={big!r})])
        """,
        limit=len(before) + 100,
    )
    assert "cannot write state file" in result.stderr
    assert path.read_bytes() == before
    assert statefile.read(path) == [instance("a")]
