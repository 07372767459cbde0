"""A session's screen for keyframes: pyte fed lazily, rendered as ``vt100-screen-state-v1``.

Output arrives with every chunk (:meth:`Screen.add`) but is only kept: feeding pyte costs Python
work per byte, so it happens when a keyframe is wanted (:meth:`Screen.snapshot`), at most on the
last :data:`TAIL_BYTES` that arrived since the previous one. When more than that piled up (a flood)
or output was lost (a lag), the screen starts over from that tail, so a keyframe after a flood is
the screen the tail draws (for line output: the screen exactly; a full-screen program redraws
within it soon enough). That keeps a flooding session's keyframe cost bounded per keyframe.

The feeding and rendering run in a worker thread (one snapshot of a screen at a time): a 32 KiB
tail costs pyte about 0.1 s, which on the controller's event loop would hold every socket up that
long. Everything the event loop does here (:meth:`~Screen.add`, :meth:`~Screen.lost`,
:meth:`~Screen.resize`) only records, in order, what the next snapshot is to apply; only the
snapshot's thread touches pyte.

``vt100-screen-state-v1`` is a byte string a VT100-compatible terminal paints the screen from:
reset attributes, home and clear, every row with its SGR attributes, then the cursor position.
"""

from __future__ import annotations

from collections import deque
from typing import NamedTuple

import pyte
import trio

#: Output kept for the next keyframe; older bytes since the previous keyframe are dropped. pyte
#: takes about 4 s per MiB here: 32 KiB (several full screens of text, a full-screen program's
#: repaint) costs about 0.1 s of a worker thread a keyframe.
TAIL_BYTES = 32 * 1024

_COLOURS = {
    "black": 0,
    "red": 1,
    "green": 2,
    "brown": 3,
    "yellow": 3,
    "blue": 4,
    "magenta": 5,
    "cyan": 6,
    "white": 7,
}


def _colour(name: str, base: int) -> str | None:
    """The SGR parameter for a pyte colour (``base`` 30 for fg, 40 for bg); None for the default."""
    if name == "default":
        return None
    if name in _COLOURS:
        return str(base + _COLOURS[name])
    bright = name.removeprefix("bright")
    if bright != name and bright in _COLOURS:
        return str(base + 60 + _COLOURS[bright])
    if len(name) == 6:
        try:
            r, g, b = int(name[0:2], 16), int(name[2:4], 16), int(name[4:6], 16)
        except ValueError:
            return None
        return f"{base + 8};2;{r};{g};{b}"
    return None


def _sgr(char: pyte.screens.Char) -> str:
    params = ["0"]
    if char.bold:
        params.append("1")
    if char.italics:
        params.append("3")
    if char.underscore:
        params.append("4")
    if char.blink:
        params.append("5")
    if char.reverse:
        params.append("7")
    if char.strikethrough:
        params.append("9")
    for value in (_colour(char.fg, 30), _colour(char.bg, 40)):
        if value is not None:
            params.append(value)
    return "\x1b[" + ";".join(params) + "m"


class Snapshot(NamedTuple):
    data: bytes
    cols: int
    rows: int
    #: The last sequence it shows.
    anchor: int


class Screen:
    def __init__(self, cols: int, rows: int) -> None:
        self._screen = pyte.Screen(cols, rows)
        self._stream = pyte.ByteStream(self._screen)
        #: In arrival order: output chunks (no copying per chunk) and ``(cols, rows)`` resizes; whole
        #: old items drop off past TAIL_BYTES of output.
        self._pending: deque[bytes | tuple[int, int]] = deque()
        self._pending_bytes = 0
        self._restart = False
        #: The size to start over at (a resize dropped off the front, or the size at a loss).
        self._base: tuple[int, int] | None = None
        #: The size the screen has after everything added.
        self.size = (cols, rows)
        #: The last sequence added (what a snapshot shows the screen after).
        self.anchor = 0
        self._rendering = trio.Lock()

    def add(self, seq: int, data: bytes) -> None:
        self._pending.append(data)
        self._pending_bytes += len(data)
        while self._pending_bytes - self._first_len() >= TAIL_BYTES:
            item = self._pending.popleft()
            if isinstance(item, tuple):
                self._base = item
            else:
                self._pending_bytes -= len(item)
                self._restart = True
        self.anchor = seq

    def _first_len(self) -> int:
        first = self._pending[0]
        return 0 if isinstance(first, tuple) else len(first)

    def lost(self, resume_seq: int) -> None:
        """Output up to ``resume_seq - 1`` will never arrive: start over from what comes next."""
        self._pending.clear()
        self._pending_bytes = 0
        self._restart = True
        self._base = self.size
        self.anchor = max(self.anchor, resume_seq - 1)

    def resize(self, cols: int, rows: int) -> None:
        self.size = (cols, rows)
        self._pending.append((cols, rows))

    async def snapshot(self) -> Snapshot:
        """The screen after everything added so far (rendered in a worker thread)."""
        async with self._rendering:
            items = list(self._pending)
            self._pending.clear()
            self._pending_bytes = 0
            restart, self._restart = self._restart, False
            base, self._base = self._base, None
            (cols, rows), anchor = self.size, self.anchor
            data = await trio.to_thread.run_sync(self._render, items, restart, base)
        return Snapshot(data, cols, rows, anchor)

    def _render(self, items: list[bytes | tuple[int, int]], restart: bool, base: tuple[int, int] | None) -> bytes:
        """In the worker thread: apply what was recorded, in order, then render."""
        if restart:
            self._screen.reset()
        if base is not None:
            self._screen.resize(base[1], base[0])
        run: list[bytes] = []
        for item in items:
            if isinstance(item, tuple):
                if run:
                    self._stream.feed(b"".join(run))
                    run.clear()
                self._screen.resize(item[1], item[0])
            else:
                run.append(item)
        if run:
            self._stream.feed(b"".join(run))
        screen = self._screen
        rows = []
        for y in range(screen.lines):
            line = screen.buffer[y]
            parts: list[str] = []
            last_sgr = ""
            # Trailing blanks with default attributes are left out (the clear painted them).
            end = screen.columns
            while end > 0 and line[end - 1].data == " " and _sgr(line[end - 1]) == "\x1b[0m":
                end -= 1
            for x in range(end):
                char = line[x]
                sgr = _sgr(char)
                if sgr != last_sgr:
                    parts.append(sgr)
                    last_sgr = sgr
                parts.append(char.data)
            if last_sgr not in ("", "\x1b[0m"):
                parts.append("\x1b[0m")
            rows.append("".join(parts))
        cursor = screen.cursor
        text = "\x1b[0m\x1b[H\x1b[2J" + "\r\n".join(rows) + f"\x1b[{cursor.y + 1};{cursor.x + 1}H"
        if cursor.hidden:
            text += "\x1b[?25l"
        return text.encode("utf-8", "replace")
