"""The keyframe screen: what pyte draws, rendered so that a terminal (here: pyte again) draws the same."""

from __future__ import annotations

import pyte
import trio

from agentic_sandbox.controller.pty.screen import TAIL_BYTES, Screen


def repaint(snapshot: bytes, cols: int, rows: int) -> pyte.Screen:
    screen = pyte.Screen(cols, rows)
    pyte.ByteStream(screen).feed(snapshot)
    return screen


async def test_snapshot_redraws_text_attributes_and_cursor() -> None:
    screen = Screen(30, 5)
    screen.add(1, b"plain \x1b[1;31mbold red\x1b[0m\r\n")
    screen.add(2, b"\x1b[4;3H\x1b[7mrev\x1b[0m")
    assert screen.anchor == 2
    again = repaint((await screen.snapshot()).data, 30, 5)
    assert again.display[0].rstrip() == "plain bold red"
    assert again.buffer[0][6].bold and again.buffer[0][6].fg == "red"
    assert not again.buffer[0][0].bold
    assert again.display[3][2:5] == "rev" and again.buffer[3][2].reverse
    assert (again.cursor.x, again.cursor.y) == (5, 3)


async def test_a_flood_keeps_only_the_tail() -> None:
    screen = Screen(20, 3)
    for seq in range(1, 2001):
        screen.add(seq, f"line {seq:06d}\r\n".encode() * 20)
    assert screen.anchor == 2000
    again = repaint((await screen.snapshot()).data, 20, 3)
    assert again.display[1].rstrip() == "line 002000"
    assert TAIL_BYTES < 2000 * 20 * 13


async def test_lost_output_starts_over_and_resize() -> None:
    screen = Screen(20, 3)
    screen.add(1, b"before")
    screen.lost(resume_seq=10)
    assert screen.anchor == 9
    screen.add(10, b"after")
    assert repaint((await screen.snapshot()).data, 20, 3).display[0].rstrip() == "after"
    screen.resize(40, 6)
    assert screen.size == (40, 6)
    assert repaint((await screen.snapshot()).data, 40, 6).display[0].rstrip() == "after"


async def test_resizes_apply_in_order_with_the_output_around_them() -> None:
    screen = Screen(10, 3)
    screen.add(1, b"0123456789abc")  # wraps at 10 columns
    screen.resize(20, 3)
    screen.add(2, b"\r\nwide line of 18ch")
    snap = await screen.snapshot()
    assert (snap.cols, snap.rows, snap.anchor) == (20, 3, 2)
    again = repaint(snap.data, 20, 3)
    assert again.display[0].rstrip() == "0123456789"
    assert again.display[1].rstrip() == "abc"
    assert again.display[2].rstrip() == "wide line of 18ch"
    # A resize that a flood pushed off the front still sets the size the tail is drawn at.
    screen.resize(12, 4)
    for seq in range(3, 3000):
        screen.add(seq, b"%011d\r\n" % seq)
    snap = await screen.snapshot()
    assert (snap.cols, snap.rows) == (12, 4)
    assert repaint(snap.data, 12, 4).display[2].rstrip() == "00000002999"


async def test_the_event_loop_goes_on_while_a_keyframe_renders() -> None:
    screen = Screen(80, 24)
    for seq in range(1, 200):
        screen.add(seq, b"x" * 1000)  # a tail of text without newlines: pyte's slowest case
    ticks = 0

    async def ticker() -> None:
        nonlocal ticks
        while True:
            await trio.sleep(0.005)
            ticks += 1

    async with trio.open_nursery() as nursery:
        nursery.start_soon(ticker)
        await screen.snapshot()  # pyte needs about 0.1 s for that tail
        nursery.cancel_scope.cancel()
    assert ticks >= 2  # the loop kept ticking meanwhile (on the loop itself pyte would allow none)
