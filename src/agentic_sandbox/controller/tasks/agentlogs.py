"""What an agent that speaks the protocol writes to stdout and stderr: its logs, kept per task.

Once an agent said ``hello`` (docs/agent-protocol.md) its output is no longer the task's answer;
it is kept here for an admin (``GET /api/v2/admin/tasks/{task_id}/logs``), at most ``limit`` bytes
a task: the first ``limit`` bytes are kept and a last line says how much more was dropped (the
start of a log says how the agent began, which is what a failed task needs). One file a task,
``<root>/<task id>.log`` (0600), removed when the task is purged.
"""

from __future__ import annotations

import os
from pathlib import Path

import trio

from .files import SAFE_ID


class TaskLogs:
    def __init__(self, root: Path, limit: int) -> None:
        self.root = root
        self.limit = limit

    def path(self, task_id: str) -> Path | None:
        return self.root / f"{task_id}.log" if SAFE_ID.match(task_id) else None

    async def append(self, task_id: str, chunks: list[bytes]) -> None:
        """Add output to the task's log, up to the limit (past it, only a count is kept)."""
        path = self.path(task_id)
        if path is not None and chunks:
            await trio.to_thread.run_sync(self._append, path, b"".join(chunks))

    def _append(self, path: Path, data: bytes) -> None:
        self.root.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            size = os.fstat(fd).st_size
            room = self.limit - size
            if room > 0:
                os.write(fd, data[:room])
        finally:
            os.close(fd)
        dropped = len(data) - max(room, 0)
        if dropped > 0:
            self._count_dropped(path, dropped)

    def _count_dropped(self, path: Path, dropped: int) -> None:
        marker = path.with_suffix(".dropped")
        try:
            before = int(marker.read_text())
        except (FileNotFoundError, ValueError):
            before = 0
        marker.write_text(str(before + dropped))

    async def read(self, task_id: str) -> bytes | None:
        """The task's log (with the dropped count as its last line), or None if it has none."""
        path = self.path(task_id)
        if path is None:
            return None

        def read() -> bytes | None:
            try:
                data = path.read_bytes()
            except FileNotFoundError:
                return None
            try:
                dropped = int(path.with_suffix(".dropped").read_text())
            except (FileNotFoundError, ValueError):
                return data
            return data + f"\n[{dropped} more bytes of output were dropped: the log keeps {self.limit}]\n".encode()

        return await trio.to_thread.run_sync(read)

    async def remove(self, task_ids: list[str]) -> None:
        """Remove the logs of these (purged) tasks."""

        def remove() -> None:
            for task_id in task_ids:
                path = self.path(task_id)
                if path is not None:
                    path.unlink(missing_ok=True)
                    path.with_suffix(".dropped").unlink(missing_ok=True)

        await trio.to_thread.run_sync(remove)
