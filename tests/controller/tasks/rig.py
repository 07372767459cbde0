"""What the task tests share: a task row, and a rig (the ``rig`` fixture of conftest.py) of a hostd
link, a store on a real file and a host instance, on which execs run under a :class:`Runner`."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import trio

from agentic_sandbox.controller.hostlink import HostdLink
from agentic_sandbox.controller.store import Append, Store, TaskEvent, TaskRecord
from agentic_sandbox.controller.tasks.agentevents import AgentEvents, AgentLimits
from agentic_sandbox.controller.tasks.agentlogs import TaskLogs
from agentic_sandbox.controller.tasks.files import TaskFiles
from agentic_sandbox.controller.tasks.runner import Runner
from agentic_sandbox.proto import messages as m
from agentic_sandbox.proto import new_id


def working_task(task_id: str, *, exec_id: str | None) -> TaskRecord:
    status = {"state": "TASK_STATE_WORKING"}
    return TaskRecord(
        id=task_id, instance_id="i1", context_id="c1", state=status["state"], status=status, metadata={"k": "v"},
        exec_id=exec_id, last_at=1.0, created_at=1.0, status_at=1.0,
    )  # fmt: skip


@dataclass
class Rig:
    """A hostd link, a store on a real file and a host instance on that hostd."""

    link: HostdLink
    store: Store
    instance_id: str
    files: TaskFiles
    logs: TaskLogs

    async def start(self, script: str) -> TaskRecord:
        """An exec of ``script`` (bash, with a control channel) and its task, stored."""
        exec_id = f"x-{new_id()}"
        await self.link.call(
            m.ExecStartRequest(
                instance_id=self.instance_id,
                argv=["bash", "-c", script],
                control=True,
                control_flow=True,
                exec_id=exec_id,
            )
        )
        task = working_task(f"t-{new_id()}", exec_id=exec_id)
        first = Append(kind="message", body={"messageId": "m", "role": "ROLE_USER", "parts": [{"text": "go"}]})
        await self.store.tasks.create(task, first)
        return task

    def runner(
        self,
        task: TaskRecord,
        *,
        canceled: bool = False,
        max_output_bytes: int = 1 << 20,
        started: set[str] = frozenset(),
        limits: AgentLimits = AgentLimits(),
    ) -> Runner:
        async def record_many(task_id: str, changes: list[Append]) -> TaskRecord | None:
            return (await self.store.tasks.append_many(task_id, changes, time.time()))[1]

        async def deliver(task_id: str) -> None:
            pass

        async def first_message(task_id: str) -> dict[str, Any] | None:
            first = await self.store.tasks.events_after(task_id, 0, limit=1)
            return first[0].body if first else None

        return Runner(
            task, link=self.link, record_many=record_many, canceled=lambda _: canceled, deliver=deliver,
            max_output_bytes=max_output_bytes, started=set(started),
            agent=AgentEvents(task, self.files, limits, []), logs=self.logs, first_message=first_message,
        )  # fmt: skip

    async def run(self, script: str, **kw: Any) -> tuple[TaskRecord, list[TaskEvent]]:
        task = await self.start(script)
        with trio.fail_after(20):
            await self.runner(task, **kw).run()
        rec = await self.store.tasks.get(task.id)
        assert rec is not None
        return rec, await self.store.tasks.events_after(task.id, 1)
