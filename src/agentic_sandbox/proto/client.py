"""The trio client for hostd, shared by the controller and ``agentic-hostctl``.

Resource handling: :func:`open_hostd` connects, performs the Hello handshake and yields a
:class:`HostdClient` whose reader task lives in a nursery owned by the context manager;
leaving the block closes the socket and fails whatever is still in flight.

Error handling: it fails closed. Every failure is a :class:`~proto.errors.HostdError`:
no socket or nothing listening (``HostdNotRunning``), a deadline passed (``HostdTimeout``),
the connection dropped (``HostdConnectionLost``, raised at once in every in-flight call and
stream), a malformed, oversized or unexpected frame (``HostdProtocolError``, which also
closes the connection), another protocol version (``HostdVersionMismatch``) and explicit
errors from hostd (``HostdRemoteError``). Nothing is ever retried: a broken client stays
broken and the caller decides whether to open a new one.

One connection carries any number of concurrent calls and streams. A stream whose consumer
falls behind by more than ``stream_buffer`` events is cancelled on hostd at once (by the reader)
and ends with :class:`HostdStreamOverflow` after the buffered events, so one slow consumer never
stalls or burdens the other calls on the connection; the consumer resubscribes from the next
sequence it wants.
"""

from __future__ import annotations

import contextlib
import errno
import math
import os
import socket
from collections import deque
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from typing import Any, TypeVar

import msgspec
import trio

from . import messages as m
from .errors import (
    ErrorCode,
    HostdConnectionLost,
    HostdError,
    HostdNotRunning,
    HostdProtocolError,
    HostdRemoteError,
    HostdRestarting,
    HostdTimeout,
    HostdUnavailable,
    HostdVersionMismatch,
)
from .framing import FrameBuffer, FrameEncoder

DEFAULT_CONNECT_TIMEOUT_S = 5.0
DEFAULT_CALL_TIMEOUT_S = 30.0
DEFAULT_STREAM_BUFFER = 1024
READ_CHUNK_BYTES = 256 * 1024
SEND_STALL_S = 10.0
#: Events a stream's consumer may take from its buffer in a row without passing through the scheduler.
_YIELD_EVERY = 64
#: Posted requests (see :meth:`HostdClient.post`) that may wait for their answers at once.
MAX_POSTS = 4096

R = TypeVar("R", bound=m.Response)

_SERVER_DECODER = msgspec.msgpack.Decoder(m.ServerFrame)


class HostdStreamOverflow(HostdError):
    """The stream's consumer fell too far behind; hostd was told to stop sending it."""


def _expected_response(request: m.Request) -> type[m.Response] | None:
    name = type(request).__name__
    if not name.endswith("Request"):
        return None
    return getattr(m, name[: -len("Request")] + "Response", None)


class EventStream:
    """The events of one stream, in order (an async iterator), and how many of them have arrived
    and wait to be taken: a consumer that stores what it gets can take those too and store them
    together, without waiting for anything."""

    __slots__ = ("_events", "_state")

    def __init__(self, events: AsyncGenerator[m.Event, None], state: _Stream) -> None:
        self._events = events
        self._state = state

    def __aiter__(self) -> EventStream:
        return self

    async def __anext__(self) -> m.Event:
        return await self._events.__anext__()

    async def aclose(self) -> None:
        await self._events.aclose()

    @property
    def buffered(self) -> int:
        """Events (and the stream's end, if it came) that the next ``__anext__`` calls take at once."""
        return len(self._state.items)


class _Call:
    __slots__ = ("done", "reply")

    def __init__(self) -> None:
        self.done = trio.Event()
        self.reply: m.Response | BaseException | None = None


class _Stream:
    """What the reader has delivered to one stream and its consumer has not taken yet.

    Bounded by ``size``; the consumer takes what is there without passing through the scheduler
    per event (a trio channel's ``receive`` makes a pass each time), and sleeps only when it is
    empty. ``closed`` ends it once drained: the consumer then looks at ``overflowed`` or the
    client's ``broken``.
    """

    __slots__ = ("_waiter", "closed", "items", "overflowed", "size")

    def __init__(self, size: int) -> None:
        self.items: deque[Any] = deque()
        self.size = size
        self.overflowed = False
        self.closed = False
        self._waiter: trio.Event | None = None

    def put(self, item: Any) -> bool:
        """Add ``item``; False (and nothing added) when the consumer is ``size`` items behind."""
        if len(self.items) >= self.size:
            return False
        self.items.append(item)
        self._wake()
        return True

    def close(self) -> None:
        self.closed = True
        self._wake()

    def _wake(self) -> None:
        if self._waiter is not None:
            self._waiter.set()
            self._waiter = None

    async def get(self) -> Any:
        """The next item, waiting while there is none; ``trio.EndOfChannel`` once closed and drained."""
        while not self.items:
            if self.closed:
                raise trio.EndOfChannel
            self._waiter = trio.Event()
            await self._waiter.wait()
        return self.items.popleft()


class HostdClient:
    """One multiplexed connection to hostd. Made by :func:`open_hostd` only."""

    def __init__(self, sock: trio.SocketStream, *, max_frame_bytes: int, stream_buffer: int) -> None:
        self._sock = sock
        self._fd = sock.socket.fileno()
        self._encoder = FrameEncoder(max_frame_bytes)
        self._max_frame_bytes = max_frame_bytes
        self._stream_buffer = stream_buffer
        self._send_lock = trio.Lock()
        self._next_id = 1
        self._calls: dict[int, _Call] = {}
        self._streams: dict[int, _Stream] = {}
        self._posts: dict[int, tuple[Callable[[HostdError], None], Callable[[], None] | None]] = {}
        self._broken: HostdError | None = None
        #: Set when hostd said it hands itself over (an upgrade in place): nothing new is sent, what
        #: was sent is answered, and the connection ends with this error (see :meth:`_restarting`).
        self._closing: HostdRestarting | None = None
        self._reader_done = trio.Event()
        #: The nursery of the client's own tasks (the reader, cancels of overflowed streams).
        self._nursery: trio.Nursery | None = None
        self.hello: m.HelloResponse | None = None

    # -- public API ---------------------------------------------------------------------------

    @property
    def broken(self) -> HostdError | None:
        """Why this client can no longer be used, or None while it is healthy."""
        return self._broken

    @property
    def closing(self) -> bool:
        """hostd said it hands over to a new image: nothing new can be sent; what was sent is still
        answered until the connection ends (then :attr:`broken` is :class:`HostdRestarting`)."""
        return self._closing is not None

    async def call(self, request: m.Request, *, timeout: float | None = DEFAULT_CALL_TIMEOUT_S) -> Any:
        """Send one request and return its typed response (never an ``ErrorResponse``)."""
        self._raise_if_broken()
        call_id = self._allocate_id()
        request.id = call_id
        pending = _Call()
        self._calls[call_id] = pending
        try:
            with trio.move_on_after(math.inf if timeout is None else timeout) as scope:
                await self._send(request)
                await pending.done.wait()
            if scope.cancelled_caught:
                raise HostdTimeout(f"{type(request).__name__} got no answer within {timeout} s")
        finally:
            self._calls.pop(call_id, None)
        reply = pending.reply
        if isinstance(reply, BaseException):
            raise reply
        if isinstance(reply, m.ErrorResponse):
            raise HostdRemoteError(reply.code, reply.message, dict(reply.details))
        expected = _expected_response(request)
        if expected is not None and not isinstance(reply, expected):
            error = HostdProtocolError(f"{type(request).__name__} answered with {type(reply).__name__}")
            self._fail(error)
            raise error
        return reply

    async def post(
        self,
        request: m.Request,
        on_error: Callable[[HostdError], None],
        on_success: Callable[[], None] | None = None,
    ) -> None:
        """Send one request without waiting for its answer: the keystroke path, where an echo must
        not wait for a reply to the write that caused it.

        A success answer calls ``on_success`` (if given) when it arrives. An error answer is given
        to ``on_error`` as a ``HostdRemoteError``, in the order hostd sent it (so, for ordered
        requests such as session writes, in request order); a connection lost before the answer
        gives ``on_error`` that error. Both run in the client's reader task (or in this call, for
        a failure while sending): they must not block. Exactly one of them is called for every post
        that returns; a post that raises calls neither: the client was broken already, more than
        :data:`MAX_POSTS` posts wait for their answers (``HostdTimeout``), or the caller was
        cancelled before anything was sent.
        """
        self._raise_if_broken()
        if len(self._posts) >= MAX_POSTS:
            raise HostdTimeout(f"{MAX_POSTS} posted requests are still unanswered")
        post_id = self._allocate_id()
        request.id = post_id
        self._posts[post_id] = (on_error, on_success)
        try:
            await self._send(request)
        except HostdError as exc:
            post = self._posts.pop(post_id, None)
            if post is not None:  # else the failure reached it with every other post
                post[0](exc)
        except BaseException:
            self._posts.pop(post_id, None)
            raise

    @asynccontextmanager
    async def stream(
        self, request: m.Request, *, open_timeout: float | None = DEFAULT_CALL_TIMEOUT_S
    ) -> AsyncIterator[EventStream]:
        """Open a stream; iterate the events it yields until hostd ends it.

        hostd's ``StreamOpened`` is consumed here (``open_timeout`` bounds the wait for it);
        the iterator yields the events, ends after ``StreamEnd``, raises an ``ErrorResponse``
        as ``HostdRemoteError``; leaving the block early sends ``StreamCancel``.
        """
        self._raise_if_broken()
        stream_id = self._allocate_id()
        request.id = stream_id
        state = _Stream(self._stream_buffer)
        self._streams[stream_id] = state
        finished = False
        try:
            await self._send(request)

            unyielded = 0

            async def next_item() -> Any:
                nonlocal finished, unyielded
                try:
                    if state.items:
                        # Taken without a pass through the scheduler, but a consumer that never
                        # finds its buffer empty still lets the other tasks in now and then.
                        unyielded += 1
                        if unyielded >= _YIELD_EVERY:
                            unyielded = 0
                            await trio.lowlevel.checkpoint()
                        else:
                            await trio.lowlevel.checkpoint_if_cancelled()
                        return state.items.popleft()  # only this consumer takes from it
                    unyielded = 0
                    return await state.get()
                except trio.EndOfChannel:
                    # An overflowed stream was cancelled on hostd by the reader already.
                    finished = True
                    if state.overflowed:
                        raise HostdStreamOverflow(
                            f"stream {stream_id} fell more than {self._stream_buffer} events behind"
                        ) from None
                    raise self._broken or HostdConnectionLost("stream closed") from None

            async def events() -> AsyncGenerator[m.Event, None]:
                nonlocal finished
                # Only the answer that opens the stream has a deadline: a cancel scope per event
                # would cost every keystroke echo a little.
                with trio.move_on_after(math.inf if open_timeout is None else open_timeout) as scope:
                    item = await next_item()
                if scope.cancelled_caught:
                    raise HostdTimeout(f"{type(request).__name__} got no answer within {open_timeout} s")
                if isinstance(item, m.StreamOpened):
                    item = await next_item()
                while True:
                    if isinstance(item, BaseException):
                        finished = True
                        raise item
                    if isinstance(item, m.StreamEnd):
                        finished = True
                        return
                    if isinstance(item, m.ErrorResponse):
                        finished = True
                        raise HostdRemoteError(item.code, item.message, dict(item.details))
                    yield item
                    item = await next_item()

            yield EventStream(events(), state)
        finally:
            self._streams.pop(stream_id, None)
            if not finished and self._broken is None:
                with trio.CancelScope(shield=True), trio.move_on_after(1):
                    try:
                        await self._send(m.StreamCancel(stream_id=stream_id))
                    except HostdError:
                        pass

    # -- internals ----------------------------------------------------------------------------

    def _allocate_id(self) -> int:
        call_id = self._next_id
        self._next_id += 1
        return call_id

    def _raise_if_broken(self) -> None:
        if self._broken is not None:
            raise self._broken
        if self._closing is not None:
            raise self._closing

    async def _send(self, frame: m.Frame) -> None:
        try:
            data = self._encoder.encode(frame)
        except HostdError:
            raise
        except (TypeError, ValueError) as exc:
            raise HostdProtocolError(f"cannot encode {type(frame).__name__}: {exc}") from exc
        # An uncontended lock is taken without yielding (acquire() would schedule first).
        try:
            self._send_lock.acquire_nowait()
        except trio.WouldBlock:
            await self._send_lock.acquire()
        try:
            self._raise_if_broken()
            try:
                # The keystroke path: what the socket takes at once is written without a pass
                # through the scheduler (trio's send_all makes two); only a rest waits.
                try:
                    sent = os.write(self._fd, data)
                except BlockingIOError:
                    sent = 0
                if sent == len(data):
                    return
                # Whole frames only: a send cut short by the caller's deadline or cancellation
                # would leave half a frame on the wire for every other call on the connection.
                # A hostd that takes no bytes at all for SEND_STALL_S breaks the connection.
                with trio.CancelScope(shield=True), trio.move_on_after(SEND_STALL_S) as stall:
                    await self._sock.send_all(memoryview(data)[sent:])
                if stall.cancelled_caught:
                    self._fail(HostdConnectionLost(f"hostd took no data for {SEND_STALL_S} s"))
                    raise self._broken  # type: ignore[misc]
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
                # hostd may have said why before it closed (a refused peer, shutting down):
                # let the reader take that frame first, so the caller gets the real reason.
                with trio.move_on_after(1):
                    await self._reader_done.wait()
                self._fail(HostdConnectionLost(f"connection to hostd lost while sending: {exc}"))
                raise self._broken from exc  # type: ignore[misc]
        finally:
            self._send_lock.release()

    def _fail(self, error: HostdError) -> None:
        """Mark the client broken and fail every in-flight call and stream at once."""
        if self._broken is not None:
            return
        self._broken = error
        # After a handover notice hostd answers all it read before it closes: a call or post still
        # unanswered was cut (it ran past hostd's drain deadline), so its outcome is unknown, unlike
        # a request refused before it was sent. A stream is resumed by sequence either way.
        cut = HostdConnectionLost(f"{error}, before it answered") if isinstance(error, HostdRestarting) else error
        posts, self._posts = self._posts, {}
        for on_error, _ in posts.values():
            on_error(cut)
        for call in self._calls.values():
            if not call.done.is_set():  # an answer already delivered stands
                call.reply = cut
                call.done.set()
        for stream in self._streams.values():
            # A full buffer: the consumer sees the error after draining, via close.
            stream.put(error)
            stream.close()
        # Closing the socket makes a concurrent send or receive fail fast.
        self._sock.socket.close()

    def _restarting(self, message: str) -> None:
        """hostd's notice that it hands itself over to a new image: send nothing more, end our side
        (after a frame being written, under the send lock) so hostd knows it has read every request
        we sent, and read on: hostd answers each of them (those it will not do with
        ``hostd.restarting``) before it closes, and the connection then fails with
        :class:`HostdRestarting`."""
        if self._closing is not None or self._broken is not None:
            return
        self._closing = HostdRestarting(f"hostd restarts in place: {message}")
        if self._nursery is None:
            return

        async def end_our_side() -> None:
            async with self._send_lock:
                if self._broken is None:
                    with contextlib.suppress(OSError):
                        self._sock.socket.shutdown(socket.SHUT_WR)

        self._nursery.start_soon(end_our_side)

    def _deliver(self, frame: Any) -> None:
        frame_id = frame.id
        post = self._posts.pop(frame_id, None)
        if post is not None:
            on_error, on_success = post
            if isinstance(frame, m.ErrorResponse):
                on_error(HostdRemoteError(frame.code, frame.message, dict(frame.details)))
            elif on_success is not None:
                on_success()
            return
        call = self._calls.get(frame_id)
        if call is not None and not call.done.is_set():
            call.reply = frame
            call.done.set()
            return
        stream = self._streams.get(frame_id)
        if stream is None or stream.overflowed:
            return  # late answer to a call that timed out or a stream already left
        if not stream.closed and not stream.put(frame):
            stream.overflowed = True
            stream.close()
            self._cancel_soon(frame_id)
        if isinstance(frame, (m.StreamEnd, m.ErrorResponse)):
            self._streams.pop(frame_id, None)

    def _cancel_soon(self, stream_id: int) -> None:
        """Tell hostd now to stop a stream whose consumer fell behind: else it would go on sending
        it, at the cost of every other stream on the connection, until the consumer moved again."""
        if self._nursery is None:
            return

        async def cancel() -> None:
            try:
                await self._send(m.StreamCancel(stream_id=stream_id))
            except HostdError:
                pass  # the connection is gone: so is the stream

        self._nursery.start_soon(cancel)

    async def _read_loop(self) -> None:
        buffer = FrameBuffer(self._max_frame_bytes)
        fd = self._fd
        try:
            while True:
                # One pass through the scheduler per read, as in hostd's server: sleep until the
                # socket is readable, or yield once when data was already there.
                await trio.lowlevel.checkpoint_if_cancelled()
                waited = False
                while True:
                    if self._broken is not None:
                        return  # the socket is closed: its fd number may already name another file
                    try:
                        data = os.read(fd, READ_CHUNK_BYTES)
                        break
                    except BlockingIOError:
                        await trio.lowlevel.wait_readable(fd)
                        waited = True
                if not waited:
                    await trio.lowlevel.cancel_shielded_checkpoint()
                if not data:
                    raise self._closing or HostdConnectionLost("hostd closed the connection")
                buffer.feed(data)
                while (frame := buffer.next_message(_SERVER_DECODER)) is not None:
                    if frame.id == 0 and isinstance(frame, m.ErrorResponse):
                        if frame.code == ErrorCode.RESTARTING.value:
                            self._restarting(frame.message)
                            continue
                        raise HostdRemoteError(frame.code, frame.message, dict(frame.details))
                    self._deliver(frame)
        except HostdError as exc:
            self._fail(exc)
        except msgspec.DecodeError as exc:
            self._fail(HostdProtocolError(f"malformed frame from hostd: {exc}"))
        except (trio.BrokenResourceError, trio.ClosedResourceError, OSError) as exc:
            self._fail(HostdConnectionLost(f"connection to hostd lost: {exc}"))
        finally:
            self._reader_done.set()


@contextmanager
def _unwrap_single() -> Iterator[None]:
    try:
        yield
    except BaseExceptionGroup as group:
        if len(group.exceptions) == 1:
            raise group.exceptions[0] from None
        raise


async def _connect(path: str) -> trio.SocketStream:
    sock = trio.socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        await sock.connect(path)
    except FileNotFoundError as exc:
        sock.close()
        raise HostdNotRunning(f"hostd socket {path} does not exist") from exc
    except ConnectionRefusedError as exc:
        sock.close()
        raise HostdNotRunning(f"nothing listens on hostd socket {path}") from exc
    except PermissionError as exc:
        sock.close()
        raise HostdUnavailable(f"not permitted to connect to hostd socket {path}") from exc
    except OSError as exc:
        sock.close()
        if exc.errno in (errno.ENOTSOCK, errno.ECONNREFUSED, errno.ENOENT):
            raise HostdNotRunning(f"hostd socket {path}: {exc.strerror}") from exc
        raise HostdUnavailable(f"cannot connect to hostd socket {path}: {exc}") from exc
    return trio.SocketStream(sock)


@asynccontextmanager
async def open_hostd(
    path: str | os.PathLike[str],
    *,
    client_name: str = "",
    connect_timeout: float = DEFAULT_CONNECT_TIMEOUT_S,
    max_frame_bytes: int = m.DEFAULT_MAX_FRAME_BYTES,
    stream_buffer: int = DEFAULT_STREAM_BUFFER,
) -> AsyncIterator[HostdClient]:
    """Connect to hostd at ``path``, say Hello, and yield the client.

    Raises a ``HostdError`` if the connection or the handshake fails. The client is unusable
    (every call raises) once the connection breaks; the block itself keeps running so the
    caller decides when to reconnect.
    """
    path = os.fspath(path)
    with trio.move_on_after(connect_timeout) as scope:
        sock = await _connect(path)
    if scope.cancelled_caught:
        raise HostdTimeout(f"connecting to hostd socket {path} took longer than {connect_timeout} s")
    client = HostdClient(sock, max_frame_bytes=max_frame_bytes, stream_buffer=stream_buffer)
    try:
        # The reader task never raises, so a group here holds only what the body raised:
        # hand that on unwrapped, as callers expect from an ordinary context manager.
        with _unwrap_single():
            async with trio.open_nursery() as nursery:
                client._nursery = nursery
                nursery.start_soon(client._read_loop)
                try:
                    hello = await client.call(
                        m.HelloRequest(protocol_version=m.PROTOCOL_VERSION, client_name=client_name),
                        timeout=connect_timeout,
                    )
                except HostdRemoteError as exc:
                    if exc.code == "protocol.version_mismatch":
                        raise HostdVersionMismatch(exc.message) from exc
                    raise
                if hello.protocol_version != m.PROTOCOL_VERSION:
                    raise HostdVersionMismatch(
                        f"hostd speaks protocol {hello.protocol_version}, this client {m.PROTOCOL_VERSION}"
                    )
                client.hello = hello
                try:
                    yield client
                finally:
                    nursery.cancel_scope.cancel()
    finally:
        client._fail(HostdConnectionLost("client closed"))
        await sock.aclose()
