"""Task logs on a real directory: output appended up to the limit, the rest counted and said on
the last line, private files, ids that name no path, removal with the task."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from agentic_sandbox.controller.tasks.agentlogs import TaskLogs


async def test_output_is_kept_up_to_the_limit_and_the_rest_counted(tmp_path: Path) -> None:
    logs = TaskLogs(tmp_path / "logs", limit=10)
    assert await logs.read("t1") is None
    await logs.append("t1", [b"abc", b"def"])
    assert await logs.read("t1") == b"abcdef"
    await logs.append("t1", [b"ghijkl"])
    await logs.append("t1", [b"mn"])
    assert await logs.read("t1") == b"abcdefghij\n[4 more bytes of output were dropped: the log keeps 10]\n"
    assert stat.S_IMODE(os.stat(tmp_path / "logs" / "t1.log").st_mode) == 0o600
    await logs.append("t1", [])  # nothing to add: nothing touched
    assert (tmp_path / "logs" / "t1.dropped").read_text() == "4"


async def test_ids_that_name_no_path_and_removal(tmp_path: Path) -> None:
    logs = TaskLogs(tmp_path, limit=100)
    await logs.append("../escape", [b"x"])
    assert await logs.read("../escape") is None and not (tmp_path.parent / "escape.log").exists()
    await logs.append("t1", [b"x" * 200])
    await logs.append("t2", [b"y"])
    await logs.remove(["t1"])
    assert sorted(os.listdir(tmp_path)) == ["t2.log"]
