"""The task service: send (new task or follow-up), get, list, cancel, and the runners' nursery.

* **send**: a message without ``taskId`` starts a task: stored ``submitted`` with the message as
  its first event, then the instance's loadout command is started through hostd's exec (never
  here) with the message as its input; once hostd has it the task is ``working`` and a
  :class:`~controller.tasks.runner.Runner` follows it in the service's nursery. A hostd failure
  there fails the task (``fail_kind: infrastructure``) and the send (fail closed: the error is
  raised). A message with ``taskId`` is a follow-up: stored in the task's history and handed to
  the running agent on its control channel; to a terminal task it is refused. A follow-up that
  carries ``metadata.hitl_response_for`` answers the task's hitl-prompt/v1 prompt
  (:mod:`controller.tasks.prompts`): checked against the prompt, stored with the task back in
  ``working`` (one answer per prompt gets through), and handed to the agent.
* **deliver**: what the agent is handed (follow-ups, answers) is queued in the agent outbox in the
  same transaction as its event, and removed once hostd took it; so it reaches the agent after a
  controller crash or a hostd outage too (the runner hands over what waits when it subscribes).
* **wait_settled**: until the task is terminal or interrupted (blocking sends, cancel).
* **cancel**: kills the exec's process tree (hostd ``ExecCancel``) and answers once the task is
  ``canceled``; a terminal task is not cancelable.
* **recover**: at start, tasks left unfinished by a previous controller get their runner back
  (their exec may still run in hostd; the stream resumes after the last stored event).
* **leases** (:meth:`TaskService.run_leases`): a task's exec stream is followed by the controller
  that owns it (:mod:`controller.store.tasks`, ownership), which renews its claims every quarter of
  ``lease_ttl_s``. On a shared store (PostgreSQL, several controllers) each controller also sweeps
  for unfinished tasks whose owner stopped renewing and adopts them: the runner resumes from the
  stored hostd sequence, so nothing is lost or written twice (a runner whose task was taken from it
  writes nothing more: ``LeaseLost``). A clean stop releases its claims, so the takeover is
  immediate. On the embedded store there is one controller: at start it takes every unfinished
  task at once.
* **news** (shared store): another controller stored events of a task; waiters here are woken with
  them (:meth:`TaskService.news`, from the store's notifications and polls), and the owner of a task
  hands its agent what another controller queued in its outbox (:meth:`TaskService.outbox_news`).

Metadata rules (kagent gateway note): caller values of keys the controller owns (``runtime.*``,
the ``kagent.dev/a2a/`` timeline keys, ``fail_kind``, ``exit_code``, ``output_truncated``) are removed before the
controller sets its own; ``kagent.dev/a2a/task-created-at`` is set on every task.

Errors: :mod:`controller.errors` only, with the A2A codes of :mod:`controller.a2a.errors`.
"""

from __future__ import annotations

import base64
import binascii
import builtins
import logging
import time
from collections.abc import Awaitable, Callable
from contextvars import ContextVar
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

import msgspec
import trio

from agentic_sandbox.proto import messages as m
from agentic_sandbox.proto import new_id

from ..errors import (
    HITL_MISSING_TASK_ID,
    HITL_NOT_ACTIVATED,
    PUSH_NOT_SUPPORTED,
    TASK_NOT_CANCELABLE,
    TASK_NOT_FOUND,
    UNSUPPORTED_OPERATION,
    ControllerError,
    InvalidState,
    NotFound,
    Unavailable,
    Unimplemented,
    ValidationFailed,
)
from ..events.bus import TASK_CREATED, TASK_STATUS_CHANGED, EventBus
from ..hostlink import HostdLink
from ..loadouts.service import LoadoutService
from ..store import Append, InstanceRecord, Store, StoreClosed, StoreUnavailable, TaskRecord
from ..store.tasks import INTERRUPTED, PURGE_BATCH, TERMINAL, LeaseLost, rfc3339_us
from . import prompts
from .agentevents import VERSION, AgentEvents, AgentLimits
from .agentio import EXTENSIONS, check_parts, message_dict, stdin_of, strip_owned
from .agentlogs import TaskLogs
from .files import TaskFiles
from .handover import AgentOutbox
from .hub import TaskHub
from .model import SendMessageRequest
from .runner import AGENT_PROTOCOL, Runner, status_change

if TYPE_CHECKING:
    from ..hosts.registry import HostRegistry
    from ..metrics import Metrics

log = logging.getLogger(__name__)

DEFAULT_LOADOUT = "shell"
TASK_CREATED_AT = "kagent.dev/a2a/task-created-at"
TASK_STATES = (
    "TASK_STATE_SUBMITTED",
    "TASK_STATE_WORKING",
    "TASK_STATE_COMPLETED",
    "TASK_STATE_FAILED",
    "TASK_STATE_CANCELED",
    "TASK_STATE_INPUT_REQUIRED",
    "TASK_STATE_REJECTED",
    "TASK_STATE_AUTH_REQUIRED",
)
SETTLED = frozenset(TERMINAL) | frozenset(INTERRUPTED)
DEFAULT_PAGE_SIZE = 50
MAX_PAGE_SIZE = 100
CANCEL_GRACE_S = 2.0
CANCEL_WAIT_S = 15.0
#: The retention's rounds: at least this often, and a pause between two batches of one round.
PURGE_INTERVAL_S = 60.0
PURGE_PAUSE_S = 0.05
#: States a follow-up message takes a task out of (back to working) when no prompt is pending.
RESUMED_BY_MESSAGE = frozenset({"TASK_STATE_INPUT_REQUIRED", "TASK_STATE_AUTH_REQUIRED"})
#: Set while a send runs again under an idempotency/v1 key whose first send died with its controller
#: (:mod:`controller.a2a.idempotencycache`): a task that message started already is the answer.
RESUMED_SEND: ContextVar[bool] = ContextVar("RESUMED_SEND", default=False)


def task_not_found(task_id: str) -> NotFound:
    return NotFound(TASK_NOT_FOUND, f"no task {task_id[:256]!r} on this agent", details={"taskId": task_id[:256]})


def _field(field: str, message: str, code: str = "invalid") -> ValidationFailed:
    return ValidationFailed([{"field": field, "message": message, "code": code}])


class ListQuery(msgspec.Struct, rename="camel", kw_only=True):
    """ListTasksRequest (query parameters or a JSON-RPC params object)."""

    context_id: str | None = None
    status: str | None = None
    page_size: int | None = None
    page_token: str | None = None
    history_length: int | None = None
    status_timestamp_after: str | None = None
    include_artifacts: bool = False
    tenant: str | None = None


@dataclass
class Page:
    tasks: list[TaskRecord]
    next_page_token: str
    page_size: int
    total_size: int


def encode_cursor(rec: TaskRecord) -> str:
    return base64.urlsafe_b64encode(msgspec.json.encode([rec.status_at, rec.id])).rstrip(b"=").decode()


def decode_cursor(token: str) -> tuple[float, str]:
    try:
        raw = base64.urlsafe_b64decode(token + "=" * (-len(token) % 4))
        status_at, task_id = msgspec.json.decode(raw, type=tuple[float, str])
    except (binascii.Error, ValueError, msgspec.DecodeError):
        raise _field("pageToken", "not a page token this agent gave out", "page_token") from None
    return status_at, task_id


class TaskService:
    def __init__(
        self,
        store: Store,
        link: HostdLink,
        loadouts: LoadoutService,
        events: EventBus,
        *,
        files: TaskFiles,
        logs: TaskLogs,
        retention_s: float = 7 * 24 * 3600.0,
        keep_per_instance: int = 0,
        metrics: Metrics | None = None,
        max_output_bytes: int = 16 * 1024 * 1024,
        agent_limits: AgentLimits = AgentLimits(),
        agent_cancel_grace_s: float = 5.0,
        owner: str | None = None,
        lease_ttl_s: float = 2.0,
        hosts: HostRegistry | None = None,
    ) -> None:
        self.store = store
        #: This host among others (None: alone): whether it takes new tasks (drain).
        self.hosts = hosts
        #: This controller's id: what its claims on tasks are made in.
        self.owner = owner or new_id()
        self.lease_ttl_s = lease_ttl_s
        self.files = files
        self.logs = logs
        self.agent_limits = agent_limits
        self.agent_cancel_grace_s = agent_cancel_grace_s
        self.link = link
        self.loadouts = loadouts
        self.events = events
        self.hub = TaskHub()
        self.retention_s = retention_s
        self.keep_per_instance = keep_per_instance
        self.metrics = metrics
        self.max_output_bytes = max_output_bytes
        self._nursery: trio.Nursery | None = None
        self._canceling: set[str] = set()
        #: The row of each task whose runner is alive here, as its last change left it: what
        #: waiters check first, so the state of a running task needs no read.
        self._live: dict[str, TaskRecord] = {}
        #: Writes under way per task, and news of a task that came during one (see :meth:`news`).
        self._writing: dict[str, int] = {}
        self._deferred: dict[str, int] = {}
        self.outbox = AgentOutbox(store, link)

    def attach(self, nursery: trio.Nursery) -> None:
        self._nursery = nursery

    # -- recording ------------------------------------------------------------------------------

    async def record(self, task_id: str, change: Append) -> TaskRecord | None:
        """Store one change and wake the task's waiters; the row after it (None if skipped)."""
        return await self.record_many(task_id, [change])

    async def record_many(self, task_id: str, changes: list[Append], *, owned: bool = False) -> TaskRecord | None:
        """Several changes in one transaction; None if every one was skipped. ``owned``: only
        while the task is this controller's (a runner's changes; else ``LeaseLost``)."""
        owner = self.owner if owned else None
        self._writing[task_id] = self._writing.get(task_id, 0) + 1
        try:
            events, rec = await self.store.tasks.append_many(task_id, changes, time.time(), owner=owner)
        finally:
            if self._writing[task_id] == 1:
                del self._writing[task_id]
            else:
                self._writing[task_id] -= 1
        deferred = self._deferred.pop(task_id, None) if task_id not in self._writing else None
        if deferred is not None:
            assert self._nursery is not None
            self._nursery.start_soon(self.news, task_id, deferred)  # after the pulses below
        stored = [event for event in events if event is not None]
        if not stored:
            return None
        if rec.terminal:
            self._canceling.discard(task_id)
        live = self._live.get(task_id)
        if live is not None and live.last_seq < rec.last_seq:
            self._live[task_id] = rec
        for event in stored:
            self.hub.pulse(task_id, event)
            if event.kind == "status":
                state = event.body["status"]["state"]
                self.events.task_changed(
                    TASK_STATUS_CHANGED, task_id, instance_id=rec.instance_id, context_id=rec.context_id, state=state
                )
        return rec

    # -- reads ----------------------------------------------------------------------------------

    async def get(self, instance_id: str, task_id: str) -> TaskRecord:
        rec = await self.store.tasks.get(task_id)
        if rec is None or rec.instance_id != instance_id:
            raise task_not_found(task_id)
        return rec

    async def list(self, instance_id: str, query: ListQuery) -> Page:
        size = DEFAULT_PAGE_SIZE if query.page_size is None else query.page_size
        if not 1 <= size <= MAX_PAGE_SIZE:
            raise _field("pageSize", f"must be between 1 and {MAX_PAGE_SIZE}", "range")
        if query.status is not None and query.status not in TASK_STATES:
            raise _field("status", f"must be one of {', '.join(TASK_STATES)}", "enum")
        if query.history_length is not None and query.history_length < 0:
            raise _field("historyLength", "must be 0 or more", "range")
        after = None
        if query.status_timestamp_after:
            try:
                after = datetime.fromisoformat(query.status_timestamp_after.replace("Z", "+00:00")).timestamp()
            except ValueError:
                raise _field("statusTimestampAfter", "not an ISO 8601 timestamp", "type") from None
        cursor = decode_cursor(query.page_token) if query.page_token else None
        tasks, total = await self.store.tasks.page(
            instance_id,
            context_id=query.context_id,
            state=query.status,
            status_after=after,
            after=cursor,
            limit=size + 1,
        )
        more = len(tasks) > size
        tasks = tasks[:size]
        return Page(tasks, encode_cursor(tasks[-1]) if more else "", size, total)

    async def wait_settled(self, task_id: str) -> TaskRecord:
        """The task once it is terminal or interrupted (waits as long as it takes)."""
        with self.hub.watch(task_id) as watch:
            changed = watch.changed()
            rec = await self._current(task_id)
            while True:
                if rec is None:
                    raise task_not_found(task_id)
                if rec.state in SETTLED:
                    return rec
                await changed.wait()
                changed = watch.changed()
                # Look again only when a status event says the task may have settled.
                news = watch.tail_after(rec.last_seq)
                if news is None or any(e.kind == "status" and e.body["status"]["state"] in SETTLED for e in news):
                    rec = await self._current(task_id)

    async def _current(self, task_id: str) -> TaskRecord | None:
        """The task's row as its last change left it: from memory while its runner is alive here
        (kept up to date by :meth:`record_many` before it wakes anyone), else read."""
        live = self._live.get(task_id)
        return live if live is not None else await self.store.tasks.get(task_id)

    # -- send -----------------------------------------------------------------------------------

    async def send(
        self,
        instance: InstanceRecord,
        req: SendMessageRequest,
        *,
        prompts_active: bool = False,
        extensions: builtins.list[str] | None = None,
    ) -> TaskRecord:
        """Start a task or follow one up; ``prompts_active``: the request activated hitl-prompt/v1,
        without which a message answering a prompt is refused (400, naming the extension);
        ``extensions``: what the request activated (the agent is told, in its ``task`` line)."""
        msg = req.message
        self.link.require_host(instance.id, instance.host_id)
        if req.configuration is not None and req.configuration.task_push_notification_config is not None:
            # The A2A surface makes an inline config itself (A2AService.send) and passes none on.
            raise Unimplemented(PUSH_NOT_SUPPORTED, "an inline push config is not taken on this path")
        if msg.role != "ROLE_USER":
            raise _field("message.role", "a client sends ROLE_USER messages", "enum")
        check_parts(msg)
        answer = prompts.answer_of(msg.metadata)
        if answer is not None and not prompts_active:
            raise ValidationFailed(
                [],
                f"message.metadata.{prompts.ANSWER_KEY} answers a prompt: activate {prompts.HITL_EXTENSION} "
                "(A2A-Extensions) to send it",
                code=HITL_NOT_ACTIVATED,
                details={"extension": prompts.HITL_EXTENSION},
            )
        if msg.task_id is not None:
            return await self._follow_up(instance, req, answer)
        if answer is not None:
            missing = {"field": "message.taskId", "message": "an answer names the task that asked", "code": "required"}
            raise ValidationFailed([missing], code=HITL_MISSING_TASK_ID)
        if self.hosts is not None:
            self.hosts.require_open()  # a draining host takes no new task
        return await self._start(instance, req, extensions or [])

    async def _follow_up(
        self, instance: InstanceRecord, req: SendMessageRequest, answer: prompts.Answer | None
    ) -> TaskRecord:
        msg = req.message
        assert msg.task_id is not None
        rec = await self.get(instance.id, msg.task_id)
        if rec.terminal and answer is None:  # an answer to an ended task is told its prompt is gone (409)
            raise InvalidState(UNSUPPORTED_OPERATION, f"task {rec.id} is {rec.state} and takes no more messages")
        if msg.context_id is not None and msg.context_id != rec.context_id:
            raise _field("message.contextId", f"task {rec.id} belongs to another context", "mismatch")
        body = message_dict(msg, task_id=rec.id, context_id=rec.context_id)
        # The agent reads it on its control channel (see controller.tasks.agentio).
        if answer is None:
            changes = [Append(kind="message", body=body, outbox={"type": "message", "message": body})]
            if rec.state in RESUMED_BY_MESSAGE and prompts.pending(rec.state, rec.status) is None:
                # Plain A2A: the agent asked for input (or auth) with a status; this message is it.
                changes.append(status_change(rec, "TASK_STATE_WORKING", unless_terminal=True))
        else:
            envelope = prompts.pending(rec.state, rec.status)
            prompts.check_answer(envelope, answer, time.time())
            assert envelope is not None
            guard = answer.prompt_id.lower()
            control = {
                "type": "input_response",
                "prompt_id": envelope["prompt_id"],
                "payload": answer.payload,
                "message": body,
            }
            changes = [
                Append(kind="message", body=body, outbox=control, if_prompt=guard),
                status_change(rec, "TASK_STATE_WORKING", if_prompt=guard),
            ]
        self.outbox.expect(rec.id)  # before the write: a runner subscribing meanwhile looks too
        stored = await self.record_many(rec.id, changes)
        if stored is None:
            assert answer is not None
            raise prompts.unknown_prompt(answer.prompt_id, f"prompt {answer.prompt_id} was answered meanwhile")
        if not self.store.shared or rec.id in self._live:
            # On a shared store the task's owner hands it over (told by the store's notification):
            # one controller per task talks to its agent, so a message is not handed over twice.
            await self.outbox.deliver(rec.id, force=True)
        return stored

    async def _start(
        self, instance: InstanceRecord, req: SendMessageRequest, extensions: builtins.list[str]
    ) -> TaskRecord:
        msg = req.message
        if RESUMED_SEND.get():
            started = await self.store.tasks.by_message(instance.id, msg.message_id)
            if started is not None:
                log.info("task %s: the send that started it is answered again (its controller stopped)", started.id)
                return started
        for ref in msg.reference_task_ids or []:
            await self.get(instance.id, ref)  # TASK_NOT_FOUND for a task not of this agent
        stdin = stdin_of(msg)
        loadout = self.loadouts.get(instance.loadout or DEFAULT_LOADOUT)
        if loadout is None:
            raise InvalidState(
                "instance.invalid_state", f"the instance's loadout {instance.loadout!r} no longer exists"
            )
        now = time.time()
        task_id, context_id = new_id(), msg.context_id or new_id()
        metadata = {**(strip_owned(req.metadata) or {}), TASK_CREATED_AT: rfc3339_us(now)}
        if extensions:
            metadata[EXTENSIONS] = list(extensions)  # for the agent's ``task`` line
        rec = TaskRecord(
            id=task_id,
            instance_id=instance.id,
            context_id=context_id,
            state="TASK_STATE_SUBMITTED",
            status={"state": "TASK_STATE_SUBMITTED", "timestamp": rfc3339_us(now)},
            metadata=metadata,
            last_at=now,
            created_at=now,
            status_at=now,
        )
        await self.store.tasks.create(
            rec,
            Append(kind="message", body=message_dict(msg, task_id=task_id, context_id=context_id)),
            owner=self.owner,
            until=now + self.lease_ttl_s,
            message_id=msg.message_id,
        )
        self.events.task_changed(TASK_CREATED, task_id, instance_id=instance.id, context_id=context_id, state=rec.state)
        exec_id = new_id()
        call = m.ExecStartRequest(
            instance_id=instance.id,
            argv=loadout.command,
            env={"AIWG_TASK_ID": task_id, "AIWG_CONTEXT_ID": context_id, "AIWG_AGENT_PROTOCOL": str(VERSION)},
            stdin=stdin,
            # Only where the provider has one (host instances): an fd cannot cross into a container or
            # VM. A row whose provider facts were never folded in yet asks, as before they existed.
            control="exec.control" in instance.capabilities or not instance.capabilities,
            control_flow=True,
            exec_id=exec_id,
        )
        try:
            try:
                await self.link.call(call)
            except InvalidState as exc:
                raise Unavailable("runtime.not_ready", f"the instance cannot run tasks now: {exc.message}") from exc
        except ControllerError as exc:
            # Fail closed: the task fails for what it is (hostd could not start it), and so does the send.
            await self._fail_start(rec, f"the agent could not be started: {exc.message}")
            raise
        try:
            working = await self.record(task_id, status_change(rec, "TASK_STATE_WORKING", exec_id=exec_id))
        except StoreUnavailable:
            # The send fails (503), so its agent must not run on unseen: it is stopped, and the task
            # is failed once the store answers again.
            with trio.CancelScope(shield=True):
                try:
                    await self.link.call(m.ExecCancelRequest(exec_id=exec_id, grace_s=0))
                except ControllerError as exc:
                    log.warning("task %s: its agent could not be stopped: %s", task_id, exc.message)
                await self._fail_start(rec, "the controller's store was unavailable while the agent started")
            raise
        assert working is not None
        self._spawn(working, artifacts=[])
        await self.outbox.deliver(task_id)  # a follow-up that came while the agent was being started
        return working

    async def _fail_start(self, rec: TaskRecord, text: str) -> None:
        """Fail a task whose agent did not start; if the store is away, later (in the background),
        so the task does not stay submitted."""
        failed = status_change(
            rec,
            "TASK_STATE_FAILED",
            text,
            metadata={**rec.metadata, "fail_kind": "infrastructure"},
            unless_terminal=True,
        )
        try:
            await self.record(rec.id, failed)
        except StoreUnavailable:
            assert self._nursery is not None
            self._nursery.start_soon(self._once_the_store_answers, lambda: self.record(rec.id, failed))

    async def _once_the_store_answers(self, fn: Callable[[], Awaitable[object]]) -> None:
        """``fn()`` in the background, tried again (with backoff) for as long as the store is away;
        given up once the store is closed (shutdown)."""
        pause = 0.1
        while True:
            await trio.sleep(pause)
            pause = min(pause * 2, self.lease_ttl_s)
            try:
                await fn()
                return
            except StoreUnavailable:
                continue
            except StoreClosed:
                return

    def parked_execs(self) -> builtins.list[str]:
        """The execs of the tasks run here that wait for an answer (``input-required``,
        ``auth-required``): they do not keep their instance awake (docs/sleep.md)."""
        return [rec.exec_id for rec in self._live.values() if rec.state in RESUMED_BY_MESSAGE and rec.exec_id]

    def _spawn(self, rec: TaskRecord, *, artifacts: builtins.list[dict[str, Any]]) -> None:
        assert self._nursery is not None, "TaskService.attach was not called"
        self._live[rec.id] = rec
        runner = Runner(
            rec,
            link=self.link,
            record_many=self._record_owned,
            canceled=lambda tid: tid in self._canceling,
            deliver=self.outbox.deliver,
            max_output_bytes=self.max_output_bytes,
            started={a["artifactId"] for a in artifacts},
            agent=AgentEvents(rec, self.files, self.agent_limits, artifacts),
            logs=self.logs,
            first_message=self._first_message,
        )
        self._nursery.start_soon(self._run, runner)

    async def _record_owned(self, task_id: str, changes: builtins.list[Append]) -> TaskRecord | None:
        return await self.record_many(task_id, changes, owned=True)

    async def _first_message(self, task_id: str) -> dict[str, Any] | None:
        first = await self.store.tasks.events_after(task_id, 0, limit=1)
        return first[0].body if first and first[0].kind == "message" else None

    async def _run(self, runner: Runner) -> None:
        try:
            await runner.run()
        except LeaseLost as exc:
            # Another controller took the task (this one stalled past its claim): it follows the
            # stream from what was stored; nothing more is written here.
            log.warning("task %s: %s; no longer following it here", runner.task.id, exc)
        except StoreUnavailable as exc:
            # What the runner held in memory past the last write is not stored: a new runner
            # resumes from the store once it answers (here, or at the controller that claims it).
            log.warning("task %s: %s; following it again once the store is back", runner.task.id, exc.message)
            assert self._nursery is not None
            task_id = runner.task.id  # followed again once this runner is gone
            self._nursery.start_soon(self._once_the_store_answers, lambda: self._follow_again(task_id))
        finally:
            self._live.pop(runner.task.id, None)

    async def _follow_again(self, task_id: str) -> None:
        """Adopt the task afresh from the store, unless it ended or another controller has it."""
        now = time.time()
        rec = await self.store.tasks.get(task_id)
        if rec is None or rec.terminal:
            return
        if await self.store.tasks.claim(task_id, self.owner, now + self.lease_ttl_s, now):
            await self.adopt(rec)

    # -- cancel ---------------------------------------------------------------------------------

    async def cancel(self, instance_id: str, task_id: str) -> TaskRecord:
        rec = await self.get(instance_id, task_id)
        if rec.terminal:
            raise InvalidState(TASK_NOT_CANCELABLE, f"task {rec.id} is {rec.state}", details={"taskId": rec.id})
        self._canceling.add(rec.id)
        if rec.exec_id is None:
            await self.record(rec.id, status_change(rec, "TASK_STATE_CANCELED", "canceled", unless_terminal=True))
        elif await self._agent_ends(rec):
            pass
        else:
            try:
                await self.link.call(m.ExecCancelRequest(exec_id=rec.exec_id, grace_s=CANCEL_GRACE_S))
            except NotFound:
                pass  # already gone: its runner records the end
            except ControllerError as exc:
                ended = exc.details.get("hostd_code") in ("exec.not_found", "exec.exited")
                # A call that failed while the exec ended anyway (its runner recorded the end) has
                # nothing left to report: the task's state is the answer.
                if not ended and not (await self.get(instance_id, task_id)).terminal:
                    self._canceling.discard(rec.id)
                    raise
                if not ended:
                    log.info("task %s: ended while its cancel failed (%s)", rec.id, exc.message)
        with trio.move_on_after(CANCEL_WAIT_S):
            return await self.wait_settled(rec.id)
        return await self.get(instance_id, task_id)

    async def _agent_ends(self, rec: TaskRecord) -> bool:
        """Ask an agent that speaks the protocol to end its task (a ``cancel`` line); True if it did
        within the grace period (else its tree is killed, as for any agent)."""
        if not rec.metadata.get(AGENT_PROTOCOL) or rec.exec_id is None:
            return False
        try:
            line: dict[str, object] = {"type": "cancel", "reason": "a client canceled the task"}
            await self.link.call(m.ExecControlSendRequest(exec_id=rec.exec_id, message=line))
        except ControllerError:
            return False  # its channel is gone: the tree goes
        with trio.move_on_after(self.agent_cancel_grace_s):
            await self.wait_settled(rec.id)
            return True
        return False

    async def run_purger(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Prune ended tasks past the retention's age or past the count kept per instance, on a
        timer, forever; in batches of short transactions with a pause between, so requests go on
        meanwhile."""
        interval = min(max(self.retention_s / 4, 0.05), PURGE_INTERVAL_S)
        task_status.started()
        while True:
            try:
                await self.prune()
            except StoreClosed:
                return
            except StoreUnavailable as exc:
                log.warning("task purge: %s (tried again later)", exc.message)
            await trio.sleep(interval)

    async def prune(self) -> int:
        """One round of :meth:`run_purger`: until nothing is left to prune; how many went."""
        pruned = 0
        rounds: list[tuple[str, Callable[[], Awaitable[list[str]]]]] = [
            ("age", lambda: self.store.tasks.purge(time.time() - self.retention_s))
        ]
        if self.keep_per_instance:
            rounds.append(("count", lambda: self.store.tasks.trim(self.keep_per_instance)))
        for reason, batch in rounds:
            while gone := await batch():
                pruned += len(gone)
                if self.metrics is not None:
                    self.metrics.tasks_pruned.labels(reason=reason).inc(len(gone))
                await self.files.remove(gone)
                await self.logs.remove(gone)
                if len(gone) < PURGE_BATCH:
                    break
                await trio.sleep(PURGE_PAUSE_S)
        if pruned:
            log.info("pruned %d ended task(s) past retention", pruned)
        return pruned

    # -- restart --------------------------------------------------------------------------------

    async def recover(self) -> None:
        """Give unfinished tasks their runner back (see the module docstring): all of them on the
        embedded store; on a shared one the lease sweep adopts those whose owner is gone."""
        await self.outbox.recover()  # each runner hands over what waits for its agent
        if self.store.shared:
            return
        until = time.time() + self.lease_ttl_s
        for rec in await self.store.tasks.unfinished():
            if await self.store.tasks.claim(rec.id, self.owner, until, 0.0, steal=True):
                await self.adopt(rec)

    async def adopt(self, rec: TaskRecord) -> None:
        """Follow a task this controller has just claimed (its previous owner is gone)."""
        if rec.exec_id is None:
            metadata = {**rec.metadata, "fail_kind": "infrastructure"}
            text = "the controller stopped before the agent was started"
            await self.record(rec.id, status_change(rec, "TASK_STATE_FAILED", text, metadata=metadata))
            return
        if rec.id in self._live:
            return  # followed here already (its claim was only renewed late)
        log.info("task %s: following its exec %s (its previous controller is gone)", rec.id, rec.exec_id)
        self._spawn(rec, artifacts=await self.store.tasks.artifacts(rec.id))

    async def run_leases(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Renew this controller's claims and, on a shared store, adopt tasks whose owner stopped
        renewing (see the module docstring); forever. A clean stop releases the claims."""
        interval = self.lease_ttl_s / 4
        task_status.started()
        try:
            while True:
                try:
                    await self._lease_round()
                except StoreUnavailable as exc:
                    log.warning("task leases: %s (tried again in %.2f s)", exc.message, interval)
                except StoreClosed:
                    return
                await trio.sleep(interval)
        finally:
            with trio.CancelScope(shield=True), trio.move_on_after(2):
                try:
                    await self.store.release(self.owner)
                except (StoreUnavailable, StoreClosed):
                    pass  # the claims run out by themselves

    async def _lease_round(self) -> None:
        if not self.store.shared:
            return  # one controller: its claims are never contested
        now = time.time()
        await self.store.renew(self.owner, now + self.lease_ttl_s)  # every claim it holds, of every kind
        host_id = self.link.host_id
        if host_id is None:
            return  # not connected to hostd yet: nothing could be followed here
        # Only this host's tasks: another host's exec streams are its hostd's.
        for rec in await self.store.tasks.orphans(now, host_id=host_id):
            if await self.store.tasks.claim(rec.id, self.owner, now + self.lease_ttl_s, now):
                await self.adopt(rec)

    # -- news from other controllers (shared store) ---------------------------------------------

    async def news(self, task_id: str, seq: int) -> None:
        """Task ``task_id`` has events up to ``seq`` (a notification): wake its waiters here with
        those they have not seen."""
        if task_id in self._writing:
            # Most likely its own write, whose notification overtook the write's return: looked at
            # again once the write is told here (reading the store now would read it twice).
            self._deferred[task_id] = max(seq, self._deferred.get(task_id, 0))
            return
        seen = self.hub.behind(task_id, seq)
        if seen is not None:
            await self._catch_up(task_id, seen)

    async def outbox_news(self, task_id: str) -> None:
        """Something was queued for the agent of ``task_id``: hand it over if the task is followed here."""
        if task_id in self._live:
            await self.outbox.deliver(task_id, force=True)

    async def _catch_up(self, task_id: str, seen: int) -> None:
        if seen == 0:
            self.hub.pulse(task_id)  # nothing told yet: the waiters read the store themselves
            return
        for event in await self.store.tasks.events_after(task_id, seen):
            self.hub.pulse(task_id, event)

    async def poll(self) -> None:
        """Catch the waiters here up with the store (after a reconnect, and as the fallback for a
        notification that never came)."""
        watched = self.hub.watched()
        if not watched:
            return
        for task_id, last_seq in (await self.store.tasks.last_seqs(watched)).items():
            await self.news(task_id, last_seq)


__all__ = ["ListQuery", "Page", "TaskService"]
