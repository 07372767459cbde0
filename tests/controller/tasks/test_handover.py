"""The agent outbox handing control messages to a task's agent, on a real hostd and a real store:
in order and removed once hostd took them; kept while the agent is being started or hostd is away;
dropped once the agent can never take them; found again after a restart."""

from __future__ import annotations

import json
import time

import trio

from agentic_sandbox.controller.hostlink import HostdLink
from agentic_sandbox.controller.store import Append, TaskRecord
from agentic_sandbox.controller.tasks.handover import AgentOutbox
from agentic_sandbox.proto import messages as m
from tests.controller.tasks.rig import Rig, working_task

FD = '"$AIWG_CONTROL_FD"'
#: An agent that echoes the first two lines it is handed, then exits.
ECHO_TWO = f'for i in 1 2; do read -r -u {FD} line || exit 3; echo "$line"; done'


async def _queue(rig: Rig, task_id: str, *bodies: dict[str, int]) -> None:
    for body in bodies:
        message = {"messageId": f"m{body}", "role": "ROLE_USER", "parts": [{"text": "x"}]}
        await rig.store.tasks.append(task_id, Append(kind="message", body=message, outbox=body), time.time())


async def _agent_output(rig: Rig, task: TaskRecord) -> list[dict[str, int]]:
    """Follow the exec to its end with a runner; the JSON lines it printed."""
    with trio.fail_after(20):
        await rig.runner(task).run()
    rec = await rig.store.tasks.get(task.id)
    assert rec is not None and rec.state == "TASK_STATE_COMPLETED", rec.status
    [stdout] = [a for a in await rig.store.tasks.artifacts(task.id) if a["artifactId"] == "stdout"]
    return [json.loads(line) for line in "".join(p["text"] for p in stdout["parts"]).splitlines()]


async def test_messages_reach_the_agent_in_order_and_leave_the_outbox(rig: Rig) -> None:
    task = await rig.start(ECHO_TWO)
    await _queue(rig, task.id, {"n": 1}, {"n": 2})
    outbox = AgentOutbox(rig.store, rig.link)
    await outbox.deliver(task.id)  # not due: nothing is read, nothing handed over
    assert len(await rig.store.outbox.pending(task.id)) == 2
    await outbox.deliver(task.id, force=True)
    assert await rig.store.outbox.pending(task.id) == []
    assert await _agent_output(rig, task) == [{"n": 1}, {"n": 2}]


async def test_what_waits_for_an_agent_being_started_goes_once_it_runs(rig: Rig) -> None:
    task = await rig.start(ECHO_TWO)
    exec_id = task.exec_id
    starting = working_task("t-starting", exec_id=None)
    await rig.store.tasks.create(starting, Append(kind="message", body={"messageId": "m", "parts": []}))
    await _queue(rig, "t-starting", {"n": 1}, {"n": 2})
    outbox = AgentOutbox(rig.store, rig.link)
    await outbox.deliver("t-starting", force=True)
    assert len(await rig.store.outbox.pending("t-starting")) == 2  # no exec yet: kept, and due
    working = {"state": "TASK_STATE_WORKING"}
    await rig.store.tasks.append(
        "t-starting", Append(kind="status", body={"status": working}, status=working, exec_id=exec_id), time.time()
    )
    await outbox.deliver("t-starting")  # due: the runner's call on subscribing hands them over
    assert await rig.store.outbox.pending("t-starting") == []
    assert await _agent_output(rig, task) == [{"n": 1}, {"n": 2}]


async def test_what_an_agent_can_never_take_is_dropped(rig: Rig) -> None:
    # The task ended: nothing is sent.
    ended = working_task("t-ended", exec_id="x-whatever")
    await rig.store.tasks.create(ended, Append(kind="message", body={"messageId": "m", "parts": []}))
    await _queue(rig, "t-ended", {"n": 1})
    done = {"state": "TASK_STATE_COMPLETED"}
    await rig.store.tasks.append("t-ended", Append(kind="status", body={"status": done}, status=done), time.time())
    outbox = AgentOutbox(rig.store, rig.link)
    await outbox.deliver("t-ended", force=True)
    assert await rig.store.outbox.pending("t-ended") == []
    # The exec has exited (the task not ended yet): hostd refuses for good, the message goes.
    task = await rig.start("exit 0")
    with trio.fail_after(10):
        while (await rig.link.call(m.ExecGetRequest(exec_id=task.exec_id))).exec.state != "exited":  # type: ignore[arg-type]
            await trio.sleep(0.02)
    await _queue(rig, task.id, {"n": 1}, {"n": 2})
    await outbox.deliver(task.id, force=True)
    assert await rig.store.outbox.pending(task.id) == []


async def test_while_hostd_is_away_messages_wait_and_a_restart_finds_them(rig: Rig) -> None:
    task = await rig.start(ECHO_TWO)
    await _queue(rig, task.id, {"n": 1}, {"n": 2})
    away = HostdLink(
        "/nonexistent/hostd.sock", call_timeout_s=1, connect_timeout_s=1, ping_interval_s=1, reconnect_max_s=1
    )
    down = AgentOutbox(rig.store, away)  # never connected: every call is Unavailable
    await down.deliver(task.id, force=True)
    assert [i.body for i in await rig.store.outbox.pending(task.id)] == [{"n": 1}, {"n": 2}]

    restarted = AgentOutbox(rig.store, rig.link)  # a new controller: nothing is due in memory yet
    await restarted.deliver(task.id)
    assert len(await rig.store.outbox.pending(task.id)) == 2
    await restarted.recover()
    await restarted.deliver(task.id)
    assert await rig.store.outbox.pending(task.id) == []
    await restarted.deliver(task.id)  # done: no longer due (and nothing to send twice)
    assert await _agent_output(rig, task) == [{"n": 1}, {"n": 2}]


async def test_a_call_during_a_pass_makes_it_go_round_again(rig: Rig) -> None:
    """Two deliveries at once, each after queueing its message: both messages reach the agent, once
    each, in order (the second call does not start a pass of its own)."""
    task = await rig.start(ECHO_TWO)
    outbox = AgentOutbox(rig.store, rig.link)

    async def queue_and_deliver(n: int) -> None:
        outbox.expect(task.id)
        await _queue(rig, task.id, {"n": n})
        await outbox.deliver(task.id)

    async with trio.open_nursery() as nursery:
        for n in (1, 2):
            nursery.start_soon(queue_and_deliver, n)
            await trio.sleep(0)
    assert await rig.store.outbox.pending(task.id) == []
    assert await _agent_output(rig, task) == [{"n": 1}, {"n": 2}]
