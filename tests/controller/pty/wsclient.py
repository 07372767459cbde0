"""A pty-ws/v1 test client on the ``websockets`` package (its sync client, driven from trio through
worker threads), which validates every JSON frame the server sends against upstream's schemas."""

from __future__ import annotations

import base64
import json
import struct
from datetime import UTC, datetime
from ssl import SSLContext
from typing import Any

import trio
from websockets.exceptions import ConnectionClosed, InvalidStatus
from websockets.sync.client import ClientConnection, connect

from agentic_sandbox.proto import new_id
from tests.contracts import validate_pty_frame

from ..conftest import ADMIN_TOKEN

__all__ = ["WS", "ConnectionClosed", "InvalidStatus", "attach_url", "cframe"]


def attach_url(base: str, instance_id: str, session_id: str, query: str = "") -> str:
    url = "ws" + base.removeprefix("http") + f"/agents/{instance_id}/sessions/{session_id}/attach"
    return url + (f"?{query}" if query else "")


def cframe(op: str, payload: dict[str, Any] | None = None, **extra: Any) -> dict[str, Any]:
    ts = datetime.now(UTC).isoformat().replace("+00:00", "Z")
    return {"op": op, "id": new_id(), "ts": ts, "payload": {} if payload is None else payload, **extra}


class WS:
    def __init__(self, conn: ClientConnection) -> None:
        self.conn = conn
        #: Every JSON frame received, in order (after validation).
        self.frames: list[dict[str, Any]] = []

    @classmethod
    async def connect(
        cls,
        url: str,
        *,
        token: str | None = ADMIN_TOKEN,
        subprotocols: tuple[str, ...] = ("pty-ws.v1",),
        headers: dict[str, str] | None = None,
        ssl: SSLContext | None = None,
    ) -> WS:
        all_headers = dict(headers or {})
        if token is not None:
            all_headers["Authorization"] = f"Bearer {token}"

        def open_() -> ClientConnection:
            return connect(
                url,
                subprotocols=list(subprotocols) or None,  # type: ignore[arg-type]
                additional_headers=all_headers,
                open_timeout=10,
                max_size=None,
                close_timeout=2,
                ssl=ssl,
            )

        return cls(await trio.to_thread.run_sync(open_))

    @property
    def subprotocol(self) -> str | None:
        return self.conn.subprotocol

    async def send(self, message: dict[str, Any] | str | bytes) -> None:
        data = json.dumps(message) if isinstance(message, dict) else message
        await trio.to_thread.run_sync(self.conn.send, data)

    async def recv(self, timeout: float = 15) -> str | bytes:
        return await trio.to_thread.run_sync(lambda: self.conn.recv(timeout=timeout))

    async def frame(self, timeout: float = 15) -> dict[str, Any] | tuple[int, bytes]:
        """The next frame: a validated JSON frame, or ``(seq, data)`` for a PW1O binary frame."""
        message = await self.recv(timeout)
        if isinstance(message, bytes):
            magic, seq, stream = struct.unpack(">4sQB", message[:13])
            assert magic == b"PW1O" and stream == 1, message[:13]
            return seq, message[13:]
        frame = json.loads(message)
        validate_pty_frame(frame)
        self.frames.append(frame)
        return frame

    async def json(self, timeout: float = 15) -> dict[str, Any]:
        frame = await self.frame(timeout)
        assert isinstance(frame, dict), frame
        return frame

    async def until(self, pred: Any, timeout: float = 15) -> dict[str, Any]:
        """Read JSON frames (skipping pings and others) until one matches ``pred``."""
        with trio.fail_after(timeout):
            while True:
                frame = await self.frame(timeout)
                if isinstance(frame, dict) and pred(frame):
                    return frame

    async def kind(self, kind: str, timeout: float = 15) -> dict[str, Any]:
        return await self.until(lambda fr: fr["op"] == "pty.session_frame" and fr["payload"]["kind"] == kind, timeout)

    async def error(self, timeout: float = 15) -> dict[str, Any]:
        return await self.until(lambda fr: fr["op"] == "Error", timeout)

    async def join(self, role: str = "controller", **extra: Any) -> dict[str, Any]:
        """Send the join; return the RoleAssigned payload."""
        payload = {"role": role, **extra.pop("payload", {})}
        await self.send(cframe("pty.join_session", payload, **extra))
        return (await self.kind("RoleAssigned"))["payload"]

    async def type(self, text: bytes) -> None:
        await self.send(cframe("pty.session_input", {"data": base64.b64encode(text).decode()}))

    async def output_until(self, needle: bytes, timeout: float = 15) -> bytes:
        """Output bytes (JSON or binary frames) until ``needle`` has been seen."""
        seen = b""
        with trio.fail_after(timeout):
            while needle not in seen:
                frame = await self.frame(timeout)
                if isinstance(frame, tuple):
                    seen += frame[1]
                elif frame["op"] == "pty.session_frame" and frame["payload"]["kind"] == "Output":
                    seen += base64.b64decode(frame["payload"]["data"])
        return seen

    async def close_code(self, timeout: float = 15) -> int | None:
        """Read until the server closes; its close code."""
        with trio.fail_after(timeout):
            while True:
                try:
                    await self.frame(timeout)
                except ConnectionClosed as exc:
                    return exc.rcvd.code if exc.rcvd is not None else None

    async def close(self) -> None:
        await trio.to_thread.run_sync(self.conn.close)
