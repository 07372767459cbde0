"""Forwarding to a peer over real sockets: an edge app that forwards everything (hypercorn on
loopback) in front of a raw ASGI peer (hypercorn too); httpx and trio-websocket as clients."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import pytest
import trio
import trio_websocket
from hypercorn.config import Config
from hypercorn.trio import serve

from agentic_sandbox.controller.hosts.forward import Forwarder, PeerUnreachable
from agentic_sandbox.controller.pty.legacy import answer_lifespan as lifespan


class Peer:
    """A raw ASGI app: what each path does is below; what it saw is kept for the test."""

    def __init__(self) -> None:
        self.release = trio.Event()
        self.disconnected = trio.Event()
        self.heads: list[dict[bytes, bytes]] = []
        self.connections: set[Any] = set()

    async def __call__(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            await lifespan(receive, send)
            return
        self.heads.append(dict(scope["headers"]))
        self.connections.add(scope.get("client"))
        if scope["type"] == "websocket":
            await self._websocket(scope, receive, send)
            return
        path = scope["path"]
        body = b""
        while True:
            event = await receive()
            body += event.get("body", b"")
            if not event.get("more_body"):
                break
        if path == "/stream":
            await send(
                {"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/event-stream")]}
            )
            await send({"type": "http.response.body", "body": b"data: one\n\n", "more_body": True})
            await self.release.wait()
            await send({"type": "http.response.body", "body": b"data: two\n\n", "more_body": False})
        elif path == "/hang":
            await send({"type": "http.response.start", "status": 200, "headers": []})
            await send({"type": "http.response.body", "body": b"first", "more_body": True})
            while (await receive())["type"] != "http.disconnect":
                pass
            self.disconnected.set()
        else:
            answer = {
                "method": scope["method"],
                "path": path,
                "query": scope["query_string"].decode(),
                "size": len(body),
            }
            data = json.dumps(answer).encode()
            head = [
                (b"content-type", b"application/json"),
                (b"x-peer", b"yes"),
                (b"content-length", str(len(data)).encode()),
            ]
            await send({"type": "http.response.start", "status": 201, "headers": head})
            await send({"type": "http.response.body", "body": data, "more_body": False})

    async def _websocket(self, scope: dict[str, Any], receive: Any, send: Any) -> None:
        await receive()  # websocket.connect
        if scope["path"] == "/refuse":
            head = [(b"content-type", b"application/json"), (b"www-authenticate", b"Bearer")]
            await send({"type": "websocket.http.response.start", "status": 401, "headers": head})
            await send({"type": "websocket.http.response.body", "body": b'{"error":"no"}', "more_body": False})
            return
        offered = scope.get("subprotocols") or []
        await send({"type": "websocket.accept", "subprotocol": offered[0] if offered else None})
        while True:
            event = await receive()
            if event["type"] == "websocket.disconnect":
                return
            if event.get("text") == "close":
                await send({"type": "websocket.close", "code": 4001, "reason": "bye"})
                return
            if event.get("text") is not None:
                await send({"type": "websocket.send", "text": "echo:" + event["text"]})
            else:
                await send({"type": "websocket.send", "bytes": b"echo:" + event["bytes"]})


def edge_app(forwarder: Forwarder, peer_url: str) -> Any:
    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            await lifespan(receive, send)
            return
        headers = list(scope["headers"])
        try:
            if scope["type"] == "websocket":
                await forwarder.websocket(peer_url, scope, receive, send, headers)
            else:
                await forwarder.http(peer_url, scope, receive, send, headers)
        except PeerUnreachable as exc:
            await send({"type": "http.response.start", "status": 503, "headers": []})
            await send({"type": "http.response.body", "body": str(exc).encode(), "more_body": False})

    return app


@asynccontextmanager
async def served(app: Any) -> AsyncIterator[str]:
    config = Config()
    config.bind = ["127.0.0.1:0"]
    config.graceful_timeout = 0.5
    stop = trio.Event()
    async with trio.open_nursery() as nursery:
        binds = await nursery.start(
            lambda task_status: serve(app, config, shutdown_trigger=stop.wait, task_status=task_status)
        )
        try:
            yield str(binds[0])
        finally:
            stop.set()


@asynccontextmanager
async def pair() -> AsyncIterator[tuple[Peer, str, Forwarder]]:
    peer = Peer()
    forwarder = Forwarder(connect_timeout_s=2)
    async with served(peer) as peer_url, served(edge_app(forwarder, peer_url)) as edge_url:
        try:
            yield peer, edge_url, forwarder
        finally:
            await forwarder.aclose()


async def test_a_request_and_its_answer_pass_whole_and_connections_are_kept_alive() -> None:
    async with pair() as (peer, edge, _), httpx.AsyncClient(base_url=edge, timeout=10) as client:
        body = b"x" * (3 * 1024 * 1024 + 7)
        for n in range(5):
            answer = await client.post(f"/echo/{n}?a=1&b=%20", content=body, headers={"authorization": "Bearer t"})
            assert answer.status_code == 201 and answer.headers["x-peer"] == "yes"
            assert answer.json() == {"method": "POST", "path": f"/echo/{n}", "query": "a=1&b=%20", "size": len(body)}
        head = peer.heads[-1]
        assert head[b"x-aiwg-hop"] == b"1" and head[b"x-forwarded-for"] == b"127.0.0.1"
        assert b"authorization" in head  # the caller decides what goes (the router drops credentials)
        assert len(peer.connections) == 1  # one kept-alive connection from the edge for all five

        async def pieces() -> AsyncIterator[bytes]:
            for _ in range(4):
                yield b"y" * 1000
                await trio.sleep(0.01)

        chunked = await client.post("/echo/chunked", content=pieces())
        assert chunked.json()["size"] == 4000


async def test_a_stream_flows_as_the_peer_writes_it() -> None:
    async with pair() as (peer, edge, _), httpx.AsyncClient(base_url=edge, timeout=10) as client:
        async with client.stream("GET", "/stream") as stream:
            lines = stream.aiter_lines()
            with trio.fail_after(5):  # the first event arrives while the peer still holds the second
                assert await lines.__anext__() == "data: one"
            peer.release.set()
            rest = [line async for line in lines]
        assert "data: two" in rest


async def test_a_client_that_leaves_ends_the_peers_request() -> None:
    async with pair() as (peer, edge, _):
        async with httpx.AsyncClient(base_url=edge, timeout=10) as client, client.stream("GET", "/hang") as stream:
            async for chunk in stream.aiter_bytes():
                assert chunk == b"first"
                break
        with trio.fail_after(5):
            await peer.disconnected.wait()


async def test_a_peer_that_does_not_listen_is_unreachable() -> None:
    forwarder = Forwarder(connect_timeout_s=1)
    async with served(edge_app(forwarder, "http://127.0.0.1:1")) as edge, httpx.AsyncClient(base_url=edge) as client:
        answer = await client.get("/anything")
    assert answer.status_code == 503 and "cannot connect" in answer.text


async def test_a_websocket_is_relayed_both_ways_with_its_subprotocol_and_close() -> None:
    async with pair() as (_, edge, _):
        url = "ws" + edge.removeprefix("http") + "/ws?x=1"
        async with trio_websocket.open_websocket_url(url, subprotocols=["pty-ws.v1"]) as ws:
            assert ws.subprotocol == "pty-ws.v1"
            await ws.send_message("hello")
            assert await ws.get_message() == "echo:hello"
            await ws.send_message(b"\x00\x01" * 40000)
            assert await ws.get_message() == b"echo:" + b"\x00\x01" * 40000
            await ws.send_message("close")
            with pytest.raises(trio_websocket.ConnectionClosed) as closed:
                await ws.get_message()
            assert closed.value.reason.code == 4001 and closed.value.reason.reason == "bye"


async def test_a_websocket_refusal_is_the_clients_refusal() -> None:
    async with pair() as (_, edge, _):
        url = "ws" + edge.removeprefix("http") + "/refuse"
        with pytest.raises(trio_websocket.ConnectionRejected) as refused:
            async with trio_websocket.open_websocket_url(url):
                pass
        assert refused.value.status_code == 401 and refused.value.body == b'{"error":"no"}'
        assert (b"www-authenticate", b"Bearer") in refused.value.headers
