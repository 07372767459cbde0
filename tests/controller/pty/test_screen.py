"""The keyframe screen: what pyte draws, rendered so that a terminal (here: pyte again) draws the same."""

from __future__ import annotations

import pyte

from controller.pty.screen import TAIL_BYTES, Screen


def repaint(snapshot: bytes, cols: int, rows: int) -> pyte.Screen:
    screen = pyte.Screen(cols, rows)
    pyte.ByteStream(screen).feed(snapshot)
    return screen


def test_snapshot_redraws_text_attributes_and_cursor() -> None:
    screen = Screen(30, 5)
    screen.add(1, b"plain \x1b[1;31mbold red\x1b[0m\r\n")
    screen.add(2, b"\x1b[4;3H\x1b[7mrev\x1b[0m")
    assert screen.anchor == 2
    again = repaint(screen.snapshot(), 30, 5)
    assert again.display[0].rstrip() == "plain bold red"
    assert again.buffer[0][6].bold and again.buffer[0][6].fg == "red"
    assert not again.buffer[0][0].bold
    assert again.display[3][2:5] == "rev" and again.buffer[3][2].reverse
    assert (again.cursor.x, again.cursor.y) == (5, 3)


def test_a_flood_keeps_only_the_tail() -> None:
    screen = Screen(20, 3)
    for seq in range(1, 2001):
        screen.add(seq, f"line {seq:06d}\r\n".encode() * 20)
    assert screen.anchor == 2000
    again = repaint(screen.snapshot(), 20, 3)
    assert again.display[1].rstrip() == "line 002000"
    assert TAIL_BYTES < 2000 * 20 * 13


def test_lost_output_starts_over_and_resize() -> None:
    screen = Screen(20, 3)
    screen.add(1, b"before")
    screen.lost(resume_seq=10)
    assert screen.anchor == 9
    screen.add(10, b"after")
    assert repaint(screen.snapshot(), 20, 3).display[0].rstrip() == "after"
    screen.resize(40, 6)
    assert screen.size == (40, 6)
    assert repaint(screen.snapshot(), 40, 6).display[0].rstrip() == "after"
