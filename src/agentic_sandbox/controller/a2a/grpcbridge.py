"""The gRPC server's threads and the controller's trio loop, bridged explicitly.

grpcio's sync server serves each call on a thread of its own pool. The pool has ``max_calls``
threads and the server refuses calls beyond that many with RESOURCE_EXHAUSTED, so no call queues
for a thread behind long streams. The A2A work itself runs on the trio loop, as it does for every
other binding; :class:`ThreadBridge` carries a call across:

* A call's trio side is a task in the bridge's nursery (opened by :func:`serve`, which runs in the
  app's nursery). The gRPC thread starts it with ``TrioToken.run_sync_soon``: the loop never waits
  on a thread, and the thread waits only on its own :class:`Pipe`.
* Results come back through the call's :class:`Pipe`, bounded: the task takes one of ``PIPE_SIZE``
  slots of a trio semaphore per item and the gRPC thread gives each back once it has taken the item.
  A producer ahead of a slow client (a task stream) waits for room; nothing piles up for it.
* Cancellation both ways. The call ending on the gRPC side (the client cancels, its deadline
  passes, the server stops) cancels the task's cancel scope (``context.add_callback``). The task
  ending ends the pipe, and with it the call: with the exception the task raised, or
  :class:`Interrupted` when it was cancelled before it finished.

Resource handling: :func:`serve` binds, starts the server and reports the bound port. Cancelled
(the app stopping), it cancels the bridge's nursery, so every call's task ends and its thread
answers; then the server stops (``STOP_GRACE_S`` for calls still writing) and the thread pool is
joined before it returns: no thread of ours outlives it.
"""

from __future__ import annotations

import logging
import queue
from collections.abc import Awaitable, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Generic, TypeVar

import grpc
import trio

from ..bindcheck import bind_error

log = logging.getLogger(__name__)

T = TypeVar("T")
#: Hands one item to the gRPC thread (waits while the pipe is full).
Emit = Callable[[T], Awaitable[None]]

#: Items a call's trio side may have handed over that its gRPC thread has not taken yet.
PIPE_SIZE = 16
#: How long a keep-alive ping may go unanswered before the connection is closed.
KEEPALIVE_TIMEOUT_MS = 20_000
#: How long stopping the server waits for calls that are still writing their last answer.
STOP_GRACE_S = 1.0


class Interrupted(Exception):
    """The call's trio side was cancelled before it finished: the call ended first, or the
    controller is stopping."""


class Pipe(Generic[T]):
    """One call's items, from its trio task to the gRPC thread serving the call, then its end.

    The trio side calls :meth:`send` and, once, :meth:`end`; the gRPC thread iterates. Built on
    the gRPC thread; its trio objects (the semaphore, the cancel scope) are made on the loop.
    """

    def __init__(self, token: trio.lowlevel.TrioToken) -> None:
        self._token = token
        self._items: queue.SimpleQueue[tuple[bool, Any]] = queue.SimpleQueue()
        self._room: trio.Semaphore | None = None
        self._scope: trio.CancelScope | None = None
        self._cancel_requested = False

    # -- the trio side ---------------------------------------------------------------------------

    async def send(self, item: T) -> None:
        assert self._room is not None
        await self._room.acquire()
        self._items.put((True, item))

    def end(self, error: BaseException | None) -> None:
        self._items.put((False, error))

    def _cancel_on_loop(self) -> None:
        self._cancel_requested = True
        if self._scope is not None:
            self._scope.cancel()

    # -- the gRPC thread ---------------------------------------------------------------------------

    def __iter__(self) -> Iterator[T]:
        """The items as they come; then returns, or raises what the trio side ended with."""
        while True:
            more, value = self._items.get()
            if not more:
                if value is not None:
                    raise value
                return
            try:
                self._token.run_sync_soon(self._release)
            except trio.RunFinishedError:
                pass  # the loop is gone, and the producer with it
            yield value

    def first(self) -> T:
        """The one item of a unary call (the trio side ends right after it)."""
        for item in self:
            return item
        raise Interrupted("the call ended without an answer")

    def cancel(self) -> None:
        """Cancel the trio side (any thread; nothing happens once it has ended)."""
        try:
            self._token.run_sync_soon(self._cancel_on_loop)
        except trio.RunFinishedError:
            pass

    def _release(self) -> None:
        if self._room is not None:
            self._room.release()


class ThreadBridge:
    """Starts a call's trio side from the gRPC thread serving it (see the module docstring)."""

    def __init__(self, token: trio.lowlevel.TrioToken, nursery: trio.Nursery) -> None:
        self._token = token
        self._nursery = nursery

    def open(self, produce: Callable[[Emit[T]], Awaitable[None]], context: grpc.ServicerContext) -> Pipe[T]:
        """Run ``produce(emit)`` as a task of the bridge's nursery for the call ``context`` serves;
        what it emits comes out of the returned pipe. Called on the call's gRPC thread."""
        pipe: Pipe[T] = Pipe(self._token)
        # Registered first: a call that ends from here on cancels its task, wherever it is by then.
        if not context.add_callback(pipe.cancel):
            pipe.end(Interrupted("the call had already ended"))
            return pipe
        try:
            self._token.run_sync_soon(self._spawn, pipe, produce)
        except trio.RunFinishedError:
            pipe.end(Interrupted("the controller has stopped"))
        return pipe

    def _spawn(self, pipe: Pipe[Any], produce: Callable[[Emit[Any]], Awaitable[None]]) -> None:
        pipe._room = trio.Semaphore(PIPE_SIZE)
        try:
            self._nursery.start_soon(self._run, pipe, produce)
        except RuntimeError:  # the nursery is closed: the server is stopping
            pipe.end(Interrupted("the controller is stopping"))

    async def _run(self, pipe: Pipe[Any], produce: Callable[[Emit[Any]], Awaitable[None]]) -> None:
        # Whatever happens, the pipe ends: its gRPC thread waits for nothing else. Cancelled
        # (the call ended, or the owner's nursery) ends it as Interrupted and, from the owner,
        # propagates.
        error: BaseException | None = Interrupted("the controller is stopping")
        try:
            with trio.CancelScope() as scope:
                pipe._scope = scope
                if pipe._cancel_requested:
                    scope.cancel()
                await produce(pipe.send)
                error = None
            if scope.cancelled_caught:
                error = Interrupted("the call ended")
        except Exception as exc:
            error = exc
        finally:
            pipe.end(error)


async def serve(
    make_handlers: Callable[[ThreadBridge], list[grpc.GenericRpcHandler]],
    *,
    listen: str,
    credentials: grpc.ServerCredentials | None,
    max_calls: int,
    max_message_bytes: int,
    keepalive_s: float,
    task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve gRPC on ``listen`` until cancelled; reports the bound port once it listens.

    Raises OSError when ``listen`` cannot be bound (another process holds the port).
    """
    executor = ThreadPoolExecutor(max_workers=max_calls, thread_name_prefix="grpc-call")
    try:
        server = grpc.server(
            executor,
            maximum_concurrent_rpcs=max_calls,
            options=[
                ("grpc.max_receive_message_length", max_message_bytes),
                # Two controllers on one port would split its calls between them silently.
                ("grpc.so_reuseport", 0),
                # HTTP/2 pings on an idle connection, as SSE streams write keep-alive comments:
                # a client that vanished without a word (its host gone) is noticed, and its
                # calls end. Pings go on while streams send no data.
                ("grpc.keepalive_time_ms", int(keepalive_s * 1000)),
                ("grpc.keepalive_timeout_ms", KEEPALIVE_TIMEOUT_MS),
                ("grpc.http2.max_pings_without_data", 0),
            ],
        )
        # Bound before the calls' nursery opens: a refusal is raised as itself, in no exception group.
        try:
            if credentials is None:
                port = server.add_insecure_port(listen)
            else:
                port = server.add_secure_port(listen, credentials)
        except RuntimeError as exc:  # grpcio says only "Failed to bind"; the OS says why
            raise OSError(f"gRPC cannot listen on {listen}: {bind_error(listen) or exc}") from None
        async with trio.open_nursery() as calls:
            server.add_generic_rpc_handlers(make_handlers(ThreadBridge(trio.lowlevel.current_trio_token(), calls)))
            server.start()
            try:
                task_status.started(port)
                await trio.sleep_forever()
            finally:
                # The calls' tasks are being cancelled with this nursery; their threads then
                # answer, so the server has nothing left to wait for but writes in flight.
                calls.cancel_scope.cancel()
                with trio.CancelScope(shield=True):
                    await trio.to_thread.run_sync(lambda: server.stop(STOP_GRACE_S).wait())
    finally:
        with trio.CancelScope(shield=True):
            await trio.to_thread.run_sync(executor.shutdown)
