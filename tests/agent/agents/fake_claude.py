"""A stand-in for the ``claude`` CLI: replays a recorded stream-json transcript.

The real CLI needs credentials and the network; the adapter's tests point ``AIWG_CLAUDE_COMMAND``
at ``python fake_claude.py`` instead. It checks that it was called as the adapter must call
Claude Code (``-p <prompt> --output-format stream-json --verbose [extra...]``: exit 2 otherwise),
then writes the transcript's lines to stdout byte for byte, doing what the recorded ``Write``
tool calls did (``input.content`` to ``input.file_path``, under the current directory) so the
adapter finds the files.

Environment:

* ``FAKE_CLAUDE_TRANSCRIPT``: the transcript (.jsonl) to replay (required);
* ``FAKE_CLAUDE_DELAY``: seconds to sleep before each line (default 0);
* ``FAKE_CLAUDE_EXIT``: the exit status once replayed (default 0);
* ``FAKE_CLAUDE_LINGER``: seconds to stay alive after the last line (the real CLI sometimes does);
* ``FAKE_CLAUDE_ARGV``: a file to write the arguments to (JSON), for the test to check;
* ``FAKE_CLAUDE_TERM_MARKER``: a file written when SIGTERM arrives (the fake then exits 143).
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from types import FrameType
from typing import Any

EXPECTED = ["--output-format", "stream-json", "--verbose"]


def on_term(signum: int, frame: FrameType | None) -> None:
    marker = os.environ.get("FAKE_CLAUDE_TERM_MARKER")
    if marker:
        with open(marker, "w") as file:
            file.write(f"SIGTERM to pid {os.getpid()} in process group {os.getpgrp()}\n")
    sys.stderr.write("fake claude: terminated\n")
    sys.stderr.flush()
    os._exit(143)


def perform(line: bytes) -> None:
    """Do what a replayed Write tool call did: write its content to its file_path."""
    try:
        event: Any = json.loads(line)
    except ValueError:
        return
    if not isinstance(event, dict) or event.get("type") != "assistant":
        return
    for block in (event.get("message") or {}).get("content") or []:
        if isinstance(block, dict) and block.get("type") == "tool_use" and block.get("name") == "Write":
            tool_input = block.get("input") or {}
            path = tool_input["file_path"]
            os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
            with open(path, "w", encoding="utf-8") as file:
                file.write(tool_input["content"])


def main(argv: list[str]) -> int:
    signal.signal(signal.SIGTERM, on_term)
    argv_file = os.environ.get("FAKE_CLAUDE_ARGV")
    if argv_file:
        with open(argv_file, "w") as file:
            json.dump(argv, file)
    if len(argv) < 5 or argv[0] != "-p" or argv[2:5] != EXPECTED:
        sys.stderr.write(f"fake claude: expected -p <prompt> {' '.join(EXPECTED)} [extra...], got {argv!r}\n")
        return 2
    delay = float(os.environ.get("FAKE_CLAUDE_DELAY") or 0)
    sys.stderr.write(f"fake claude: replaying {os.path.basename(os.environ['FAKE_CLAUDE_TRANSCRIPT'])}\n")
    sys.stderr.flush()
    with open(os.environ["FAKE_CLAUDE_TRANSCRIPT"], "rb") as transcript:
        for line in transcript:
            if delay:
                time.sleep(delay)
            sys.stdout.buffer.write(line)
            sys.stdout.buffer.flush()
            perform(line)
    sys.stderr.write("fake claude: the transcript is over\n")
    sys.stderr.flush()
    time.sleep(float(os.environ.get("FAKE_CLAUDE_LINGER") or 0))
    return int(os.environ.get("FAKE_CLAUDE_EXIT") or 0)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
