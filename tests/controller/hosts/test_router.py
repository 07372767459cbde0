"""The router's reading of a request: which instance (or task) it is about, what a peer is sent.

Forwarding itself, placement and the 503 of an unavailable host run end to end with two hosts in
``tests/scenarios/test_hosts.py``."""

from __future__ import annotations

import base64
from typing import Any

import pytest
import trio

from agentic_sandbox.controller.hosts.router import (
    _bearer_subprotocol,
    _Recording,
    _replay,
    _without_credentials,
    instance_ref,
)


def scope(path: str, query: bytes = b"", headers: list[tuple[bytes, bytes]] | None = None) -> dict[str, Any]:
    return {"type": "http", "path": path, "query_string": query, "headers": headers or []}


@pytest.mark.parametrize(
    ("path", "query", "ref"),
    [
        ("/agents/i-1", b"", ("instance", "i-1")),
        ("/agents/i-1/", b"", ("instance", "i-1")),
        ("/agents/i-1/message:send", b"", ("instance", "i-1")),
        ("/agents/i-1/.well-known/agent-card.json", b"", ("instance", "i-1")),
        ("/agents/i-1/sessions/s-1/attach", b"", ("instance", "i-1")),
        ("/api/v2/admin/instances/i-2", b"", ("instance", "i-2")),
        ("/api/v2/admin/instances/i-2/sessions/s", b"", ("instance", "i-2")),
        ("/api/v1/sessions/i-3/dispatch", b"", ("instance", "i-3")),
        ("/api/v1/vms/i-4/start", b"", ("instance", "i-4")),
        ("/api/v2/admin/storage/inbox/i-5/a/b.txt", b"", ("instance", "i-5")),
        ("/api/v1/storage/outbox/i-6/x", b"", ("instance", "i-6")),
        ("/api/v2/admin/storage/global/i-7/x", b"", None),
        ("/api/v2/admin/storage/inbox//etc/passwd", b"", None),
        ("/api/v2/admin/tasks/t-1/logs", b"", ("task", "t-1")),
        ("/api/v1/ws/missions/t-2", b"", ("task", "t-2")),
        ("/api/v1/hitl/t-3", b"", ("task", "t-3")),
        ("/api/v1/agent-output/chat", b"x=1&command_id=t-4", ("task", "t-4")),
        # About no one instance: served where asked.
        ("/api/v2/admin/instances", b"", None),
        ("/api/v2/admin/tasks", b"", None),
        ("/api/v2/admin/hosts", b"", None),
        ("/.well-known/jwks.json", b"", None),
        ("/api/v1/agent-output/chat", b"", None),
        ("/agentsx/i-1", b"", None),
    ],
)
def test_what_a_request_is_about(path: str, query: bytes, ref: tuple[str, str] | None) -> None:
    assert instance_ref(scope(path, query)) == ref


def test_a_peer_gets_no_credentials_of_the_callers() -> None:
    token = base64.urlsafe_b64encode(b"secret-token").decode().rstrip("=")
    headers = [
        (b"authorization", b"Bearer secret-token"),
        (b"x-aiwg-peer", b"v1.forged"),
        (b"sec-websocket-protocol", f"pty-ws.v1, bearer.{token}".encode()),
        (b"content-type", b"application/json"),
    ]
    kept = _without_credentials(headers)
    assert kept == [(b"sec-websocket-protocol", b"pty-ws.v1"), (b"content-type", b"application/json")]
    assert _without_credentials([(b"sec-websocket-protocol", f"bearer.{token}".encode())]) == []


def test_the_attach_sockets_bearer_subprotocol_is_read_as_a_header() -> None:
    token = base64.urlsafe_b64encode(b"tok-123").decode().rstrip("=")
    offered = [(b"sec-websocket-protocol", f"pty-ws.v1, bearer.{token}".encode())]
    assert _bearer_subprotocol(scope("/", headers=offered)) == "Bearer tok-123"
    assert _bearer_subprotocol(scope("/", headers=[(b"sec-websocket-protocol", b"bearer.%%%")])) is None
    assert _bearer_subprotocol(scope("/")) is None


async def test_a_body_read_for_placement_is_given_back_first() -> None:
    events = [{"type": "http.request", "body": b" tail", "more_body": False}]

    async def receive() -> dict[str, Any]:
        await trio.lowlevel.checkpoint()
        return events.pop(0)

    whole = _replay(b"{}", receive)
    assert await whole() == {"type": "http.request", "body": b"{}", "more_body": False}
    partial = _replay(b"head", receive, more=True)
    assert (await partial())["more_body"] is True
    assert (await partial())["body"] == b" tail"


async def test_a_request_read_by_a_failed_attempt_is_read_again_from_its_start() -> None:
    events = [
        {"type": "http.request", "body": b"a", "more_body": True},
        {"type": "http.request", "body": b"b", "more_body": False},
        {"type": "http.disconnect"},
    ]

    async def receive() -> dict[str, Any]:
        await trio.lowlevel.checkpoint()
        return events.pop(0)

    first = _Recording(receive)
    assert (await first())["body"] == b"a"  # an attempt that failed after one piece
    second = first.again()
    assert [(await second())["body"] for _ in range(2)] == [b"a", b"b"]  # replayed, then read on
    third = second.again()
    assert [(await third())["body"] for _ in range(2)] == [b"a", b"b"]
    assert (await third())["type"] == "http.disconnect"


async def test_a_body_too_big_to_keep_is_not_read_again() -> None:
    big = {"type": "http.request", "body": b"x" * (_Recording.KEEP_BYTES + 1), "more_body": False}

    async def receive() -> dict[str, Any]:
        await trio.lowlevel.checkpoint()
        return big

    first = _Recording(receive)
    assert (await first()) is big  # the attempt itself reads it whole
    assert (await first.again()())["type"] == "http.disconnect"
