"""The writes queued for an exec's stdin pipe, written in order by the one task that owns the pipe.

Callers of :meth:`StdinQueue.write` wait until their data is in the pipe (or will never be);
the writer task (:meth:`StdinQueue.run`) takes the writes one by one, so a slow reader on the
other end blocks the queue, never hostd.

What a write has put in the pipe leaves it at once, so the writer can be stopped at any checkpoint
and started again (an upgrade in place freezes it, :mod:`hostd.freezer`): :meth:`StdinQueue.snapshot`
is then exactly what is still to be written.
"""

from __future__ import annotations

import os
from collections import deque

import trio

from agentic_sandbox.proto import ErrorCode

from . import procspawn
from .errors import RpcError

#: Writes that may wait for the writer task before ``write`` itself waits for room.
_QUEUE = 16


class _Write:
    __slots__ = ("data", "done", "eof", "error", "written")

    def __init__(self, data: bytes, eof: bool) -> None:
        self.data = data
        self.eof = eof
        self.done = trio.Event()
        self.written = False
        self.error: RpcError | None = None


class StdinQueue:
    """One exec's stdin writes. ``first`` (and the end of input unless ``keep_open``) is queued
    right away, so every later :meth:`write` lands after it."""

    def __init__(self, exec_id: str, first: bytes | None, keep_open: bool) -> None:
        self._exec_id = exec_id
        #: Whether ``write`` is accepted: False once an end of input was queued, the pipe broke or
        #: the exec ended (:meth:`close`).
        self.open = keep_open
        self._queue: deque[_Write] = deque()
        self._queued = trio.Event()
        self._room = trio.Event()
        self._ended = False
        if first or not keep_open:
            self._queue.append(_Write(first or b"", eof=not keep_open))

    async def write(self, data: bytes, eof: bool) -> int:
        """Queue ``data`` (then close the pipe if ``eof``) and wait until it is in the pipe.

        Raises ``REQUEST_INVALID`` when stdin is closed already, ``EXEC_EXITED`` when the exec ended
        before it was written, or the writer's error when the pipe broke.
        """
        if not self.open:
            raise RpcError(
                ErrorCode.REQUEST_INVALID, f"stdin of exec {self._exec_id!r} is closed", exec_id=self._exec_id
            )
        if eof:
            self.open = False
        while len(self._queue) >= _QUEUE and not self._ended:
            await self._room.wait()
        if self._ended:
            raise self._exited()
        item = _Write(data, eof)
        self._queue.append(item)
        self._queued.set()
        await item.done.wait()
        if item.error is not None:
            raise item.error
        if not item.written:
            raise self._exited()
        return len(data)

    async def run(self, proc: procspawn.Process) -> None:
        """The writer task: write queued items into ``proc.stdin`` until cancelled. Restartable.

        A broken pipe fails that write (``EXEC_EXITED`` if the process has exited, else
        ``REQUEST_INVALID``) and closes the queue to new writes; it does not end the task.
        """
        stdin = proc.stdin
        while True:
            while not self._queue:
                self._queued = trio.Event()
                await self._queued.wait()
            item = self._queue[0]
            try:
                if stdin is None or stdin.fileno() < 0:
                    raise trio.ClosedResourceError
                await self._send(stdin, item)
                if item.eof:
                    stdin.close()
                item.written = True
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                self.open = False
                item.error = RpcError(
                    ErrorCode.EXEC_EXITED if proc.returncode is not None else ErrorCode.REQUEST_INVALID,
                    f"exec {self._exec_id!r} closed its stdin",
                    exec_id=self._exec_id,
                )
            self._queue.popleft()
            item.done.set()
            self._room.set()
            self._room = trio.Event()

    @staticmethod
    async def _send(stdin: trio.lowlevel.FdStream, item: _Write) -> None:
        """Write ``item.data``, taking what the pipe took off it as it goes."""
        fd = stdin.fileno()
        while item.data:
            try:
                written = os.write(fd, item.data)
            except BlockingIOError:
                await trio.lowlevel.wait_writable(fd)
                continue
            except OSError as exc:
                raise trio.BrokenResourceError(f"stdin write failed: {exc}") from exc
            item.data = item.data[written:]
        await trio.lowlevel.checkpoint()

    def close(self) -> None:
        """The exec ended: writes still queued will never be written; release their callers and
        refuse new ones."""
        self.open = False
        self._ended = True
        while self._queue:
            self._queue.popleft().done.set()
        self._room.set()

    def snapshot(self) -> list[tuple[bytes, bool]]:
        """(data, eof) of every write not yet in the pipe, in order (what a handover carries)."""
        return [(item.data, item.eof) for item in self._queue]

    def resume(self, writes: list[tuple[bytes, bool]]) -> None:
        """Queue what an earlier image of hostd had not written yet (its callers are gone)."""
        self._queue.clear()
        for data, eof in writes:
            self._queue.append(_Write(data, eof))
        self._queued.set()

    def _exited(self) -> RpcError:
        return RpcError(ErrorCode.EXEC_EXITED, f"exec {self._exec_id!r} has exited", exec_id=self._exec_id)
