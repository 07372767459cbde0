"""One task's exec on hostd, from its output to its final status.

:meth:`Runner.run` follows the exec's stream (replay from the last hostd sequence stored, then
live) and turns each event into one stored task event: output into ``stdout`` / ``stderr``
artifact chunks (the first chunk creates the artifact, later ones ``append``; a closing
``lastChunk`` when the exec ends), control messages into status updates (``status``: working with
the agent's text; ``input_request``: input-required with a hitl-prompt/v1 envelope, see
:mod:`controller.tasks.prompts`), the exit into the final status. Each event is stored with the
hostd sequence it came from, so a restarted controller (or a reconnected link) resumes exactly
after the last one kept. The events that have arrived together (a short task's output and its
exit, a burst of output) are stored in one transaction, in their order.

When the link to hostd drops, the runner waits for it and resubscribes; an exec hostd no longer
knows (hostd restarted) fails the task with ``fail_kind: infrastructure``. The runner ends by
deleting the exec on hostd (exited execs are bounded there), a moment after the end was stored.
"""

from __future__ import annotations

import codecs
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import trio

from agentic_sandbox.proto import messages as m
from agentic_sandbox.proto import new_id

from ..errors import ControllerError, NotFound, Unavailable
from ..hostlink import HostdLink
from ..store import Append, TaskRecord
from . import prompts

log = logging.getLogger(__name__)

STREAMS = ("stdout", "stderr")
#: Output events kept per task (an agent writing byte by byte must not grow the timeline without end).
MAX_OUTPUT_EVENTS = 100_000
#: Events that have arrived together and are stored in one transaction, at most.
MAX_BATCH = 256
RESUBSCRIBE_PAUSE_S = 0.2
#: How long the end of an exec's stream may take to follow its exit.
DRAIN_S = 1.0
#: How long after its task's end an exec is deleted on hostd (see Runner.run).
DELETE_AFTER_S = 0.01


def agent_message(task: TaskRecord, text: str) -> dict[str, Any]:
    return {
        "messageId": new_id(),
        "role": "ROLE_AGENT",
        "parts": [{"text": text}],
        "taskId": task.id,
        "contextId": task.context_id,
    }


def status_change(
    task: TaskRecord,
    state: str,
    text: str | None = None,
    *,
    metadata: dict[str, Any] | None = None,
    message_fields: dict[str, Any] | None = None,
    **kw: Any,
) -> Append:
    """A status update; ``message_fields`` go on its agent message besides the text."""
    status: dict[str, Any] = {"state": state}
    if text:
        status["message"] = {**agent_message(task, text), **(message_fields or {})}
    body = {"taskId": task.id, "contextId": task.context_id, "status": status}
    return Append(kind="status", body=body, status=status, metadata=metadata, **kw)


def exit_outcome(exited: m.ExecExited, canceled: bool) -> tuple[str, str | None, str | None]:
    """(state, status text, fail kind) for an exit."""
    if canceled or exited.reason == "canceled":
        return "TASK_STATE_CANCELED", "canceled", None
    if exited.reason == "exited" and exited.exit_code == 0:
        return "TASK_STATE_COMPLETED", None, None
    if exited.reason == "spawn_failed":
        return "TASK_STATE_FAILED", "the agent command could not be started", "infrastructure"
    if exited.reason == "lost":
        return "TASK_STATE_FAILED", "hostd lost the agent process", "infrastructure"
    if exited.signal is not None:
        return "TASK_STATE_FAILED", f"the agent was ended by signal {exited.signal} ({exited.reason})", "application"
    return "TASK_STATE_FAILED", f"the agent exited with status {exited.exit_code} ({exited.reason})", "application"


class Runner:
    def __init__(
        self,
        task: TaskRecord,
        *,
        link: HostdLink,
        record_many: Callable[[str, list[Append]], Awaitable[TaskRecord | None]],
        canceled: Callable[[str], bool],
        deliver: Callable[[str], Awaitable[None]],
        max_output_bytes: int,
        started: set[str],
    ) -> None:
        self.task = task
        self.link = link
        self.record_many = record_many
        self.canceled = canceled
        #: Hands the agent what waits in its outbox (the service's; cheap when nothing does).
        self.deliver = deliver
        self.max_output_bytes = max_output_bytes
        self.output_bytes = 0
        self.output_events = 0
        self.truncated = False
        #: Artifacts already created (resumed from the store after a restart).
        self.started = set(started)
        self.decoders = {name: codecs.getincrementaldecoder("utf-8")("replace") for name in STREAMS}

    async def run(self) -> None:
        exec_id = self.task.exec_id
        assert exec_id is not None
        try:
            await self._follow(exec_id)
        except ControllerError as exc:
            log.warning("task %s: its exec %s cannot be followed: %s", self.task.id, exec_id, exc)
            await self._fail_infrastructure(f"hostd lost the task's process: {exc.message}")
        except trio.Cancelled:
            # The controller is stopping: the exec goes on in hostd and the next controller
            # follows it again (recover), so it is not deleted.
            raise
        with trio.CancelScope(shield=True), trio.move_on_after(5):
            # Housekeeping, after the answers the end woke (blocking sends, streams) went out: its
            # round trip to hostd would compete with them for the loop and the CPU.
            await trio.sleep(DELETE_AFTER_S)
            try:
                await self.link.call(m.ExecDeleteRequest(exec_id=exec_id))
            except ControllerError:
                pass

    async def _follow(self, exec_id: str) -> None:
        while True:
            try:
                async with self.link.stream(
                    m.ExecSubscribeRequest(exec_id=exec_id, from_seq=self.task.exec_seq + 1)
                ) as events:
                    await self.deliver(self.task.id)  # what waited for the agent (a restart, a hostd outage)
                    async for event in events:
                        batch = [event]
                        while events.buffered and len(batch) < MAX_BATCH:
                            try:
                                batch.append(await anext(events))
                            except StopAsyncIteration:
                                break
                        if await self._on_events(batch):
                            await _drain(events)
                            return
                # The stream ended without an exit (hostd shutting down, or the exec deleted).
                info = (await self.link.call(m.ExecGetRequest(exec_id=exec_id))).exec
                if info.state == "exited":
                    continue  # resubscribe: the replay holds the exit
            except NotFound:
                raise
            except Unavailable as exc:
                code = exc.details.get("hostd_code")
                if code == "exec.not_found":
                    raise
                if code == "stream.seq_out_of_range":
                    # Output older than hostd's ring went unread (a long outage): resume at what it holds.
                    info = (await self.link.call(m.ExecGetRequest(exec_id=exec_id))).exec
                    log.warning("task %s: output before %d was lost", self.task.id, info.first_seq)
                    self.task.exec_seq = info.first_seq - 1
                    continue
                log.info("task %s: hostd link lost (%s); resuming once it is back", self.task.id, exc.message)
            await self.link.wait_ready()
            await trio.sleep(RESUBSCRIBE_PAUSE_S)

    async def _on_events(self, batch: list[m.Event]) -> bool:
        """Store what ``batch`` changes in one transaction; True once the exec has exited."""
        changes: list[Append] = []
        exited = False
        for event in batch:
            if isinstance(event, m.ExecOutput):
                text = self.decoders[event.stream].decode(event.data)
                changes += self._output(event.stream, text, event.seq)
            elif isinstance(event, m.ExecControlMessage):
                changes += await self._control(event)
            elif isinstance(event, m.ExecLagged):
                log.warning("task %s: output %d..%d was lost", self.task.id, event.missed_from, event.resume_seq - 1)
                self.task.exec_seq = event.resume_seq - 1
            elif isinstance(event, m.ExecExited):
                changes += self._finish(event)
                exited = True
                break
        await self._record(changes)
        return exited

    def _output(self, stream: str, text: str, seq: int) -> list[Append]:
        self.output_bytes += len(text)
        self.output_events += 1
        if self.output_bytes > self.max_output_bytes or self.output_events > MAX_OUTPUT_EVENTS:
            self.truncated = True
            self.task.exec_seq = seq
            return []
        if not text:
            self.task.exec_seq = seq
            return []
        append = stream in self.started
        artifact = {"artifactId": stream, "name": stream, "parts": [{"text": text}]}
        body: dict[str, Any] = {"taskId": self.task.id, "contextId": self.task.context_id, "artifact": artifact}
        if append:
            body["append"] = True
        self.started.add(stream)
        return [Append(kind="artifact", body=body, artifact=artifact, append=append, exec_seq=seq)]

    async def _control(self, event: m.ExecControlMessage) -> list[Append]:
        message = event.message
        text = message.get("text")
        if message.get("type") == "status" and isinstance(text, str) and text:
            return [
                status_change(self.task, "TASK_STATE_WORKING", text[:65536], exec_seq=event.seq, unless_terminal=True)
            ]
        if message.get("type") == "input_request":
            return await self._prompt(message, event.seq)
        self.task.exec_seq = event.seq
        return []

    async def _prompt(self, line: dict[str, Any], seq: int) -> list[Append]:
        """The task waits for input with the agent's prompt; a request that cannot be one is
        answered ``input_request_invalid`` on the control channel (the task goes on working)."""
        try:
            envelope = prompts.envelope_of(line, time.time())
        except prompts.PromptInvalid as exc:
            log.info("task %s: the agent's input request is refused: %s", self.task.id, exc)
            self.task.exec_seq = seq
            reply: dict[str, Any] = {"type": "input_request_invalid", "error": str(exc)}
            if isinstance(line.get("prompt_id"), str):
                reply["prompt_id"] = line["prompt_id"][:64]
            await self._tell_agent(reply)
            return []
        change = status_change(
            self.task,
            prompts.INPUT_REQUIRED,
            envelope["prompt"],
            message_fields=prompts.prompt_message_fields(envelope),
            exec_seq=seq,
            unless_terminal=True,
        )
        return [change]

    async def _tell_agent(self, message: dict[str, Any]) -> None:
        assert self.task.exec_id is not None
        try:
            await self.link.call(m.ExecControlSendRequest(exec_id=self.task.exec_id, message=message))
        except ControllerError as exc:
            log.info("task %s: could not tell the agent: %s", self.task.id, exc.message)

    def _finish(self, exited: m.ExecExited) -> list[Append]:
        """The closing chunks and the final status."""
        changes = []
        for stream in STREAMS:
            tail = self.decoders[stream].decode(b"", final=True)
            if stream in self.started or tail:
                artifact = {"artifactId": stream, "name": stream, "parts": [{"text": tail}]}
                body = {
                    "taskId": self.task.id,
                    "contextId": self.task.context_id,
                    "artifact": artifact,
                    "append": stream in self.started,
                    "lastChunk": True,
                }
                changes.append(Append(kind="artifact", body=body, artifact=artifact, append=stream in self.started))
        state, text, fail_kind = exit_outcome(exited, self.canceled(self.task.id))
        metadata = dict(self.task.metadata)
        if fail_kind is not None:
            metadata["fail_kind"] = fail_kind
        if exited.exit_code is not None:
            metadata["exit_code"] = exited.exit_code
        if self.truncated:
            metadata["output_truncated"] = True
        final = status_change(self.task, state, text, metadata=metadata, exec_seq=exited.last_seq, unless_terminal=True)
        return [*changes, final]

    async def _fail_infrastructure(self, text: str) -> None:
        metadata = {**self.task.metadata, "fail_kind": "infrastructure"}
        with trio.CancelScope(shield=True):
            await self._record(
                [status_change(self.task, "TASK_STATE_FAILED", text, metadata=metadata, unless_terminal=True)]
            )

    async def _record(self, changes: list[Append]) -> None:
        if not changes:
            return
        seen = self.task.exec_seq  # past what was skipped, too (kept in memory only, as before)
        rec = await self.record_many(self.task.id, changes)
        if rec is not None:
            self.task = rec
            rec.exec_seq = max(rec.exec_seq, seen)


async def _drain(events: AsyncIterator[m.Event]) -> None:
    """Read a stream to its end after the exit (hostd ends it with the exit, in the same write): a
    stream read to its end needs no ``StreamCancel``. Bounded, and nothing it meets matters now."""
    with trio.move_on_after(DRAIN_S):
        try:
            async for _ in events:
                pass
        except ControllerError:
            pass


def now() -> float:
    return time.time()
