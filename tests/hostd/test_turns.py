"""Turns at writing a connection: one writer at a time, small writes before queued bulk."""

from __future__ import annotations

import trio
import trio.testing

from agentic_sandbox.hostd.turns import URGENT_BYTES, SendTurns


async def test_a_free_turn_is_taken_without_yielding() -> None:
    turns = SendTurns()
    with trio.testing.assert_no_checkpoints():
        await turns.take(10)
    turns.give()
    with trio.testing.assert_no_checkpoints():
        await turns.take(10**6)
    turns.give()


async def test_small_writes_go_before_queued_bulk_each_in_arrival_order() -> None:
    turns = SendTurns()
    await turns.take(100)  # someone is writing
    order: list[str] = []

    async def writer(name: str, size: int) -> None:
        await turns.take(size)
        order.append(name)
        turns.give()

    async with trio.open_nursery() as nursery:
        for name, size in (("bulk1", 65536), ("echo1", 1), ("bulk2", 65536), ("echo2", URGENT_BYTES)):
            nursery.start_soon(writer, name, size)
            await trio.testing.wait_all_tasks_blocked()
        turns.give()
    assert order == ["echo1", "echo2", "bulk1", "bulk2"]


async def test_a_waiter_cancelled_as_it_is_handed_the_turn_passes_it_on() -> None:
    turns = SendTurns()
    await turns.take(1)
    got: list[str] = []

    async def waiter(name: str, scope: trio.CancelScope) -> None:
        with scope:
            await turns.take(1)
            got.append(name)
            turns.give()

    first, second = trio.CancelScope(), trio.CancelScope()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(waiter, "first", first)
        await trio.testing.wait_all_tasks_blocked()
        nursery.start_soon(waiter, "second", second)
        await trio.testing.wait_all_tasks_blocked()
        first.cancel()  # "first" is cancelled, but has not run yet...
        turns.give()  # ...when the turn is handed to it: it must pass it on to "second"
    assert got == ["second"]
    with trio.testing.assert_no_checkpoints():
        await turns.take(1)  # and it is free again afterwards
