"""The freezer parks restartable loops for a handover and lets them go again."""

from __future__ import annotations

import trio

from agentic_sandbox.hostd.freezer import Freezer


async def test_a_frozen_loop_takes_nothing_until_thawed() -> None:
    freezer = Freezer()
    send, receive = trio.open_memory_channel[int](10)
    taken: list[int] = []
    starts = 0

    async def loop() -> None:
        nonlocal starts
        starts += 1
        async for item in receive:
            taken.append(item)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(freezer.run, loop)
        await send.send(1)
        with trio.fail_after(5):
            while taken != [1]:
                await trio.sleep(0.001)
        with trio.fail_after(5):
            await freezer.freeze()
        await send.send(2)
        await trio.sleep(0.05)
        assert taken == [1], "a frozen loop read on"
        freezer.thaw()
        with trio.fail_after(5):
            while taken != [1, 2]:
                await trio.sleep(0.001)
        assert starts == 2  # started again where its state says, not resumed mid-await
        await send.aclose()
    assert taken == [1, 2]


async def test_freeze_waits_for_every_loop_and_holds_reaping() -> None:
    freezer = Freezer()
    stopped = 0

    async def loop() -> None:
        nonlocal stopped
        try:
            await trio.sleep_forever()
        finally:
            stopped += 1

    reaped = trio.Event()

    async def reaper() -> None:
        await trio.sleep(0.02)
        await freezer.thawed()
        reaped.set()

    async with trio.open_nursery() as nursery:
        for _ in range(3):
            nursery.start_soon(freezer.run, loop)
        await trio.sleep(0.01)
        with trio.fail_after(5):
            await freezer.freeze()
        assert stopped == 3
        nursery.start_soon(reaper)
        await trio.sleep(0.1)
        assert not reaped.is_set(), "something reaped during a freeze"
        freezer.thaw()
        with trio.fail_after(5):
            await reaped.wait()
        nursery.cancel_scope.cancel()


async def test_a_loop_that_ends_is_not_run_again_and_freeze_needs_nothing_running() -> None:
    freezer = Freezer()
    runs = 0

    async def loop() -> None:
        nonlocal runs
        runs += 1

    await freezer.run(loop)
    with trio.fail_after(1):
        await freezer.freeze()  # nothing under it: returns at once
    freezer.thaw()
    assert runs == 1
