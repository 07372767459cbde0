"""The app's HTTP connection class: quart-trio's, with the response's last ``send`` shielded.

Why (the fault is upstream's; hypercorn 0.18.0 with quart-trio 0.12.0, as installed)
------------------------------------------------------------------------------------
When the app sends the last ``http.response.body`` message, hypercorn finishes the connection's
bookkeeping *inside that ``send`` call*, in the app's task:

1. ``hypercorn/protocol/http_stream.py`` ``HTTPStream.app_send`` → ``_send_closed`` sends
   ``StreamClosed`` to ``hypercorn/protocol/h11.py`` ``H11Protocol.stream_send`` →
   ``_maybe_recycle``;
2. ``_maybe_recycle`` → ``_close_stream`` → ``HTTPStream.handle(StreamClosed)`` puts
   ``{"type": "http.disconnect"}`` on the app's receive channel;
3. then ``_maybe_recycle`` sends ``Closed()`` (the connection must close: HTTP/1.0,
   ``Connection: close``, an unread body) or ``Updated(idle=True)`` (keep-alive) to
   ``hypercorn/trio/tcp_server.py`` ``TCPServer.protocol_send``, which closes the socket
   (``_close``: ``send_eof``, ``aclose``) or starts the keep-alive idle timer
   (``idle_task.restart``). None of it is shielded.

``quart_trio/asgi.py`` ``TrioASGIHTTPConnection.handle_messages`` cancels the request's nursery
as soon as it receives the ``http.disconnect`` of step 2. That nursery holds ``handle_request``,
the task still inside ``send``, so the first checkpoint of step 3 raises ``Cancelled``: the socket
is never closed and the idle timer never restarted. The connection then stays open until the
client closes it (upstream pgjones/hypercorn#330 reports the symptom). A bare ASGI app on the same
worker never cancels its own ``send`` and is not affected.

The workaround (no patched or copied upstream code): run the final body ``send`` in a shielded
cancel scope, so hypercorn's bookkeeping completes. The shield adds no unbounded wait: hypercorn
already shields its socket writes (``protocol_send`` ``RawData``), step 2 puts one message on a
bounded channel that ``handle_messages`` is still draining, and step 3 is a close or a timer start.
Drop this class once hypercorn runs that bookkeeping outside the app's task (or shields it).
"""

from __future__ import annotations

from hypercorn.typing import ASGIReceiveCallable, ASGISendCallable, ASGISendEvent
from quart_trio.asgi import TrioASGIHTTPConnection
from trio import CancelScope


def _shield_last_body(send: ASGISendCallable) -> ASGISendCallable:
    async def shielded_send(message: ASGISendEvent) -> None:
        if message["type"] == "http.response.body" and not message.get("more_body", False):
            with CancelScope(shield=True):
                await send(message)
        else:
            await send(message)

    return shielded_send


class HTTPConnection(TrioASGIHTTPConnection):
    """Set as ``app.asgi_http_class``: every HTTP request of the app goes through it."""

    async def __call__(self, receive: ASGIReceiveCallable, send: ASGISendCallable) -> None:
        await super().__call__(receive, _shield_last_body(send))
