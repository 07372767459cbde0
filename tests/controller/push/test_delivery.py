"""Push delivery end to end: a real hostd, the controller on loopback, a real webhook receiver."""

from __future__ import annotations

import re
import signal
from pathlib import Path
from typing import Any

import httpx
import trio

from tests.controller.a2a.helpers import new_agent
from tests.controller.conftest import ADMIN_TOKEN, ControllerProcess, LiveController, LiveHostd, controller_env

from .conftest import PUSH_ENV
from .receiver import Receiver
from .test_configs import a_task, message

END = "TASK_STATE_COMPLETED"


async def metric(client: httpx.AsyncClient, name: str, instance_id: str) -> float:
    text = (await client.get("/metrics")).text
    found = re.search(rf'^{name}{{instance="{re.escape(instance_id)}"}} (\S+)$', text, re.M)
    return float(found.group(1)) if found else 0.0


async def wait_metric(client: httpx.AsyncClient, name: str, instance_id: str, at_least: float) -> float:
    with trio.fail_after(30):
        while (value := await metric(client, name, instance_id)) < at_least:
            await trio.sleep(0.05)
    return value


def send_with_push(text: str, receiver: Receiver, **push: Any) -> dict[str, Any]:
    config = {"taskPushNotificationConfig": {"url": receiver.url, **push}, "returnImmediately": True}
    return {"message": message(text), "configuration": config}


async def test_each_event_is_posted_in_order(push_admin: httpx.AsyncClient, push_controller: LiveController) -> None:
    agent = await new_agent(push_admin, push_controller, "push-deliver", loadout="shell")
    receiver = Receiver()
    async with trio.open_nursery() as nursery, agent.client(push_controller) as client:
        await nursery.start(receiver.serve)
        auth = {"scheme": "Bearer", "credentials": "s3cret"}
        sent = await client.post(
            "/message:send", json=send_with_push("echo hi", receiver, token="tok", authentication=auth)
        )
        assert sent.status_code == 200, sent.text
        task_id = sent.json()["task"]["id"]
        await receiver.wait_for(lambda: END in receiver.states())
        assert receiver.states() == ["TASK_STATE_WORKING", END]
        artifacts = [r.body["artifactUpdate"] for r in receiver.received if "artifactUpdate" in r.body]
        assert "".join(p["text"] for a in artifacts for p in a["artifact"]["parts"]) == "hi\n"
        for got in receiver.received:
            assert got.path == "/hook"
            assert got.headers["content-type"] == "application/a2a+json"
            assert got.headers["authorization"] == "Bearer s3cret"
            assert got.headers["x-a2a-notification-token"] == "tok"
            assert got.headers["host"] == f"127.0.0.1:{receiver.port}"
            event = got.body.get("statusUpdate") or got.body["artifactUpdate"]
            assert event["taskId"] == task_id
        delivered = len(receiver.received)
        assert await wait_metric(push_admin, "aiwg_push_deliveries_total", agent.instance_id, delivered) == delivered

        # A config made on a running task gets the events after it (here: the cancel).
        later = Receiver()
        await nursery.start(later.serve)
        running = await a_task(client)
        made = await client.post(f"/tasks/{running}/pushNotificationConfigs", json={"url": later.url})
        assert made.status_code == 200, made.text
        await client.post(f"/tasks/{running}:cancel")
        await later.wait_for(lambda: "TASK_STATE_CANCELED" in later.states())
        assert later.states() == ["TASK_STATE_CANCELED"]
        nursery.cancel_scope.cancel()


async def test_a_failing_receiver_gets_every_event_after_retries(
    push_admin: httpx.AsyncClient, push_controller: LiveController
) -> None:
    agent = await new_agent(push_admin, push_controller, "push-retry", loadout="shell")
    receiver = Receiver(fail_first=3)
    async with trio.open_nursery() as nursery, agent.client(push_controller) as client:
        await nursery.start(receiver.serve)
        sent = await client.post("/message:send", json=send_with_push("echo again", receiver))
        assert sent.status_code == 200, sent.text
        await receiver.wait_for(lambda: END in receiver.states())
        assert receiver.states() == ["TASK_STATE_WORKING", END]
        assert receiver.attempts == len(receiver.received) + 3
        assert await wait_metric(push_admin, "aiwg_push_retries_total", agent.instance_id, 3) == 3
        assert await metric(push_admin, "aiwg_push_failures_total", agent.instance_id) == 0
        nursery.cancel_scope.cancel()


async def test_a_receiver_that_never_answers_is_given_up_on(
    push_admin: httpx.AsyncClient, push_controller: LiveController
) -> None:
    agent = await new_agent(push_admin, push_controller, "push-hang", loadout="shell")
    receiver = Receiver(hang=True)
    async with trio.open_nursery() as nursery, agent.client(push_controller) as client:
        await nursery.start(receiver.serve)
        sent = await client.post("/message:send", json=send_with_push("echo nobody", receiver))
        assert sent.status_code == 200, sent.text
        # Each attempt times out (AIWG_PUSH_TIMEOUT_S) and is retried until the budget is spent;
        # then the event is dropped and counted, and the next one is tried.
        assert await wait_metric(push_admin, "aiwg_push_failures_total", agent.instance_id, 1) >= 1
        assert receiver.attempts >= 2 and receiver.received == []
        assert await metric(push_admin, "aiwg_push_retries_total", agent.instance_id) >= 1
        nursery.cancel_scope.cancel()


async def run_across_sigkill(hostd: LiveHostd, tmp_path: Path, script: str, **extra: str) -> dict[str, Any]:
    env = controller_env(tmp_path / "c", hostd.socket_path, **{**PUSH_ENV, "AIWG_PUSH_RETRY_S": "600", **extra})
    receiver = Receiver(fail_first=10**9)  # nothing gets through while the first controller runs
    out: dict[str, Any] = {"receiver": receiver}
    async with trio.open_nursery() as nursery:
        await nursery.start(receiver.serve)
        first = ControllerProcess(env)
        url = await first.start(nursery)
        async with httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {ADMIN_TOKEN}"}) as admin:
            live = LiveController(url=url, app=None, config=None)  # type: ignore[arg-type]
            with trio.fail_after(15):
                while (await admin.get("/readyz")).status_code != 200:
                    await trio.sleep(0.05)
            agent = await new_agent(admin, live, "push-crash", loadout="shell")
        async with agent.client(live) as client:
            sent = await client.post("/message:send", json=send_with_push(script, receiver))
            task_id = sent.json()["task"]["id"]
            with trio.fail_after(30):
                while (await client.get(f"/tasks/{task_id}")).json()["status"]["state"] != END:
                    await trio.sleep(0.05)
        await receiver.wait_for(lambda: receiver.attempts >= 1)
        await first.stop(signal.SIGKILL)
        assert receiver.received == []
        receiver.fail_first = 0

        second = ControllerProcess(env)
        url = await second.start(nursery)
        await receiver.wait_for(lambda: END in receiver.states())
        async with httpx.AsyncClient(base_url=url) as anon:
            out["failures"] = await metric(anon, "aiwg_push_failures_total", agent.instance_id)
        assert await second.stop() == 0, second.output()
        nursery.cancel_scope.cancel()
    return out


async def test_events_queued_at_a_sigkill_are_delivered_after_restart(hostd: LiveHostd, tmp_path: Path) -> None:
    out = await run_across_sigkill(hostd, tmp_path, "echo survived")
    receiver: Receiver = out["receiver"]
    assert receiver.states() == ["TASK_STATE_WORKING", END]
    artifacts = [r.body["artifactUpdate"] for r in receiver.received if "artifactUpdate" in r.body]
    assert "".join(p["text"] for a in artifacts for p in a["artifact"]["parts"]) == "survived\n"
    assert out["failures"] == 0


async def test_a_config_holds_a_bounded_queue(hostd: LiveHostd, tmp_path: Path) -> None:
    # 20 outputs a line apart queue far more than 2 events behind the failing receiver; after the
    # restart the config is over its bound, so only the newest 2 are sent and the rest counted.
    script = "for i in $(seq 20); do echo $i; sleep 0.02; done"
    out = await run_across_sigkill(hostd, tmp_path, script, AIWG_PUSH_MAX_QUEUE="2")
    receiver: Receiver = out["receiver"]
    assert 1 <= len(receiver.received) <= 2 and receiver.states()[-1] == END
    assert "TASK_STATE_WORKING" not in receiver.states()
    assert out["failures"] >= 1


async def test_prompts_reach_receivers_whose_config_activated_hitl(
    push_admin: httpx.AsyncClient, push_controller: LiveController, tmp_path: Path
) -> None:
    """hitl-prompt/v1: a config made by a request that activated the extension gets the prompt
    envelope on the INPUT_REQUIRED update (so a webhook can answer it); another config does not."""
    from agentic_sandbox.controller.tasks.prompts import HITL_EXTENSION
    from tests.controller.a2a.test_hitl import ACTIVE, ask_script
    from tests.controller.a2a.test_rest import message as a2a_message

    agent = await new_agent(push_admin, push_controller, "push-hitl", loadout="shell")
    with_prompts, without = Receiver(), Receiver()
    async with (
        trio.open_nursery() as nursery,
        agent.client(push_controller, **ACTIVE) as client,
        agent.client(push_controller) as plain,
    ):
        await nursery.start(with_prompts.serve)
        await nursery.start(without.serve)
        push = {"taskPushNotificationConfig": {"url": with_prompts.url}, "returnImmediately": True}
        gate = tmp_path / "gate"  # the agent asks once both configs are made
        script = f"while [ ! -e {gate} ]; do sleep 0.05; done\n{ask_script()}"
        sent = await client.post("/message:send", json={"message": a2a_message(script), "configuration": push})
        assert sent.status_code == 200, sent.text
        task_id = sent.json()["task"]["id"]
        made = await plain.post(f"/tasks/{task_id}/pushNotificationConfigs", json={"url": without.url})
        assert made.status_code == 200, made.text
        gate.touch()
        for receiver in (with_prompts, without):
            await receiver.wait_for(lambda r=receiver: "TASK_STATE_INPUT_REQUIRED" in r.states())
        [shown] = [r.body for r in with_prompts.received if "statusUpdate" in r.body][-1:]
        envelope = shown["statusUpdate"]["status"]["message"]["metadata"][HITL_EXTENSION]
        assert envelope["prompt"] == "Approve?"
        [bare] = [r.body for r in without.received if "statusUpdate" in r.body]
        assert HITL_EXTENSION not in bare["statusUpdate"]["status"]["message"]["metadata"]
        await client.post(f"/tasks/{task_id}:cancel")
        nursery.cancel_scope.cancel()


async def test_deliveries_share_a_kept_alive_connection_and_the_cursor_catches_up(
    push_admin: httpx.AsyncClient, push_controller: LiveController
) -> None:
    agent = await new_agent(push_admin, push_controller, "push-keep", loadout="shell")
    receiver = Receiver(keep_alive=True)
    async with trio.open_nursery() as nursery, agent.client(push_controller) as client:
        await nursery.start(receiver.serve)
        script = "for i in $(seq 40); do echo $i; done"
        sent = await client.post("/message:send", json=send_with_push(script, receiver))
        task_id = sent.json()["task"]["id"]
        await receiver.wait_for(lambda: END in receiver.states())
        assert receiver.connections == 1  # every delivery on one connection
        artifacts = [r.body["artifactUpdate"] for r in receiver.received if "artifactUpdate" in r.body]
        assert "".join(p["text"] for a in artifacts for p in a["artifact"]["parts"]) == "".join(
            f"{i}\n" for i in range(1, 41)
        )
        # The cursor, written in batches, ends at the task's last event once the worker is done.
        store = push_controller.state.tasks.store
        with trio.fail_after(10):
            while True:
                task = await store.tasks.get(task_id)
                [cfg] = await store.push.list(task_id)
                if task is not None and cfg.delivered_seq == task.last_seq:
                    break
                await trio.sleep(0.05)
        nursery.cancel_scope.cancel()
