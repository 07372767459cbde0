"""The writes queued for an exec's stdin pipe, written in order by the one task that owns the pipe.

Callers of :meth:`StdinQueue.write` wait until their data is in the pipe (or will never be);
the writer task (:meth:`StdinQueue.run`) takes the writes one by one, so a slow reader on the
other end blocks the queue, never hostd.
"""

from __future__ import annotations

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
        #: the exec ended (its registry clears it then).
        self.open = keep_open
        self._tx, self._rx = trio.open_memory_channel[_Write](_QUEUE)
        if first or not keep_open:
            self._tx.send_nowait(_Write(first or b"", eof=not keep_open))

    async def write(self, data: bytes, eof: bool) -> int:
        """Queue ``data`` (then close the pipe if ``eof``) and wait until it is in the pipe.

        Raises ``REQUEST_INVALID`` when stdin is closed already, ``EXEC_EXITED`` when the writer
        task is gone or ended before writing it, or the writer's error when the pipe broke.
        """
        if not self.open:
            raise RpcError(
                ErrorCode.REQUEST_INVALID, f"stdin of exec {self._exec_id!r} is closed", exec_id=self._exec_id
            )
        if eof:
            self.open = False
        item = _Write(data, eof)
        try:
            await self._tx.send(item)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            raise self._exited() from None
        await item.done.wait()
        if item.error is not None:
            raise item.error
        if not item.written:
            raise self._exited()
        return len(data)

    async def run(self, proc: procspawn.Process) -> None:
        """The writer task: write queued items into ``proc.stdin`` until cancelled.

        A broken pipe fails that write (``EXEC_EXITED`` if the process has exited, else
        ``REQUEST_INVALID``) and closes the queue to new writes; it does not end the task. When
        the task ends, writes still queued are released unwritten and new ones are refused.
        """
        stdin = proc.stdin
        assert stdin is not None
        try:
            async for item in self._rx:
                try:
                    if item.data:
                        await stdin.send_all(item.data)
                    if item.eof:
                        await stdin.aclose()
                    item.written = True
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    self.open = False
                    item.error = RpcError(
                        ErrorCode.EXEC_EXITED if proc.returncode is not None else ErrorCode.REQUEST_INVALID,
                        f"exec {self._exec_id!r} closed its stdin",
                        exec_id=self._exec_id,
                    )
                finally:
                    item.done.set()
        finally:
            # Writes still queued will never be written: release their callers, refuse new ones.
            while True:
                try:
                    self._rx.receive_nowait().done.set()
                except (trio.WouldBlock, trio.EndOfChannel):
                    break
            self._rx.close()

    def _exited(self) -> RpcError:
        return RpcError(ErrorCode.EXEC_EXITED, f"exec {self._exec_id!r} has exited", exec_id=self._exec_id)
