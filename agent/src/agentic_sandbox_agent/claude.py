"""Claude Code as an agent: ``claude -p`` on the task's text, its stream-json output turned into A2A.

    python -m agentic_sandbox_agent.claude [--claude PATH] [--return-files] [-- EXTRA CLAUDE ARGS]

Runs ``<cli> -p <the task's text> --output-format stream-json --verbose <extra>`` in the current
directory, where ``<cli>`` is ``--claude``, else ``AIWG_CLAUDE_COMMAND`` (split as a shell would),
else ``claude``. What the CLI prints becomes the task's events while it runs, so a client follows
the session live and the raw stream is kept for provenance:

* every stdout line as printed (JSON or not) is appended to the artifact ``claude-stream``: text
  parts of ``application/x-ndjson`` whose concatenation is the stream (a line too long for one
  channel line is cut into several parts; the last part has ``lastChunk``);
* ``system``/``init``: a working status naming the session and the model (``claude.session_id``
  and ``claude.model`` go into the task's metadata);
* an ``assistant`` event: its text blocks joined as a working status; each ``tool_use`` block a
  working status with a data part ``{"kind": "tool_call", "name", "tool_id", "input"}``; thinking
  is skipped;
* a ``tool_result`` block: the artifact ``tool-result-<tool id>`` named ``<tool> result``;
* ``result``: a success completes the task with its text and ``claude.session_id``,
  ``claude.num_turns``, ``claude.duration_ms``, ``claude.total_cost_usd`` and ``claude.usage``;
  anything else fails it, saying how Claude Code ended;
* asked with ``--return-files`` or the request metadata ``{"return_files": true}``: the files that
  the run's Write, Edit, MultiEdit and NotebookEdit calls wrote (and that still exist) are sent as
  artifacts ``file-<n>`` before the task ends (at most 64);
* the CLI not starting, or exiting without a result, fails the task (with the end of its stderr);
  a ``cancel`` stops the CLI's process group (SIGTERM, then SIGKILL after 5 s) and cancels it;
* a CLI still running ``AIWG_CLAUDE_EXIT_GRACE_S`` (10 s) after its result is stopped the same way
  (Claude Code sometimes hangs there, anthropics/claude-code#25629), and its result stands.

The exit status is 0 when the task completed, else 1. Standard library only, like the helper.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import queue
import shlex
import signal
import stat
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Sequence
from types import FrameType
from typing import IO, Any, NoReturn

from . import Channel, ChannelClosed, FollowUp, Refused, State, __version__, connect, data_part, text_part

__all__ = ["ClaudeRun", "main"]

log = logging.getLogger("agentic_sandbox_agent.claude")

#: The agent's name in ``hello``.
AGENT_NAME = "claude-code"
#: The artifact the raw stream is appended to, and its parts' media type.
STREAM_ARTIFACT = "claude-stream"
STREAM_MEDIA_TYPE = "application/x-ndjson"
STREAM_DESCRIPTION = "Claude Code's stream-json output, as printed"
#: Tools whose ``file_path`` (``notebook_path`` for NotebookEdit) is a file the run wrote.
FILE_TOOLS = frozenset(("Write", "Edit", "MultiEdit", "NotebookEdit"))
#: Most files returned.
MAX_FILES = 64
#: The end of the CLI's stderr that is kept, and how much of it a failure quotes.
STDERR_TAIL_BYTES = 64 * 1024
FAILURE_TAIL_CHARS = 2000
#: Seconds between SIGTERM and SIGKILL.
KILL_AFTER_S = 5.0
#: Seconds the CLI may run on after its result (``AIWG_CLAUDE_EXIT_GRACE_S``).
EXIT_GRACE_S = 10.0
#: Seconds the CLI's stdout may stay open once it exited (a process it started holding it).
EOF_GRACE_S = 5.0
#: How often the loop looks at the CLI, the cancel flag and the controller's events.
POLL_S = 0.1
#: Room kept in a channel line for everything around a text or a data part.
ENVELOPE = 4096
#: The controller's default bound on a task's files (``AIWG_AGENT_MAX_FILE_BYTES``).
DEFAULT_MAX_FILE_BYTES = 256 * 1024 * 1024
#: What the ``claude.*`` metadata of the end holds, from the result event.
RESULT_KEYS = ("session_id", "num_turns", "duration_ms", "total_cost_usd", "usage")
TRUNCATED = "\n[truncated here: the whole text is in the claude-stream artifact]"


# --- small pieces -------------------------------------------------------------------------------


def _env_number(name: str, default: float) -> float:
    try:
        return float(os.environ.get(name, "").strip() or default)
    except ValueError:
        return default


def _json_size(value: Any) -> int:
    """Bytes ``value`` takes in a channel line (encoded as the helper encodes)."""
    return len(json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode("utf-8"))


def _pieces(text: str, budget: int) -> list[str]:
    """``text`` whole when its JSON string fits ``budget`` bytes, else cut into pieces that do.

    Escapes and UTF-8 make a character 1 to 6 bytes, so pieces are measured, not counted.
    """
    if _json_size(text) <= budget:
        return [text]
    pieces = []
    start = 0
    while start < len(text):
        count = min(len(text) - start, budget)
        while True:
            size = _json_size(text[start : start + count])
            if size <= budget:
                break
            count = max(1, min(count - 1, count * budget // size))
        pieces.append(text[start : start + count])
        start += count
    return pieces


def _shrink(value: Any, limit: int) -> Any:
    """``value`` with every string longer than ``limit`` characters cut (a Write's whole file, say)."""
    if isinstance(value, str) and len(value) > limit:
        return f"{value[:limit]}[... {len(value) - limit} more characters]"
    if isinstance(value, dict):
        return {key: _shrink(item, limit) for key, item in value.items()}
    if isinstance(value, list):
        return [_shrink(item, limit) for item in value]
    return value


def _reject_constant(name: str) -> NoReturn:
    raise ValueError(f"{name} is not JSON")


def _parse(line: str) -> dict[str, Any] | None:
    """A stream-json event, or None for a line that is not a JSON object (it is still streamed)."""
    stripped = line.strip()
    if not stripped.startswith("{"):
        return None
    try:
        event = json.loads(stripped, parse_constant=_reject_constant)  # NaN could not be sent on
    except ValueError:
        return None
    return event if isinstance(event, dict) else None


def _blocks(event: dict[str, Any]) -> list[dict[str, Any]]:
    """An assistant or user event's content blocks (a plain string content is one text block)."""
    message = event.get("message")
    content = message.get("content") if isinstance(message, dict) else None
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if isinstance(content, list):
        return [block for block in content if isinstance(block, dict)]
    return []


def _content_text(content: Any) -> str:
    """A tool result's content as text: a string as is, a list's text blocks joined by lines."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = [block.get("text") for block in content if isinstance(block, dict) and block.get("type") == "text"]
        return "\n".join(text for text in texts if isinstance(text, str))
    return json.dumps(content, ensure_ascii=False)


def _failure_text(result: dict[str, Any]) -> str:
    """Why a result is not a success: its subtype and its text (or its errors, or its turns)."""
    subtype = str(result.get("subtype") or "no subtype")
    # "success" with is_error (an API or auth error ends this way): "ended with success" misleads.
    head = "Claude Code ended with an error" if subtype == "success" else f"Claude Code ended with {subtype}"
    text = result.get("result")
    if not isinstance(text, str) or not text:
        errors = result.get("errors")
        text = "; ".join(str(error) for error in errors) if isinstance(errors, list) else ""
    if text:
        return f"{head}: {text}"
    turns = result.get("num_turns")
    return f"{head} after {turns} turns" if isinstance(turns, int) else head


def _asked_for_files(metadata: Any) -> bool:
    """The request metadata's ``return_files``: true (or a string saying so)."""
    value = metadata.get("return_files") if isinstance(metadata, dict) else None
    return value is True or (isinstance(value, str) and value.strip().lower() in ("true", "yes", "1"))


def _prompt_arg(prompt: str) -> str:
    """The prompt as an argument the CLI cannot take for an option: a leading "-" gets a space."""
    return " " + prompt if prompt.startswith("-") else prompt


def _read_lines(stream: IO[bytes], lines: queue.Queue[bytes | None]) -> None:
    """The stdout thread: each line (bytes, with its newline) into ``lines``, then None at EOF."""
    try:
        for raw in iter(stream.readline, b""):
            lines.put(raw)
    except (OSError, ValueError):
        pass
    finally:
        lines.put(None)


# --- the run ------------------------------------------------------------------------------------


class ClaudeRun:
    """One run of the CLI for the channel's task, and what its stream told so far."""

    def __init__(
        self, channel: Channel, cli: Sequence[str], extra: Sequence[str] = (), *, return_files: bool = False
    ) -> None:
        self.channel = channel
        self.cli = list(cli)
        self.extra = list(extra)
        self.return_files = return_files or _asked_for_files(channel.task.metadata)
        self.cwd = os.getcwd()
        #: Bytes a text or data part may take in one channel line.
        self.budget = max(channel.max_line - ENVELOPE, 1024)
        self.exit_grace_s = _env_number("AIWG_CLAUDE_EXIT_GRACE_S", EXIT_GRACE_S)
        self.proc: subprocess.Popen[bytes] | None = None
        #: The last ``result`` event, once one came.
        self.result: dict[str, Any] | None = None
        self.tool_names: dict[str, str] = {}
        #: Files the run wrote, in first-written order: path -> [calls, calls whose result was an error].
        self.writes: dict[str, list[int]] = {}
        self._file_of_tool: dict[str, str] = {}
        self._result_at: float | None = None
        self._stream_started = False
        self._held: str | None = None
        self._stopping = False
        self._stderr_tail = bytearray()
        self._stderr_lock = threading.Lock()
        self._stderr_thread: threading.Thread | None = None

    def run(self) -> int:
        """Run the CLI to its end and end the task; the exit status (0: completed)."""
        prompt = self.channel.task.text()
        if not prompt.strip():
            return self._end(State.FAILED, "the task has no text to give Claude Code as its prompt")
        if self.channel.canceled.is_set():
            return self._end(State.CANCELED, self.channel.cancel_reason or None)
        argv = [*self.cli, "-p", _prompt_arg(prompt), "--output-format", "stream-json", "--verbose", *self.extra]
        try:
            self.proc = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,  # its own process group: a cancel stops its children too
            )
        except (OSError, ValueError) as exc:  # ValueError: a NUL in the prompt
            return self._end(State.FAILED, f"cannot start Claude Code ({shlex.join(self.cli)}): {exc}")
        log.info("started Claude Code, pid %d: %s", self.proc.pid, shlex.join(self.cli))
        try:
            self._pump()
            code = self.proc.wait()
        finally:
            if self.proc.poll() is None:  # the adapter is failing: the CLI goes with it
                self._stop("the adapter is ending")
        return self._finish(code)

    # --- reading the CLI

    def _pump(self) -> None:
        """Handle stdout's lines as they come, until EOF; stop the CLI on a cancel or a hang."""
        proc = self.proc
        assert proc is not None and proc.stdout is not None and proc.stderr is not None
        lines: queue.Queue[bytes | None] = queue.Queue(maxsize=256)  # full: the CLI waits on its writes
        threading.Thread(target=_read_lines, args=(proc.stdout, lines), name="claude-stdout", daemon=True).start()
        self._stderr_thread = threading.Thread(
            target=self._read_stderr, args=(proc.stderr,), name="claude-stderr", daemon=True
        )
        self._stderr_thread.start()
        exited_at: float | None = None
        swept = False
        while True:
            self._drain_events()
            if self.channel.canceled.is_set() and not self._stopping:
                self._stop("the task was canceled")
            try:
                raw = lines.get(timeout=POLL_S)
            except queue.Empty:
                now = time.monotonic()
                if (
                    self._result_at is not None
                    and not self._stopping
                    and proc.poll() is None
                    and now - self._result_at > self.exit_grace_s
                ):
                    self._stop(f"it still runs {self.exit_grace_s:g} s after its result")
                if proc.poll() is not None:
                    if exited_at is None:
                        exited_at = now
                    elif now - exited_at > EOF_GRACE_S:
                        if swept:
                            log.warning("Claude Code's stdout stays open after its exit: no more of it is read")
                            return
                        log.warning("Claude Code exited and its stdout stays open: SIGKILL to its process group")
                        self._signal(signal.SIGKILL)
                        swept, exited_at = True, now
                continue
            if raw is None:
                return
            self._line(raw)

    def _read_stderr(self, stream: IO[bytes]) -> None:
        """The stderr thread: passed on to the agent's logs, its last 64 KiB kept for a failure."""
        out = getattr(sys.stderr, "buffer", None)
        while True:
            try:
                chunk = os.read(stream.fileno(), 65536)
            except (OSError, ValueError):
                return
            if not chunk:
                return
            with self._stderr_lock:
                self._stderr_tail += chunk
                del self._stderr_tail[:-STDERR_TAIL_BYTES]
            if out is not None:
                try:
                    out.write(chunk)
                    out.flush()
                except (OSError, ValueError):
                    out = None

    def _stderr_text(self) -> str:
        with self._stderr_lock:
            tail = bytes(self._stderr_tail)
        return tail.decode("utf-8", "replace")[-FAILURE_TAIL_CHARS:].strip()

    def _drain_events(self) -> None:
        """The controller's events besides cancel (which sets a flag): logged, nothing more."""
        while True:
            try:
                event = self.channel.next_event(0)
            except ChannelClosed:
                return
            if event is None:
                return
            if isinstance(event, Refused):
                log.warning("the controller refused a %s line: %s", event.event, event.error)
            elif isinstance(event, FollowUp):
                log.warning("a follow-up message is ignored: claude -p answers one prompt")

    def _line(self, raw: bytes) -> None:
        """One stdout line: onto the claude-stream artifact, then into the task's events."""
        text = raw.decode("utf-8", "replace")
        if self._held is not None:
            self._stream(self._held, last=False)
            self._held = None
        event = _parse(text)
        if self.result is not None or (event is not None and event.get("type") == "result"):
            # The result is the stream's last line (as is any after it, until another comes): it
            # waits for EOF, so that it closes the artifact with lastChunk.
            self._held = text
        else:
            self._stream(text, last=False)
        if event is not None and not self.channel.canceled.is_set():
            self._project(event)

    def _stream(self, text: str, *, last: bool) -> None:
        """Append ``text`` to claude-stream (the first line creates it), cut where it must be."""
        pieces = _pieces(text, self.budget)
        for index, piece in enumerate(pieces):
            first = not self._stream_started
            self.channel.artifact(
                STREAM_ARTIFACT,
                [text_part(piece, media_type=STREAM_MEDIA_TYPE)],
                name=STREAM_ARTIFACT if first else None,
                description=STREAM_DESCRIPTION if first else None,
                append=not first,
                last_chunk=last and index == len(pieces) - 1,
            )
            self._stream_started = True

    def _close_stream(self) -> None:
        if self._held is not None:
            self._stream(self._held, last=True)
            self._held = None
        elif self._stream_started:  # no result line to close it: an empty last part does
            self._stream("", last=True)

    # --- the projection

    def _project(self, event: dict[str, Any]) -> None:
        kind = event.get("type")
        if kind == "system" and event.get("subtype") == "init":
            self._init(event)
        elif kind == "assistant":
            self._assistant(event)
        elif kind == "user":
            self._tool_results(event)
        elif kind == "result":
            self.result = event
            self._result_at = time.monotonic()

    def _init(self, event: dict[str, Any]) -> None:
        session, model = event.get("session_id"), event.get("model")
        metadata = {key: value for key, value in (("claude.session_id", session), ("claude.model", model)) if value}
        text = f"Claude Code session {session or '(no id)'} started (model {model or 'unknown'})"
        self.channel.status(State.WORKING, text=text, metadata=metadata or None)

    def _assistant(self, event: dict[str, Any]) -> None:
        blocks = _blocks(event)
        texts = [str(block["text"]) for block in blocks if block.get("type") == "text" and block.get("text")]
        if texts:
            self._say(text_part(self._clip("\n\n".join(texts))))
        for block in blocks:
            if block.get("type") == "tool_use":
                self._tool_call(block)

    def _say(self, part: dict[str, Any]) -> None:
        self.channel.status(State.WORKING, message={"parts": [part]})

    def _tool_call(self, block: dict[str, Any]) -> None:
        tool_id = str(block.get("id") or "")
        name = str(block.get("name") or "")
        tool_input = block.get("input", {})
        if tool_id:
            self.tool_names[tool_id] = name
        if name in FILE_TOOLS and isinstance(tool_input, dict):
            self._wrote(tool_id, tool_input)
        call = {"kind": "tool_call", "name": name, "tool_id": tool_id, "input": tool_input}
        if _json_size(call) > self.budget:  # a Write of a large file, say: its strings are cut
            for limit in (65536, 4096, 256):
                smaller = dict(call, input=_shrink(tool_input, limit), truncated=True)
                if _json_size(smaller) <= self.budget:
                    call = smaller
                    break
            else:
                call = dict(call, input=None, truncated=True)
        self._say(data_part(call))

    def _wrote(self, tool_id: str, tool_input: dict[str, Any]) -> None:
        path = tool_input.get("file_path") or tool_input.get("notebook_path")
        if not isinstance(path, str) or not path:
            return
        path = os.path.normpath(os.path.join(self.cwd, path))
        self.writes.setdefault(path, [0, 0])[0] += 1
        if tool_id:
            self._file_of_tool[tool_id] = path

    def _tool_results(self, event: dict[str, Any]) -> None:
        for block in _blocks(event):
            if block.get("type") != "tool_result":
                continue
            tool_id = str(block.get("tool_use_id") or "")
            is_error = bool(block.get("is_error"))
            if is_error and tool_id in self._file_of_tool:
                self.writes[self._file_of_tool[tool_id]][1] += 1
            self._tool_result(tool_id, self.tool_names.get(tool_id), _content_text(block.get("content")), is_error)

    def _tool_result(self, tool_id: str, name: str | None, text: str, is_error: bool) -> None:
        artifact_id = f"tool-result-{tool_id or uuid.uuid4().hex}"[:256]
        pieces = _pieces(text, self.budget)
        for index, piece in enumerate(pieces):
            first = index == 0
            self.channel.artifact(
                artifact_id,
                [text_part(piece)],
                name=f"{name or 'tool'} result"[:1024] if first else None,
                metadata={"tool_id": tool_id, "tool_name": name, "is_error": is_error} if first else None,
                append=not first,
                last_chunk=index == len(pieces) - 1,
            )

    def _clip(self, text: str) -> str:
        """A text that fits one status line (the stream keeps the whole of it)."""
        if _json_size(text) <= self.budget:
            return text
        return _pieces(text, self.budget - _json_size(TRUNCATED))[0] + TRUNCATED

    # --- the end

    def _finish(self, code: int) -> int:
        self._close_stream()
        if self._stderr_thread is not None:
            self._stderr_thread.join(EOF_GRACE_S)
        if self.channel.canceled.is_set():
            return self._end(State.CANCELED, self.channel.cancel_reason or None)
        if self.return_files:
            self._send_files()
        result = self.result
        if result is None:
            return self._end(State.FAILED, self._exit_text(code))
        if code != 0:
            log.info("Claude Code exited with status %d after its result; the result decides", code)
        metadata = {f"claude.{key}": result[key] for key in RESULT_KEYS if key in result} or None
        if result.get("subtype") == "success" and not result.get("is_error"):
            text = result.get("result")
            return self._end(State.COMPLETED, self._clip(text) if isinstance(text, str) and text else None, metadata)
        return self._end(State.FAILED, self._clip(_failure_text(result)), metadata)

    def _exit_text(self, code: int) -> str:
        text = f"Claude Code exited with status {code}"
        if code < 0:
            try:
                text += f" (killed by {signal.Signals(-code).name})"
            except ValueError:
                text += f" (killed by signal {-code})"
        text += " without a result"
        tail = self._stderr_text()
        return self._clip(f"{text}; its stderr ends with:\n{tail}" if tail else f"{text} (and no stderr)")

    def _end(self, state: str, text: str | None, metadata: dict[str, Any] | None = None) -> int:
        self.channel.status(state, text=text, metadata=metadata)
        return 0 if state == State.COMPLETED else 1

    def _send_files(self) -> None:
        """The files the run wrote, as ``file-<n>`` artifacts: once each, in first-written order."""
        candidates = []
        for path, (calls, failed) in self.writes.items():
            if failed >= calls:
                log.info("not returning %s: every call that was to write it failed", path)
            else:
                candidates.append(path)
        if len(candidates) > MAX_FILES:
            log.warning("the run wrote %d files: the first %d are returned", len(candidates), MAX_FILES)
            del candidates[MAX_FILES:]
        limit = int(_env_number("AIWG_AGENT_MAX_FILE_BYTES", DEFAULT_MAX_FILE_BYTES))
        total = sent = 0
        for path in candidates:
            try:
                info = os.stat(path)
                if not stat.S_ISREG(info.st_mode):  # a FIFO would block, a directory cannot be sent
                    log.warning("not returning %s: not a regular file", path)
                    continue
                if total + info.st_size > limit:  # past it, the controller would fail the task
                    log.warning("not returning %s: the files would add up to more than %d bytes", path, limit)
                    continue
                file = open(path, "rb")  # noqa: SIM115 (a file object: its open fails before any send)
            except OSError as exc:
                log.warning("not returning %s: %s", path, exc.strerror or exc)
                continue
            with file:
                sent += 1
                try:
                    self.channel.send_file(
                        file, os.path.basename(path), artifact_id=f"file-{sent}", metadata={"path": path}
                    )
                except ChannelClosed:
                    raise
                except OSError as exc:  # read while being sent: the artifact stays unfinished
                    log.warning("returning %s failed: %s", path, exc)
            total += info.st_size

    def _stop(self, why: str) -> None:
        """SIGTERM the CLI's process group; SIGKILL after KILL_AFTER_S; return once it exited."""
        self._stopping = True
        proc = self.proc
        if proc is None or proc.poll() is not None:
            return
        log.info("stopping Claude Code (%s): SIGTERM to its process group", why)
        self._signal(signal.SIGTERM)
        try:
            proc.wait(KILL_AFTER_S)
        except subprocess.TimeoutExpired:
            log.warning("Claude Code still runs %g s after SIGTERM: SIGKILL to its process group", KILL_AFTER_S)
            self._signal(signal.SIGKILL)
            proc.wait()

    def _signal(self, signum: int) -> None:
        proc = self.proc
        if proc is None:
            return
        try:
            os.killpg(proc.pid, signum)  # start_new_session: its pgid is its pid
        except ProcessLookupError:
            pass
        except OSError:
            if proc.poll() is None:
                proc.send_signal(signum)


# --- the command --------------------------------------------------------------------------------


def _cli(path: str | None) -> list[str]:
    """The command that runs Claude Code: ``--claude``, else ``AIWG_CLAUDE_COMMAND``, else ``claude``."""
    if path:
        return [path]
    command = os.environ.get("AIWG_CLAUDE_COMMAND", "").strip()
    return shlex.split(command) if command else ["claude"]


def _parse_args(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    extra: list[str] = []
    if "--" in argv:
        at = argv.index("--")
        argv, extra = argv[:at], argv[at + 1 :]
    parser = argparse.ArgumentParser(
        prog="python -m agentic_sandbox_agent.claude",
        description="Run Claude Code (claude -p) on the task's text, its stream-json output as the task's events.",
        epilog="Arguments after -- are passed on to Claude Code.",
    )
    parser.add_argument("--claude", metavar="PATH", help="the claude CLI (default: $AIWG_CLAUDE_COMMAND, or claude)")
    parser.add_argument(
        "--return-files",
        action="store_true",
        help='send the files the run wrote as artifacts (also: request metadata {"return_files": true})',
    )
    return parser.parse_args(argv), extra


def _exit_on_sigterm(signum: int, frame: FrameType | None) -> NoReturn:
    raise SystemExit(128 + signum)  # unwinds through ClaudeRun.run, which stops the CLI


def main(argv: Sequence[str] | None = None) -> int:
    """The command: 0 when the task completed, 1 otherwise."""
    args, extra = _parse_args(list(sys.argv[1:] if argv is None else argv))
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s")
    channel = connect(AGENT_NAME, __version__)
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, _exit_on_sigterm)
    try:
        try:
            cli = _cli(args.claude)
        except ValueError as exc:  # unbalanced quotes
            channel.fail(f"cannot start Claude Code ({os.environ.get('AIWG_CLAUDE_COMMAND')}): {exc}")
            return 1
        return ClaudeRun(channel, cli, extra, return_files=args.return_files).run()
    except Exception as exc:
        log.exception("the Claude Code adapter failed")
        if not channel.ended:
            try:
                channel.fail(f"the Claude Code adapter failed: {type(exc).__name__}: {exc}")
            except (OSError, ValueError):
                pass
        return 1
    finally:
        channel.close()


if __name__ == "__main__":
    sys.exit(main())
