"""The attach commands' terminal: detach keys, key queue, cursor file, and raw mode on a real PTY."""

from __future__ import annotations

import os
import signal
import stat
import sys
import termios
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio
from hypothesis import given
from hypothesis import strategies as st
from ptyprocess import PtyProcess

from agentic_sandbox.cli.terminal import CursorFile, DetachKeys, KeyQueue, Terminal, read_keys

# -- detach keys --------------------------------------------------------------------------------


def feed_all(chunks: list[bytes]) -> tuple[bytes, bool]:
    keys = DetachKeys()
    sent, done = b"", False
    for chunk in chunks:
        data, done = keys.feed(chunk)
        sent += data
        if done:
            break
    return sent, done


@pytest.mark.parametrize(
    ("chunks", "forwarded", "detached"),
    [
        ([b"ls\r"], b"ls\r", False),
        ([b"ab\x1dcd"], b"ab", True),
        ([b"ab\x02dcd"], b"ab", True),
        ([b"ab\x02", b"d"], b"ab", True),  # prefix and key in separate reads
        ([b"a", b"b", b"\x02", b"d", b"c"], b"ab", True),
        ([b"ab", b"\x1d", b"cd"], b"ab", True),
        ([b"\x02\x02x"], b"\x02x", False),  # Ctrl-B Ctrl-B sends one Ctrl-B
        ([b"\x02", b"\x02", b"d"], b"\x02d", False),  # ... and the d after it is just a d
        ([b"\x02x"], b"\x02x", False),
        ([b"x\x02", b"y"], b"x\x02y", False),
        ([b"x\x02"], b"x", False),  # a prefix at the end is held, not sent, until the next read
    ],
)
def test_detach_keys(chunks: list[bytes], forwarded: bytes, detached: bool) -> None:
    assert feed_all(chunks) == (forwarded, detached)


@given(st.binary(max_size=64).map(lambda b: b.replace(b"\x00", b"\x02")), st.data())
def test_detach_keys_ignore_chunk_boundaries(typed: bytes, data: st.DataObject) -> None:
    cuts = sorted(data.draw(st.lists(st.integers(0, len(typed)), max_size=8)))
    chunks = [typed[a:b] for a, b in zip([0, *cuts], [*cuts, len(typed)], strict=True)]
    assert feed_all(chunks) == feed_all([typed])


def test_key_queue_bounds_and_drains() -> None:
    queue = KeyQueue(limit=4)
    assert not queue.take(b"abc")
    assert not queue.take(b"def")  # over the limit: dropped, never blocking the keyboard
    assert queue.drain() == b"abcd"
    assert queue.drain() == b""
    assert queue.take(b"x\x1dy")
    assert queue.detached
    assert queue.drain() == b"x"


# -- cursor file --------------------------------------------------------------------------------


def test_cursor_file_round_trip_is_private(tmp_path: Path) -> None:
    cursor = CursorFile.for_session("agentic-hostctl", "host-1", "sess-1", env={"XDG_STATE_HOME": str(tmp_path)})
    assert cursor.path == tmp_path / "agentic-hostctl" / "attach" / "host-1" / "sess-1"
    assert cursor.load() is None  # first attach
    old_umask = os.umask(0)  # the modes must not depend on the caller's umask
    try:
        cursor.save(41)
        cursor.save(42)
    finally:
        os.umask(old_umask)
    assert cursor.load() == 42
    assert stat.S_IMODE(cursor.path.stat().st_mode) == 0o600
    for directory in (cursor.path.parent, tmp_path / "agentic-hostctl"):
        assert stat.S_IMODE(directory.stat().st_mode) == 0o700
    assert sorted(p.name for p in cursor.path.parent.iterdir()) == ["sess-1"]  # no temporary file left
    cursor.remove()
    cursor.remove()  # already gone: fine
    assert cursor.load() is None


def test_cursor_file_keeps_ids_inside_its_directory(tmp_path: Path) -> None:
    env = {"XDG_STATE_HOME": str(tmp_path / "state")}
    cursor = CursorFile.for_session("agentic", "../..", "a/b", ".hidden", env=env)
    assert cursor.path.parent.parent.parent == tmp_path / "state" / "agentic" / "attach"
    assert len(cursor.path.relative_to(tmp_path / "state").parts) == 5
    cursor.save(7)
    assert [p for p in tmp_path.rglob("*") if p.is_file()] == [cursor.path]
    with pytest.raises(ValueError, match="empty"):
        CursorFile.for_session("agentic", "host", "", env=env)


def test_cursor_file_defaults_to_local_state(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    cursor = CursorFile.for_session("agentic-hostctl", "h", "s", env={})
    assert cursor.path == tmp_path / ".local" / "state" / "agentic-hostctl" / "attach" / "h" / "s"


def test_cursor_file_ignores_what_it_cannot_read(tmp_path: Path) -> None:
    cursor = CursorFile(tmp_path / "c")
    cursor.path.write_text("not a number\n")
    assert cursor.load() is None
    cursor.save(-1)  # nothing seen yet of a ring that starts at 0
    assert cursor.load() == -1


# -- the terminal on a real PTY -----------------------------------------------------------------


@pytest.fixture
def pty() -> Iterator[tuple[int, int]]:
    """(master, slave) of a fresh PTY, in the cooked mode a shell leaves it in."""
    master, slave = os.openpty()
    try:
        yield master, slave
    finally:
        os.close(master)
        os.close(slave)


def lflag(fd: int) -> int:
    return termios.tcgetattr(fd)[3]


async def test_raw_mode_is_entered_and_restored(pty: tuple[int, int]) -> None:
    _, slave = pty
    before = termios.tcgetattr(slave)
    assert lflag(slave) & termios.ICANON
    with Terminal(slave, slave) as term:
        assert term.is_tty
        assert not lflag(slave) & (termios.ICANON | termios.ECHO | termios.ISIG)
        assert not os.get_blocking(slave)  # what FdStream does to the shared file description
    assert termios.tcgetattr(slave) == before
    assert os.get_blocking(slave)


async def test_raw_mode_is_restored_after_an_error_or_cancel(pty: tuple[int, int]) -> None:
    _, slave = pty
    before = termios.tcgetattr(slave)
    with pytest.raises(RuntimeError, match="boom"), Terminal(slave, slave):
        raise RuntimeError("boom")
    assert termios.tcgetattr(slave) == before
    with trio.move_on_after(0.05) as scope, Terminal(slave, slave) as term:
        await term.read()  # nothing typed: cancelled while waiting
    assert scope.cancelled_caught
    assert termios.tcgetattr(slave) == before
    assert os.get_blocking(slave)


async def test_keys_in_output_out_and_window_size(pty: tuple[int, int]) -> None:
    master, slave = pty
    termios.tcsetwinsize(slave, (33, 101))
    with Terminal(slave, slave) as term:
        assert term.size() == (101, 33)
        os.write(master, b"ab\x03")  # raw: Ctrl-C is a byte, not SIGINT
        assert await term.read() == b"ab\x03"
        await term.write(b"line\n")  # raw: no CR added
        assert os.read(master, 100) == b"line\n"
        termios.tcsetwinsize(slave, (40, 120))
        assert term.size() == (120, 40)


async def test_read_keys_sends_until_detach(pty: tuple[int, int]) -> None:
    master, slave = pty
    queue = KeyQueue(limit=1024)
    sent: list[bytes] = []

    async def send() -> None:
        sent.append(queue.drain())

    with Terminal(slave, slave) as term:
        os.write(master, b"echo hi\r")
        with trio.fail_after(5):
            while b"".join(sent) != b"echo hi\r":
                with trio.move_on_after(0.05):
                    await read_keys(term, queue, send)
        os.write(master, b"x\x02")
        os.write(master, b"d")
        with trio.fail_after(5):
            assert await read_keys(term, queue, send)
    assert b"".join(sent) == b"echo hi\rx"


async def test_files_are_read_and_written_without_polling(tmp_path: Path) -> None:
    (tmp_path / "in").write_bytes(b"typed")
    with (
        open(tmp_path / "in", "rb") as keys,
        open(tmp_path / "out", "wb") as screen,
        Terminal(keys.fileno(), screen.fileno()) as term,
    ):
        assert not term.is_tty
        assert term.size() is None
        assert await term.read() == b"typed"
        assert await term.read() == b""  # end of input
        assert not await read_keys(term, KeyQueue(limit=10), None)
        await term.write(b"shown")
    assert (tmp_path / "out").read_bytes() == b"shown"


@pytest.mark.parametrize("leave", [signal.SIGTERM, signal.SIGHUP])
async def test_signals_resize_then_leave(pty: tuple[int, int], leave: signal.Signals) -> None:
    _, slave = pty
    resized = 0

    async def on_resize() -> None:
        nonlocal resized
        resized += 1

    with Terminal(slave, slave) as term:
        signal.raise_signal(signal.SIGWINCH)
        signal.raise_signal(leave)  # caught: leaves like a detach instead of killing us
        with trio.fail_after(5):
            assert await term.watch_signals(on_resize) == leave
    assert resized == 1


LEAVER = """
import sys, trio
from agentic_sandbox.cli.terminal import Terminal

async def main():
    with Terminal() as term:
        await term.write(b"READY\\n")
        signum = await term.watch_signals(None)
    print(f"left on {signum}", flush=True)

trio.run(main)
"""


async def test_sigterm_leaves_the_terminal_cooked(tmp_path: Path) -> None:
    """A whole process on its own PTY: SIGTERM ends it cleanly, with the terminal as it found it."""
    proc = PtyProcess.spawn([sys.executable, "-c", LEAVER], cwd=str(tmp_path))
    try:
        before = termios.tcgetattr(proc.fd)
        seen = b""
        with trio.fail_after(15):
            while b"READY" not in seen:
                seen += await trio.to_thread.run_sync(proc.read, 1024)
            assert not lflag(proc.fd) & termios.ICANON  # raw while attached
            proc.kill(signal.SIGTERM)
            while b"left on 15" not in seen:
                seen += await trio.to_thread.run_sync(proc.read, 1024)
        assert termios.tcgetattr(proc.fd) == before
        assert await trio.to_thread.run_sync(proc.wait) == 0
    finally:
        proc.close(force=True)
