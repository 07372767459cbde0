"""agent-output/v1: a task's Claude Code ``stream-json`` output as a chat, over SSE.

``GET /api/v1/agent-output/chat?command_id=<task id>[&session_id=][&replay=true]`` (the route is
in :mod:`controller.v1`; upstream's ``command_id`` is our task id). The raw stream is the task's
``claude-stream`` artifact, which the Claude Code adapter (``agentic_sandbox_agent.claude``) fills
line by line as the CLI prints them; each line is projected, in order, into named SSE events of
the ``fortemi-chat-stream/v1`` envelope (upstream's spec, ``contracts/.../agent-output/v1``):

=================  ==============================================================================
stream-json        event (``data``)
=================  ==============================================================================
assistant text     ``delta`` (``content``, ``role: assistant``, ``kind: message``), one per block
assistant tool     ``tool_call`` (``name``, ``tool_id``, ``input``)
user tool_result   ``tool_result`` (``role: tool``, ``tool_id``, ``status`` ok/error, ``content``)
system             ``status`` (``role: system``, ``status``: its subtype, ``content``)
result             ``done`` (``role: status``, ``kind: usage``, ``finish_reason``, ``model``,
                   ``usage``, ``total_cost_usd``, ``content``: the result text)
anything else      ``raw`` (``role: system``, ``kind: raw``, ``content``: the line, kept, not dropped)
=================  ==============================================================================

Every ``data`` carries ``session_id`` and ``raw_ref`` (``command_id``, ``line``: the 1-based line
of the raw stream it came from). Event ids are ``{session}-{seq}`` (``session``: ``session_id``
or the task id; ``seq`` counts this projection's events from 1), so ``Last-Event-ID`` resumes
after one exactly; an id of another session, or past what the task has, ends the stream with an
``error`` event ``STREAM_INTERRUPTED`` rather than hanging. Without ``replay`` (and without
``Last-Event-ID``) only what comes after the request is sent. The stream ends once the task has
ended and its stream is projected; keep-alive comments go out while it is quiet.
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator, Iterator
from typing import Any

import msgspec
import trio

from ..store import Store, TaskEvent
from ..store.tasks import TERMINAL
from ..tasks.hub import TaskHub

AGENT_OUTPUT_EXTENSION = "https://agentic-sandbox.aiwg.io/extensions/agent-output/v1"
#: The artifact holding a task's raw ``stream-json`` (what the Claude Code adapter writes).
STREAM_ARTIFACT = "claude-stream"
EVENTS = ("delta", "tool_call", "tool_result", "status", "done", "error", "raw")
KEEPALIVE = b": keepalive\n\n"
_LAST_EVENT_ID = re.compile(r"^(.{1,256})-(\d{1,18})$")


def card_extension() -> dict[str, Any]:
    return {
        "uri": AGENT_OUTPUT_EXTENSION,
        "description": (
            "A task's Claude Code stream-json output projected as a chat (SSE) at "
            "/api/v1/agent-output/chat?command_id={task_id}, for tasks run by the claude-code loadout."
        ),
        "params": {
            "sources": ["stream-json"],
            "events": list(EVENTS),
            "envelope": "fortemi-chat-stream/v1",
            "id_format": "{session}-{seq}",
            "resume": "last-event-id",
        },
    }


class Resume(msgspec.Struct, frozen=True):
    session: str
    seq: int


def parse_last_event_id(value: str | None) -> Resume | None:
    """``{session}-{seq}`` or None (absent); ValueError for anything else."""
    if value is None or value == "":
        return None
    found = _LAST_EVENT_ID.match(value)
    if found is None:
        raise ValueError(f"Last-Event-ID {value[:80]!r} is not {{session}}-{{seq}}")
    return Resume(found.group(1), int(found.group(2)))


def project(line: str) -> list[tuple[str, dict[str, Any]]]:
    """The chat events of one raw ``stream-json`` line, in order (names and data without the
    provenance fields, which the caller adds)."""
    try:
        event = json.loads(line)
    except ValueError:
        event = None
    if not isinstance(event, dict):
        return [("raw", {"role": "system", "kind": "raw", "content": line})]
    kind = event.get("type")
    if kind == "assistant":
        out: list[tuple[str, dict[str, Any]]] = []
        for block in _blocks(event):
            if block.get("type") == "text" and isinstance(block.get("text"), str):
                out.append(("delta", {"content": block["text"], "role": "assistant", "kind": "message"}))
            elif block.get("type") == "tool_use":
                call = {"role": "assistant", "kind": "tool_call", "name": block.get("name"), "tool_id": block.get("id")}
                out.append(("tool_call", {**call, "input": block.get("input")}))
        return out
    if kind == "user":
        return [("tool_result", _tool_result(block)) for block in _blocks(event) if block.get("type") == "tool_result"]
    if kind == "system":
        content = " ".join(f"{k}={event[k]}" for k in ("session_id", "model") if isinstance(event.get(k), str))
        return [("status", {"role": "system", "kind": "message", "status": event.get("subtype"), "content": content})]
    if kind == "result":
        done: dict[str, Any] = {
            "role": "status",
            "kind": "usage",
            "finish_reason": event.get("subtype") or ("error" if event.get("is_error") else "success"),
            "model": event.get("model"),
        }
        for key in ("usage", "total_cost_usd"):
            if key in event:
                done[key] = event[key]
        if isinstance(event.get("result"), str):
            done["content"] = event["result"]
        return [("done", done)]
    return [("raw", {"role": "system", "kind": "raw", "content": line})]


def _blocks(event: dict[str, Any]) -> Iterator[dict[str, Any]]:
    message = event.get("message")
    content = message.get("content") if isinstance(message, dict) else None
    if isinstance(content, list):
        yield from (block for block in content if isinstance(block, dict))


def _tool_result(block: dict[str, Any]) -> dict[str, Any]:
    content = block.get("content")
    if isinstance(content, list):
        content = "".join(c.get("text", "") for c in content if isinstance(c, dict))
    return {
        "role": "tool",
        "kind": "tool_result",
        "tool_id": block.get("tool_use_id"),
        "status": "error" if block.get("is_error") else "ok",
        "content": content if isinstance(content, str) else json.dumps(content),
    }


class _Lines:
    """The raw stream's lines out of the artifact's chunks (a part may end inside a line)."""

    def __init__(self) -> None:
        self.partial = ""
        self.count = 0

    def feed(self, event: TaskEvent) -> list[str]:
        artifact = event.body.get("artifact") if event.kind == "artifact" else None
        if not isinstance(artifact, dict) or artifact.get("artifactId") != STREAM_ARTIFACT:
            return []
        text = self.partial + "".join(p.get("text", "") for p in artifact.get("parts") or [] if isinstance(p, dict))
        *lines, self.partial = text.split("\n")
        if event.body.get("lastChunk") and self.partial:
            lines.append(self.partial)
            self.partial = ""
        return [line for line in lines if line.strip()]


def _frame(event_id: str, name: str, data: dict[str, Any]) -> bytes:
    return f"id: {event_id}\nevent: {name}\ndata: ".encode() + msgspec.json.encode(data) + b"\n\n"


def error_frame(message: str) -> bytes:
    return b"event: error\ndata: " + msgspec.json.encode({"error": message, "code": "STREAM_INTERRUPTED"}) + b"\n\n"


async def chat(
    store: Store,
    hub: TaskHub,
    task_id: str,
    *,
    session: str,
    resume: Resume | None,
    replay: bool,
    keepalive_s: float,
) -> AsyncIterator[bytes]:
    """The chat stream of task ``task_id`` (see the module docstring)."""
    if resume is not None and resume.session != session:
        yield error_frame(f"event id {resume.session}-{resume.seq} is not of session {session}")
        return
    with hub.watch(task_id) as watch:
        changed = watch.changed()
        rec = await store.tasks.get(task_id)
        if rec is None:
            yield error_frame(f"command {task_id} is gone")
            return
        if resume is not None:
            skip = resume.seq
        elif replay:
            skip = 0
        else:
            skip = -1  # everything stored so far: only what comes next
        lines, seq, at, line_no = _Lines(), 0, 0, 0
        live_from = rec.last_seq if skip < 0 else 0
        while True:
            events = watch.tail_after(at)
            if events is None:
                events = await store.tasks.events_after(task_id, at)
            ended = False
            for event in events:
                at = event.seq
                for line in lines.feed(event):
                    line_no += 1
                    for name, data in project(line):
                        seq += 1
                        if seq <= skip or event.seq <= live_from:
                            continue
                        data = {**data, "session_id": session, "raw_ref": {"command_id": task_id, "line": line_no}}
                        yield _frame(f"{session}-{seq}", name, data)
                if event.kind == "status" and event.body["status"]["state"] in TERMINAL:
                    ended = True
            if ended:
                if resume is not None and resume.seq > seq:
                    yield error_frame(f"event id {session}-{resume.seq} is past the end of command {task_id}")
                return
            if events:
                changed = watch.changed()
                continue
            with trio.move_on_after(keepalive_s):
                await changed.wait()
            if not changed.is_set():
                yield KEEPALIVE
            changed = watch.changed()
