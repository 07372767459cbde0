"""Plain a2a-sdk AgentExecutors, written as for any a2a-sdk server, that the adapter tests run.

Each is run as ``python -m agentic_sandbox_agent.a2a a2a_executors:<Class>`` from this directory.
"""

from __future__ import annotations

import asyncio
import hashlib
import sys

from a2a.helpers import (
    get_message_text,
    new_data_part,
    new_raw_part,
    new_task,
    new_task_from_user_message,
    new_text_message,
    new_text_part,
    new_url_part,
)
from a2a.server.agent_execution import AgentExecutor, RequestContext
from a2a.server.events import EventQueue
from a2a.server.tasks import TaskUpdater
from a2a.types import Artifact, Part, TaskState, TaskStatus


def _updater(context: RequestContext, event_queue: EventQueue) -> TaskUpdater:
    assert context.task_id and context.context_id
    return TaskUpdater(event_queue, context.task_id, context.context_id)


class _NoCancel(AgentExecutor):
    async def cancel(self, context: RequestContext, event_queue: EventQueue) -> None:
        raise NotImplementedError("cancel is not supported")


class PartsExecutor(_NoCancel):
    """Every part kind, in a status message and in artifacts; reports what its context held."""

    async def execute(self, context: RequestContext, event_queue: EventQueue) -> None:
        assert context.message is not None
        task = context.current_task or new_task_from_user_message(context.message)
        await event_queue.enqueue_event(task)
        updater = _updater(context, event_queue)
        await updater.start_work(updater.new_agent_message([new_text_part("starting")]))
        received = []
        for part in context.message.parts:
            kind = part.WhichOneof("content")
            entry = {"kind": kind, "filename": part.filename, "mediaType": part.media_type}
            if kind == "raw":
                entry["sha256"] = hashlib.sha256(part.raw).hexdigest()
            received.append(entry)
        await updater.add_artifact(
            [
                new_data_part(
                    {
                        "taskId": context.task_id,
                        "contextId": context.context_id,
                        "text": context.get_user_input(),
                        "extensions": sorted(context.requested_extensions),
                        "metadata": context.metadata,
                        "hadTask": context.current_task is not None,
                        "parts": received,
                    }
                )
            ],
            artifact_id="context",
            name="context",
        )
        await updater.add_artifact(
            [
                Part(text="plain text", media_type="text/markdown", metadata={"lang": "en"}),
                new_raw_part(b"\x00\x01binary\xff", media_type="application/octet-stream", filename="blob.bin"),
                Part(
                    url="https://example.com/f.pdf", filename="f.pdf", media_type="application/pdf", metadata={"n": 2}
                ),
                new_data_part({"answer": 42, "list": [1, "two", None, True]}, media_type="application/json"),
            ],
            artifact_id="kinds",
            name="all the kinds",
            metadata={"origin": "test"},
            extensions=["https://example.com/ext/v1"],
        )
        await updater.add_artifact([new_text_part("chunk 1 ")], artifact_id="stream", name="stream")
        await updater.add_artifact([new_text_part("chunk 2 ")], artifact_id="stream", append=True)
        await updater.add_artifact([new_text_part("chunk 3")], artifact_id="stream", append=True, last_chunk=True)
        await updater.update_status(TaskState.TASK_STATE_WORKING, metadata={"progress": 0.5})
        await updater.complete(updater.new_agent_message([new_text_part("done"), new_data_part({"ok": True})]))


class InputExecutor(_NoCancel):
    """Multi-turn: asks for a name (input required), then greets with the follow-up's text."""

    async def execute(self, context: RequestContext, event_queue: EventQueue) -> None:
        updater = _updater(context, event_queue)
        task = context.current_task
        # As a2a-sdk's samples do: the task enqueued on every turn (new, or the one the context holds).
        await event_queue.enqueue_event(task or new_task_from_user_message(context.message))  # type: ignore[arg-type]
        if task is None or task.status.state != TaskState.TASK_STATE_INPUT_REQUIRED:
            await updater.start_work()
            await updater.requires_input(updater.new_agent_message([new_text_part("What is your name?")]))
            return
        await updater.start_work()
        await updater.add_artifact(
            [
                new_text_part(f"hello {get_message_text(context.message)}"),  # type: ignore[arg-type]
                new_data_part(
                    {"historyLength": len(task.history), "taskId": task.id, "messageTaskId": context.message.task_id}  # type: ignore[union-attr]
                ),
            ],
            artifact_id="greeting",
        )
        await updater.complete()


class AuthExecutor(_NoCancel):
    """Auth required, then completed once a follow-up came."""

    async def execute(self, context: RequestContext, event_queue: EventQueue) -> None:
        updater = _updater(context, event_queue)
        if context.current_task is None:
            await event_queue.enqueue_event(new_task_from_user_message(context.message))  # type: ignore[arg-type]
            await updater.requires_auth(updater.new_agent_message([new_url_part("https://auth.example.com/login")]))
            return
        await updater.complete(updater.new_agent_message([new_text_part("authorized")]))


class FailExecutor(_NoCancel):
    async def execute(self, context: RequestContext, event_queue: EventQueue) -> None:
        await _updater(context, event_queue).failed(new_text_message("could not do it"))


class RejectExecutor(_NoCancel):
    async def execute(self, context: RequestContext, event_queue: EventQueue) -> None:
        await _updater(context, event_queue).reject(new_text_message("will not do it"))


class MessageExecutor(_NoCancel):
    """Answers with a Message, no task."""

    async def execute(self, context: RequestContext, event_queue: EventQueue) -> None:
        await event_queue.enqueue_event(new_text_message(f"echo: {context.get_user_input()}"))


class RaisingExecutor(_NoCancel):
    async def execute(self, context: RequestContext, event_queue: EventQueue) -> None:
        await _updater(context, event_queue).start_work()
        raise RuntimeError("kaboom")


class SlowExecutor(AgentExecutor):
    """Works until canceled; cancel() writes the canceled status."""

    async def execute(self, context: RequestContext, event_queue: EventQueue) -> None:
        updater = _updater(context, event_queue)
        await updater.start_work(updater.new_agent_message([new_text_part("working for a long time")]))
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            print("execute was cancelled", file=sys.stderr, flush=True)
            raise
        await updater.complete()

    async def cancel(self, context: RequestContext, event_queue: EventQueue) -> None:
        assert context.task_id and context.current_task is not None
        await _updater(context, event_queue).cancel(new_text_message("stopped on request"))


class SlowNoCancelExecutor(_NoCancel):
    """Works until canceled, and its cancel() raises: the adapter cancels the task itself."""

    async def execute(self, context: RequestContext, event_queue: EventQueue) -> None:
        await _updater(context, event_queue).start_work()
        await asyncio.sleep(60)


class WaitingCancelExecutor(InputExecutor):
    """Input required, then a cancel while it waits for the follow-up."""

    async def cancel(self, context: RequestContext, event_queue: EventQueue) -> None:
        assert context.current_task is not None
        assert context.current_task.status.state == TaskState.TASK_STATE_INPUT_REQUIRED
        await _updater(context, event_queue).cancel(new_text_message("canceled while waiting"))


class BigFileExecutor(_NoCancel):
    """One raw part of 1.5 MB: more than a line holds, so the adapter chunks it."""

    SIZE = 1_500_000

    async def execute(self, context: RequestContext, event_queue: EventQueue) -> None:
        updater = _updater(context, event_queue)
        data = bytes(i * 7 % 251 for i in range(self.SIZE))
        await updater.add_artifact(
            [new_raw_part(data, media_type="application/octet-stream", filename="big.bin")],
            artifact_id="big",
            name="big",
            last_chunk=True,
        )
        await updater.complete(new_text_message(hashlib.sha256(data).hexdigest()))


class TaskObjectExecutor(_NoCancel):
    """Enqueues one finished Task with artifacts (no TaskUpdater)."""

    async def execute(self, context: RequestContext, event_queue: EventQueue) -> None:
        assert context.task_id and context.context_id
        task = new_task(
            context.task_id,
            context.context_id,
            TaskState.TASK_STATE_COMPLETED,
            artifacts=[Artifact(artifact_id="whole", name="whole", parts=[new_text_part("all at once")])],
        )
        task.status.CopyFrom(TaskStatus(state=TaskState.TASK_STATE_COMPLETED, message=new_text_message("finished")))
        await event_queue.enqueue_event(task)


class NotAnExecutor:
    pass


class RoutingExecutor(AgentExecutor):
    """The executor the first word of the task's first message names (``parts``, ``ask``,
    ``answer``, ``slow``, ``big``): one loadout, one container image, every scenario."""

    ROUTES: dict[str, type[AgentExecutor]] = {
        "parts": PartsExecutor,
        "ask": InputExecutor,
        "answer": MessageExecutor,
        "slow": SlowExecutor,
        "big": BigFileExecutor,
    }

    def __init__(self) -> None:
        self._chosen: AgentExecutor | None = None

    def _pick(self, context: RequestContext) -> AgentExecutor:
        if self._chosen is None:  # the first turn decides; a follow-up goes to the same one
            words = (context.get_user_input() or "").split()
            self._chosen = self.ROUTES.get(words[0] if words else "", PartsExecutor)()
        return self._chosen

    async def execute(self, context: RequestContext, event_queue: EventQueue) -> None:
        await self._pick(context).execute(context, event_queue)

    async def cancel(self, context: RequestContext, event_queue: EventQueue) -> None:
        await self._pick(context).cancel(context, event_queue)
