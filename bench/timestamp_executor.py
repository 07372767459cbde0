"""The a2a-sdk AgentExecutor bench_agents.py runs two ways: in a2a-sdk's own server, in-process
(``bench/peer_a2a_server.py ... --executor``), and unmodified in a host instance through
``python -m agentic_sandbox_agent.a2a``. Its input is ``"<events> <interval_ms>"``: it sends that
many artifact updates, that far apart, each holding ``time.time_ns()`` when it was made, then
completes. Plain a2a-sdk: nothing in it knows where it runs.
"""

from __future__ import annotations

import asyncio
import time

from a2a.server.agent_execution import AgentExecutor, RequestContext
from a2a.server.events import EventQueue
from a2a.server.tasks import TaskUpdater
from a2a.types import Part, Task, TaskState, TaskStatus


class TimestampExecutor(AgentExecutor):
    async def execute(self, context: RequestContext, event_queue: EventQueue) -> None:
        task_id, context_id = context.task_id or "", context.context_id or ""
        if context.current_task is None:  # the SDK's server wants the Task before any update
            status = TaskStatus(state=TaskState.TASK_STATE_SUBMITTED)
            await event_queue.enqueue_event(Task(id=task_id, context_id=context_id, status=status))
        events, interval_ms = (int(x) for x in context.get_user_input().split())
        updater = TaskUpdater(event_queue, task_id, context_id)
        await updater.start_work()
        for i in range(events):
            if interval_ms:
                await asyncio.sleep(interval_ms / 1000)
            await updater.add_artifact([Part(text=str(time.time_ns()))], artifact_id="stamps", append=i > 0)
        await updater.complete()

    async def cancel(self, context: RequestContext, event_queue: EventQueue) -> None:
        await TaskUpdater(event_queue, context.task_id or "", context.context_id or "").cancel()
