"""A bare ASGI WebSocket echo served by hypercorn's trio worker: bench_pty_ws's HTTP-stack baseline.

``python bench/ws_echo_server.py`` prints ``listening on ws://HOST:PORT`` and echoes every frame.
"""

from __future__ import annotations

import sys
from typing import Any

import trio
from hypercorn.config import Config
from hypercorn.trio import serve

from agentic_sandbox.controller.pty.legacy import answer_lifespan


async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    if scope["type"] == "lifespan":
        await answer_lifespan(receive, send)
        return
    if scope["type"] != "websocket":
        return
    await receive()  # websocket.connect
    await send({"type": "websocket.accept"})
    while True:
        event = await receive()
        if event["type"] != "websocket.receive":
            return
        await send({"type": "websocket.send", "bytes": event.get("bytes"), "text": event.get("text")})


async def main() -> None:
    config = Config()
    config.bind = ["127.0.0.1:0"]
    config.accesslog = None
    async with trio.open_nursery() as nursery:
        binds = await nursery.start(serve, app, config)
        print("listening on " + binds[0].replace("http", "ws"), flush=True)


if __name__ == "__main__":
    sys.exit(trio.run(main))
