"""The agent protocol, version 2: what an agent says on its control channel, checked, turned into
task changes (docs/agent-protocol.md has the whole protocol; docs/schemas/ its JSON Schema).

:class:`AgentEvents` holds one task's side of the conversation for its runner: whether the agent
said ``hello`` (from then on its stdout and stderr are logs), whether it ended the task, its event
budget, and the raw parts of its artifacts still growing. Each line becomes :class:`Append` changes,
or raises

* :class:`Refused`: the line is dropped and the agent is told why on the channel (bad fields, an
  unknown state, an event after the task ended); the task goes on;
* :class:`Fault`: the agent misbehaved past what a task survives (a flood of events, files over
  the limit); the runner fails the task with the reason and kills the agent's tree.

Files: consecutive ``raw`` parts of one artifact (an ``append`` chunk's first part continuing the
artifact's last raw part, same ``filename`` and ``mediaType``) are one file. While it is small it
stays inline in the stored artifact (the chunk's part replaces the stored one: ``_joins``); past
:data:`files.INLINE_BYTES` it is written to :class:`~controller.tasks.files.TaskFiles` as it comes,
and the stored part becomes a file part. The events streamed to clients carry each chunk as the
agent sent it.
"""

from __future__ import annotations

import base64
import binascii
import time
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

import msgspec

from agentic_sandbox.proto import new_id

from ..store import Append, TaskRecord
from .agentio import strip_owned
from .files import INLINE_BYTES, TaskFiles
from .model import MAX_PARTS, Id, Metadata, Uri

WORKING = "TASK_STATE_WORKING"
#: The states an agent may set; the first four end the task.
ENDING = frozenset({"TASK_STATE_COMPLETED", "TASK_STATE_FAILED", "TASK_STATE_CANCELED", "TASK_STATE_REJECTED"})
AGENT_STATES = ENDING | {WORKING, "TASK_STATE_INPUT_REQUIRED", "TASK_STATE_AUTH_REQUIRED"}
#: The protocol version this controller speaks (``AIWG_AGENT_PROTOCOL``).
VERSION = 2
#: A status text kept at most (version 1's bound, kept for its shorthand).
MAX_STATUS_TEXT = 65536
#: Set on a task answered with a Message instead of a task (see :meth:`AgentEvents.reply`).
ANSWERED_WITH = "answered_with"


class Refused(Exception):
    """The line is refused; the agent is told this on its channel and the task goes on."""


class Fault(Exception):
    """The agent misbehaved past what its task survives: the task fails with this reason."""


@dataclass(frozen=True)
class AgentLimits:
    events_per_s: float = 5000.0
    #: Seconds of ``events_per_s`` an agent may send in one burst.
    burst_s: float = 5.0
    max_file_bytes: int = 256 * 1024 * 1024


class AgentPart(msgspec.Struct, rename="camel", omit_defaults=True, kw_only=True):
    text: str | None = None
    raw: str | None = None
    url: Uri | None = None
    data: Any = msgspec.UNSET
    metadata: Metadata | None = None
    filename: Annotated[str, msgspec.Meta(max_length=1024)] | None = None
    media_type: Annotated[str, msgspec.Meta(max_length=256)] | None = None


Parts = Annotated[list[AgentPart], msgspec.Meta(min_length=1, max_length=MAX_PARTS)]


class AgentMessage(msgspec.Struct, rename="camel", omit_defaults=True, kw_only=True):
    parts: Parts
    message_id: Id | None = None
    role: Literal["ROLE_AGENT"] | None = None
    metadata: Metadata | None = None
    extensions: Annotated[list[Uri], msgspec.Meta(max_length=64)] | None = None
    reference_task_ids: Annotated[list[Id], msgspec.Meta(max_length=64)] | None = None


class HelloLine(msgspec.Struct, kw_only=True):
    version: Annotated[int, msgspec.Meta(ge=1)]


class StatusLine(msgspec.Struct, kw_only=True):
    state: str = WORKING
    message: AgentMessage | None = None
    text: Annotated[str, msgspec.Meta(min_length=1)] | None = None
    metadata: Metadata | None = None


class ArtifactLine(msgspec.Struct, rename="camel", kw_only=True):
    artifact_id: Id
    parts: Parts
    name: Annotated[str, msgspec.Meta(max_length=1024)] | None = None
    description: Annotated[str, msgspec.Meta(max_length=4096)] | None = None
    metadata: Metadata | None = None
    extensions: Annotated[list[Uri], msgspec.Meta(max_length=64)] | None = None
    append: bool = False
    last_chunk: bool = False


class ReplyLine(msgspec.Struct, kw_only=True):
    message: AgentMessage


def read_line(kind: str, line: dict[str, Any], shape: type[Any]) -> Any:
    """``line`` as ``shape``; :class:`Refused` naming the field that is wrong."""
    try:
        return msgspec.convert(line, shape)
    except msgspec.ValidationError as exc:
        raise Refused(f"{kind}: {exc}") from None


@dataclass
class _RawTail:
    """An artifact's last part while it is raw bytes that an ``append`` chunk may continue."""

    key: tuple[str | None, str | None]  # (filename, mediaType): a chunk continues only the same file
    shown: dict[str, Any]  # filename, mediaType, metadata of the part
    inline: bytearray | None  # while small; else the bytes are in the file
    file_id: str | None = None
    size: int = 0


@dataclass
class _Budget:
    """A token bucket: ``rate`` events a second, ``capacity`` at once."""

    rate: float
    capacity: float
    tokens: float = field(init=False)
    at: float = field(default_factory=time.monotonic)

    def __post_init__(self) -> None:
        self.tokens = self.capacity

    def take(self) -> bool:
        now = time.monotonic()
        self.tokens = min(self.capacity, self.tokens + (now - self.at) * self.rate)
        self.at = now
        if self.tokens < 1:
            return False
        self.tokens -= 1
        return True


class AgentEvents:
    def __init__(
        self, task: TaskRecord, files: TaskFiles, limits: AgentLimits, artifacts: list[dict[str, Any]]
    ) -> None:
        #: The task as its runner last stored it (the runner keeps this up to date).
        self.task = task
        self.files = files
        self.limits = limits
        self.speaks = 0  # the version the agent said hello with (0: none, its output is the answer)
        self.ended = task.terminal
        self.file_bytes = 0
        self._budget = _Budget(limits.events_per_s, max(1.0, limits.events_per_s * limits.burst_s))
        self._tails: dict[str, _RawTail | None] = {a["artifactId"]: _tail_of(a) for a in artifacts}

    def count(self) -> None:
        """One more line from the agent; :class:`Fault` once it floods."""
        if not self._budget.take():
            raise Fault(f"the agent sent more than {self.limits.events_per_s:g} events a second")

    def hello(self, line: dict[str, Any]) -> int:
        """The version a ``hello`` asks for, if it changes anything (0: it does not); the caller
        sets :attr:`speaks` once the agent has been handed its task."""
        hello = read_line("hello", line, HelloLine)
        if self.speaks or self.ended or hello.version < 2:
            return 0
        return min(hello.version, VERSION)

    def _open(self, kind: str) -> None:
        if self.ended:
            raise Refused(f"{kind}: the task has ended ({self.task.state}); it takes no more events")

    # -- status and reply -----------------------------------------------------------------------

    def status(self, line: dict[str, Any], seq: int) -> Append:
        self._open("status")
        status_line: StatusLine = read_line("status", line, StatusLine)
        state = status_line.state
        if state not in AGENT_STATES:
            raise Refused(f"status: {state[:80]!r} is not a state an agent may set ({', '.join(sorted(AGENT_STATES))})")
        message = None
        if status_line.message is not None:
            message = self._message(status_line.message)
        elif status_line.text is not None:
            message = self._message(AgentMessage(parts=[AgentPart(text=status_line.text[:MAX_STATUS_TEXT])]))
        metadata = None
        if status_line.metadata:
            metadata = {**self.task.metadata, **(strip_owned(status_line.metadata) or {})}
        self.ended = state in ENDING
        return self._status(state, message, metadata, seq)

    def reply(self, line: dict[str, Any], seq: int) -> Append:
        """The send's answer is this Message: the task completes with it as its status message, and a
        blocking send answers with the Message itself (:data:`ANSWERED_WITH`)."""
        self._open("message")
        reply: ReplyLine = read_line("message", line, ReplyLine)
        self.ended = True
        metadata = {**self.task.metadata, ANSWERED_WITH: "message"}
        return self._status("TASK_STATE_COMPLETED", self._message(reply.message), metadata, seq)

    def _message(self, msg: AgentMessage) -> dict[str, Any]:
        for index, part in enumerate(msg.parts):
            _check_part(part, f"message.parts[{index}]")
        out: dict[str, Any] = msgspec.to_builtins(msg)
        out.setdefault("messageId", new_id())
        out["role"] = "ROLE_AGENT"
        out["taskId"], out["contextId"] = self.task.id, self.task.context_id
        return out

    def _status(self, state: str, message: dict[str, Any] | None, metadata: dict[str, Any] | None, seq: int) -> Append:
        status: dict[str, Any] = {"state": state}
        if message is not None:
            status["message"] = message
        body = {"taskId": self.task.id, "contextId": self.task.context_id, "status": status}
        return Append(kind="status", body=body, status=status, metadata=metadata, exec_seq=seq, unless_terminal=True)

    # -- artifacts ------------------------------------------------------------------------------

    async def artifact(self, line: dict[str, Any], seq: int) -> Append:
        self._open("artifact")
        art: ArtifactLine = read_line("artifact", line, ArtifactLine)
        decoded = [_check_part(part, f"parts[{index}]") for index, part in enumerate(art.parts)]
        sent = sum(len(data) for data in decoded if data is not None)
        if self.file_bytes + sent > self.limits.max_file_bytes:
            raise Fault(
                f"the agent's files add up to more than {self.limits.max_file_bytes} bytes "
                f"(artifact {art.artifact_id[:80]!r})"
            )
        self.file_bytes += sent
        metadata = dict(art.metadata or {})  # one dict for the event and the stored artifact
        shown: dict[str, Any] = {"artifactId": art.artifact_id}
        for key, value in (("name", art.name), ("description", art.description), ("extensions", art.extensions)):
            if value is not None:
                shown[key] = value
        stored = {**shown, "metadata": metadata, "parts": await self._fold_parts(art, decoded)}
        shown["parts"] = [msgspec.to_builtins(part) for part in art.parts]
        shown["metadata"] = metadata
        body: dict[str, Any] = {"taskId": self.task.id, "contextId": self.task.context_id, "artifact": shown}
        if art.append:
            body["append"] = True
        if art.last_chunk:
            body["lastChunk"] = True
        return Append(kind="artifact", body=body, artifact=stored, append=art.append, exec_seq=seq)

    async def _fold_parts(self, art: ArtifactLine, decoded: list[bytes | None]) -> list[dict[str, Any]]:
        """The parts as the stored artifact keeps them (see the module docstring on files)."""
        tail = self._tails.get(art.artifact_id) if art.append else None
        parts: list[dict[str, Any]] = []
        for index, (part, data) in enumerate(zip(art.parts, decoded, strict=True)):
            if data is None:
                parts.append(msgspec.to_builtins(part))
                tail = None
                continue
            key = (part.filename, part.media_type)
            if index == 0 and tail is not None and tail.key == key:
                parts.append({**await self._grow(tail, data), "_joins": True})
            else:
                tail = _RawTail(key=key, shown=_part_fields(part), inline=bytearray())
                parts.append(await self._grow(tail, data))
        self._tails[art.artifact_id] = tail
        return parts

    async def _grow(self, tail: _RawTail, data: bytes) -> dict[str, Any]:
        """Add ``data`` to the raw part ``tail`` holds; the part as stored now."""
        if tail.inline is not None and tail.size + len(data) <= INLINE_BYTES:
            tail.inline += data
            tail.size += len(data)
            return {"raw": base64.b64encode(tail.inline).decode(), **tail.shown}
        if tail.file_id is None:  # it outgrows inline: what it held goes first
            tail.file_id = new_id()
            await self.files.write(self.task.id, tail.file_id, 0, bytes(tail.inline or b""))
            tail.inline = None
        await self.files.write(self.task.id, tail.file_id, tail.size, data)
        tail.size += len(data)
        return {"file": {"id": tail.file_id, "size": tail.size}, **tail.shown}


def _check_part(part: AgentPart, where: str) -> bytes | None:
    """The part's raw bytes (None if it is not raw); :class:`Refused` unless it holds one kind."""
    kinds = [k for k in ("text", "raw", "url") if getattr(part, k) is not None]
    if part.data is not msgspec.UNSET:
        kinds.append("data")
    if len(kinds) != 1:
        raise Refused(
            f"{where}: a part holds exactly one of text, raw, url, data (it has {', '.join(kinds) or 'none'})"
        )
    if part.raw is None:
        return None
    raw = part.raw
    # Either alphabet (protobuf's JSON writes the standard one and reads both), padding optional.
    alphabet = b"-_" if "-" in raw or "_" in raw else None
    try:
        return base64.b64decode(raw + "=" * (-len(raw) % 4), altchars=alphabet, validate=True)
    except (binascii.Error, ValueError):
        raise Refused(f"{where}.raw: not valid base64") from None


def _part_fields(part: AgentPart) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if part.filename is not None:
        out["filename"] = part.filename
    if part.media_type is not None:
        out["mediaType"] = part.media_type
    if part.metadata is not None:
        out["metadata"] = part.metadata
    return out


def _tail_of(stored: dict[str, Any]) -> _RawTail | None:
    """The raw tail of a stored artifact (after a controller restart), if its last part is one."""
    parts = stored.get("parts") or []
    last = parts[-1] if parts else None
    if not isinstance(last, dict) or ("raw" not in last and "file" not in last):
        return None
    shown = {k: last[k] for k in ("filename", "mediaType", "metadata") if k in last}
    key = (last.get("filename"), last.get("mediaType"))
    if "raw" in last:
        data = base64.b64decode(last["raw"])
        return _RawTail(key=key, shown=shown, inline=bytearray(data), size=len(data))
    return _RawTail(key=key, shown=shown, inline=None, file_id=last["file"]["id"], size=last["file"]["size"])
