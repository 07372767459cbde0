"""terminado (the WebSocket terminal behind Jupyter: one Python process owning the PTYs, tornado)
as bench_typing's peer: ``python bench/terminado_server.py`` prints ``listening on ws://HOST:PORT``.

``/typing`` is one terminal running the typing command (``sh -c 'stty raw -echo; echo READY; exec
cat'``); ``/flood/NAME`` a terminal per name running ``yes``. Frames are terminado's JSON arrays:
``["stdin", text]`` in, ``["stdout", text]`` out. Needs the ``bench`` extra (terminado).
"""

from __future__ import annotations

import asyncio
import sys

import tornado.web
from terminado import NamedTermManager, SingleTermManager, TermSocket

TYPING = ["sh", "-c", "stty raw -echo; echo READY; exec cat"]


async def main() -> None:
    typing = SingleTermManager(shell_command=TYPING)
    floods = NamedTermManager(shell_command=["yes"], max_terminals=64)
    app = tornado.web.Application(
        [
            (r"/typing", TermSocket, {"term_manager": typing}),
            (r"/flood/(\w+)", TermSocket, {"term_manager": floods}),
        ]
    )
    server = app.listen(0, "127.0.0.1")
    port = next(iter(server._sockets.values())).getsockname()[1]
    print(f"listening on ws://127.0.0.1:{port}", flush=True)
    try:
        await asyncio.Event().wait()
    finally:
        await floods.kill_all()
        await typing.kill_all()


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
