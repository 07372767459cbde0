"""procspawn's Process: a child started on the loop's thread, its pipes, its exit on a pidfd."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
import trio

from agentic_sandbox.hostd import procspawn
from agentic_sandbox.hostd.errors import RpcError
from agentic_sandbox.proto import ErrorCode


async def start(tmp_path: Path, argv: list[str], **stdio: int | None) -> procspawn.Process:
    streams: dict[str, int | None] = {"stdin": None, "stdout": None, "stderr": None, **stdio}
    return await procspawn.spawn(argv, cwd=str(tmp_path), env={}, tree_id="test:exec:procspawn", cgroup=None, **streams)


async def test_waiters_and_pollers_all_see_the_one_exit(tmp_path: Path, leak_check: None) -> None:
    proc = await start(tmp_path, ["sh", "-c", "sleep 0.2; exit 7"])
    assert proc.returncode is None and proc.poll() is None
    codes: list[int] = []

    async def waiter() -> None:
        codes.append(await proc.wait())

    async def poller() -> None:
        while (code := proc.poll()) is None:  # reaps it first, now and then: the waiters must not hang
            await trio.sleep(0.001)
        codes.append(code)

    with trio.fail_after(5):
        async with trio.open_nursery() as nursery:
            for work in (waiter, waiter, poller):
                nursery.start_soon(work)
    assert codes == [7, 7, 7] and proc.returncode == 7 and await proc.wait() == 7


async def test_pipes_carry_the_childs_stdio_and_a_signal_ends_it(tmp_path: Path, leak_check: None) -> None:
    proc = await start(
        tmp_path,
        ["sh", "-c", "cat; echo err >&2"],
        stdin=procspawn.PIPE,
        stdout=procspawn.PIPE,
        stderr=procspawn.STDOUT,
    )
    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is None
    await proc.stdin.send_all(b"ping\n")
    await proc.stdin.aclose()
    out = b""
    with trio.fail_after(5):
        while chunk := await proc.stdout.receive_some(1024):
            out += chunk
    await proc.stdout.aclose()
    assert out == b"ping\nerr\n" and await proc.wait() == 0

    sleeper = await start(tmp_path, ["sleep", "30"])
    sleeper.send_signal(signal.SIGTERM)
    assert await sleeper.wait() == -signal.SIGTERM
    sleeper.kill()  # reaped already: nothing is signalled (its pid may be another's by now)


async def test_what_exec_refuses_is_refused_at_the_start_with_no_pipe_left(tmp_path: Path, leak_check: None) -> None:
    plain = tmp_path / "plain"
    plain.write_text("#!/bin/sh\n")
    for argv, error in ((["no-such-program-x"], "ENOENT"), ([str(plain)], "EACCES")):
        with pytest.raises(RpcError) as excinfo:
            await start(tmp_path, argv, stdin=procspawn.PIPE, stdout=procspawn.PIPE, stderr=procspawn.PIPE)
        assert excinfo.value.code is ErrorCode.SPAWN_FAILED and excinfo.value.details["errno"] == error
    with pytest.raises(RpcError) as excinfo:
        await procspawn.spawn(
            ["true"], cwd=str(tmp_path / "gone"), env={}, tree_id="t", cgroup=None, stdin=None, stdout=None, stderr=None
        )
    assert excinfo.value.code is ErrorCode.SPAWN_FAILED and "cwd" in excinfo.value.message
