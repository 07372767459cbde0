"""A real local webhook receiver for the push tests: a small HTTP/1.1 server on a loopback port.

It records every request it answered (headers, JSON body), and can be told to answer 500 to the
first ``fail_first`` requests, to never answer (``hang``: it reads the request and keeps the
connection open without a word) or to answer each after ``delay_s``. It closes each connection
after one answer unless ``keep_alive``. ``most_in_flight`` is the most requests it held at once
(read and not yet answered): one config's deliveries come one at a time.
"""

from __future__ import annotations

import json
import ssl
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import h11
import trio


@dataclass
class Received:
    path: str
    headers: dict[str, str]
    body: dict[str, Any]


@dataclass
class Receiver:
    fail_first: int = 0
    hang: bool = False
    #: The status of a successful answer (a 3xx to see that redirects are not followed).
    status: int = 200
    #: Serve https with this context.
    tls: ssl.SSLContext | None = None
    #: Answer more than one request per connection (HTTP/1.1 keep-alive), as most servers do;
    #: without it each connection is closed after its answer.
    keep_alive: bool = False
    received: list[Received] = field(default_factory=list)
    attempts: int = 0
    #: Connections accepted.
    connections: int = 0
    #: Seconds between reading a request (recorded then) and answering it.
    delay_s: float = 0.0
    #: Requests read and not answered yet, and the most there were at once.
    in_flight: int = 0
    most_in_flight: int = 0
    port: int = 0
    _news: trio.Event = field(default_factory=trio.Event)

    @property
    def url(self) -> str:
        return f"{'https' if self.tls else 'http'}://127.0.0.1:{self.port}/hook"

    async def serve(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        self.port = listeners[0].socket.getsockname()[1]
        task_status.started()
        await trio.serve_listeners(partial(self._handle), listeners)

    async def _handle(self, plain: trio.SocketStream) -> None:
        self.connections += 1
        stream: trio.abc.Stream = plain
        if self.tls is not None:
            stream = trio.SSLStream(plain, self.tls, server_side=True)
        conn = h11.Connection(h11.SERVER)
        try:
            while await self._answer(stream, conn) and self.keep_alive:
                conn.start_next_cycle()
        except (trio.BrokenResourceError, h11.ProtocolError, ssl.SSLError):
            return
        finally:
            with trio.move_on_after(1) as cleanup:
                cleanup.shield = True
                await stream.aclose()

    async def _answer(self, stream: trio.abc.Stream, conn: h11.Connection) -> bool:
        """One request and its answer; False if the client closed the connection first."""
        request: h11.Request | None = None
        body = b""
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                data = await stream.receive_some(65536)
                if not data:
                    return False
                conn.receive_data(bytes(data))
            elif isinstance(event, h11.Request):
                request = event
            elif isinstance(event, h11.Data):
                body += event.data
            elif isinstance(event, h11.EndOfMessage):
                break
        assert request is not None
        self.attempts += 1
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            self._pulse()
            if self.hang:
                await trio.sleep_forever()
            if self.attempts <= self.fail_first:
                status = 500
            else:
                status = self.status
                headers = {k.decode().lower(): v.decode() for k, v in request.headers}
                self.received.append(Received(request.target.decode(), headers, json.loads(body)))
                self._pulse()
            await trio.sleep(self.delay_s)
            head = [("Content-Length", "0"), ("Location", "http://127.0.0.1:9/elsewhere")]
            out = conn.send(h11.Response(status_code=status, headers=head))
            await stream.send_all(out + conn.send(h11.EndOfMessage()))
        finally:
            self.in_flight -= 1
        return True

    def _pulse(self) -> None:
        self._news.set()
        self._news = trio.Event()

    async def wait_for(self, done: Any, timeout: float = 30.0) -> None:
        """Until ``done()`` is true (bounded: a missing delivery fails the test, it does not hang it)."""
        with trio.fail_after(timeout):
            while not done():
                news = self._news
                with trio.move_on_after(0.5):
                    await news.wait()

    def states(self) -> list[str]:
        return [r.body["statusUpdate"]["status"]["state"] for r in self.received if "statusUpdate" in r.body]
