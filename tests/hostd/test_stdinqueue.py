"""An exec's stdin queue (hostd.stdinqueue.StdinQueue) writing into real processes' pipes: writes
land in order and their callers wait until they are in the pipe, a closed or broken pipe and a
writer task gone are told apart. Initial stdin, writes and EOF through a real exec:
tests/hostd/test_execs.py."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path

import pytest
import trio

from agentic_sandbox.hostd import procspawn
from agentic_sandbox.hostd.errors import RpcError
from agentic_sandbox.hostd.stdinqueue import StdinQueue
from agentic_sandbox.proto import ErrorCode

#: More than the pipes between the test and a stopped reader can hold (stdin's, cat's, stdout's).
BIG = 1024 * 1024


@asynccontextmanager
async def child(
    tmp_path: Path, argv: Sequence[str], stdout: int = procspawn.DEVNULL
) -> AsyncIterator[procspawn.Process]:
    """A real child with a stdin pipe (found by ``leak_check`` through its env), killed after."""
    proc = await procspawn.spawn(
        argv,
        cwd=str(tmp_path),
        env={"AIWG_INSTANCE_DIR": str(tmp_path)},
        tree_id="test:exec:stdinqueue",
        cgroup=None,
        stdin=procspawn.PIPE,
        stdout=stdout,
        stderr=procspawn.DEVNULL,
    )
    try:
        yield proc
    finally:
        proc.kill()
        await proc.wait()
        for stream in (proc.stdin, proc.stdout):
            if stream is not None:
                await stream.aclose()


async def read_all(stream: trio.abc.ReceiveStream | None) -> bytes:
    assert stream is not None
    out = bytearray()
    while chunk := await stream.receive_some():
        out += chunk
    return bytes(out)


def code(caught: pytest.ExceptionInfo[RpcError]) -> ErrorCode:
    return caught.value.code


async def test_callers_wait_until_their_data_is_in_the_pipe_and_land_in_order(tmp_path: Path, leak_check: None) -> None:
    """cat echoes into a pipe nobody reads yet: a big write cannot be in stdin before it is drained."""
    queue = StdinQueue("e1", b"first,", keep_open=True)
    done: list[str] = []

    async def write(name: str, data: bytes, eof: bool = False) -> None:
        assert await queue.write(data, eof) == len(data)
        done.append(name)

    async with child(tmp_path, ["cat"], stdout=procspawn.PIPE) as proc, trio.open_nursery() as nursery:
        nursery.start_soon(queue.run, proc)
        nursery.start_soon(write, "big", b"b" * BIG)
        await trio.testing.wait_all_tasks_blocked()
        nursery.start_soon(write, "last", b",last", True)
        await trio.testing.wait_all_tasks_blocked()
        assert done == [] and not queue.open  # the end of input is queued: no write after it
        with pytest.raises(RpcError, match="is closed") as closed:
            await queue.write(b"late", False)
        assert code(closed) is ErrorCode.REQUEST_INVALID
        assert await read_all(proc.stdout) == b"first," + b"b" * BIG + b",last"  # cat saw the EOF
        await trio.testing.wait_all_tasks_blocked()
        assert done == ["big", "last"]
        nursery.cancel_scope.cancel()


async def test_without_keep_open_the_first_input_is_all_there_is(tmp_path: Path, leak_check: None) -> None:
    queue = StdinQueue("e1", None, keep_open=False)
    assert not queue.open
    async with child(tmp_path, ["cat"], stdout=procspawn.PIPE) as proc, trio.open_nursery() as nursery:
        nursery.start_soon(queue.run, proc)
        assert await read_all(proc.stdout) == b""
        nursery.cancel_scope.cancel()


async def test_a_pipe_the_running_child_closed_fails_the_write_and_closes_the_queue(
    tmp_path: Path, leak_check: None
) -> None:
    queue = StdinQueue("e1", None, keep_open=True)
    async with (
        child(tmp_path, ["sh", "-c", "exec 0<&-; echo closed; exec sleep 600"], stdout=procspawn.PIPE) as proc,
        trio.open_nursery() as nursery,
    ):
        assert proc.stdout is not None and await proc.stdout.receive_some() == b"closed\n"
        nursery.start_soon(queue.run, proc)
        with pytest.raises(RpcError, match="closed its stdin") as broken:
            await queue.write(b"x" * BIG, False)
        assert code(broken) is ErrorCode.REQUEST_INVALID and proc.returncode is None
        assert not queue.open
        with pytest.raises(RpcError, match="is closed"):
            await queue.write(b"y", False)
        nursery.cancel_scope.cancel()


async def test_a_pipe_broken_by_an_exited_child_is_exec_exited(tmp_path: Path, leak_check: None) -> None:
    queue = StdinQueue("e1", None, keep_open=True)
    async with child(tmp_path, ["true"]) as proc, trio.open_nursery() as nursery:
        await proc.wait()
        nursery.start_soon(queue.run, proc)
        with pytest.raises(RpcError) as exited:
            await queue.write(b"x" * BIG, False)
        assert code(exited) is ErrorCode.EXEC_EXITED and exited.value.details == {"exec_id": "e1"}
        nursery.cancel_scope.cancel()
