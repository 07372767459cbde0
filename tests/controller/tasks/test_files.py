"""Files agents return, on a real directory: written at an offset (a replayed chunk replaces, never
duplicates), read back in chunks up to the size the store records, private modes, ids that cannot
name a path outside the root, removal with the task."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from agentic_sandbox.controller.tasks.files import READ_CHUNK, TaskFiles


async def test_writes_land_at_their_offset_and_a_replay_replaces(tmp_path: Path) -> None:
    files = TaskFiles(tmp_path / "files")
    await files.write("t1", "f1", 0, b"hello ")
    await files.write("t1", "f1", 6, b"world")
    await files.write("t1", "f1", 6, b"WORLD")  # the same chunk again after a restart
    assert (tmp_path / "files" / "t1" / "f1").read_bytes() == b"hello WORLD"
    assert files.size("t1", "f1") == 11 and files.size("t1", "nope") is None
    assert stat.S_IMODE(os.stat(tmp_path / "files" / "t1").st_mode) == 0o700
    assert stat.S_IMODE(os.stat(tmp_path / "files" / "t1" / "f1").st_mode) == 0o600


async def test_a_file_is_read_in_chunks_up_to_its_recorded_size(tmp_path: Path) -> None:
    files = TaskFiles(tmp_path)
    data = os.urandom(READ_CHUNK * 2 + 17)
    await files.write("t1", "f1", 0, data)
    chunks = list(files.chunks("t1", "f1", len(data)))
    assert [len(c) for c in chunks] == [READ_CHUNK, READ_CHUNK, 17] and b"".join(chunks) == data
    assert b"".join(files.chunks("t1", "f1", 10)) == data[:10]  # what the store says it holds
    with pytest.raises(FileNotFoundError):
        list(files.chunks("t1", "missing", 1))


@pytest.mark.parametrize(("task_id", "file_id"), [("..", "x"), ("t1", "../../etc/passwd"), ("t/1", "x"), ("", "x")])
def test_ids_that_could_leave_the_root_name_no_path(tmp_path: Path, task_id: str, file_id: str) -> None:
    files = TaskFiles(tmp_path)
    assert files.path(task_id, file_id) is None and files.size(task_id, file_id) is None
    with pytest.raises(FileNotFoundError):
        list(files.chunks(task_id, file_id, 1))


async def test_the_files_of_purged_tasks_are_removed(tmp_path: Path) -> None:
    files = TaskFiles(tmp_path)
    for task_id in ("t1", "t2"):
        await files.write(task_id, "f", 0, b"x")
    await files.remove(["t1", "../t2", "never-had-any"])
    assert not (tmp_path / "t1").exists() and (tmp_path / "t2" / "f").exists()
