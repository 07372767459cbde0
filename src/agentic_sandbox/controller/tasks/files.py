"""Files agents return, kept on the controller's disk instead of in its database.

An agent sends a file as ``raw`` parts of an artifact, in chunks (docs/agent-protocol.md). What is
small stays inline in the stored artifact; a file that grows past :data:`INLINE_BYTES` is written
here, chunk by chunk as it arrives (never held whole in memory), and the stored artifact holds a
*file part* instead: ``{"file": {"id", "size"}, "filename"?, "mediaType"?, "metadata"?}``, which
the A2A views show as a ``url`` part the task's client can fetch
(``GET /agents/{id}/tasks/{task_id}/files/{file_id}``).

Layout: ``<root>/<task id>/<file id>``, created 0700/0600. Ids are the controller's own (never the
agent's), so a path cannot leave its task's directory. A write lands at the offset the stored
artifact records, so replaying the same chunk after a controller restart overwrites rather than
duplicates. Task directories go when their task is purged (:meth:`TaskFiles.remove`).
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Iterator
from pathlib import Path

import trio

#: Raw bytes a stored artifact part keeps inline; past this the part becomes a file here.
INLINE_BYTES = 256 * 1024
#: What a download reads at a time.
READ_CHUNK = 256 * 1024
#: The ids a path under a root may be made of (task and file ids are the controller's own UUIDs).
SAFE_ID = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


class TaskFiles:
    def __init__(self, root: Path) -> None:
        self.root = root

    def path(self, task_id: str, file_id: str) -> Path | None:
        """Where a file is, or None for ids that cannot be ours (nothing outside ``root``)."""
        if not SAFE_ID.match(task_id) or not SAFE_ID.match(file_id):
            return None
        return self.root / task_id / file_id

    async def write(self, task_id: str, file_id: str, offset: int, data: bytes) -> None:
        """Write ``data`` at ``offset`` (the file is cut there first: a replayed chunk replaces)."""
        path = self.path(task_id, file_id)
        assert path is not None, "file ids are made by the controller"
        await trio.to_thread.run_sync(_write_at, path, offset, data)

    def size(self, task_id: str, file_id: str) -> int | None:
        path = self.path(task_id, file_id)
        try:
            return None if path is None else path.stat().st_size
        except FileNotFoundError:
            return None

    def chunks(self, task_id: str, file_id: str, size: int) -> Iterator[bytes]:
        """The file's first ``size`` bytes (what the stored artifact says it holds), in chunks; a
        blocking iterator, for a worker thread. Raises FileNotFoundError."""
        path = self.path(task_id, file_id)
        if path is None:
            raise FileNotFoundError(file_id)
        with path.open("rb") as f:
            left = size
            while left > 0:
                data = f.read(min(READ_CHUNK, left))
                if not data:
                    return
                left -= len(data)
                yield data

    async def remove(self, task_ids: list[str]) -> None:
        """Remove the files of these (purged) tasks."""

        def remove() -> None:
            for task_id in task_ids:
                if SAFE_ID.match(task_id):
                    shutil.rmtree(self.root / task_id, ignore_errors=True)

        await trio.to_thread.run_sync(remove)


def _write_at(path: Path, offset: int, data: bytes) -> None:
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        os.ftruncate(fd, offset)
        view = memoryview(data)
        while view:
            written = os.pwrite(fd, view, offset)
            view, offset = view[written:], offset + written
    finally:
        os.close(fd)
