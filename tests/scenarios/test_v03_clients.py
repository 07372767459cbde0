"""Clients of A2A 0.3: a2a-sdk's latest 0.3 release, as a new user runs it, against a live hostd and
controller, over JSON-RPC and HTTP+JSON, on a host instance and a container instance.

a2a-sdk 0.3 and 1.x are one import name, so the 0.3 client runs in a venv of its own
(:func:`a2a03_python`: made once, under the repository's ``.venv-a2a03``, reused while it holds the
release asked for) as a subprocess (``a2a03_driver.py``), connecting from the card over the
controller's loopback port. The instance runs the test executors' RoutingExecutor: a task with
every part kind, one that waits for input and its follow-up, a Message answer, a slow one
resubscribed to and canceled; push notification configs; the extended card; an error.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import trio

from tests.controller.a2a.helpers import Agent
from tests.controller.conftest import ROOT, LiveController
from tests.scenarios.test_agents_speak_a2a import container_agent, executor_agent, python_podman

__all__ = ["python_podman"]  # the container instance's fixture, shared with the 1.x scenarios
#: The first run installs a2a-sdk 0.3 from PyPI (its own timeout bounds that).
pytestmark = pytest.mark.timeout(900)

DRIVER = Path(__file__).resolve().parent / "a2a03_driver.py"
VENV = ROOT / ".venv-a2a03"
#: a2a-sdk's 0.3 line (its latest release), with what its card verifier needs.
REQUIREMENT = "a2a-sdk[signing]>=0.3,<0.4"
TRANSPORTS = ("JSONRPC", "HTTP+JSON")
STAMP = VENV / ".requirement"


@pytest.fixture(scope="session")
def a2a03_python() -> Path:
    """The Python of a venv holding a2a-sdk 0.3 (made on the first run, from PyPI)."""
    python = VENV / "bin" / "python"
    if not (python.exists() and STAMP.exists() and STAMP.read_text() == REQUIREMENT):
        subprocess.run([sys.executable, "-m", "venv", "--clear", str(VENV)], check=True)
        pip = [str(python), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
        done = subprocess.run([*pip, REQUIREMENT, "cryptography"], capture_output=True, text=True, timeout=600)
        if done.returncode != 0:
            pytest.fail(f"could not install {REQUIREMENT} into {VENV}:\n{done.stderr[-4000:]}")
        STAMP.write_text(REQUIREMENT)
    return python


async def drive(python: Path, agent: Agent, transport: str) -> dict[str, Any]:
    done = await trio.run_process(
        [str(python), str(DRIVER), agent.base, agent.token, transport],
        capture_stdout=True,
        capture_stderr=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr.decode()[-6000:]
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def final_task(events: list[Any]) -> dict[str, Any]:
    """A blocking send's Task (each event is ``[task, update]``)."""
    task: dict[str, Any] = events[-1][0]
    return task


def check(out: dict[str, Any], agent: Agent, kind: str) -> None:
    card = out["card"]
    assert card["url"] == agent.base and card["protocolVersion"] == "0.3.0"
    assert {i["transport"] for i in card["additionalInterfaces"]} == {"JSONRPC", "HTTP+JSON"}
    assert out["extended_card"]["url"] == agent.base

    [[sent, update]] = out["send"]
    assert update is None and sent["kind"] == "task" and sent["status"]["state"] == "completed"
    assert sent["metadata"]["runtime.kind"] == kind and sent["metadata"]["agent_protocol"] == 2
    kinds = next(a for a in sent["artifacts"] if a["artifactId"] == "kinds")
    assert [p["kind"] for p in kinds["parts"]] == ["text", "file", "file", "data"]
    assert "bytes" in kinds["parts"][1]["file"] and "uri" in kinds["parts"][2]["file"]

    streamed = out["stream"]
    updates = [update for _task, update in streamed if update is not None]
    assert streamed[0][0]["kind"] == "task" and updates, streamed
    assert updates[-1]["kind"] == "status-update" and updates[-1]["final"] is True
    assert updates[-1]["status"]["state"] == "completed"
    assert not any(u["final"] for u in updates[:-1] if u["kind"] == "status-update")
    got = out["get"]
    assert got["id"] == streamed[0][0]["id"] and got["status"]["state"] == "completed"
    assert got["history"][0]["role"] == "user" and got["history"][0]["parts"][0]["kind"] == "text"

    asked = final_task(out["ask"])
    assert asked["status"]["state"] == "input-required"
    greeted = final_task(out["follow"])
    assert greeted["id"] == asked["id"] and greeted["status"]["state"] == "completed"

    [answer] = out["answer"]  # the agent answered with a Message: the send returns it, not a task
    assert answer["kind"] == "message" and answer["role"] == "agent", answer
    assert answer["parts"] == [{"kind": "text", "text": "echo: answer me"}]
    # (A stream has sent the task before the agent answers: the Message ends it as its status's.)
    streamed_answer = out["answer_stream"][-1][0]["status"]
    assert streamed_answer["state"] == "completed"
    assert streamed_answer["message"]["parts"] == [{"kind": "text", "text": "echo: answer me too"}]

    canceled = out["cancel"]
    assert canceled["status"]["state"] == "canceled"
    assert canceled["status"]["message"]["parts"] == [{"kind": "text", "text": "stopped on request"}]
    resubscribed = out["resubscribe"]
    assert resubscribed[0][0]["id"] == canceled["id"]
    last = resubscribed[-1][1]
    assert last["kind"] == "status-update" and last["final"] is True and last["status"]["state"] == "canceled"

    config = out["push_set"]
    assert config["taskId"] == canceled["id"]
    assert config["pushNotificationConfig"]["id"] == "cfg-1"
    assert config["pushNotificationConfig"]["url"] == "https://hooks.example.com/a2a"
    assert config["pushNotificationConfig"]["authentication"]["schemes"] == ["Bearer"]
    assert not config["pushNotificationConfig"]["authentication"].get("credentials")  # never shown back
    assert out["push_get"] == config
    assert out["not_found"] in ({"code": -32001, "message": out["not_found"].get("message")}, {"status": 404})


@pytest.fixture
async def routing(admin: httpx.AsyncClient, controller: LiveController) -> AsyncIterator[Agent]:
    yield await executor_agent(admin, controller, "RoutingExecutor")


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_a2a_sdk_03_on_a_host_instance(a2a03_python: Path, routing: Agent, transport: str) -> None:
    check(await drive(a2a03_python, routing, transport), routing, "host")


@pytest.mark.podman
async def test_a2a_sdk_03_on_a_container_instance(
    a2a03_python: Path, python_podman: tuple[httpx.AsyncClient, LiveController]
) -> None:
    admin, controller = python_podman
    agent = await container_agent(admin, controller, "boxed-03")
    for transport in TRANSPORTS:
        check(await drive(a2a03_python, agent, transport), agent, "container")
