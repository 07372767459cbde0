"""A small SSE reader over an httpx streaming response (the tests' client for /events and /logs)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import httpx


@dataclass
class SseEvent:
    event: str
    data: Any
    id: int | None = None
    comments: list[str] = field(default_factory=list)


class SseReader:
    """Parses the stream into events; comments (``: keepalive``) are kept on the next event or
    returned alone as an event named ``""`` when ``comments=True``."""

    def __init__(self, response: httpx.Response) -> None:
        self._lines = response.aiter_lines()

    async def next(self, *, comments: bool = False) -> SseEvent:
        fields: dict[str, str] = {}
        seen_comments: list[str] = []
        async for line in self._lines:
            if line == "":
                if fields:
                    raw_id = fields.get("id")
                    return SseEvent(
                        event=fields.get("event", "message"),
                        data=json.loads(fields["data"]) if "data" in fields else None,
                        id=int(raw_id) if raw_id is not None else None,
                        comments=seen_comments,
                    )
                if comments and seen_comments:
                    return SseEvent(event="", data=None, comments=seen_comments)
                continue
            if line.startswith(":"):
                seen_comments.append(line[1:].strip())
                continue
            name, _, value = line.partition(":")
            fields[name] = value[1:] if value.startswith(" ") else value
        raise EOFError("the stream ended")

    async def until(self, predicate: Any) -> SseEvent:
        while True:
            event = await self.next()
            if predicate(event):
                return event
