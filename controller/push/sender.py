"""One webhook POST: to the checked address itself, over HTTP/1.1, no redirects followed.

The connection goes to :attr:`Target.address` (never re-resolved); the URL's host is sent as
``Host`` and, for https, as SNI and the name the certificate is verified against (the system's
trust store). Any answer but 2xx is a failure (a 3xx too: a redirect is not followed). The whole
attempt (connect, TLS, send, answer head) is bounded by ``timeout``; the answer's body is not read
beyond a small bound (a receiver has nothing to say to us but its status).
"""

from __future__ import annotations

import ssl

import h11
import trio

from .target import Target

MAX_ANSWER_BYTES = 64 * 1024


class DeliveryFailed(Exception):
    """The attempt did not end in a 2xx (the message says why, for the log)."""


def _tls_context() -> ssl.SSLContext:
    return ssl.create_default_context()


async def post(
    target: Target, body: bytes, headers: list[tuple[str, str]], *, timeout: float, tls: ssl.SSLContext | None = None
) -> int:
    """POST ``body``; the status of a 2xx answer, or :class:`DeliveryFailed`."""
    try:
        with trio.fail_after(timeout):
            return await _post(target, body, headers, tls)
    except trio.TooSlowError:
        raise DeliveryFailed(f"no answer within {timeout:g}s") from None
    except (OSError, trio.BrokenResourceError, h11.ProtocolError, ssl.SSLError) as exc:
        cause = exc.__cause__ or exc  # trio wraps a TLS failure (a certificate refused) in BrokenResourceError
        raise DeliveryFailed(f"{type(cause).__name__}: {cause}") from None


async def _post(target: Target, body: bytes, headers: list[tuple[str, str]], tls: ssl.SSLContext | None) -> int:
    url = target.url
    stream: trio.abc.Stream = await trio.open_tcp_stream(target.address, url.port)
    try:
        if url.scheme == "https":
            stream = trio.SSLStream(stream, tls or _tls_context(), server_hostname=url.host, https_compatible=True)
            await stream.do_handshake()
        conn = h11.Connection(h11.CLIENT)
        head = [("Host", url.host_header), ("Content-Length", str(len(body))), ("Connection", "close"), *headers]
        await stream.send_all(
            conn.send(h11.Request(method="POST", target=url.path, headers=head))
            + conn.send(h11.Data(data=body))
            + conn.send(h11.EndOfMessage())
        )
        received = 0
        while True:
            event = conn.next_event()
            if event is h11.NEED_DATA:
                data = await stream.receive_some(16384)
                received += len(data)
                if received > MAX_ANSWER_BYTES:
                    raise DeliveryFailed("the answer's head is too large")
                conn.receive_data(bytes(data))
                continue
            if isinstance(event, h11.Response):
                if not 200 <= event.status_code < 300:
                    raise DeliveryFailed(f"answered {event.status_code}")
                return int(event.status_code)
            if isinstance(event, h11.ConnectionClosed):
                raise DeliveryFailed("the connection closed before an answer")
    finally:
        with trio.move_on_after(1) as cleanup:
            cleanup.shield = True
            await stream.aclose()
