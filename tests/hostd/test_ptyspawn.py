"""A PTY child's output reader: interactive output as it comes, bulk output gathered in a worker
thread, and neither path losing, reordering or holding on to output."""

from __future__ import annotations

import os
import sys

import trio

from agentic_sandbox.hostd.ptyspawn import PtyChild, spawn_pty

# Raw mode: the PTY passes bytes through unchanged. The child writes a bulk burst, waits for a line,
# echoes one key at a time, then writes another burst and exits.
SCRIPT = r"""
import os, sys, tty
tty.setraw(0)
out = sys.stdout.buffer
out.write(bytes(range(33, 127)) * 2000); out.flush()
for _ in range(3):
    key = os.read(0, 1)
    out.write(key); out.flush()
out.write(b"#" * 300000); out.flush()
"""


async def _child() -> PtyChild:
    env = {"PATH": os.environ["PATH"], "TERM": "dumb"}
    return await spawn_pty([sys.executable, "-c", SCRIPT], cwd="/", env=env)


async def _read(child: PtyChild, size: int) -> bytes:
    got = b""
    with trio.fail_after(20):
        while len(got) < size:
            chunk = await child.read_chunk(65536)
            assert chunk, f"output ended after {len(got)} of {size} bytes"
            got += chunk
    return got


async def test_bulk_then_keys_then_bulk_arrive_whole_and_in_order() -> None:
    child = await _child()
    try:
        first = await _read(child, 94 * 2000)
        assert first == bytes(range(33, 127)) * 2000
        # Keys typed after a burst come back one by one, each as soon as it is echoed, whichever
        # way the reader is reading at that moment.
        for key in b"ab":
            os.write(child.fd, bytes([key]))
            assert await _read(child, 1) == bytes([key])
        os.write(child.fd, b"c")  # the last key, then the second burst right behind it
        assert await _read(child, 1 + 300000) == b"c" + b"#" * 300000
        chunks = 0
        with trio.fail_after(20):
            while await child.read_chunk(65536):  # the end: b"" once the child is gone
                chunks += 1
        assert chunks == 0
    finally:
        child.close()
        await child.wait_exited()
        child.reap()


async def test_a_bulk_read_in_a_thread_gives_way_to_a_cancellation() -> None:
    """A read that went to a worker thread because output came in bulk returns promptly when
    cancelled, though nothing more comes (the child waits for input)."""
    child = await _child()
    try:
        assert await _read(child, 94 * 2000) == bytes(range(33, 127)) * 2000
        child._bulk = True  # as after a bulk read: the next read waits in a worker thread
        with trio.fail_after(2), trio.move_on_after(0.3) as scope:
            await child.read_chunk(65536)  # nothing comes: the child waits for a key
        assert scope.cancelled_caught
        os.write(child.fd, b"z")  # and nothing read was lost to the cancellation
        assert await _read(child, 1) == b"z"
    finally:
        child.close()
        await child.wait_exited()
        child.reap()
