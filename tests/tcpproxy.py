"""A loopback TCP proxy a test can cut: what one process sees of a server that goes away while
others still reach it (its connections reset, new ones refused until it is restored)."""

from __future__ import annotations

import trio


class TcpProxy:
    """Forwards ``127.0.0.1:<port>`` to ``target``. Run with ``nursery.start(proxy.run)``."""

    def __init__(self, target_host: str, target_port: int) -> None:
        self.target = (target_host, target_port)
        self.port = 0
        self._cut = False
        self._scopes: set[trio.CancelScope] = set()

    async def run(self, *, task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED) -> None:
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        self.port = listeners[0].socket.getsockname()[1]
        task_status.started(self.port)
        await trio.serve_listeners(self._serve, listeners)

    def cut(self) -> None:
        """Drop every connection now and refuse new ones."""
        self._cut = True
        for scope in list(self._scopes):
            scope.cancel()

    def restore(self) -> None:
        self._cut = False

    async def _serve(self, client: trio.SocketStream) -> None:
        async with client:
            if self._cut:
                return
            with trio.CancelScope() as scope:
                self._scopes.add(scope)
                try:
                    upstream = await trio.open_tcp_stream(*self.target)
                except OSError:
                    return
                async with upstream, trio.open_nursery() as nursery:
                    nursery.start_soon(_pipe, client, upstream, nursery.cancel_scope)
                    nursery.start_soon(_pipe, upstream, client, nursery.cancel_scope)
            self._scopes.discard(scope)


async def _pipe(source: trio.SocketStream, sink: trio.SocketStream, done: trio.CancelScope) -> None:
    try:
        while data := await source.receive_some(65536):
            await sink.send_all(data)
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        pass
    done.cancel()
