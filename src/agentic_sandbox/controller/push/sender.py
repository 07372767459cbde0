"""Webhook POSTs over kept-alive HTTP/1.1 connections, each pinned to the address checked when it
was opened; no redirects followed.

:class:`Sender` keeps up to :data:`IDLE_PER_ORIGIN` idle connections per origin (scheme, host,
port). A POST takes an idle connection of its origin when there is one, else resolves the URL and
checks every address (:func:`controller.push.target.resolve`) and connects to the address chosen,
sending the URL's host as ``Host`` and, for https, as SNI and the name the certificate is verified
against (the system's trust store; the TLS context is made once). So a connection never goes
anywhere but an address that was checked when it was opened, and a name that resolves elsewhere
later (DNS rebinding) cannot move it; a connection is not reused after :data:`MAX_AGE_S`, so a
receiver that moved is found again by its name.

Any answer but 2xx is a failure (a 3xx too: a redirect is not followed). The whole attempt
(connect, TLS, send, answer) is bounded by the sender's ``timeout``; the answer's body is read (to
reuse the connection) up to a small bound, beyond which the connection is closed instead. A
receiver may close a kept-alive connection whenever it likes: a reused connection that fails
before any answer came is dropped and the POST is made once more on a new one (the receiver may
then see it twice, which push delivery allows: at least once).
"""

from __future__ import annotations

import ssl
from collections import deque
from dataclasses import dataclass, field

import h11
import trio

from .target import Target, Url, resolve

MAX_ANSWER_BYTES = 64 * 1024
#: Idle connections kept per origin, and by the whole sender.
IDLE_PER_ORIGIN = 4
IDLE_TOTAL = 256
#: An idle connection older than this is closed rather than reused (receivers close idle ones).
IDLE_S = 15.0
#: A connection is not reused after this long (a receiver that moved is resolved again).
MAX_AGE_S = 120.0

Origin = tuple[str, str, int]


class DeliveryFailed(Exception):
    """The attempt did not end in a 2xx (the message says why, for the log)."""


class _Stale(Exception):
    """A reused connection failed before any answer came: the receiver had closed it."""


@dataclass(eq=False)
class _Connection:
    stream: trio.abc.Stream
    address: str
    opened: float
    idle_since: float = 0.0
    http: h11.Connection = field(default_factory=lambda: h11.Connection(h11.CLIENT))


def tls_context() -> ssl.SSLContext:
    return ssl.create_default_context()


def origin_of(url: Url) -> Origin:
    return (url.scheme, url.host.lower(), url.port)


class Sender:
    """The POSTs of push delivery (one per app); :meth:`close` closes what it keeps."""

    def __init__(self, *, allow_private: bool, timeout: float, tls: ssl.SSLContext | None = None) -> None:
        self.allow_private = allow_private
        self.timeout = timeout
        self._tls = tls
        self._idle: dict[Origin, deque[_Connection]] = {}
        self._idle_count = 0
        #: Connections opened (for the tests and the bench: keep-alive means few).
        self.opened = 0

    async def post(self, url: Url, body: bytes, headers: list[tuple[str, str]]) -> int:
        """POST ``body`` to ``url``; the status of a 2xx answer, or :class:`DeliveryFailed`
        (:class:`~controller.errors.ValidationFailed` when the URL no longer passes the checks)."""
        try:
            with trio.fail_after(self.timeout):
                reused = self._checkout(origin_of(url))
                if reused is not None:
                    try:
                        return await self._exchange(reused, url, body, headers, reused=True)
                    except _Stale:
                        pass  # closed by the receiver while idle: once more on a new connection
                target = await resolve(url, allow_private=self.allow_private)
                return await self._exchange(await self._connect(target), url, body, headers, reused=False)
        except trio.TooSlowError:
            raise DeliveryFailed(f"no answer within {self.timeout:g}s") from None

    async def post_to(self, target: Target, body: bytes, headers: list[tuple[str, str]]) -> int:
        """POST to an address checked already, on a new connection (the bench's baseline, tests)."""
        try:
            with trio.fail_after(self.timeout):
                conn = await self._connect(target)
                return await self._exchange(conn, target.url, body, headers, reused=False, keep=False)
        except trio.TooSlowError:
            raise DeliveryFailed(f"no answer within {self.timeout:g}s") from None

    def close(self) -> None:
        """Close the idle connections kept (at shutdown)."""
        for pool in self._idle.values():
            for conn in pool:
                _drop(conn)
        self._idle.clear()
        self._idle_count = 0

    # -- the pool ---------------------------------------------------------------------------------

    def _checkout(self, origin: Origin) -> _Connection | None:
        pool = self._idle.get(origin)
        now = trio.current_time()
        while pool:
            conn = pool.pop()  # the most recently used: the least likely to have been closed
            self._idle_count -= 1
            if now - conn.idle_since < IDLE_S and now - conn.opened < MAX_AGE_S:
                return conn
            _drop(conn)
        return None

    def _checkin(self, origin: Origin, conn: _Connection) -> bool:
        """Keep ``conn`` for reuse if the exchange left it clean and there is room."""
        if conn.http.our_state is not h11.DONE or conn.http.their_state is not h11.DONE:
            return False
        if self._idle_count >= IDLE_TOTAL or len(self._idle.get(origin, ())) >= IDLE_PER_ORIGIN:
            return False
        conn.http.start_next_cycle()
        conn.idle_since = trio.current_time()
        self._idle.setdefault(origin, deque()).append(conn)
        self._idle_count += 1
        return True

    async def _connect(self, target: Target) -> _Connection:
        url = target.url
        try:
            stream: trio.abc.Stream = await trio.open_tcp_stream(target.address, url.port)
        except OSError as exc:
            raise DeliveryFailed(f"{type(exc).__name__}: {exc}") from None
        self.opened += 1
        conn = _Connection(stream, target.address, trio.current_time())
        if url.scheme == "https":
            if self._tls is None:
                self._tls = tls_context()
            conn.stream = trio.SSLStream(stream, self._tls, server_hostname=url.host, https_compatible=True)
            try:
                await conn.stream.do_handshake()
            except BaseException as exc:
                await _close(conn)
                if isinstance(exc, trio.BrokenResourceError | ssl.SSLError | OSError):
                    cause = exc.__cause__ or exc  # trio wraps a refused certificate in BrokenResourceError
                    raise DeliveryFailed(f"{type(cause).__name__}: {cause}") from None
                raise
        return conn

    # -- one exchange -----------------------------------------------------------------------------

    async def _exchange(
        self,
        conn: _Connection,
        url: Url,
        body: bytes,
        headers: list[tuple[str, str]],
        *,
        reused: bool,
        keep: bool = True,
    ) -> int:
        kept = False
        try:
            status = await self._request(conn, url, body, headers, reused=reused)
            kept = keep and self._checkin(origin_of(url), conn)
            if not 200 <= status < 300:
                raise DeliveryFailed(f"answered {status}")
            return status
        except (OSError, trio.BrokenResourceError, trio.ClosedResourceError, h11.ProtocolError, ssl.SSLError) as exc:
            cause = exc.__cause__ or exc
            raise DeliveryFailed(f"{type(cause).__name__}: {cause}") from None
        finally:
            if not kept:
                await _close(conn)

    async def _request(
        self, conn: _Connection, url: Url, body: bytes, headers: list[tuple[str, str]], *, reused: bool
    ) -> int:
        http = conn.http
        head = [("Host", url.host_header), ("Content-Length", str(len(body))), *headers]
        answered = False
        try:
            await conn.stream.send_all(
                http.send(h11.Request(method="POST", target=url.path, headers=head))
                + http.send(h11.Data(data=body))
                + http.send(h11.EndOfMessage())
            )
            status = 0
            received = 0
            while True:
                event = http.next_event()
                if event is h11.NEED_DATA:
                    data = await conn.stream.receive_some(16384)
                    if data:
                        answered = True
                    received += len(data)
                    if received > MAX_ANSWER_BYTES:
                        raise DeliveryFailed(f"answered {status or 'with'} more than {MAX_ANSWER_BYTES} bytes")
                    http.receive_data(bytes(data))
                elif isinstance(event, h11.Response):
                    status = int(event.status_code)
                elif isinstance(event, h11.EndOfMessage):
                    return status
                elif isinstance(event, h11.ConnectionClosed):
                    if reused and not answered:
                        raise _Stale()
                    raise DeliveryFailed("the connection closed before an answer")
        except (OSError, trio.BrokenResourceError, h11.RemoteProtocolError):
            if reused and not answered:
                raise _Stale() from None
            raise


async def _close(conn: _Connection) -> None:
    """Close now, without a TLS goodbye (nothing more is said on a connection we drop)."""
    with trio.CancelScope(shield=True):
        await trio.aclose_forcefully(conn.stream)


def _drop(conn: _Connection) -> None:
    """Close an idle connection from synchronous code: its socket goes at once (an unfinished TLS
    goodbye is not worth waiting for)."""
    stream = conn.stream
    plain = stream.transport_stream if isinstance(stream, trio.SSLStream) else stream
    if isinstance(plain, trio.SocketStream):
        plain.socket.close()


async def post(
    target: Target, body: bytes, headers: list[tuple[str, str]], *, timeout: float, tls: ssl.SSLContext | None = None
) -> int:
    """One POST to a checked address on a new connection, closed after (tests, the bench's baseline)."""
    return await Sender(allow_private=True, timeout=timeout, tls=tls).post_to(target, body, headers)
