"""Write agents for agentic-sandbox instances: the agent's side of the control channel, version 2.

Standard library only (Python 3.9+), so it installs into any agent image without pulling anything
in. The protocol is docs/agent-protocol.md; this module speaks it so an agent does not have to::

    import agentic_sandbox_agent as agent

    ch = agent.connect(name="upper", version="1")      # hello, then the task
    ch.status(text="working on it")
    ch.send_text(ch.task.text().upper(), name="answer")
    ch.send_file("report.pdf")                         # streamed in chunks, any size
    answer = ch.ask("Deploy?", {"type": "object", "properties": {"ok": {"type": "boolean"}}})
    ch.complete("done")

or ``agent.run(main)``, which connects, calls ``main(channel)``, completes the task when ``main``
returns, fails it naming the exception when ``main`` raises, and exits.

Where the channel is found: ``AIWG_CONTROL_FD`` (an inherited Unix stream socket's fd number), else
``AIWG_CONTROL_SOCKET`` (a socket path to connect to); :func:`connect` takes both out of the
environment and keeps the fd from the agent's children. Which protocol: ``AIWG_AGENT_PROTOCOL``
(absent means version 1). The three modes, in :attr:`Channel.protocol`:

* **2** (a channel, and a controller speaking version 2): ``hello`` is sent, the ``task`` line is
  read, and every send is a line on the channel; stdout and stderr are only logs.
* **1** (a channel, version 1 only): no hello; the task is built from the environment and stdin as
  in mode 0; ``status(text=...)`` in ``TASK_STATE_WORKING``, ``ask`` and follow-up events use the
  channel, everything else is written as in mode 0.
* **0** (no channel: a VM, or an agent started by hand): the task is built from ``AIWG_TASK_ID``,
  ``AIWG_CONTEXT_ID`` and stdin's text (one text part; stdin is read to its end, so type Ctrl-D
  by hand). What the task produces goes to **stdout**, which the runtime makes the ``stdout``
  artifact: artifact parts (text as is, ``data`` as a JSON line, ``raw`` and files as their bytes,
  ``url`` as a line), ``reply`` and ``complete`` texts. Progress and failure texts (``status`` in a
  non-terminal state, ``fail``, ``reject``) go to **stderr**. The exit status decides the task:
  :attr:`Channel.exit_code` (and :func:`run`) is 1 after ``fail`` or ``reject``. ``ask``
  raises :class:`NoChannel`; there are no events (:meth:`Channel.next_event` raises
  :class:`ChannelClosed`).

Reading happens on a daemon thread that queues what arrives, so a ``cancel`` sets
:attr:`Channel.canceled` (and calls ``on_cancel``) while the agent works, and :meth:`Channel.ask`
waits for its answer without losing the events that arrive meanwhile. Writes are thread-safe.
"""

from __future__ import annotations

import base64
import binascii
import collections
import datetime
import json
import mimetypes
import os
import socket
import sys
import threading
import traceback
import uuid
from collections.abc import Callable, Iterable, Iterator
from typing import IO, Any, NoReturn

__version__ = "0.1.0"

__all__ = [
    "DEFAULT_CHUNK_SIZE",
    "MAX_FILE_CHUNK",
    "MAX_LINE",
    "MAX_PARTS",
    "PROTOCOL_VERSION",
    "AskError",
    "Cancel",
    "Canceled",
    "Channel",
    "ChannelClosed",
    "Event",
    "File",
    "FollowUp",
    "InputRequestInvalid",
    "InputResponse",
    "NoChannel",
    "Refused",
    "State",
    "Task",
    "connect",
    "data_part",
    "message_data",
    "message_files",
    "message_text",
    "raw_part",
    "run",
    "text_part",
    "url_part",
]

#: The protocol version this module speaks.
PROTOCOL_VERSION = 2
#: Longest line either side accepts (bytes, its newline included here, to stay on the safe side).
MAX_LINE = 1024 * 1024
#: Largest file chunk the controller takes in one ``raw`` part.
MAX_FILE_CHUNK = 512 * 1024
#: :meth:`Channel.send_file`'s chunk: its base64 is well under :data:`MAX_LINE`.
DEFAULT_CHUNK_SIZE = 256 * 1024
#: Most parts in one message or artifact line.
MAX_PARTS = 256

_PART_KINDS = ("text", "raw", "url", "data")


class State:
    """The task states an agent may set (plain strings, as on the wire)."""

    WORKING = "TASK_STATE_WORKING"
    INPUT_REQUIRED = "TASK_STATE_INPUT_REQUIRED"
    AUTH_REQUIRED = "TASK_STATE_AUTH_REQUIRED"
    COMPLETED = "TASK_STATE_COMPLETED"
    FAILED = "TASK_STATE_FAILED"
    CANCELED = "TASK_STATE_CANCELED"
    REJECTED = "TASK_STATE_REJECTED"

    ALL = frozenset((WORKING, INPUT_REQUIRED, AUTH_REQUIRED, COMPLETED, FAILED, CANCELED, REJECTED))
    #: The states that end the task.
    TERMINAL = frozenset((COMPLETED, FAILED, CANCELED, REJECTED))
    #: The states in which the task waits for a follow-up message.
    INTERRUPTED = frozenset((INPUT_REQUIRED, AUTH_REQUIRED))

    @classmethod
    def normalize(cls, state: str) -> str:
        """``"completed"``, ``"COMPLETED"`` and ``"TASK_STATE_COMPLETED"`` all name one state."""
        name = str(state).strip().upper().replace("-", "_")
        if not name.startswith("TASK_STATE_"):
            name = "TASK_STATE_" + name
        if name not in cls.ALL:
            raise ValueError(f"not a state an agent may set: {state!r} (one of {sorted(cls.ALL)})")
        return name


# --- errors -------------------------------------------------------------------------------------


class ChannelClosed(ConnectionError):
    """The controller closed the channel (or there never was one): no more events will come."""


class NoChannel(RuntimeError):
    """The operation needs a control channel, and this agent has none (protocol mode 0)."""


class Canceled(Exception):
    """The task was canceled while :meth:`Channel.ask` waited: the agent should wind down."""

    def __init__(self, reason: str = "") -> None:
        super().__init__(reason or "the task was canceled")
        self.reason = reason


class AskError(Exception):
    """The controller would not turn an ``input_request`` into a prompt."""

    def __init__(self, error: str, prompt_id: str | None = None) -> None:
        super().__init__(error)
        self.error = error
        self.prompt_id = prompt_id


# --- parts and messages -------------------------------------------------------------------------


def _part(
    kind: str, value: Any, filename: str | None, media_type: str | None, metadata: dict[str, Any] | None
) -> dict[str, Any]:
    part: dict[str, Any] = {kind: value}
    if filename is not None:
        part["filename"] = filename
    if media_type is not None:
        part["mediaType"] = media_type
    if metadata is not None:
        part["metadata"] = metadata
    return part


def text_part(
    text: str, *, filename: str | None = None, media_type: str | None = None, metadata: dict[str, Any] | None = None
) -> dict[str, Any]:
    """A ``text`` part."""
    return _part("text", str(text), filename, media_type, metadata)


def raw_part(
    data: bytes, *, filename: str | None = None, media_type: str | None = None, metadata: dict[str, Any] | None = None
) -> dict[str, Any]:
    """A ``raw`` part: ``data``'s bytes, base64-encoded as the wire wants them."""
    return _part("raw", base64.b64encode(bytes(data)).decode("ascii"), filename, media_type, metadata)


def url_part(
    url: str, *, filename: str | None = None, media_type: str | None = None, metadata: dict[str, Any] | None = None
) -> dict[str, Any]:
    """A ``url`` part: a file the client fetches itself."""
    return _part("url", str(url), filename, media_type, metadata)


def data_part(
    data: Any, *, filename: str | None = None, media_type: str | None = None, metadata: dict[str, Any] | None = None
) -> dict[str, Any]:
    """A ``data`` part: any JSON value."""
    return _part("data", data, filename, media_type, metadata)


def _normalize_part(part: Any) -> dict[str, Any]:
    """A part as the wire wants it: a ``str`` becomes a text part, ``raw`` bytes become base64.

    Checks that it holds exactly one kind, so a mistake is a ValueError here rather than a
    refusal on the channel later.
    """
    if isinstance(part, str):
        return {"text": part}
    if not isinstance(part, dict):
        raise TypeError(f"a part is a dict (or a str for a text part), not {type(part).__name__}")
    kinds = [kind for kind in _PART_KINDS if kind in part]
    if len(kinds) != 1:
        raise ValueError(f"a part holds exactly one of text, raw, url, data; this one has {kinds or 'none'}")
    raw = part.get("raw")
    if isinstance(raw, (bytes, bytearray, memoryview)):
        part = dict(part, raw=base64.b64encode(bytes(raw)).decode("ascii"))
    return part


def _normalize_parts(parts: Iterable[Any]) -> list[dict[str, Any]]:
    if isinstance(parts, (str, dict)):
        parts = [parts]
    out = [_normalize_part(part) for part in parts]
    if not out:
        raise ValueError("at least one part is needed")
    if len(out) > MAX_PARTS:
        raise ValueError(f"{len(out)} parts in one line: at most {MAX_PARTS}")
    return out


def _agent_message(message: str | dict[str, Any]) -> dict[str, Any]:
    """A Message from the agent: a ``str`` is one text part; ``messageId`` and ``role`` filled in."""
    if isinstance(message, str):
        message = {"parts": [{"text": message}]}
    elif not isinstance(message, dict):
        raise TypeError(f"a message is a dict (or a str), not {type(message).__name__}")
    out = dict(message)
    out["parts"] = _normalize_parts(out.get("parts") or [])
    out.setdefault("messageId", str(uuid.uuid4()))
    out.setdefault("role", "ROLE_AGENT")
    return out


def _b64decode(value: str) -> bytes:
    """A ``raw`` part's bytes: standard or URL-safe base64, padded or not (both are A2A JSON)."""
    text = value.strip()
    text += "=" * (-len(text) % 4)
    try:
        if "-" in text or "_" in text:
            return base64.urlsafe_b64decode(text)
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise ValueError(f"a raw part is not valid base64: {exc}") from exc


class File:
    """A file a message carries: a ``raw`` part (``data`` holds its bytes) or a ``url`` part."""

    __slots__ = ("data", "filename", "media_type", "metadata", "url")

    def __init__(
        self,
        *,
        data: bytes | None = None,
        url: str | None = None,
        filename: str | None = None,
        media_type: str | None = None,
        metadata: dict[str, Any] | None = None,
    ) -> None:
        self.data = data
        self.url = url
        self.filename = filename
        self.media_type = media_type
        self.metadata = metadata if metadata is not None else {}

    def __repr__(self) -> str:
        what = f"{len(self.data)} bytes" if self.data is not None else f"url={self.url!r}"
        return f"File({what}, filename={self.filename!r}, media_type={self.media_type!r})"


def _parts_of(message: dict[str, Any] | None) -> list[dict[str, Any]]:
    parts = (message or {}).get("parts") or []
    return [part for part in parts if isinstance(part, dict)]


def message_text(message: dict[str, Any] | None, sep: str = "\n") -> str:
    """A message's text parts joined by ``sep``."""
    return sep.join(str(part["text"]) for part in _parts_of(message) if "text" in part)


def message_files(message: dict[str, Any] | None) -> list[File]:
    """A message's ``raw`` parts (decoded) and ``url`` parts, with their filename, type, metadata."""
    files = []
    for part in _parts_of(message):
        common: dict[str, Any] = {
            "filename": part.get("filename"),
            "media_type": part.get("mediaType"),
            "metadata": part.get("metadata"),
        }
        if "raw" in part:
            files.append(File(data=_b64decode(str(part["raw"])), **common))
        elif "url" in part:
            files.append(File(url=str(part["url"]), **common))
    return files


def message_data(message: dict[str, Any] | None) -> list[Any]:
    """The values of a message's ``data`` parts."""
    return [part["data"] for part in _parts_of(message) if "data" in part]


class _MessageReader:
    """Reading helpers for whatever carries a ``message``."""

    message: dict[str, Any]

    @property
    def parts(self) -> list[dict[str, Any]]:
        """The message's parts, as they came."""
        return _parts_of(self.message)

    def text(self, sep: str = "\n") -> str:
        """The message's text parts joined by ``sep``."""
        return message_text(self.message, sep)

    def files(self) -> list[File]:
        """The message's files (``raw`` parts decoded, ``url`` parts as URLs)."""
        return message_files(self.message)

    def data(self) -> list[Any]:
        """The values of the message's ``data`` parts."""
        return message_data(self.message)


class Task(_MessageReader):
    """The task the agent runs: the ``task`` line (or, without one, what the environment says)."""

    def __init__(self, line: dict[str, Any]) -> None:
        self.line = line
        self.version: int = line.get("version", 0)
        self.task_id: str = str(line.get("taskId") or "")
        self.context_id: str = str(line.get("contextId") or "")
        self.message: dict[str, Any] = line.get("message") or {}
        self.extensions: list[str] = list(line.get("extensions") or [])
        self.metadata: dict[str, Any] = line.get("metadata") or {}

    def __repr__(self) -> str:
        return f"Task(task_id={self.task_id!r}, context_id={self.context_id!r}, text={self.text()[:40]!r})"


# --- events -------------------------------------------------------------------------------------


class Event:
    """A line the controller sent after the task; ``line`` is all of it, ``type`` its type.

    Types this module does not know arrive as plain :class:`Event`s (the protocol says to ignore
    them; they are here for a newer controller's sake).
    """

    def __init__(self, line: dict[str, Any]) -> None:
        self.line = line
        self.type = str(line.get("type"))

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.line!r})"


class FollowUp(Event, _MessageReader):
    """``message``: a follow-up message to the task (after ``TASK_STATE_INPUT_REQUIRED``, say)."""

    def __init__(self, line: dict[str, Any]) -> None:
        super().__init__(line)
        self.message = line.get("message") or {}


class InputResponse(Event, _MessageReader):
    """``input_response``: a client answered the prompt ``prompt_id`` with ``payload``."""

    def __init__(self, line: dict[str, Any]) -> None:
        super().__init__(line)
        self.prompt_id: str = str(line.get("prompt_id") or "")
        self.payload: dict[str, Any] = line.get("payload") or {}
        self.message = line.get("message") or {}


class InputRequestInvalid(Event):
    """``input_request_invalid``: an ``input_request`` could not become a prompt."""

    def __init__(self, line: dict[str, Any]) -> None:
        super().__init__(line)
        self.error: str = str(line.get("error") or "")
        self.prompt_id: str | None = line.get("prompt_id")


class Cancel(Event):
    """``cancel``: a client canceled the task; the agent has a few seconds to end it."""

    def __init__(self, line: dict[str, Any]) -> None:
        super().__init__(line)
        self.reason: str = str(line.get("reason") or "")


class Refused(Event):
    """``error``: the controller refused the agent's last line (``event`` is its type); the task goes on."""

    def __init__(self, line: dict[str, Any]) -> None:
        super().__init__(line)
        self.error: str = str(line.get("error") or "")
        self.event: str | None = line.get("event")


_EVENT_TYPES: dict[str, type[Event]] = {
    "message": FollowUp,
    "input_response": InputResponse,
    "input_request_invalid": InputRequestInvalid,
    "cancel": Cancel,
    "error": Refused,
}


# --- the channel --------------------------------------------------------------------------------


def _env_int(name: str) -> int | None:
    value = os.environ.get(name, "").strip()
    try:
        return int(value) if value else None
    except ValueError:
        return None


class Channel:
    """The agent's end of its control channel, and the task it runs.

    Usually made by :func:`connect`. ``sock`` is the connected socket (``None``: no channel, mode
    0); ``protocol`` the controller's version (2 sends ``hello`` and reads the ``task`` line).
    ``on_cancel(reason)`` is called on the reader thread when a ``cancel`` arrives. ``timeout``
    bounds the wait for the ``task`` line (:class:`TimeoutError`).
    """

    def __init__(
        self,
        sock: socket.socket | None,
        *,
        protocol: int = PROTOCOL_VERSION,
        name: str | None = None,
        version: str | None = None,
        on_cancel: Callable[[str], Any] | None = None,
        timeout: float | None = None,
        stdin: IO[bytes] | None = None,
    ) -> None:
        self._sock = sock
        self.protocol = 0 if sock is None else min(max(protocol, 1), PROTOCOL_VERSION)
        self.max_line = min(_env_int("AIWG_AGENT_MAX_LINE") or MAX_LINE, MAX_LINE)
        #: Set once a ``cancel`` arrived (wait on it, or poll ``is_set()``).
        self.canceled = threading.Event()
        #: The ``cancel`` line's reason, once one arrived.
        self.cancel_reason: str | None = None
        #: The last answer :meth:`ask` returned, in full (its ``message`` too).
        self.last_input_response: InputResponse | None = None
        self.on_cancel = on_cancel
        self._write_lock = threading.Lock()
        self._cond = threading.Condition()
        self._events: collections.deque[Event] = collections.deque()
        self._closed = sock is None
        self._task: Task | None = None
        self._seen_messages: set[str] = set()
        self._seen_prompts: set[str] = set()
        self._last_state: str | None = None
        self._ended = False
        self._failed = False
        self._reader: threading.Thread | None = None

        if self.protocol >= 2:
            hello: dict[str, Any] = {"type": "hello", "version": PROTOCOL_VERSION}
            agent = {k: v for k, v in (("name", name), ("version", version)) if v is not None}
            if agent:
                hello["agent"] = agent
            self.send(hello)
        if sock is not None:
            self._reader = threading.Thread(target=self._read_loop, name="aiwg-control-reader", daemon=True)
            self._reader.start()
        if self.protocol >= 2:
            self._task = self._wait_for_task(timeout)
        else:
            self._task = self._task_from_environment(stdin)

    # --- the task, and what the agent did with it

    @property
    def task(self) -> Task:
        """The task this agent runs."""
        assert self._task is not None
        return self._task

    @property
    def has_channel(self) -> bool:
        """Whether the agent has a control channel (protocol mode 1 or 2), open or since closed."""
        return self.protocol > 0

    @property
    def ended(self) -> bool:
        """Whether the agent ended the task (a terminal status, or a :meth:`reply`)."""
        return self._ended

    @property
    def last_state(self) -> str | None:
        """The last state the agent set (``None`` before any status)."""
        return self._last_state

    @property
    def exit_code(self) -> int:
        """What the agent should exit with: 1 when it last ended the task failed or rejected, else 0.

        It matters without a channel (mode 0 and 1: the exit status decides the task); with one,
        a terminal status already decided it.
        """
        return 1 if self._failed else 0

    def _task_from_environment(self, stdin: IO[bytes] | None) -> Task:
        """Without a ``task`` line: the ids from the environment, stdin's text as one text part."""
        stream = stdin if stdin is not None else getattr(sys.stdin, "buffer", None)
        text = ""
        if stream is not None:
            try:
                text = stream.read().decode("utf-8", "replace")
            except (OSError, ValueError):
                text = ""
        return Task(
            {
                "type": "task",
                "version": self.protocol,
                "taskId": os.environ.get("AIWG_TASK_ID", ""),
                "contextId": os.environ.get("AIWG_CONTEXT_ID", ""),
                "message": {"messageId": str(uuid.uuid4()), "role": "ROLE_USER", "parts": [{"text": text}]},
                "extensions": [],
                "metadata": {},
            }
        )

    def _wait_for_task(self, timeout: float | None) -> Task:
        with self._cond:
            if not self._cond.wait_for(lambda: self._task is not None or self._closed, timeout):
                raise TimeoutError("no task line arrived on the control channel")
            if self._task is None:
                raise ChannelClosed("the control channel closed before the task arrived")
            return self._task

    # --- reading

    def _read_loop(self) -> None:
        """The reader thread: every line to an event (or the task), until EOF."""
        assert self._sock is not None
        try:
            stream = self._sock.makefile("rb")
            while True:
                line = stream.readline(self.max_line + 1)
                if not line:
                    break
                if len(line) > self.max_line and not line.endswith(b"\n"):
                    while True:  # drop the rest of a line that is too long
                        rest = stream.readline(64 * 1024)
                        if not rest or rest.endswith(b"\n"):
                            break
                    self._log(f"skipped a control line longer than {self.max_line} bytes")
                    continue
                line = line.strip()
                if not line:
                    continue
                try:
                    obj = json.loads(line)
                except ValueError:
                    self._log(f"skipped a control line that is not JSON: {line[:200]!r}")
                    continue
                if not isinstance(obj, dict):
                    self._log(f"skipped a control line that is not a JSON object: {line[:200]!r}")
                    continue
                try:
                    self._dispatch(obj)
                except Exception:  # a line this module cannot make sense of must not end the reading
                    self._log(f"skipped a control line: {traceback.format_exc()}")
        except (OSError, ValueError):
            pass  # the socket was closed under us: the same as EOF
        finally:
            with self._cond:
                self._closed = True
                self._cond.notify_all()

    @staticmethod
    def _log(text: str) -> None:
        """A note in the agent's logs (stderr, which the runtime keeps as the task's logs)."""
        try:
            sys.stderr.write(f"agentic_sandbox_agent: {text}\n")
            sys.stderr.flush()
        except (OSError, ValueError):
            pass

    def _dispatch(self, line: dict[str, Any]) -> None:
        """Queue one line, dropping what the controller hands over again (at-least-once delivery)."""
        kind = line.get("type")
        with self._cond:
            if kind == "task":
                if self._task is None:
                    self._task = Task(line)
                    message_id = self._task.message.get("messageId")
                    if message_id:
                        self._seen_messages.add(str(message_id))
                    self._cond.notify_all()
                return
            event = _EVENT_TYPES.get(str(kind), Event)(line)
            if isinstance(event, FollowUp):
                message_id = event.message.get("messageId")
                if message_id:
                    if message_id in self._seen_messages:
                        return
                    self._seen_messages.add(str(message_id))
            elif isinstance(event, InputResponse):
                if event.prompt_id in self._seen_prompts:
                    return
                self._seen_prompts.add(event.prompt_id)
            elif isinstance(event, Cancel):
                if self.canceled.is_set():
                    return
                self.cancel_reason = event.reason
                self.canceled.set()
            self._events.append(event)
            self._cond.notify_all()
        if isinstance(event, Cancel) and self.on_cancel is not None:
            try:
                self.on_cancel(event.reason)
            except Exception:
                self._log("on_cancel raised:\n" + traceback.format_exc())

    def next_event(self, timeout: float | None = None) -> Event | None:
        """The next event (follow-up, answer, cancel, refusal), waiting up to ``timeout`` seconds.

        Returns ``None`` when the time is up; raises :class:`ChannelClosed` once the channel is
        closed and nothing is left (at once without a channel).
        """
        with self._cond:
            if not self._cond.wait_for(lambda: self._events or self._closed, timeout):
                return None
            if self._events:
                return self._events.popleft()
            raise ChannelClosed("the control channel is closed")

    def __iter__(self) -> Iterator[Event]:
        """Every event, as it comes, until the channel closes."""
        while True:
            try:
                event = self.next_event()
            except ChannelClosed:
                return
            if event is not None:
                yield event

    def _take(self, match: Callable[[Event], bool]) -> Event | None:
        """Remove and return the first queued event ``match`` accepts (the caller holds the lock)."""
        for event in self._events:
            if match(event):
                self._events.remove(event)
                return event
        return None

    # --- writing

    def send(self, line: dict[str, Any]) -> None:
        """Write one line (any type: the typed methods below are built on this).

        Raises ValueError for a line longer than :data:`MAX_LINE` (nothing is sent),
        :class:`NoChannel` without a channel, :class:`ChannelClosed` when the controller is gone.
        """
        data = json.dumps(line, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode("utf-8")
        if len(data) + 1 > self.max_line:
            raise ValueError(f"a {line.get('type')} line of {len(data) + 1} bytes: at most {self.max_line}")
        if self._sock is None:
            if self.protocol:
                raise ChannelClosed("the control channel is closed")
            raise NoChannel("this agent has no control channel")
        with self._write_lock:
            try:
                self._sock.sendall(data + b"\n")
            except (BrokenPipeError, ConnectionResetError) as exc:
                raise ChannelClosed("the controller closed the control channel") from exc

    def status(
        self,
        state: str = State.WORKING,
        text: str | None = None,
        message: str | dict[str, Any] | None = None,
        metadata: dict[str, Any] | None = None,
    ) -> None:
        """A status update: ``state`` (default working) with ``text`` or a ``message`` (one of them).

        ``metadata`` is merged into the task's metadata. A terminal state ends the task.
        """
        state = State.normalize(state)
        if text is not None and message is not None:
            raise ValueError("give text or message, not both")
        line: dict[str, Any] = {"type": "status", "state": state}
        if text:
            line["text"] = str(text)
        if message is not None:
            line["message"] = _agent_message(message)
        if metadata is not None:
            line["metadata"] = metadata
        if self.protocol >= 2:
            self.send(line)
        elif self.protocol == 1 and state == State.WORKING and text and message is None:
            self.send({"type": "status", "text": line["text"]})  # version 1's status: working, with a text
        else:
            said = text if text else message_text(line.get("message"))
            if said:
                self._write_output(said, stderr=state != State.COMPLETED, newline=True)
            if "message" in line and state == State.COMPLETED:
                self._write_parts([p for p in line["message"]["parts"] if "text" not in p])
        self._last_state = state
        if state in State.TERMINAL:
            self._ended = True
            self._failed = state in (State.FAILED, State.REJECTED)

    def artifact(
        self,
        artifact_id: str,
        parts: Iterable[Any],
        name: str | None = None,
        description: str | None = None,
        metadata: dict[str, Any] | None = None,
        append: bool = False,
        last_chunk: bool = False,
        extensions: list[str] | None = None,
    ) -> None:
        """An artifact update: ``parts`` (part dicts, :func:`text_part` & co, or plain strings).

        ``append`` adds the parts to the artifact sent before under ``artifact_id``; ``last_chunk``
        says it is whole. A ``raw`` part may hold bytes: they are base64-encoded here.
        """
        if not artifact_id:
            raise ValueError("an artifact needs an artifact_id")
        line: dict[str, Any] = {"type": "artifact", "artifactId": str(artifact_id), "parts": _normalize_parts(parts)}
        for key, value in (("name", name), ("description", description), ("metadata", metadata)):
            if value is not None:
                line[key] = value
        if extensions is not None:
            line["extensions"] = list(extensions)
        line["append"] = bool(append)
        line["lastChunk"] = bool(last_chunk)
        if self.protocol >= 2:
            self.send(line)
        else:
            self._write_parts(line["parts"])

    def send_text(
        self,
        text: str,
        artifact_id: str | None = None,
        *,
        name: str | None = None,
        media_type: str | None = None,
        metadata: dict[str, Any] | None = None,
        append: bool = False,
        last_chunk: bool = False,
    ) -> str:
        """An artifact of one text part; returns its id (a new one unless given, to append later)."""
        part = text_part(text, media_type=media_type)
        return self._one_part(part, artifact_id, name=name, metadata=metadata, append=append, last_chunk=last_chunk)

    def send_data(
        self,
        data: Any,
        artifact_id: str | None = None,
        *,
        name: str | None = None,
        media_type: str | None = None,
        metadata: dict[str, Any] | None = None,
        append: bool = False,
        last_chunk: bool = False,
    ) -> str:
        """An artifact of one ``data`` part (any JSON value); returns its id."""
        part = data_part(data, media_type=media_type)
        return self._one_part(part, artifact_id, name=name, metadata=metadata, append=append, last_chunk=last_chunk)

    def _one_part(self, part: dict[str, Any], artifact_id: str | None, **fields: Any) -> str:
        artifact_id = artifact_id or str(uuid.uuid4())
        self.artifact(artifact_id, [part], **fields)
        return artifact_id

    def send_file(
        self,
        source: str | os.PathLike[str] | bytes | bytearray | memoryview | IO[bytes],
        filename: str | None = None,
        media_type: str | None = None,
        *,
        artifact_id: str | None = None,
        name: str | None = None,
        description: str | None = None,
        metadata: dict[str, Any] | None = None,
        chunk_size: int = DEFAULT_CHUNK_SIZE,
    ) -> str:
        """Stream a file (a path, bytes, or a binary file object) as one artifact; returns its id.

        Each chunk of ``chunk_size`` bytes is one ``raw`` part on a line of its own: the first
        line makes the artifact, the others have ``append``, the last has ``lastChunk``. Only one
        chunk is in memory at a time (and the one read ahead to know which is last). Every chunk
        carries ``filename`` (a path's name by default) and ``media_type`` (guessed from the
        filename, else ``application/octet-stream``); ``name`` defaults to the filename.
        """
        if not 0 < chunk_size <= MAX_FILE_CHUNK:
            raise ValueError(f"chunk_size is 1 to {MAX_FILE_CHUNK} bytes, not {chunk_size}")
        if filename is None and isinstance(source, (str, os.PathLike)):
            filename = os.path.basename(os.fspath(source))
        if media_type is None:
            media_type = (mimetypes.guess_type(filename)[0] if filename else None) or "application/octet-stream"
        artifact_id = artifact_id or str(uuid.uuid4())
        if name is None:
            name = filename
        first = True
        for chunk, last in _chunks(source, chunk_size):
            if self.protocol < 2:
                self._write_output(chunk)
                continue
            part = raw_part(chunk, filename=filename, media_type=media_type)
            self.artifact(
                artifact_id,
                [part],
                name=name if first else None,
                description=description if first else None,
                metadata=metadata if first else None,
                append=not first,
                last_chunk=last,
            )
            first = False
        return artifact_id

    def reply(self, message: str | dict[str, Any]) -> None:
        """Answer the send with this Message instead of a task (A2A's direct Message answer).

        The task then shows as completed with it as its status message.
        """
        msg = _agent_message(message)
        if self.protocol >= 2:
            self.send({"type": "message", "message": msg})
        else:
            text = message_text(msg)
            if text:
                self._write_output(text, newline=True)
            self._write_parts([p for p in msg["parts"] if "text" not in p])
        self._ended = True
        self._last_state = State.COMPLETED

    def ask(
        self,
        prompt: str,
        response_schema: dict[str, Any],
        prompt_id: str | None = None,
        deadline: str | datetime.datetime | None = None,
        *,
        allowed_responders: str | None = None,
        timeout: float | None = None,
    ) -> dict[str, Any]:
        """Ask a human (hitl-prompt/v1) and wait for the answer; returns its payload.

        The task waits in ``TASK_STATE_INPUT_REQUIRED`` meanwhile. ``response_schema`` is a JSON
        Schema (``"type": "object"``) the payload is valid against; ``deadline`` an RFC 3339 time
        (or an aware datetime). Raises :class:`AskError` when the controller refused the request,
        :class:`Canceled` when the task is canceled meanwhile, :class:`ChannelClosed`, or
        :class:`TimeoutError` after ``timeout`` seconds. Other events stay queued.
        """
        if self.protocol == 0:
            raise NoChannel("this agent has no control channel: it cannot ask for input")
        if self.canceled.is_set():
            raise Canceled(self.cancel_reason or "")
        prompt_id = prompt_id or str(uuid.uuid4())
        line: dict[str, Any] = {
            "type": "input_request",
            "prompt": prompt,
            "response_schema": response_schema,
            "prompt_id": prompt_id,
        }
        if isinstance(deadline, datetime.datetime):
            if deadline.tzinfo is None:
                raise ValueError("a deadline needs a time zone")
            deadline = deadline.isoformat()
        if deadline is not None:
            line["deadline"] = deadline
        if allowed_responders is not None:
            line["allowed_responders"] = allowed_responders
        self.send(line)
        self._last_state = State.INPUT_REQUIRED

        def answer(event: Event) -> bool:
            if isinstance(event, InputResponse):
                return event.prompt_id == prompt_id
            if isinstance(event, InputRequestInvalid):
                return event.prompt_id in (None, prompt_id)
            return isinstance(event, Refused) and event.event == "input_request"

        with self._cond:
            found: list[Event] = []

            def ready() -> bool:
                event = self._take(answer)
                if event is not None:
                    found.append(event)
                return bool(found) or self.canceled.is_set() or self._closed

            if not self._cond.wait_for(ready, timeout):
                raise TimeoutError(f"no answer to prompt {prompt_id} in {timeout} s")
        if not found:
            if self.canceled.is_set():
                raise Canceled(self.cancel_reason or "")
            raise ChannelClosed("the control channel closed before the answer came")
        event = found[0]
        if isinstance(event, InputResponse):
            self.last_input_response = event
            self._last_state = State.WORKING
            return event.payload
        if isinstance(event, InputRequestInvalid):
            raise AskError(event.error, event.prompt_id)
        assert isinstance(event, Refused)
        raise AskError(event.error, prompt_id)

    def complete(self, text: str | None = None) -> None:
        """End the task as completed, with ``text`` as its status message."""
        self.status(State.COMPLETED, text=text)

    def fail(self, text: str | None = None) -> None:
        """End the task as failed, saying why."""
        self.status(State.FAILED, text=text)

    def reject(self, text: str | None = None) -> None:
        """End the task as rejected (the agent will not do it), saying why."""
        self.status(State.REJECTED, text=text)

    # --- output without a channel

    def _write_output(self, data: str | bytes, *, stderr: bool = False, newline: bool = False) -> None:
        """Mode 0/1: what the task produces to stdout (becoming its artifact), progress to stderr."""
        text_stream = sys.stderr if stderr else sys.stdout
        stream = getattr(text_stream, "buffer", None)
        raw = data.encode("utf-8") if isinstance(data, str) else bytes(data)
        if newline and not raw.endswith(b"\n"):
            raw += b"\n"
        if stream is None:  # a replaced sys.stdout without a buffer
            text_stream.write(raw.decode("utf-8", "replace"))
            text_stream.flush()
            return
        text_stream.flush()
        stream.write(raw)
        stream.flush()

    def _write_parts(self, parts: list[dict[str, Any]]) -> None:
        for part in parts:
            if "text" in part:
                self._write_output(str(part["text"]))
            elif "raw" in part:
                self._write_output(_b64decode(str(part["raw"])))
            elif "url" in part:
                self._write_output(str(part["url"]), newline=True)
            elif "data" in part:
                self._write_output(json.dumps(part["data"], ensure_ascii=False), newline=True)

    # --- the end

    def close(self) -> None:
        """Close the channel (the controller sees EOF); the reader thread ends."""
        sock, self._sock = self._sock, None
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            sock.close()
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def __enter__(self) -> Channel:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _chunks(source: Any, size: int) -> Iterator[tuple[bytes, bool]]:
    """``(chunk, is_last)`` pairs of a path's, a bytes-like's or a binary file's content.

    Reads one chunk ahead to know which is last; an empty source is one empty last chunk.
    """
    if isinstance(source, (bytes, bytearray, memoryview)):
        view = memoryview(source).cast("B")
        total = len(view)
        if total == 0:
            yield b"", True
        for start in range(0, total, size):
            yield bytes(view[start : start + size]), start + size >= total
        return
    if isinstance(source, (str, os.PathLike)):
        with open(source, "rb") as file:
            yield from _chunks(file, size)
        return
    if not hasattr(source, "read"):
        raise TypeError(f"send_file takes a path, bytes or a binary file, not {type(source).__name__}")
    current = source.read(size)
    if isinstance(current, str):
        raise TypeError("send_file needs a binary file (open it with 'rb')")
    while True:
        following = source.read(size) if current else b""
        if not following:
            yield bytes(current or b""), True
            return
        yield bytes(current), False
        current = following


def _find_socket() -> socket.socket | None:
    """The channel's socket from the environment, made this process's own.

    The variables are removed and the fd is not inherited, so a program the agent starts (which
    may use this module too) neither writes on the agent's channel nor mistakes another fd for it.
    """
    fd = _env_int("AIWG_CONTROL_FD")
    path = os.environ.get("AIWG_CONTROL_SOCKET", "").strip()
    sock: socket.socket | None = None
    if fd is not None:
        sock = socket.socket(fileno=fd)
    elif path:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            sock.connect(path)
        except OSError:
            sock.close()
            raise
    if sock is not None:
        sock.set_inheritable(False)
        os.environ.pop("AIWG_CONTROL_FD", None)
        os.environ.pop("AIWG_CONTROL_SOCKET", None)
    return sock


def connect(
    name: str | None = None,
    version: str | None = None,
    *,
    on_cancel: Callable[[str], Any] | None = None,
    timeout: float | None = None,
) -> Channel:
    """The agent's channel, found from the environment; with protocol 2, after hello and the task.

    ``name`` and ``version`` go into ``hello``'s ``agent``. Without a channel (or with a version 1
    controller) the task comes from the environment and stdin (see the module's docstring). Call
    it once per process: it takes ``AIWG_CONTROL_FD``/``AIWG_CONTROL_SOCKET`` out of the environment.
    """
    sock = _find_socket()
    protocol = _env_int("AIWG_AGENT_PROTOCOL") or 1
    return Channel(sock, protocol=protocol, name=name, version=version, on_cancel=on_cancel, timeout=timeout)


def run(
    main: Callable[[Channel], Any],
    *,
    name: str | None = None,
    version: str | None = None,
    on_cancel: Callable[[str], Any] | None = None,
) -> NoReturn:
    """Connect, run ``main(channel)``, end the task the way ``main`` ended, and exit.

    ``main`` returning completes the task (unless it ended it already; a cancel that arrived makes
    it canceled instead); ``main`` raising fails it naming the exception (exit status 1);
    :class:`Canceled` out of ``main`` cancels it.
    """
    channel = connect(name, version, on_cancel=on_cancel)
    code = 0
    try:
        main(channel)
    except Canceled:
        if not channel.ended:
            channel.status(State.CANCELED, text=channel.cancel_reason or None)
    except Exception as exc:
        traceback.print_exc()
        code = 1
        if not channel.ended:
            try:
                channel.fail(f"{type(exc).__name__}: {exc}")
            except (OSError, ValueError):
                pass
    else:
        if not channel.ended:
            if channel.canceled.is_set():
                channel.status(State.CANCELED, text=channel.cancel_reason or None)
            else:
                channel.complete()
    finally:
        channel.close()
    sys.exit(code or channel.exit_code)
