"""One task's exec on hostd, from its output to its final status.

:meth:`Runner.run` follows the exec's stream (replay from the last hostd sequence stored, then
live) and turns each event into one stored task event: output into ``stdout`` / ``stderr``
artifact chunks (the first chunk creates the artifact, later ones ``append``; a closing
``lastChunk`` when the exec ends), or into the task's log once the agent said ``hello``
(:mod:`controller.tasks.agentlogs`); control messages into task events (the agent protocol,
:mod:`controller.tasks.agentevents`: statuses, artifacts, a Message answer; ``input_request``:
input-required with a hitl-prompt/v1 envelope, see :mod:`controller.tasks.prompts`), the exit
into the final status unless the agent ended the task itself. A refused line is answered with an
``error`` on the channel; an agent at fault (a flood, files over the limit) gets its task failed
and its tree killed. The control messages it processed are acknowledged to hostd
(``ExecControlAck``), which reads the channel only as fast as that. Each event is stored with the
hostd sequence it came from, so a restarted controller (or a reconnected link) resumes exactly
after the last one kept. The events that have arrived together (a short task's output and its
exit, a burst of output) are stored in one transaction, in their order.

When the link to hostd drops, the runner waits for it and resubscribes; an exec hostd no longer
knows (hostd restarted) fails the task with ``fail_kind: infrastructure``. When the store cannot be
written (``StoreUnavailable``: PostgreSQL away) the runner ends, leaving the task as stored, and
its service follows it again from the store once it answers. The runner ends by
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

from ..errors import ControllerError, LimitReached, NotFound, Unavailable
from ..hostlink import HostdLink
from ..store import Append, StoreUnavailable, TaskRecord
from . import prompts
from .agentevents import VERSION, AgentEvents, Fault, Refused
from .agentio import EXTENSIONS, OUTCOME_KEYS, strip_owned
from .agentlogs import TaskLogs
from .hub import parts_weight

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
#: Control messages (or their bytes) processed before hostd is told (well below what it lets wait).
ACK_EVERY = 64
ACK_EVERY_BYTES = 512 * 1024
#: A batch stops growing once its control messages hold about this much.
MAX_BATCH_BYTES = 4 * 1024 * 1024
#: How long an agent at fault gets between SIGTERM and SIGKILL.
FAULT_GRACE_S = 1.0
#: Set on a task whose agent said hello (its version): its output is a log from then on.
AGENT_PROTOCOL = "agent_protocol"


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
        agent: AgentEvents,
        logs: TaskLogs,
        first_message: Callable[[str], Awaitable[dict[str, Any] | None]],
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
        self.agent = agent
        self.agent.speaks = int(task.metadata.get(AGENT_PROTOCOL) or 0)  # a hello before a restart
        self.logs = logs
        #: The message that started a task, as stored (for the agent's ``task`` line).
        self.first_message = first_message
        self.fault: str | None = None
        self.killed = False
        self.unacked = 0
        self.unacked_bytes = 0

    async def run(self) -> None:
        exec_id = self.task.exec_id
        assert exec_id is not None
        try:
            await self._follow(exec_id)
        except StoreUnavailable:
            raise  # the store is away, not the exec: the service follows it again from the store
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
                        batch, size = [event], _size(event)
                        while events.buffered and len(batch) < MAX_BATCH and size < MAX_BATCH_BYTES:
                            try:
                                batch.append(await anext(events))
                            except StopAsyncIteration:
                                break
                            size += _size(batch[-1])
                        if await self._on_events(batch):
                            await _drain(events)
                            return
                # The stream ended without an exit (hostd shutting down, or the exec deleted).
                info = (await self.link.call(m.ExecGetRequest(exec_id=exec_id))).exec
                if info.state == "exited":
                    continue  # resubscribe: the replay holds the exit
            except (NotFound, StoreUnavailable):
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
            except LimitReached as exc:
                # hostd's requests in flight are full for a moment: an answer to wait out, not a failure.
                log.info("task %s: %s; resubscribing in a moment", self.task.id, exc.message)
                await trio.sleep(exc.retry_after_s or RESUBSCRIBE_PAUSE_S)
            await self.link.wait_ready()
            await trio.sleep(RESUBSCRIBE_PAUSE_S)

    async def _on_events(self, batch: list[m.Event]) -> bool:
        """Store what ``batch`` changes in one transaction; True once the exec has exited."""
        changes: list[Append] = []
        logged: list[bytes] = []
        exited = False
        acked_to = None
        for event in batch:
            if isinstance(event, m.ExecOutput):
                if self.agent.speaks:
                    logged.append(event.data)
                    self.task.exec_seq = event.seq
                else:
                    text = self.decoders[event.stream].decode(event.data)
                    changes += self._output(event.stream, text, event.seq)
            elif isinstance(event, m.ExecControlMessage):
                if self.fault is None:
                    try:
                        changes += await self._control(event)
                    except _HandOverLater as later:
                        # The link went down: what came before is stored, the hello comes again.
                        self.task.exec_seq = later.seq - 1
                        await self._record(changes)
                        raise Unavailable("hostd.unavailable", "hostd went away while the agent said hello") from later
                else:
                    self.task.exec_seq = event.seq
                self.unacked += 1
                self.unacked_bytes += _size(event)
                acked_to = event.seq
            elif isinstance(event, m.ExecLagged):
                log.warning("task %s: output %d..%d was lost", self.task.id, event.missed_from, event.resume_seq - 1)
                self.task.exec_seq = event.resume_seq - 1
            elif isinstance(event, m.ExecExited):
                changes += self._finish(event)
                exited = True
                break
        if logged:
            await self.logs.append(self.task.id, logged)
        await self._record(changes)
        if acked_to is not None and (self.unacked >= ACK_EVERY or self.unacked_bytes >= ACK_EVERY_BYTES):
            await self._ack(acked_to)
        if self.fault is not None and not exited and not self.killed:
            self.killed = True
            await self._kill()
        return exited

    async def _ack(self, seq: int) -> None:
        """Tell hostd the control messages up to ``seq`` are stored (it reads more of them)."""
        assert self.task.exec_id is not None
        self.unacked = self.unacked_bytes = 0
        try:
            await self.link.call(m.ExecControlAckRequest(exec_id=self.task.exec_id, seq=seq))
        except ControllerError as exc:
            log.info("task %s: could not acknowledge its agent's messages: %s", self.task.id, exc.message)

    async def _kill(self) -> None:
        assert self.task.exec_id is not None
        try:
            await self.link.call(m.ExecCancelRequest(exec_id=self.task.exec_id, grace_s=FAULT_GRACE_S))
        except ControllerError as exc:
            log.info("task %s: could not stop its agent: %s", self.task.id, exc.message)

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
        """The changes one line of the agent makes (see :mod:`controller.tasks.agentevents`)."""
        message, seq = event.message, event.seq
        kind = message.get("type")
        self.task.exec_seq = seq  # past it, whatever it makes
        try:
            self.agent.count()
            if kind == "hello":
                return await self._hello(message, seq)
            if kind == "status":
                return [self.agent.status(message, seq)]
            if kind == "artifact":
                return [await self.agent.artifact(message, seq)]
            if kind == "message":
                return [self.agent.reply(message, seq)]
            if kind == "input_request":
                if self.agent.ended:
                    raise Refused(f"input_request: the task has ended ({self.task.state})")
                return await self._prompt(message, seq)
            if kind == "invalid":  # hostd's notice in place of a line that was not one JSON object
                raise Refused(f"not a JSON object of at most 1 MiB: {str(message.get('raw'))[:80]!r}")
        except Refused as exc:
            log.info("task %s: the agent's %s is refused: %s", self.task.id, kind, exc)
            if self.agent.speaks:  # version 1 agents were never told (their next line may be an answer)
                await self._tell_agent({"type": "error", "error": str(exc), "event": str(kind)[:64]})
        except Fault as exc:
            log.warning("task %s: the agent is at fault: %s", self.task.id, exc)
            self.fault = str(exc)
            self.agent.ended = True
            metadata = {**self.task.metadata, "fail_kind": "application"}
            return [
                status_change(
                    self.task, "TASK_STATE_FAILED", self.fault, metadata=metadata, exec_seq=seq, unless_terminal=True
                )
            ]
        return []

    async def _hello(self, message: dict[str, Any], seq: int) -> list[Append]:
        """The agent speaks the protocol: it is handed its ``task`` line before the hello is stored
        (so a restart or a lost link hands it over again rather than never), and the task records
        the version (a working status carrying it), so a restarted controller knows its output is
        a log."""
        version = self.agent.hello(message)
        if not version:
            return []
        first = await self.first_message(self.task.id)
        metadata = self.task.metadata
        line: dict[str, object] = {
            "type": "task",
            "version": VERSION,
            "taskId": self.task.id,
            "contextId": self.task.context_id,
            "message": first or {},
            "extensions": list(metadata.get(EXTENSIONS) or []),
            "metadata": strip_owned({k: v for k, v in metadata.items() if k not in OUTCOME_KEYS}) or {},
        }
        assert self.task.exec_id is not None
        try:
            await self.link.call(m.ExecControlSendRequest(exec_id=self.task.exec_id, message=line))
        except ControllerError as exc:
            if "hostd_code" in exc.details:  # hostd said no for good (the agent is gone, the line too long)
                raise Fault(f"the agent could not be handed its task: {exc.message}") from None
            raise _HandOverLater(seq) from exc
        self.agent.speaks = version
        metadata = {**metadata, AGENT_PROTOCOL: version}
        return [status_change(self.task, "TASK_STATE_WORKING", metadata=metadata, exec_seq=seq, unless_terminal=True)]

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
                changes.append(
                    Append(
                        kind="artifact",
                        body=body,
                        artifact=artifact,
                        append=stream in self.started,
                        unless_terminal=True,  # the agent may have ended the task itself
                    )
                )
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
            self.task = self.agent.task = rec
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


class _HandOverLater(Exception):
    """The ``task`` line could not be sent now (the link to hostd is down): resume before the hello."""

    def __init__(self, seq: int) -> None:
        super().__init__(seq)
        self.seq = seq


def _size(event: m.Event) -> int:
    """About how many bytes a control message holds (its parts' text and raw); 0 for the rest."""
    return parts_weight(event.message.get("parts")) if isinstance(event, m.ExecControlMessage) else 0


def now() -> float:
    return time.time()
