"""v1 compatibility: v1 paths answer through the v2 handlers, carry the deprecation headers, count."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from agentic_sandbox.controller.config import DEFAULT_V1_SUNSET, load_config
from agentic_sandbox.controller.v1 import PATH_MAP, route_label, to_v2_path

from .conftest import LiveController, LiveHostd, controller_env, serve_controller, wait_operation
from .http.test_problems import assert_problem

LINK = '<https://agentic-sandbox.aiwg.io/v2-migration-guide>; rel="successor-version"'


def assert_deprecated(response: httpx.Response, sunset: str = DEFAULT_V1_SUNSET) -> None:
    assert response.headers["Sunset"] == sunset
    assert response.headers["Deprecated"] == "true"
    assert response.headers["Link"] == LINK


def test_path_translation_and_labels() -> None:
    assert to_v2_path("/api/v1/vms") == "/api/v2/admin/instances"
    assert to_v2_path("/api/v1/agents") == "/api/v2/admin/instances"
    assert to_v2_path("/api/v1/vms/abc/stop") == "/api/v2/admin/instances/abc/stop"
    assert to_v2_path("/api/v1/vmsx") == "/api/v2/admin/vmsx"
    assert to_v2_path("/api/v1/operations/op_1") == "/api/v2/admin/operations/op_1"
    assert to_v2_path("/api/v1/storage/inbox/a/b") == "/api/v2/admin/storage/inbox/a/b"
    assert route_label("/api/v1/storage/<scope>/<v1rest:path>") == "/api/v1/storage/{scope}/{path}"
    assert route_label("/api/v1/vms/<id>") == "/api/v1/vms/{id}"


async def test_v1_answers_through_v2(admin: httpx.AsyncClient) -> None:
    response = await admin.post("/api/v1/vms", json={"name": "legacy-vm", "runtime": "host", "start": True})
    assert response.status_code == 202
    assert_deprecated(response)
    op_id = response.json()["id"]
    assert response.headers["Location"] == f"/api/v2/admin/operations/{op_id}"

    v1_op = await admin.get(f"/api/v1/operations/{op_id}")
    assert v1_op.status_code == 200
    assert_deprecated(v1_op)
    done = await wait_operation(admin, op_id)
    iid = done["result"]["instance_id"]

    for path in ("/api/v1/vms", "/api/v1/agents"):
        v1, v2 = await admin.get(path), await admin.get("/api/v2/admin/instances")
        assert v1.status_code == 200
        assert_deprecated(v1)
        assert "Sunset" not in v2.headers and "Deprecated" not in v2.headers
        assert v1.json() == v2.json()

    detail = await admin.get(f"/api/v1/vms/{iid}")
    assert detail.status_code == 200 and detail.json()["name"] == "legacy-vm"

    stop = await admin.post(f"/api/v1/vms/{iid}/stop")
    assert stop.status_code == 202 and stop.json()["kind"] == "instance.stop"
    assert (await wait_operation(admin, stop.json()["id"]))["state"] == "succeeded"

    gone = await admin.delete(f"/api/v1/vms/{iid}")
    assert gone.status_code == 202
    assert (await wait_operation(admin, gone.json()["id"]))["state"] == "succeeded"
    missing = await admin.get(f"/api/v1/vms/{iid}")
    assert_problem(missing, 404, "instance.not_found")
    assert_deprecated(missing)


async def test_v1_catalog_and_storage_paths(admin: httpx.AsyncClient) -> None:
    images = await admin.get("/api/v1/container-images")
    assert images.status_code == 200
    assert_deprecated(images)
    assert images.json()["items"] == (await admin.get("/api/v2/admin/container-images")).json()["items"]
    missing = await admin.get("/api/v1/storage/global/no/such/object.txt")
    assert missing.status_code == 404
    assert_deprecated(missing)
    assert missing.headers["content-type"].startswith("application/problem+json")


async def test_every_v1_response_is_marked(admin: httpx.AsyncClient, anon: httpx.AsyncClient) -> None:
    unmatched = await admin.get("/api/v1/nothing/here")
    assert_problem(unmatched, 404, "route.not_found")
    assert_deprecated(unmatched)
    wrong_method = await admin.delete("/api/v1/agents")
    assert wrong_method.status_code == 405
    assert_deprecated(wrong_method)
    unauthorized = await anon.get("/api/v1/vms")
    assert_problem(unauthorized, 401, "auth.unauthorized")
    assert_deprecated(unauthorized)
    invalid = await admin.post("/api/v1/agents", json={"name": "NOPE", "runtime": "host"})
    assert_problem(invalid, 422, "validation.failed")
    assert_deprecated(invalid)


async def test_counters_by_route_template(admin: httpx.AsyncClient) -> None:
    await admin.get("/api/v1/vms")
    await admin.get("/api/v1/vms")
    await admin.get("/api/v1/agents")
    await admin.get("/api/v1/vms/01900000-0000-7000-8000-000000000001")
    await admin.get("/api/v1/vms/01900000-0000-7000-8000-000000000002")
    await admin.get("/api/v1/operations/op_nope")

    response = await admin.get("/api/v2/admin/deprecation/v1-counters")
    assert response.status_code == 200
    body = response.json()
    assert body["counters"] == {
        "/api/v1/vms": 2,
        "/api/v1/agents": 1,
        "/api/v1/vms/{id}": 2,
        "/api/v1/operations/{id}": 1,
    }
    assert body["path_map"] == PATH_MAP
    assert body["path_map"]["/api/v1/vms"] == "/api/v2/admin/instances"
    assert body["sunset"] == "2027-05-09T00:00:00Z"

    metrics = (await admin.get("/metrics")).text
    samples = {
        s.labels["path"]: s.value
        for family in text_string_to_metric_families(metrics)
        if family.name == "aiwg_v1_path_requests"
        for s in family.samples
        if s.name == "aiwg_v1_path_requests_total"
    }
    assert samples == {"/api/v1/vms": 2, "/api/v1/agents": 1, "/api/v1/vms/{id}": 2, "/api/v1/operations/{id}": 1}


async def test_sunset_override(hostd: LiveHostd, tmp_path: Path) -> None:
    sunset = "Mon, 01 Nov 2027 00:00:00 GMT"
    config = load_config(env=controller_env(tmp_path / "c", hostd.socket_path, AIWG_V1_SUNSET_DATE=sunset))
    async with serve_controller(config) as live, live.client() as admin:
        response = await admin.get("/api/v1/vms")
        assert_deprecated(response, sunset)
        assert (await admin.get("/api/v2/admin/deprecation/v1-counters")).json()["sunset"] == "2027-11-01T00:00:00Z"


async def test_v1_dispatch_and_mission_stream_answer_through_the_a2a_surface(
    admin: httpx.AsyncClient, controller: LiveController
) -> None:
    from agentic_sandbox.controller.a2a.card import RUNTIME_EXTENSION
    from tests.controller.a2a.helpers import new_agent
    from tests.controller.a2a.test_rest import message

    agent = await new_agent(admin, controller, "v1-dispatch", loadout="shell")
    headers = {"Authorization": f"Bearer {agent.token}", "A2A-Extensions": RUNTIME_EXTENSION}
    async with httpx.AsyncClient(base_url=controller.url, headers=headers, timeout=15) as client:
        response = await client.post(
            f"/api/v1/sessions/{agent.instance_id}/dispatch", json={"message": message("echo v1")}
        )
        assert response.status_code == 200, response.text
        assert response.headers["deprecated"] == "true" and "sunset" in response.headers
        task = response.json()["task"]
        assert task["status"]["state"] == "TASK_STATE_COMPLETED"
        done = await client.get(f"/api/v1/ws/missions/{task['id']}")
        assert done.status_code == 409 and done.headers["deprecated"] == "true"  # a finished mission (a problem)
        running = await client.post(
            f"/api/v1/sessions/{agent.instance_id}/dispatch",
            json={"message": message("sleep 1; echo later"), "configuration": {"returnImmediately": True}},
        )
        tid = running.json()["task"]["id"]
        async with client.stream("GET", f"/api/v1/ws/missions/{tid}") as stream:
            assert stream.status_code == 200 and stream.headers["deprecated"] == "true"
            assert stream.headers["content-type"].startswith("text/event-stream")
            events = [json.loads(line[6:]) async for line in stream.aiter_lines() if line.startswith("data: ")]
        assert events[0]["task"]["id"] == tid
        assert events[-1]["statusUpdate"]["status"]["state"] == "TASK_STATE_COMPLETED"
        missing = await client.get("/api/v1/ws/missions/01930000-0000-7000-8000-000000000000")
        assert missing.status_code == 404 and missing.headers["content-type"] == "application/problem+json"
    counters = (await admin.get("/api/v2/admin/deprecation/v1-counters")).json()
    assert "/api/v1/sessions/{instance_id}/dispatch" in json.dumps(counters)


async def test_v1_hitl_reads_and_answers_the_prompt_a_task_waits_on(
    admin: httpx.AsyncClient, operator: httpx.AsyncClient, controller: LiveController
) -> None:
    from agentic_sandbox.controller.a2a.card import RUNTIME_EXTENSION
    from agentic_sandbox.controller.tasks.prompts import HITL_EXTENSION
    from tests.controller.a2a.helpers import new_agent
    from tests.controller.a2a.test_rest import message

    agent = await new_agent(admin, controller, "v1-hitl", loadout="prompt")
    other = await new_agent(admin, controller, "v1-hitl-other", loadout="shell")
    headers = {"Authorization": f"Bearer {agent.token}", "A2A-Extensions": RUNTIME_EXTENSION}
    async with httpx.AsyncClient(base_url=controller.url, headers=headers, timeout=15) as client:
        sent = await client.post(f"/api/v1/sessions/{agent.instance_id}/dispatch", json={"message": message("Who?")})
        task = sent.json()["task"]
        assert task["status"]["state"] == "TASK_STATE_INPUT_REQUIRED"
        # The v1 path shows the prompt (the dispatch did not activate hitl-prompt/v1: no envelope there).
        assert HITL_EXTENSION not in task["status"]["message"]["metadata"]
        prompt = await client.get(f"/api/v1/hitl/{task['id']}")
        assert prompt.status_code == 200, prompt.text
        assert_deprecated(prompt)
        body = prompt.json()
        assert (body["task_id"], body["instance_id"]) == (task["id"], agent.instance_id)
        assert body["prompt"]["prompt"] == "Who?" and body["prompt"]["response_schema"]["type"] == "object"

        invalid = await client.post(f"/api/v1/hitl/{task['id']}", json={"payload": {"answer": 1, "x": 2}})
        assert_problem(invalid, 422, "hitl.response_invalid")
        assert_deprecated(invalid)
        assert {(e["field"], e["code"]) for e in invalid.json()["errors"]} == {
            ("/answer", "type"),
            ("/x", "additionalProperties"),
        }
        wrong = await client.post(
            f"/api/v1/hitl/{task['id']}", json={"payload": {"answer": "x"}, "prompt_id": str(uuid.uuid4())}
        )
        assert_problem(wrong, 409, "hitl.already_answered_or_unknown")
        shape = await client.post(f"/api/v1/hitl/{task['id']}", json={"answer": "x"})
        assert_problem(shape, 422, "validation.failed")

        answered = await client.post(f"/api/v1/hitl/{task['id']}", json={"payload": {"answer": "v1"}})
        assert answered.status_code == 200, answered.text
        assert_deprecated(answered)
        assert answered.json()["task"]["status"]["state"] != "TASK_STATE_INPUT_REQUIRED"
        again = await client.post(f"/api/v1/hitl/{task['id']}", json={"payload": {"answer": "v1"}})
        assert_problem(again, 409, "hitl.already_answered_or_unknown")
        assert (await client.get(f"/api/v1/hitl/{task['id']}")).status_code == 409
    # Another instance's token does not see the task; the operator token does; none gets 401.
    async with httpx.AsyncClient(
        base_url=controller.url, headers={"Authorization": f"Bearer {other.token}"}, timeout=15
    ) as stranger:
        assert_problem(await stranger.get(f"/api/v1/hitl/{task['id']}"), 404, "task.not_found")
    assert (await operator.get(f"/api/v1/hitl/{task['id']}")).status_code == 409
    async with httpx.AsyncClient(base_url=controller.url, timeout=15) as anon:
        assert_problem(await anon.get(f"/api/v1/hitl/{task['id']}"), 401, "auth.unauthorized")
    assert_problem(await admin.get("/api/v1/hitl/no-such-task"), 404, "task.not_found")
    counters = (await admin.get("/api/v2/admin/deprecation/v1-counters")).json()["counters"]
    assert counters["/api/v1/hitl/{task_id}"] >= 7
