"""The RPC server: accept connections on the Unix socket and serve frames on each.

Resource handling: :meth:`RpcServer.serve` owns the listening socket and a nursery holding one
task per connection; each connection owns a nursery for its slow requests, its ordered-write
workers and its streams. When the client hangs up (or half-closes), its streams are cancelled and
the calls it already made run to completion, so no provision or stop is ever cut in half; hostd's
own shutdown cancels everything. PTY readers and process waiters live in the registries'
nursery, never a connection's, so a dropped controller kills no shell.

Scheduling per connection (see :mod:`hostd.handlers`): cheap requests are answered inline by
the read loop; writes keep their order per session/exec in a small worker each, whose backlog is
bounded (a full backlog is answered ``limit.reached`` instead of buffering); everything else runs
as its own task so a slow stop never delays a ping.

Logging: each request is handled inside ``proto.log_context`` with the ids it names (see
:mod:`hostd.logids`), so every line logged while serving it, or by a task it started (a PTY reader,
an exec's pumps), carries them; at DEBUG each answer but a ping is logged (the request's type and
id only, never its fields).

Error handling: a handler's :class:`RpcError` becomes an ``ErrorResponse`` for its id; any other
exception is logged with its traceback and answered ``internal.error``. A frame that fails
validation is answered ``request.invalid``. A malformed, oversized or unknown frame, a first frame
that is not Hello, a version mismatch or a refused peer get one error frame (id 0) and end that
connection only.
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Awaitable, Callable
from functools import partial

import msgspec
import trio

from agentic_sandbox.proto import (
    PROTOCOL_VERSION,
    ErrorCode,
    FrameBuffer,
    FrameEncoder,
    FrameInvalid,
    FrameTooLarge,
    Limit,
    UnknownFrame,
    log_context,
)
from agentic_sandbox.proto import messages as m

from .config import HostdConfig
from .errors import QUEUE_RETRY_S, RpcError
from .handlers import INLINE, ORDERED, STREAMS, Handlers, ordered_key
from .listener import BoundSocket, peer_credentials
from .logids import request_log_ids
from .turns import SendTurns

log = logging.getLogger(__name__)

READ_CHUNK_BYTES = 256 * 1024
ORDERED_BACKLOG = 256
ORDERED_IDLE_S = 30.0
#: A client that accepts no bytes for this long is disconnected (its sessions go on).
SEND_STALL_S = 10.0
MAX_TASKS_PER_CONNECTION = 4096
#: SO_SNDBUF of each client connection (Linux doubles it for its own bookkeeping).
CONNECTION_SEND_BUFFER = 64 * 1024
HELLO_TIMEOUT_S = 10.0
_CLIENT_DECODER = msgspec.msgpack.Decoder(m.ClientFrame)


class _CloseConnection(Exception):
    """Raised inside a connection to end it after an error frame was sent."""


class Connection:
    """One client connection. Made and owned by :class:`RpcServer`."""

    def __init__(self, server: RpcServer, stream: trio.SocketStream, peer: tuple[int, int, int]) -> None:
        self.server = server
        self.stream = stream
        self._fd = stream.socket.fileno()
        self.peer_pid, self.peer_uid, self.peer_gid = peer
        self._encoder = FrameEncoder(server.config.max_frame_bytes)
        self._turns = SendTurns()
        self._streams: dict[int, trio.CancelScope] = {}
        self._ordered: dict[str, trio.MemorySendChannel[m.Request]] = {}
        self._tasks = 0
        self._closed = False
        #: False once the read loop ended: streams not yet started must not start.
        self._reading = True

    def __repr__(self) -> str:
        return f"<connection pid={self.peer_pid} uid={self.peer_uid}>"

    async def send(self, frames: m.Frame | list[m.Frame]) -> None:
        """Send one frame, or several in one write (streams batch what the ring holds).

        The keystroke path: when no other send is in progress and the socket takes the whole
        write at once, this returns without yielding (a trio ``send_all`` would pass through the
        scheduler twice, which is most of an echo's cost in hostd). Otherwise the rest is written
        whole, waiting for the client, under the connection's send lock.
        """
        if self._closed:
            raise trio.ClosedResourceError("connection closed")
        data: bytes | bytearray | memoryview
        if isinstance(frames, list):
            data = batch = bytearray()
            for frame in frames:
                self._encoder.append(frame, batch)
        else:
            data = self._encoder.encode(frames)
        # A free turn is taken without yielding (trio's Lock.acquire() schedules first, which
        # lets a PTY echo overtake the reply to the write that caused it); a small frame waits
        # only behind what is being written, not behind other streams' queued bulk.
        await self._turns.take(len(data))
        try:
            if self._closed:
                raise trio.ClosedResourceError("connection closed")
            try:
                sent = os.write(self._fd, data)
            except BlockingIOError:
                sent = 0
            except OSError as exc:
                self._closed = True
                raise trio.BrokenResourceError(f"{self!r}: {exc}") from exc
            if sent == len(data):
                return
            data = memoryview(data)[sent:]
            # A frame is written whole or the connection is closed: a send cut short by a
            # cancellation (StreamCancel, a deadline) would leave half a frame on the wire and
            # the peer's decoder lost. A peer that stops reading altogether is cut off instead.
            with trio.CancelScope(shield=True), trio.move_on_after(SEND_STALL_S) as stall:
                await self.stream.send_all(data)
            if stall.cancelled_caught:
                self._closed = True
                await self.stream.aclose()
                raise trio.BrokenResourceError(f"{self!r} took no data for {SEND_STALL_S} s")
        finally:
            self._turns.give()

    async def send_error(self, frame_id: int, code: ErrorCode, message: str, **details: object) -> None:
        await self.send(m.ErrorResponse(id=frame_id, code=code.value, message=message, details=details))

    async def run(self) -> None:
        if not self.server.config.peer_allowed(self.peer_uid, self.peer_gid):
            log.warning("refusing peer pid=%s uid=%s gid=%s", self.peer_pid, self.peer_uid, self.peer_gid)
            await self._fatal(ErrorCode.PEER_REFUSED, f"uid {self.peer_uid} / gid {self.peer_gid} may not use hostd")
            return
        buffer = FrameBuffer(self.server.config.max_frame_bytes)
        try:
            await self._handshake(buffer)
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                # Nothing raised here may escape as a group: _read_loop ends the connection by
                # returning, and every task it spawns is guarded (see _guarded).
                await self._read_loop(buffer)
                # The client is gone or done sending. Streams would never end on their own;
                # calls already accepted run to completion (a provision or a stop is never cut
                # in half by a client that went away; its answer is simply not delivered).
                self._reading = False
                for scope in list(self._streams.values()):
                    scope.cancel()
                for send in self._ordered.values():
                    send.close()
        except (_CloseConnection, trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        finally:
            self._closed = True
            for send in self._ordered.values():
                send.close()

    def cancel_streams(self) -> None:
        for scope in list(self._streams.values()):
            scope.cancel()

    async def _fatal(self, code: ErrorCode, message: str, **details: object) -> None:
        """Send a connection-level error frame and give up on the connection."""
        try:
            with trio.move_on_after(1):
                await self.send_error(0, code, message, **details)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass

    async def _next_frame(self, buffer: FrameBuffer) -> m.Request | None:
        """The next decoded frame, or None at EOF. Bad frames end the connection."""
        while True:
            try:
                frame = buffer.next_message(_CLIENT_DECODER)
            except FrameInvalid as exc:
                await self.send_error(exc.frame_id, ErrorCode.REQUEST_INVALID, exc.reason)
                continue
            except FrameTooLarge as exc:
                await self._fatal(ErrorCode.PROTOCOL_FRAME_TOO_LARGE, str(exc))
                raise _CloseConnection from exc
            except UnknownFrame as exc:
                await self._fatal(ErrorCode.PROTOCOL_MALFORMED_FRAME, str(exc))
                raise _CloseConnection from exc
            except msgspec.DecodeError as exc:
                await self._fatal(ErrorCode.PROTOCOL_MALFORMED_FRAME, f"undecodable frame: {exc}")
                raise _CloseConnection from exc
            if frame is not None:
                return frame
            data = await self._receive()
            if not data:
                return None
            try:
                buffer.feed(data)
            except FrameTooLarge as exc:
                await self._fatal(ErrorCode.PROTOCOL_FRAME_TOO_LARGE, str(exc))
                raise _CloseConnection from exc

    async def _receive(self) -> bytes:
        """The client's next bytes; ``b""`` at its end.

        Passes through the scheduler once per read: when nothing is waiting it sleeps until the
        socket is readable; when data was already there it still yields (a client sending flat
        out must not starve the other tasks). trio's ``receive_some`` would do both.
        """
        await trio.lowlevel.checkpoint_if_cancelled()
        waited = False
        while True:
            if self._closed:  # never read an fd number the closed socket may have passed on
                raise trio.ClosedResourceError("connection closed")
            try:
                data = os.read(self._fd, READ_CHUNK_BYTES)
            except BlockingIOError:
                await trio.lowlevel.wait_readable(self._fd)
                waited = True
                continue
            except OSError as exc:
                raise trio.BrokenResourceError(f"{self!r}: {exc}") from exc
            if not waited:
                await trio.lowlevel.cancel_shielded_checkpoint()  # what was read is never lost
            return data

    async def _handshake(self, buffer: FrameBuffer) -> None:
        with trio.move_on_after(HELLO_TIMEOUT_S):
            frame = await self._next_frame(buffer)
            if frame is None:
                raise _CloseConnection
            if not isinstance(frame, m.HelloRequest):
                await self._fatal(
                    ErrorCode.PROTOCOL_HELLO_REQUIRED, f"expected HelloRequest, got {type(frame).__name__}"
                )
                raise _CloseConnection
            if frame.protocol_version != PROTOCOL_VERSION:
                await self._fatal(
                    ErrorCode.PROTOCOL_VERSION_MISMATCH,
                    f"hostd speaks protocol {PROTOCOL_VERSION}, client {frame.protocol_version}",
                )
                raise _CloseConnection
            hello = self.server.handlers.hello(self.peer_uid, self.peer_gid)
            hello.id = frame.id
            await self.send(hello)
            log.debug("%r said hello as %r", self, frame.client_name)
            return
        await self._fatal(ErrorCode.PROTOCOL_HELLO_REQUIRED, "no Hello within the handshake deadline")
        raise _CloseConnection

    async def _read_loop(self, buffer: FrameBuffer) -> None:
        """Serve frames until EOF or a fatal frame; returns instead of raising."""
        try:
            await self._serve_frames(buffer)
        except (_CloseConnection, trio.BrokenResourceError, trio.ClosedResourceError):
            pass

    async def _serve_frames(self, buffer: FrameBuffer) -> None:
        handlers = self.server.handlers
        while (frame := await self._next_frame(buffer)) is not None:
            kind = type(frame)
            if isinstance(frame, m.StreamCancel):
                scope = self._streams.get(frame.stream_id)
                if scope is not None:
                    scope.cancel()
            elif kind in INLINE:
                await self._answer(frame, handlers.call(frame))
            elif self.server.restarting:
                # hostd hands over to a new image: what cannot be done at once is not started, and
                # the client knows to send it again to the new image.
                await self.send_error(frame.id, ErrorCode.RESTARTING, "hostd is restarting in place; send it again")
            elif kind is m.HelloRequest:
                await self.send_error(frame.id, ErrorCode.REQUEST_INVALID, "Hello was already exchanged")
            elif self._tasks >= MAX_TASKS_PER_CONNECTION:
                limit = Limit(name="requests_in_flight", limit=MAX_TASKS_PER_CONNECTION, retry_after_s=QUEUE_RETRY_S)
                await self.send_error(
                    frame.id,
                    ErrorCode.LIMIT_REACHED,
                    f"more than {MAX_TASKS_PER_CONNECTION} requests in flight on this connection",
                    **limit.details(),
                )
            elif kind in ORDERED:
                await self._enqueue_ordered(frame)
            elif kind in STREAMS:
                handlers.pin(frame)
                # Registered now, not when its task starts: a StreamCancel read right behind the
                # request must find it.
                scope = self._streams[frame.id] = trio.CancelScope()
                self._spawn(partial(self._run_stream, scope), frame)
            else:
                self._spawn(self._run_call, frame)

    def _spawn(self, fn: Callable[[m.Request], Awaitable[None]], frame: m.Request) -> None:
        self._tasks += 1

        async def run() -> None:
            try:
                await self._guarded(fn(frame))
            finally:
                self._tasks -= 1

        self._nursery.start_soon(run)

    async def _guarded(self, work: Awaitable[None]) -> None:
        """Run a connection task so that nothing it raises takes the connection (or hostd) down."""
        try:
            await work
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass  # the client went away; the work it asked for is done or cancelled
        except Exception:
            log.exception("connection task failed on %r", self)

    async def _answer(self, frame: m.Request, work: Awaitable[m.Response]) -> None:
        # Log lines of the handler, and of every task it starts, name what the request names.
        with log_context(**request_log_ids(frame)):
            try:
                reply = await work
            except RpcError as exc:
                log.debug("%s (id %s) refused: %s", type(frame).__name__, frame.id, exc.code.value)
                await self.send_error(frame.id, exc.code, exc.message, **exc.details)
                return
            except Exception:
                log.exception("%s (id %s) failed", type(frame).__name__, frame.id)
                await self.send_error(frame.id, ErrorCode.INTERNAL, f"{type(frame).__name__} failed inside hostd")
                return
            if type(frame) is not m.PingRequest:  # the controller pings every second
                log.debug("%s (id %s) answered", type(frame).__name__, frame.id)
        reply.id = frame.id
        await self.send(reply)

    async def _run_call(self, frame: m.Request) -> None:
        await self._answer(frame, self.server.handlers.call(frame))

    async def _enqueue_ordered(self, frame: m.Request) -> None:
        key = ordered_key(frame)
        channel = self._ordered.get(key)
        if channel is None:
            channel, receive = trio.open_memory_channel[m.Request](ORDERED_BACKLOG)
            self._ordered[key] = channel
            self._nursery.start_soon(self._guarded, self._ordered_worker(key, receive))
        try:
            channel.send_nowait(frame)
        except trio.WouldBlock:
            limit = Limit(name="pending_writes", limit=ORDERED_BACKLOG, retry_after_s=QUEUE_RETRY_S)
            await self.send_error(
                frame.id,
                ErrorCode.LIMIT_REACHED,
                f"more than {ORDERED_BACKLOG} writes to {key} waiting; not buffered",
                **limit.details(),
            )

    async def _ordered_worker(self, key: str, receive: trio.MemoryReceiveChannel[m.Request]) -> None:
        async with receive:
            while True:
                frame = None
                with trio.move_on_after(ORDERED_IDLE_S):
                    try:
                        frame = await receive.receive()
                    except trio.EndOfChannel:
                        return  # the connection stopped reading; everything queued was answered
                if frame is None:
                    # Idle: go away so a long-lived connection does not keep a worker per
                    # session. No checkpoint between the timeout and the pop, so no write
                    # can slip into a channel nobody reads.
                    channel = self._ordered.pop(key, None)
                    if channel is not None:
                        channel.close()
                    return
                await self._answer(frame, self.server.handlers.call(frame))

    async def _run_stream(self, scope: trio.CancelScope, frame: m.Request) -> None:
        if not self._reading:
            self._forget_stream(frame.id, scope)
            return
        try:
            with scope, log_context(**request_log_ids(frame)):
                try:
                    await self.server.handlers.stream(frame, self.send)
                except RpcError as exc:
                    await self.send_error(frame.id, exc.code, exc.message, **exc.details)
                except (trio.BrokenResourceError, trio.ClosedResourceError):
                    raise
                except Exception:
                    log.exception("stream %s (id %s) failed", type(frame).__name__, frame.id)
                    await self.send_error(frame.id, ErrorCode.INTERNAL, "stream failed inside hostd")
            if scope.cancelled_caught and not self._closed and not self.server.restarting:
                # (A handover cancels every stream and says nothing: the client resumes it on the
                # new image from where it got to.)
                with trio.move_on_after(5):
                    await self.send(m.StreamEnd(id=frame.id, reason="canceled"))
        finally:
            self._forget_stream(frame.id, scope)

    def _forget_stream(self, stream_id: int, scope: trio.CancelScope) -> None:
        if self._streams.get(stream_id) is scope:  # a client may reuse an id: never drop another's
            del self._streams[stream_id]


class RpcServer:
    def __init__(self, config: HostdConfig, handlers: Handlers) -> None:
        self.config = config
        self.handlers = handlers
        self.connections: set[Connection] = set()
        #: Set while hostd hands over to a new image (:meth:`hand_over`).
        self.restarting = False
        self._accepting = trio.CancelScope()
        self._resume = trio.Event()
        self._idle = trio.Event()

    async def serve(self, bound: BoundSocket, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Accept connections until cancelled. Reports started once accepting."""
        listener = trio.SocketListener(bound.sock)
        async with trio.open_nursery() as nursery:
            task_status.started()
            while True:
                with self._accepting:
                    while True:
                        try:
                            stream = await listener.accept()
                        except OSError as exc:
                            # EMFILE and friends: back off rather than spin.
                            log.error("accept failed: %s", exc)
                            await trio.sleep(0.1)
                            continue
                        nursery.start_soon(self._serve_connection, stream)
                # A handover stopped accepting (connections wait in the backlog for the new image);
                # one that failed lets this image go on.
                await self._resume.wait()

    async def hand_over(self, drain_s: float) -> int:
        """Get every connection ready for a handover; return how many were still open at the end.

        Accepting stops (the socket stays bound: new clients wait in its backlog for the next image).
        Every client is told (``hostd.restarting``, id 0) and its streams end; what it sends from then
        on is answered at once or refused with ``hostd.restarting`` (so the client knows it was not
        done), and calls already running finish. A client that understood ends its side, which ends
        the connection once its calls are answered. Waits up to ``drain_s`` for all that.
        """
        self.stop_accepting()

        async def tell(conn: Connection) -> None:
            conn.cancel_streams()
            try:
                await conn.send_error(0, ErrorCode.RESTARTING, "hostd hands over to a new image of itself; reconnect")
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                pass

        with trio.move_on_after(drain_s):
            async with trio.open_nursery() as nursery:
                for conn in list(self.connections):
                    nursery.start_soon(tell, conn)
            while self.connections:
                self._idle = trio.Event()
                await self._idle.wait()
        return len(self.connections)

    def stop_accepting(self) -> None:
        """The first step of :meth:`hand_over`, taken at once when an upgrade is decided: from now on
        a new client waits in the backlog for the next image, and what cannot be answered at once is
        refused with ``hostd.restarting``."""
        if not self.restarting:
            self.restarting = True
            self._resume = trio.Event()
            self._accepting.cancel()

    def resume(self) -> None:
        """A handover that did not happen: accept and serve again."""
        self.restarting = False
        self._accepting = trio.CancelScope()
        self._resume.set()

    async def _serve_connection(self, stream: trio.SocketStream) -> None:
        async with stream:
            try:
                peer = peer_credentials(stream.socket)
            except OSError as exc:
                log.warning("cannot read peer credentials: %s", exc)
                return
            # A small send buffer: a frame sent behind bulk output waits for at most this much to
            # drain into the client (and the client's queue holds no more than this of it).
            stream.socket.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, CONNECTION_SEND_BUFFER)
            conn = Connection(self, stream, peer)
            if len(self.connections) >= self.config.max_connections:
                limit = Limit(name="connections", limit=self.config.max_connections, setting="AIWG_MAX_CONNECTIONS")
                await conn._fatal(
                    ErrorCode.LIMIT_REACHED, f"more than {self.config.max_connections} connections", **limit.details()
                )
                return
            self.connections.add(conn)
            try:
                await conn.run()
            except Exception:
                # A bug serving one client must never take hostd down for everyone.
                log.exception("connection %r failed", conn)
            finally:
                self.connections.discard(conn)
                if not self.connections:
                    self._idle.set()

    async def announce_shutdown(self) -> None:
        """Tell every client hostd is going away: best effort, all at once, so one client that
        stopped reading (whose send can take up to ``SEND_STALL_S``) delays no one else."""

        async def tell(conn: Connection) -> None:
            try:
                await conn.send_error(0, ErrorCode.SHUTTING_DOWN, "hostd is shutting down")
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                pass

        with trio.move_on_after(1):
            async with trio.open_nursery() as nursery:
                for conn in list(self.connections):
                    nursery.start_soon(tell, conn)
