"""Handing a task's agent its control messages: follow-ups and hitl-prompt/v1 answers.

What the agent is to be handed is queued in the store's agent outbox (:mod:`controller.store.controlqueue`)
in the same transaction as its task event, and removed here once hostd took it (``ExecControlSend``:
the line is in the agent's socket) or can never take it (the agent ended, closed its channel, the
line is too long: logged and dropped). So an acknowledged message reaches the agent after a
controller crash or a hostd outage too; at least once (a crash between hostd's answer and the
removal hands it over again), in the order the events were stored.

:meth:`AgentOutbox.deliver` runs one pass at a time per task; a call during a pass makes that pass
go round again, so nothing queued meanwhile is left behind. It reads the store only for tasks that
may have something waiting: the caller just queued something (``force``), or the task is *due*
(marked by :meth:`expect` before a write, left due by a pass that could not finish, or found
waiting by :meth:`recover` after a restart). The runner of a task calls it each time it subscribes
to its exec, which is when an agent that was being started, or a hostd that was away, can take what
waited.
"""

from __future__ import annotations

import logging

from agentic_sandbox.proto import messages as m

from ..errors import ControllerError
from ..hostlink import HostdLink
from ..store import Store

log = logging.getLogger(__name__)


class AgentOutbox:
    def __init__(self, store: Store, link: HostdLink) -> None:
        self.store = store
        self.link = link
        self._due: set[str] = set()
        self._delivering: set[str] = set()
        self._again: set[str] = set()

    def expect(self, task_id: str) -> None:
        """Something is about to be queued for ``task_id`` (called before the write)."""
        self._due.add(task_id)

    async def recover(self) -> None:
        """After a restart: every task with something waiting is due (its runner hands it over)."""
        self._due |= await self.store.outbox.task_ids()

    async def deliver(self, task_id: str, *, force: bool = False) -> None:
        """Hand the agent of ``task_id`` what waits for it, oldest first (see the module docstring)."""
        if not force and task_id not in self._due:
            return
        if task_id in self._delivering:
            self._again.add(task_id)
            return
        self._delivering.add(task_id)
        try:
            while True:
                self._again.discard(task_id)
                done = await self._pass(task_id)
                if task_id not in self._again:
                    break
            if done:
                self._due.discard(task_id)
            else:
                self._due.add(task_id)
        finally:
            self._delivering.discard(task_id)

    async def _pass(self, task_id: str) -> bool:
        """True once nothing waits; False if what waits must wait longer (no exec yet, hostd away)."""
        items = await self.store.outbox.pending(task_id)
        if not items:
            return True
        rec = await self.store.tasks.get(task_id)
        if rec is not None and rec.exec_id is None and not rec.terminal:
            return False  # the agent is being started: its runner hands these over
        for item in items:
            if rec is None or rec.exec_id is None or rec.terminal:
                log.info("task %s: its agent has ended; a queued control message is dropped", task_id)
            else:
                try:
                    await self.link.call(m.ExecControlSendRequest(exec_id=rec.exec_id, message=item.body))
                except ControllerError as exc:
                    if "hostd_code" not in exc.details:
                        log.info("task %s: a control message waits for hostd (%s)", task_id, exc.message)
                        return False
                    # hostd said no for good: the agent exited, closed its channel, the line is too long.
                    log.warning("task %s: the agent cannot take a control message: %s", task_id, exc.message)
            await self.store.outbox.remove(task_id, item.seq)
        return True
