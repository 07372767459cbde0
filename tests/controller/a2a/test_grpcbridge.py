"""The bridge between grpcio's threads and trio, for real: a grpcio server started by
:func:`grpcbridge.serve` in the test's trio run, a tiny servicer built on :meth:`ThreadBridge.open`
(as grpcbinding's, without A2A: raw bytes, a trio-side producer per method), and grpcio's sync client
on worker threads.

Covered: a unary answer and a stream's items, made on the trio loop; the pipe's bound (a producer
ahead of its gRPC thread is held at ``PIPE_SIZE`` items; a client that reads nothing holds it too);
a call ending on the gRPC side (cancelled, past its deadline) cancels its trio side; a trio-side
exception ends the call with it; serve's reported port, its refusal of a taken one, and its stop
(open calls end with an answer, no thread of its pool is left).
"""

from __future__ import annotations

import queue
import socket
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from contextlib import asynccontextmanager
from functools import partial
from typing import Any

import grpc
import pytest
import trio
import trio.testing

from agentic_sandbox.controller.a2a import grpcbridge
from agentic_sandbox.controller.a2a.grpcbridge import PIPE_SIZE, Emit, Interrupted, ThreadBridge
from agentic_sandbox.controller.bindcheck import bind_error

SERVICE = "t.Bridge"
#: A call's trio side: given the request, emits the answer (unary: one item) or the stream's items.
Producer = Callable[[bytes, Emit[bytes]], Awaitable[None]]


async def nothing(request: bytes, emit: Emit[bytes]) -> None:
    return None


class Service:
    """A servicer on the bridge, as grpcbinding's: each method runs its producer on the trio loop
    and answers what comes out of the pipe; Interrupted is UNAVAILABLE, any other exception
    INTERNAL (``"<type>: <message>"``). What each handler ended with (on its gRPC thread) is put
    on ``ended``. A stream handler waits for ``gate``, when there is one, before it takes an item.
    The stream ``None`` emits nothing."""

    def __init__(
        self,
        unary: dict[str, Producer] | None = None,
        stream: dict[str, Producer] | None = None,
        *,
        gate: threading.Event | None = None,
    ) -> None:
        self.unary = unary or {}
        self.stream = {"None": nothing, **(stream or {})}
        self.gate = gate
        self.ended: queue.SimpleQueue[str] = queue.SimpleQueue()
        self.bridge: ThreadBridge | None = None

    def handlers(self, bridge: ThreadBridge) -> list[grpc.GenericRpcHandler]:
        self.bridge = bridge
        table: dict[str, grpc.RpcMethodHandler] = {}
        for name, produce in self.unary.items():
            table[name] = grpc.unary_unary_rpc_method_handler(partial(self._serve_unary, produce))
        for name, produce in self.stream.items():
            table[name] = grpc.unary_stream_rpc_method_handler(partial(self._serve_stream, produce))
        return [grpc.method_handlers_generic_handler(SERVICE, table)]

    def _serve_unary(self, produce: Producer, request: bytes, context: grpc.ServicerContext) -> bytes:
        assert self.bridge is not None
        pipe = self.bridge.open(partial(produce, request), context)
        try:
            answer: bytes = pipe.first()
        except Interrupted as exc:
            self.ended.put(f"Interrupted: {exc}")
            context.abort(grpc.StatusCode.UNAVAILABLE, str(exc))
        except Exception as exc:
            self.ended.put(f"{type(exc).__name__}: {exc}")
            context.abort(grpc.StatusCode.INTERNAL, f"{type(exc).__name__}: {exc}")
        self.ended.put("answered")
        return answer

    def _serve_stream(self, produce: Producer, request: bytes, context: grpc.ServicerContext) -> Iterator[bytes]:
        assert self.bridge is not None
        pipe = self.bridge.open(partial(produce, request), context)
        outcome = "closed"  # by grpcio, between items (the call ended)
        try:
            if self.gate is not None:
                self.gate.wait()
            yield from pipe
            outcome = "finished"
        except Interrupted as exc:
            outcome = f"Interrupted: {exc}"
            context.abort(grpc.StatusCode.UNAVAILABLE, str(exc))
        except Exception as exc:
            outcome = f"{type(exc).__name__}: {exc}"
            context.abort(grpc.StatusCode.INTERNAL, outcome)
        finally:
            pipe.cancel()
            self.ended.put(outcome)


@asynccontextmanager
async def serving(service: Service, *, max_calls: int = 8) -> AsyncIterator[str]:
    """``service`` served by grpcbridge.serve on an ephemeral port; its target. Stopped on leaving."""
    async with trio.open_nursery() as nursery:
        port = await nursery.start(partial(serve, service))
        try:
            yield f"127.0.0.1:{port}"
        finally:
            nursery.cancel_scope.cancel()


async def serve(
    service: Service,
    *,
    listen: str = "127.0.0.1:0",
    max_calls: int = 8,
    task_status: trio.TaskStatus[int] = trio.TASK_STATUS_IGNORED,
) -> None:
    await grpcbridge.serve(
        service.handlers,
        listen=listen,
        credentials=None,
        max_calls=max_calls,
        max_message_bytes=4 * 1024 * 1024,
        keepalive_s=30,
        task_status=task_status,
    )


def call_error(fn: Callable[[], Any]) -> tuple[grpc.StatusCode, str]:
    try:
        fn()
    except grpc.RpcError as exc:
        error: Any = exc
        return error.code(), error.details()
    raise AssertionError("the call succeeded")


async def ended(service: Service) -> str:
    """What the next handler to end ended with (waits for it, on a worker thread)."""
    return await trio.to_thread.run_sync(partial(service.ended.get, timeout=5))


def grpc_call_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith("grpc-call")]


# -- answers --------------------------------------------------------------------------------------


async def test_a_unary_call_is_answered_from_the_trio_loop() -> None:
    loop_thread = threading.current_thread()
    seen: list[threading.Thread] = []

    async def echo(request: bytes, emit: Emit[bytes]) -> None:
        seen.append(threading.current_thread())
        await trio.sleep(0)  # a trio checkpoint: this runs as a task of the loop
        await emit(b"echo:" + request)

    service = Service(unary={"Echo": echo})
    with trio.fail_after(10):
        async with serving(service) as target:
            with grpc.insecure_channel(target) as channel:
                call = channel.unary_unary(f"/{SERVICE}/Echo")
                answers = await trio.to_thread.run_sync(lambda: [call(b"x%d" % n, timeout=5) for n in range(3)])
            assert [await ended(service) for _ in range(3)] == ["answered"] * 3
    assert answers == [b"echo:x0", b"echo:x1", b"echo:x2"]
    assert seen == [loop_thread] * 3


async def test_a_streams_items_arrive_in_order() -> None:
    count = 5 * PIPE_SIZE

    async def numbers(request: bytes, emit: Emit[bytes]) -> None:
        for n in range(count):
            await emit(b"%d" % n)

    service = Service(stream={"Numbers": numbers})
    with trio.fail_after(10):
        async with serving(service) as target:
            with grpc.insecure_channel(target) as channel:
                call = channel.unary_stream(f"/{SERVICE}/Numbers")
                items = await trio.to_thread.run_sync(lambda: list(call(b"", timeout=5)))
                empty = await trio.to_thread.run_sync(lambda: list(channel.unary_stream(f"/{SERVICE}/None")(b"")))
            assert [await ended(service) for _ in range(2)] == ["finished", "finished"]
    assert items == [b"%d" % n for n in range(count)]
    assert empty == []


# -- the pipe's bound -------------------------------------------------------------------------------


async def test_the_pipe_holds_a_producer_its_thread_has_not_caught_up_with() -> None:
    gate = threading.Event()
    total = 2 * PIPE_SIZE + 3
    sent = 0
    full = trio.Event()

    async def eager(request: bytes, emit: Emit[bytes]) -> None:
        nonlocal sent
        for n in range(total):
            await emit(b"%d" % n)
            sent += 1
            if sent == PIPE_SIZE:
                full.set()

    service = Service(stream={"Eager": eager}, gate=gate)
    with trio.fail_after(10):
        async with serving(service) as target:
            with grpc.insecure_channel(target) as channel:
                stream = channel.unary_stream(f"/{SERVICE}/Eager")(b"", timeout=8)
                try:
                    await full.wait()
                    await trio.testing.wait_all_tasks_blocked()
                    held = sent  # the producer waits in emit: its gRPC thread has taken nothing
                finally:
                    gate.set()  # (a failure here must not leave the thread waiting: serve joins it)
                items = await trio.to_thread.run_sync(lambda: list(stream))
            assert await ended(service) == "finished"
    assert held == PIPE_SIZE
    assert items == [b"%d" % n for n in range(total)] and sent == total


async def test_a_client_that_reads_nothing_holds_the_producer() -> None:
    # Items far beyond what HTTP/2 flow control and the sockets buffer: grpcio's thread blocks in
    # its write, the pipe fills, and the producer waits in emit until the client reads.
    size, total = 512 * 1024, 128
    sent = 0
    in_emit = False
    started = trio.Event()

    async def big(request: bytes, emit: Emit[bytes]) -> None:
        nonlocal sent, in_emit
        started.set()
        for n in range(total):
            in_emit = True
            await emit(b"%08d" % n + b"x" * (size - 8))
            in_emit = False
            sent += 1

    service = Service(stream={"Big": big})
    with trio.fail_after(20):
        async with serving(service) as target:
            with grpc.insecure_channel(target) as channel:
                stream = channel.unary_stream(f"/{SERVICE}/Big")(b"", timeout=15)
                await started.wait()
                await trio.testing.wait_all_tasks_blocked(cushion=0.05)
                held, was_in_emit = sent, in_emit
                heads = await trio.to_thread.run_sync(lambda: [item[:8] for item in stream])
            assert await ended(service) == "finished"
    assert was_in_emit and PIPE_SIZE <= held < total // 2, held
    assert heads == [b"%08d" % n for n in range(total)] and sent == total


# -- the call ending first cancels the trio side ----------------------------------------------------


@pytest.mark.parametrize("how", ["cancel", "deadline"])
@pytest.mark.parametrize("producer", ["idle", "pushing"])
async def test_a_call_that_ends_cancels_its_trio_side(how: str, producer: str) -> None:
    cancelled = trio.Event()
    finished = trio.Event()

    async def one_then_more(request: bytes, emit: Emit[bytes]) -> None:
        try:
            await emit(b"first")
            if producer == "idle":
                await trio.sleep_forever()
            while True:  # as fast as the client reads, then held by the pipe
                await emit(b"more")
        except trio.Cancelled:
            cancelled.set()
            raise
        finally:
            finished.set()

    service = Service(stream={"Follow": one_then_more})
    with trio.fail_after(10):
        async with serving(service) as target:
            with grpc.insecure_channel(target) as channel:
                stream = channel.unary_stream(f"/{SERVICE}/Follow")(b"", timeout=0.5 if how == "deadline" else 8)
                assert await trio.to_thread.run_sync(lambda: next(stream)) == b"first"
                if how == "cancel":
                    stream.cancel()
                with trio.fail_after(5):  # promptly: long before the client's 8 s
                    await finished.wait()
                assert cancelled.is_set()
                code, _details = await trio.to_thread.run_sync(lambda: call_error(lambda: list(stream)))
            # Its gRPC thread is done with it as well: whether it was waiting on the pipe
            # (Interrupted, answered into a call already over) or closed between items.
            assert await ended(service) in ("Interrupted: the call ended", "closed")
    assert code == (grpc.StatusCode.CANCELLED if how == "cancel" else grpc.StatusCode.DEADLINE_EXCEEDED)


async def test_a_unary_call_past_its_deadline_cancels_its_trio_side() -> None:
    cancelled = trio.Event()

    async def never(request: bytes, emit: Emit[bytes]) -> None:
        try:
            await trio.sleep_forever()
        finally:
            cancelled.set()

    service = Service(unary={"Never": never})
    with trio.fail_after(10):
        async with serving(service) as target:
            with grpc.insecure_channel(target) as channel:
                call = channel.unary_unary(f"/{SERVICE}/Never")
                code, _ = await trio.to_thread.run_sync(lambda: call_error(lambda: call(b"", timeout=0.3)))
                await cancelled.wait()
            assert await ended(service) == "Interrupted: the call ended"
    assert code == grpc.StatusCode.DEADLINE_EXCEEDED


# -- the trio side failing ends the call with its error ---------------------------------------------


async def test_a_trio_side_exception_ends_the_call_with_it() -> None:
    async def boom(request: bytes, emit: Emit[bytes]) -> None:
        await trio.sleep(0)
        raise ValueError(f"bad {request.decode()}")

    async def two_then_boom(request: bytes, emit: Emit[bytes]) -> None:
        await emit(b"1")
        await emit(b"2")
        raise KeyError("k")

    async def silent(request: bytes, emit: Emit[bytes]) -> None:
        return None  # a unary producer that answers nothing

    service = Service(unary={"Boom": boom, "Silent": silent}, stream={"TwoThenBoom": two_then_boom})
    with trio.fail_after(10):
        async with serving(service) as target:
            with grpc.insecure_channel(target) as channel:
                unary = channel.unary_unary(f"/{SERVICE}/Boom")
                failed = await trio.to_thread.run_sync(lambda: call_error(lambda: unary(b"input", timeout=5)))
                assert await ended(service) == "ValueError: bad input"
                silent_call = channel.unary_unary(f"/{SERVICE}/Silent")
                no_answer = await trio.to_thread.run_sync(lambda: call_error(lambda: silent_call(b"", timeout=5)))
                assert await ended(service) == "Interrupted: the call ended without an answer"
                stream = channel.unary_stream(f"/{SERVICE}/TwoThenBoom")(b"", timeout=5)
                got: list[bytes] = []

                def read() -> tuple[grpc.StatusCode, str]:
                    return call_error(lambda: got.extend(stream))

                stream_failed = await trio.to_thread.run_sync(read)
                assert await ended(service) == "KeyError: 'k'"
                # The server goes on serving.
                assert await trio.to_thread.run_sync(lambda: list(channel.unary_stream(f"/{SERVICE}/None")(b""))) == []
    assert failed == (grpc.StatusCode.INTERNAL, "ValueError: bad input")
    assert no_answer == (grpc.StatusCode.UNAVAILABLE, "the call ended without an answer")
    assert got == [b"1", b"2"] and stream_failed == (grpc.StatusCode.INTERNAL, "KeyError: 'k'")


# -- serve ------------------------------------------------------------------------------------------


async def test_serve_reports_the_port_it_listens_on() -> None:
    async def echo(request: bytes, emit: Emit[bytes]) -> None:
        await emit(request)

    service = Service(unary={"Echo": echo})
    with trio.fail_after(10):
        async with trio.open_nursery() as nursery:
            port = await nursery.start(partial(serve, service))
            assert isinstance(port, int) and port > 0
            # Something listens there, and it is this server.
            with socket.create_connection(("127.0.0.1", port), timeout=5):
                pass
            with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
                call = channel.unary_unary(f"/{SERVICE}/Echo")
                assert await trio.to_thread.run_sync(lambda: call(b"here", timeout=5)) == b"here"
            nursery.cancel_scope.cancel()


async def test_stopping_serve_ends_open_calls_and_its_threads() -> None:
    cancelled: list[str] = []
    first_sent, waiting = trio.Event(), trio.Event()

    async def follow(request: bytes, emit: Emit[bytes]) -> None:
        try:
            await emit(b"first")
            first_sent.set()
            await trio.sleep_forever()
        except trio.Cancelled:
            cancelled.append("stream")
            raise

    async def wait(request: bytes, emit: Emit[bytes]) -> None:
        try:
            waiting.set()
            await trio.sleep_forever()
        except trio.Cancelled:
            cancelled.append("unary")
            raise

    service = Service(unary={"Wait": wait}, stream={"Follow": follow})
    unary: list[tuple[grpc.StatusCode, str]] = []
    channel: grpc.Channel | None = None
    try:
        with trio.fail_after(15):
            async with trio.open_nursery() as outer:
                async with trio.open_nursery() as server:
                    port = await server.start(partial(serve, service))
                    channel = grpc.insecure_channel(f"127.0.0.1:{port}")
                    stream = channel.unary_stream(f"/{SERVICE}/Follow")(b"", timeout=30)
                    wait_call = channel.unary_unary(f"/{SERVICE}/Wait")

                    async def call_wait() -> None:
                        outcome = await trio.to_thread.run_sync(lambda: call_error(lambda: wait_call(b"", timeout=30)))
                        unary.append(outcome)

                    outer.start_soon(call_wait)
                    assert await trio.to_thread.run_sync(lambda: next(stream)) == b"first"
                    await first_sent.wait()
                    await waiting.wait()  # both calls are open, each on a gRPC thread of serve's pool
                    assert len(grpc_call_threads()) >= 2
                    server.cancel_scope.cancel()
                # serve has returned: every call's trio side was cancelled, its thread answered,
                # and the pool was joined.
                assert sorted(cancelled) == ["stream", "unary"]
                assert not grpc_call_threads()
                streamed = await trio.to_thread.run_sync(lambda: call_error(lambda: list(stream)))
    finally:
        if channel is not None:
            channel.close()
    assert streamed == unary[0] == (grpc.StatusCode.UNAVAILABLE, "the controller is stopping")
    assert [service.ended.get_nowait(), service.ended.get_nowait()] == ["Interrupted: the controller is stopping"] * 2


async def test_a_taken_port_is_an_os_error() -> None:
    service = Service()
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        taken = f"127.0.0.1:{holder.getsockname()[1]}"
        assert bind_error(taken) == "Address already in use"
        with trio.fail_after(10):
            async with trio.open_nursery() as nursery:
                with pytest.raises(OSError) as caught:
                    await nursery.start(partial(serve, service, listen=taken))
    assert str(caught.value) == f"gRPC cannot listen on {taken}: Address already in use"
    assert service.bridge is None  # refused before anything was served
    assert not grpc_call_threads()
