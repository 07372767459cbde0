"""The controller ends HTTP/1 connections itself, checked byte for byte over raw sockets.

A response to an HTTP/1.0 request or to ``Connection: close`` is followed by EOF (a client reading
to EOF must not hang); an idle keep-alive connection is closed after the keep-alive timeout
(``AIWG_KEEP_ALIVE_TIMEOUT_S``), so idle clients cannot pile up file descriptors in the controller.
No hostd is needed: ``/healthz`` answers without it.
"""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator
from pathlib import Path

import psutil
import pytest
import trio

from agentic_sandbox.controller.config import load_config

from ..conftest import ControllerProcess, LiveController, controller_env, serve_controller

KEEP_ALIVE_S = 0.5
#: How long a test waits for an EOF that must come (generous for a loaded 2-core machine).
EOF_WAIT_S = 5.0


def _env(base: Path, keep_alive_s: float = KEEP_ALIVE_S) -> dict[str, str]:
    return controller_env(base / "controller", str(base / "no-hostd.sock"), AIWG_KEEP_ALIVE_TIMEOUT_S=str(keep_alive_s))


@pytest.fixture
async def live(short_dir: Path) -> AsyncIterator[LiveController]:
    async with serve_controller(load_config(env=_env(short_dir)), wait_ready=False) as controller:
        yield controller


async def _connect(url: str) -> trio.SocketStream:
    host, port = url.removeprefix("http://").rsplit(":", 1)
    return await trio.open_tcp_stream(host, int(port))


async def _read_to_eof(stream: trio.SocketStream, limit_s: float) -> tuple[bytes, float | None]:
    """Everything the server sends, and the seconds until its EOF (None: no EOF within ``limit_s``)."""
    data = b""
    started = trio.current_time()
    with trio.move_on_after(limit_s):
        while chunk := await stream.receive_some():
            data += chunk
        return data, trio.current_time() - started
    return data, None


async def test_http10_response_is_followed_by_eof(live: LiveController) -> None:
    stream = await _connect(live.url)
    async with stream:
        await stream.send_all(b"GET /healthz HTTP/1.0\r\n\r\n")
        data, eof_after = await _read_to_eof(stream, EOF_WAIT_S)
    assert data.startswith(b"HTTP/1.1 200 "), data
    assert eof_after is not None, f"no EOF within {EOF_WAIT_S} s after an HTTP/1.0 response"
    assert eof_after < KEEP_ALIVE_S, "closed by the idle timer, not after the response"


async def test_connection_close_is_followed_by_eof(live: LiveController) -> None:
    stream = await _connect(live.url)
    async with stream:
        await stream.send_all(b"GET /healthz HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n")
        data, eof_after = await _read_to_eof(stream, EOF_WAIT_S)
    assert data.startswith(b"HTTP/1.1 200 ") and b"\r\nconnection: close\r\n" in data.lower(), data
    assert eof_after is not None, f"no EOF within {EOF_WAIT_S} s after a Connection: close response"
    assert eof_after < KEEP_ALIVE_S, "closed by the idle timer, not after the response"


async def test_idle_keep_alive_connection_is_closed(live: LiveController) -> None:
    stream = await _connect(live.url)
    async with stream:
        # Two requests on one connection: keep-alive itself still works.
        for _ in range(2):
            await stream.send_all(b"GET /healthz HTTP/1.1\r\nHost: test\r\n\r\n")
            data = b""
            with trio.fail_after(EOF_WAIT_S):
                while not data.endswith(b"}"):  # the whole answer: {"status":"alive"}
                    data += await stream.receive_some()
            assert data.startswith(b"HTTP/1.1 200 ") and b"connection: close" not in data.lower(), data
        rest, eof_after = await _read_to_eof(stream, EOF_WAIT_S)
    assert rest == b""
    assert eof_after is not None, f"idle keep-alive connection still open after {EOF_WAIT_S} s"
    assert eof_after >= KEEP_ALIVE_S * 0.8, f"closed after {eof_after:.2f} s, before the keep-alive timeout"


async def test_idle_clients_do_not_hold_descriptors(short_dir: Path) -> None:
    """Many clients that made one request and went quiet: the controller's fd count comes back down."""
    clients = 200
    keep_alive_s = 5.0  # long enough for all the clients to be connected at once, even on a busy box
    async with trio.open_nursery() as nursery:
        process = ControllerProcess(_env(short_dir, keep_alive_s))
        url = await process.start(nursery)
        assert process.proc is not None
        controller = psutil.Process(process.proc.pid)
        host, port = url.removeprefix("http://").rsplit(":", 1)
        request = f"GET /healthz HTTP/1.1\r\nHost: {host}\r\n\r\n".encode()

        # Warm up (first request, lazily opened files), then take the baseline.
        warm = await _connect(url)
        async with warm:
            await warm.send_all(request)
            await _read_to_eof(warm, EOF_WAIT_S)
        baseline = controller.num_fds()

        socks: list[socket.socket] = []
        try:
            for _ in range(clients):
                sock = socket.create_connection((host, int(port)))
                sock.sendall(request)
                socks.append(sock)
            for sock in socks:  # every client got its whole answer and now sits idle
                sock.settimeout(EOF_WAIT_S)
                answer = b""
                while not answer.endswith(b"}"):
                    answer += sock.recv(4096)
                assert answer.startswith(b"HTTP/1.1 200 "), answer
            assert controller.num_fds() >= baseline + clients * 0.9, "the clients were not all connected at once"

            def all_closed() -> bool:
                for sock in socks:
                    sock.settimeout(keep_alive_s + EOF_WAIT_S)
                    if sock.recv(4096) != b"":
                        return False
                return True

            assert await trio.to_thread.run_sync(all_closed), "a client got data instead of EOF"
            with trio.fail_after(EOF_WAIT_S):
                while controller.num_fds() > baseline + 2:
                    await trio.sleep(0.05)
        finally:
            for sock in socks:
                sock.close()
        assert await process.stop() == 0, process.output()
        nursery.cancel_scope.cancel()
