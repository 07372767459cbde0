"""Run an unmodified a2a-sdk ``AgentExecutor`` as an agentic-sandbox agent.

    python -m agentic_sandbox_agent.a2a my_agent:MyExecutor

An a2a-sdk agent is an ``AgentExecutor`` that a server calls with a ``RequestContext`` and an
``EventQueue``. Inside an instance the controller is the server, and the control channel
(docs/agent-protocol.md) is the wire, so this runs the executor the way a2a-sdk's request handler
does and turns its events into channel lines:

* ``module:Class`` is imported (the current directory is on ``sys.path``; ``path/to/file.py:Class``
  works too) and instantiated without arguments;
* the ``task`` line becomes a real ``RequestContext`` (the Message parsed into a2a-sdk's protobuf
  type, the task and context ids set, the activated extensions as its requested extensions, the
  request metadata as the request's) and execute() gets a real ``EventQueue`` that is drained
  while it runs: a ``Message`` becomes a ``message`` line, a ``TaskStatusUpdateEvent`` a
  ``status`` line, a ``TaskArtifactUpdateEvent`` ``artifact`` lines (a raw part larger than
  512 KiB is sent as a file in appended chunks, an artifact too large for one line in several), a ``Task`` its
  artifacts then its status (``TASK_STATE_SUBMITTED`` is not sent: the controller made the task);
* multi-turn: when execute() returns with the task in ``TASK_STATE_INPUT_REQUIRED`` or
  ``TASK_STATE_AUTH_REQUIRED``, the next follow-up ``message`` line starts execute() again with a
  new context carrying that message, the same ids and the task as its events built it; any other
  return ends the agent (exit 0);
* a ``cancel`` line calls ``executor.cancel()`` with the same queue, then cancels execute() (as
  a2a-sdk does); a task that is not over by then is set ``TASK_STATE_CANCELED`` (also when
  cancel() raised: it is logged);
* an exception out of execute() fails the task naming it, and the exit status is 1.

Without a channel (see :mod:`agentic_sandbox_agent`) the same runs against stdin and stdout.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import importlib
import importlib.util
import json
import logging
import os
import sys
import threading
import traceback
from collections.abc import Callable
from typing import Any

from a2a.server.agent_execution import AgentExecutor, RequestContext
from a2a.server.context import ServerCallContext
from a2a.server.events.event_queue import QueueShutDown
from a2a.server.events.event_queue_v2 import EventQueueSource
from a2a.types import (
    Artifact,
    Message,
    Part,
    SendMessageRequest,
    Task,
    TaskArtifactUpdateEvent,
    TaskState,
    TaskStatus,
    TaskStatusUpdateEvent,
)
from google.protobuf import json_format
from google.protobuf.message import Message as ProtoMessage

import agentic_sandbox_agent as agent

log = logging.getLogger("agentic_sandbox_agent.a2a")

_TERMINAL = frozenset(
    (
        TaskState.TASK_STATE_COMPLETED,
        TaskState.TASK_STATE_FAILED,
        TaskState.TASK_STATE_CANCELED,
        TaskState.TASK_STATE_REJECTED,
    )
)
_INTERRUPTED = frozenset((TaskState.TASK_STATE_INPUT_REQUIRED, TaskState.TASK_STATE_AUTH_REQUIRED))


# --- A2A JSON <-> a2a-sdk protobuf ----------------------------------------------------------------


def _plain(value: Any) -> Any:
    """JSON as people write it: protobuf's Struct holds every number as a double, so ``1.0`` -> ``1``."""
    if isinstance(value, float) and value.is_integer() and abs(value) <= 2**53:
        return int(value)
    if isinstance(value, dict):
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_plain(item) for item in value]
    return value


def to_json(message: ProtoMessage) -> dict[str, Any]:
    """A2A v1.0 JSON of an a2a-sdk object: camelCase names, enum names, ``raw`` in base64."""
    return _plain(json_format.MessageToDict(message))


def message_from_json(data: dict[str, Any]) -> Message:
    """An a2a-sdk Message from A2A v1.0 JSON (unknown keys ignored, as the protocol says)."""
    return json_format.ParseDict(data, Message(), ignore_unknown_fields=True)


def _parts_json(parts: Any) -> list[dict[str, Any]]:
    """The parts that hold something (a Part with no content would be refused)."""
    return [to_json(part) for part in parts if part.WhichOneof("content") is not None]


def _message_json(message: Message) -> dict[str, Any] | None:
    data = to_json(message)
    data["parts"] = _parts_json(message.parts)
    return data if data["parts"] else None


def _status_call(channel: agent.Channel, status: TaskStatus, metadata: dict[str, Any] | None) -> Callable[[], None]:
    """The ``status`` line of a TaskStatus, or nothing for a state the agent does not set."""
    name = TaskState.Name(status.state)
    if name not in agent.State.ALL:
        if status.state != TaskState.TASK_STATE_SUBMITTED:
            log.warning("not sent: a status in %s, which an agent does not set", name)
        return _nothing
    message = _message_json(status.message) if status.HasField("message") else None
    return functools.partial(channel.status, name, message=message, metadata=metadata or None)


def _nothing() -> None:
    return None


def _artifact_calls(
    channel: agent.Channel, artifact: Artifact, append: bool, last_chunk: bool
) -> list[Callable[[], None]]:
    """The ``artifact`` lines of one artifact update: one, unless it must be chunked.

    A ``raw`` part larger than :data:`agent.MAX_FILE_CHUNK` is cut into chunks, each after the
    first the first part of an appended line of its own: the controller continues a file only with
    an ``append`` line's first raw part (same filename and mediaType). Parts are grouped into lines
    of at most :data:`agent.MAX_LINE` bytes and :data:`agent.MAX_PARTS` parts; the first line keeps
    the update's ``append``, the others append, and only the last keeps its ``lastChunk``.
    """
    pieces: list[tuple[dict[str, Any], bool]] = []  # (part, whether it continues the raw part before it)
    for part in artifact.parts:
        if part.WhichOneof("content") is None:
            continue
        if part.WhichOneof("content") == "raw" and len(part.raw) > agent.MAX_FILE_CHUNK:
            for start in range(0, len(part.raw), agent.DEFAULT_CHUNK_SIZE):
                chunk = Part()
                chunk.CopyFrom(part)
                chunk.raw = part.raw[start : start + agent.DEFAULT_CHUNK_SIZE]
                pieces.append((to_json(chunk), start > 0))
        else:
            pieces.append((to_json(part), False))
    if not pieces:
        log.warning("not sent: artifact %r has no parts", artifact.artifact_id)
        return []
    name: str | None = artifact.name or None
    description: str | None = artifact.description or None
    metadata: dict[str, Any] | None = to_json(artifact.metadata) if artifact.HasField("metadata") else None
    extensions: list[str] | None = list(artifact.extensions) or None
    header = json.dumps([name, description, metadata, extensions], ensure_ascii=False)
    budget = agent.MAX_LINE - len(header) - 256 - len(artifact.artifact_id)
    groups: list[list[dict[str, Any]]] = [[]]
    size = 0
    for piece, continues in pieces:
        length = len(json.dumps(piece, ensure_ascii=False, separators=(",", ":")).encode()) + 1
        if groups[-1] and (continues or size + length > budget or len(groups[-1]) >= agent.MAX_PARTS):
            groups.append([])
            size = 0
        groups[-1].append(piece)
        size += length
    calls: list[Callable[[], None]] = []
    for index, group in enumerate(groups):
        first, last = index == 0, index == len(groups) - 1
        calls.append(
            functools.partial(
                channel.artifact,
                artifact.artifact_id,
                group,
                name=name if first else None,
                description=description if first else None,
                metadata=metadata if first else None,
                extensions=extensions if first else None,
                append=append if first else True,
                last_chunk=last_chunk if last else False,
            )
        )
    return calls


# --- running the executor ------------------------------------------------------------------------


class _Runner:
    """One task: execute() for its first message and each follow-up, the events onto the channel."""

    def __init__(self, executor: AgentExecutor, channel: agent.Channel) -> None:
        self.executor = executor
        self.channel = channel
        task = channel.task
        self.task_id: str | None = task.task_id or None
        self.context_id: str | None = task.context_id or None
        self.call_context = ServerCallContext(requested_extensions=set(task.extensions))
        #: The task as its events built it: what a follow-up's and cancel()'s context carry.
        self.snapshot: Task | None = None
        self.user_messages: list[Message] = []
        self.state: int = TaskState.TASK_STATE_SUBMITTED
        self.replied = False
        self.send_error: BaseException | None = None
        # What the controller sends, as the loop sees it (fed by _pump's thread).
        self._followups: asyncio.Queue[dict[str, Any]] = asyncio.Queue()
        self._cancel = asyncio.Event()
        self._closed = asyncio.Event()

    @property
    def ended(self) -> bool:
        """Whether the task is over (a terminal state, or a Message answered it)."""
        return self.replied or self.state in _TERMINAL

    async def run(self) -> int:
        """Run the task to its end; returns the exit status."""
        loop = asyncio.get_running_loop()
        threading.Thread(target=self._pump, args=(loop,), name="aiwg-a2a-events", daemon=True).start()

        message: dict[str, Any] | None = self.channel.task.message
        metadata: dict[str, Any] = self.channel.task.metadata
        current: Task | None = None  # a new task: a2a-sdk's context has none yet
        while True:
            try:
                request = json_format.ParseDict(
                    {"message": message, "metadata": metadata}, SendMessageRequest(), ignore_unknown_fields=True
                )
            except json_format.ParseError as exc:
                await self._fail(f"the message is not an A2A Message: {exc}")
                return 1
            try:
                context = RequestContext(
                    call_context=self.call_context,
                    request=request,
                    task_id=self.task_id,
                    context_id=self.context_id,
                    task=current,
                )
            except Exception as exc:  # the executor's Task named other ids
                await self._fail(f"no request context: {type(exc).__name__}: {exc}")
                return 1
            self.task_id, self.context_id = context.task_id, context.context_id  # generated without a channel
            self.user_messages.append(request.message)
            if self.snapshot is not None:
                self.snapshot.history.append(request.message)
            outcome = await self._turn(context)
            if outcome is not None:
                return outcome
            if self.ended or self.state not in _INTERRUPTED:
                return self._exit_status()
            message = await self._next_followup()
            if self._cancel.is_set():
                return await self._cancel_between_turns()
            if not message:
                log.warning("the task waits for input, but no follow-up can come: the channel is closed")
                return 0 if self.channel.protocol == 0 else 1
            metadata = {}
            current = self._context_task()

    def _exit_status(self) -> int:
        """0, or without a channel what the task's end says (the exit status decides it there)."""
        return 0 if self.channel.protocol >= 2 else self.channel.exit_code

    # --- what the controller sends

    def _pump(self, loop: asyncio.AbstractEventLoop) -> None:
        """The channel's events into the loop (a thread: the channel's reading blocks)."""
        try:
            for event in self.channel:
                loop.call_soon_threadsafe(self._on_event, event)
        finally:
            with contextlib.suppress(RuntimeError):  # the loop is gone: nobody listens any more
                loop.call_soon_threadsafe(self._closed.set)

    def _on_event(self, event: agent.Event) -> None:
        if isinstance(event, agent.Cancel):
            self._cancel.set()
        elif isinstance(event, agent.FollowUp):
            self._followups.put_nowait(event.message)
        elif isinstance(event, agent.Refused):
            log.warning("the controller refused a %s line: %s", event.event, event.error)

    async def _next_followup(self) -> dict[str, Any] | None:
        """The next follow-up message; ``None`` once a cancel came or the channel closed."""
        get = asyncio.ensure_future(self._followups.get())
        stops = {asyncio.ensure_future(self._cancel.wait()), asyncio.ensure_future(self._closed.wait())}
        done, pending = await asyncio.wait({get, *stops}, return_when=asyncio.FIRST_COMPLETED)
        for waiting in pending:
            waiting.cancel()  # a get cancelled before it took a message loses none
        if self._cancel.is_set() or get not in done:
            return None
        return get.result()

    # --- one execute()

    async def _turn(self, context: RequestContext) -> int | None:
        """execute() once, its events drained onto the channel; an exit status when the agent is done."""
        queue = EventQueueSource()
        drain = asyncio.create_task(self._drain(queue))
        execute = asyncio.create_task(self.executor.execute(context, queue))
        canceled = asyncio.create_task(self._cancel.wait())
        try:
            await asyncio.wait({execute, canceled}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            canceled.cancel()
        if not execute.done():  # a cancel came first
            await self._call_cancel(queue, execute)
            await self._close(queue, drain)
            await self._end_canceled()
            return self._exit_status()
        await self._close(queue, drain)
        error = None if execute.cancelled() else execute.exception()
        if error is not None:
            traceback.print_exception(type(error), error, error.__traceback__, file=sys.stderr)
            await self._fail(f"{type(error).__name__}: {error}")
            return 1
        if self.send_error is not None:
            await self._fail(f"an event could not be sent: {type(self.send_error).__name__}: {self.send_error}")
            return 1
        return None

    async def _call_cancel(self, queue: EventQueueSource, execute: asyncio.Task[Any] | None) -> None:
        """executor.cancel(), then execute() cancelled: a2a-sdk's order, so cancel() can still write."""
        context = RequestContext(
            call_context=self.call_context,
            task_id=self.task_id,
            context_id=self.context_id,
            task=self._context_task(),
        )
        try:
            await self.executor.cancel(context, queue)
        except Exception:
            log.exception("the executor's cancel() raised; the task is canceled anyway")
        finally:
            if execute is not None and not execute.done():
                execute.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await execute

    async def _cancel_between_turns(self) -> int:
        """A cancel while the task waited for input: cancel() with a queue of its own."""
        queue = EventQueueSource()
        drain = asyncio.create_task(self._drain(queue))
        await self._call_cancel(queue, None)
        await self._close(queue, drain)
        await self._end_canceled()
        return self._exit_status()

    async def _end_canceled(self) -> None:
        if not self.ended:
            with contextlib.suppress(agent.ChannelClosed, OSError):
                await asyncio.to_thread(self.channel.status, agent.State.CANCELED)
            self.state = TaskState.TASK_STATE_CANCELED

    async def _fail(self, text: str) -> None:
        """The task failed, saying why (unless it is over already)."""
        if not self.ended:
            with contextlib.suppress(agent.ChannelClosed, OSError, ValueError):
                await asyncio.to_thread(self.channel.status, agent.State.FAILED, text=text[:60000])
            self.state = TaskState.TASK_STATE_FAILED

    @staticmethod
    async def _close(queue: EventQueueSource, drain: asyncio.Task[None]) -> None:
        """No more events: wait until the drain sent what is queued."""
        await queue.close(immediate=False)
        await drain

    # --- events to lines

    async def _drain(self, queue: EventQueueSource) -> None:
        """Send each event as it comes; a failed send is kept (and the rest skipped) so close() never hangs."""
        while True:
            try:
                event = await queue.dequeue_event()
            except QueueShutDown:
                return
            try:
                if self.send_error is None:
                    calls = self._plan(event)
                    if calls:
                        await asyncio.to_thread(_call_all, calls)
            except Exception as exc:
                log.exception("could not send %s", type(event).__name__)
                self.send_error = exc
            finally:
                queue.task_done()

    def _plan(self, event: Any) -> list[Callable[[], None]]:
        """The channel calls for one event, and the task's state as it leaves it."""
        if self.ended:
            log.warning("not sent: a %s after the task ended", type(event).__name__)
            return []
        channel = self.channel
        if isinstance(event, Message):
            message = _message_json(event)
            if message is None:
                log.warning("not sent: a Message without parts")
                return []
            self.replied = True
            return [functools.partial(channel.reply, message)]
        if isinstance(event, Task):
            # Executors enqueue context.current_task again on each turn: only what is new is sent
            # (its input-required status again would ask the client the same question again).
            known = self.snapshot
            calls = [
                call
                for artifact in event.artifacts
                if known is None or artifact not in known.artifacts
                for call in _artifact_calls(channel, artifact, False, True)
            ]
            if known is None or known.status != event.status:
                metadata = to_json(event.metadata) if event.HasField("metadata") else None
                calls.append(_status_call(channel, event.status, metadata))
            self.snapshot = Task()
            self.snapshot.CopyFrom(event)
            self._track_state(event.status.state)
            return calls
        if isinstance(event, TaskStatusUpdateEvent):
            snapshot = self._current_task()
            snapshot.status.CopyFrom(event.status)
            if event.status.HasField("message"):
                snapshot.history.append(event.status.message)
            self._track_state(event.status.state)
            metadata = to_json(event.metadata) if event.HasField("metadata") else None
            return [_status_call(channel, event.status, metadata)]
        if isinstance(event, TaskArtifactUpdateEvent):
            self._track_artifact(event)
            return _artifact_calls(channel, event.artifact, event.append, event.last_chunk)
        log.warning("not sent: an event of type %s", type(event).__name__)
        return []

    def _track_state(self, state: int) -> None:
        if TaskState.Name(state) in agent.State.ALL:
            self.state = state

    def _track_artifact(self, event: TaskArtifactUpdateEvent) -> None:
        snapshot = self._current_task()
        for artifact in snapshot.artifacts:
            if artifact.artifact_id == event.artifact.artifact_id:
                if event.append:
                    artifact.parts.extend(event.artifact.parts)
                else:
                    artifact.CopyFrom(event.artifact)
                return
        snapshot.artifacts.append(event.artifact)

    def _context_task(self) -> Task | None:
        """The task for a RequestContext: the snapshot, unless the executor's Task named other ids."""
        task = self._current_task()
        return task if task.id == (self.task_id or "") and task.context_id == (self.context_id or "") else None

    def _current_task(self) -> Task:
        """The task as its events built it (made from the ids and messages if none came yet)."""
        if self.snapshot is None:
            self.snapshot = Task(
                id=self.task_id or "",
                context_id=self.context_id or "",
                status=TaskStatus(state=TaskState.TASK_STATE_SUBMITTED),
                history=self.user_messages,
            )
        return self.snapshot


def _call_all(calls: list[Callable[[], None]]) -> None:
    for call in calls:
        call()


# --- the command ---------------------------------------------------------------------------------


def load_executor(spec: str) -> AgentExecutor:
    """``module:Class`` (or ``path/to/file.py:Class``), instantiated without arguments."""
    module_name, _, class_path = spec.rpartition(":")
    if not module_name or not class_path:
        raise ValueError(f"not module:Class: {spec!r}")
    if module_name.endswith(".py") or os.sep in module_name:
        name = os.path.splitext(os.path.basename(module_name))[0]
        module_spec = importlib.util.spec_from_file_location(name, module_name)
        if module_spec is None or module_spec.loader is None:
            raise ImportError(f"cannot load {module_name}")
        module = importlib.util.module_from_spec(module_spec)
        sys.modules[name] = module
        module_spec.loader.exec_module(module)
    else:
        module = importlib.import_module(module_name)
    target: Any = module
    for attribute in class_path.split("."):
        target = getattr(target, attribute)
    executor = target()
    if not callable(getattr(executor, "execute", None)) or not callable(getattr(executor, "cancel", None)):
        raise TypeError(f"{spec} is not an AgentExecutor (no execute() and cancel())")
    return executor


def main(argv: list[str] | None = None) -> int:
    """``python -m agentic_sandbox_agent.a2a module:Class``: the task's exit status."""
    parser = argparse.ArgumentParser(
        prog="python -m agentic_sandbox_agent.a2a",
        description="Run an a2a-sdk AgentExecutor as an agentic-sandbox agent (control-channel protocol v2).",
    )
    parser.add_argument("executor", help="module:Class (from the current directory or sys.path) or file.py:Class")
    parser.add_argument("--name", help="the agent's name in hello (default: the executor's module:Class)")
    parser.add_argument("--agent-version", help="the agent's version in hello")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s")
    if os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())

    channel = agent.connect(name=(args.name or args.executor)[:256], version=args.agent_version)
    try:
        try:
            executor = load_executor(args.executor)
        except Exception as exc:
            traceback.print_exc()
            with contextlib.suppress(agent.ChannelClosed, OSError, ValueError):
                channel.fail(f"cannot load {args.executor}: {type(exc).__name__}: {exc}")
            return 1
        return asyncio.run(_Runner(executor, channel).run())
    finally:
        channel.close()


if __name__ == "__main__":
    sys.exit(main())
