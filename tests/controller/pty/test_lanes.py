"""A socket's send lanes (pty.lanes): control frames go first and never wait; output waits for
room; a client that reads nothing overflows the control lane instead of holding a broadcaster."""

from __future__ import annotations

import trio
import trio.testing

from agentic_sandbox.controller.pty.lanes import CONTROL_ITEMS, OUTPUT_ITEMS, Outbox


async def test_control_first_output_bounded() -> None:
    box = Outbox()
    for i in range(OUTPUT_ITEMS):
        await box.put_output(f"out{i}")
    blocked = trio.Event()

    async def one_more() -> None:
        await box.put_output("late")
        blocked.set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(one_more)
        await trio.testing.wait_all_tasks_blocked()
        assert not blocked.is_set()  # full: the producer waits
        assert box.put_control("ctl")
        assert await box.get() == "ctl"  # control overtakes output
        assert await box.get() == "out0"
        await blocked.wait()
    assert [await box.get() for _ in range(OUTPUT_ITEMS)][-1] == "late"


async def test_control_overflow() -> None:
    box = Outbox()
    for i in range(CONTROL_ITEMS):
        assert box.put_control(str(i))
    assert not box.put_control("one too many")
    assert box.overflowed
    assert await box.get() is None
