"""Drains flooding terminals over WebSocket as fast as they send, in a process of its own (so the
bench's measuring loop is not the one starved): ``python bench/flood_drain.py URL...``.

A URL with ``#pty-ws`` at the end is a controller attach socket: it is opened with the binary
subprotocol and the bearer token in ``AIWG_TOKEN`` and joined as an observer; any other URL is read
as it is (terminado). Runs until killed; on SIGTERM prints the bytes each socket got.
"""

from __future__ import annotations

import json
import os
import signal
import sys

import trio
from trio_websocket import open_websocket_url

MIB = 1024 * 1024


async def drain(url: str, counts: dict[str, int]) -> None:
    attach = url.endswith("#pty-ws")
    url = url.removesuffix("#pty-ws")
    options: dict[str, object] = {"max_message_size": 16 * MIB, "receive_buffer_size": 256 * 1024}
    if attach:
        options["subprotocols"] = ["pty-ws.v1.binary"]
        options["extra_headers"] = [(b"Authorization", f"Bearer {os.environ['AIWG_TOKEN']}".encode())]
    async with open_websocket_url(url, **options) as ws:  # type: ignore[arg-type]
        if attach:
            join = {"op": "pty.join_session", "id": "drain", "ts": "2026-01-01T00:00:00Z"}
            await ws.send_message(json.dumps({**join, "payload": {"role": "observer"}}))
        while True:
            message = await ws.get_message()
            counts[url] = counts.get(url, 0) + len(message)
            if attach and isinstance(message, str) and '"ping"' in message:
                ping = json.loads(message)  # a socket that never answers is reaped
                pong = {"op": "pong", "id": ping["id"], "ts": ping["ts"], "payload": ping["payload"]}
                await ws.send_message(json.dumps(pong))


async def main(urls: list[str]) -> None:
    counts: dict[str, int] = {}
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async with trio.open_nursery() as nursery:
            for url in urls:
                nursery.start_soon(drain, url, counts)
            print("draining", flush=True)
            async for _ in signals:
                nursery.cancel_scope.cancel()
                break
    print(json.dumps(counts), flush=True)


if __name__ == "__main__":
    trio.run(main, sys.argv[1:])
