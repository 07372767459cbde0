"""multi-tenant/v1, declared mode (MT-D-01..09): a real hostd, the controller on loopback, httpx."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import jsonschema
import trio

from agentic_sandbox.controller.a2a.card import MULTI_TENANT_EXTENSION, RUNTIME_EXTENSION
from tests.controller.a2a.helpers import error_reason, new_agent
from tests.controller.a2a.test_rest import message
from tests.controller.a2a.test_sse import read_stream
from tests.controller.conftest import ADMIN_TOKEN, OPERATOR_TOKEN, LiveController

ACTIVATED = {"A2A-Extensions": f"{RUNTIME_EXTENSION}, {MULTI_TENANT_EXTENSION}"}
SCHEMA = json.loads(
    (Path(__file__).parents[3] / "contracts/upstream/extensions/multi-tenant/v1/metadata.schema.json").read_text()
)


def tenant_body(text: str, tenant: Any = None, **extra: Any) -> dict[str, Any]:
    fields = {} if tenant is None else {"metadata": {"tenant_id": tenant}}
    return {"message": message(text, **fields), **extra}


def violation_fields(response: httpx.Response) -> list[str]:
    details = response.json()["error"]["details"]
    [bad] = [d for d in details if d["@type"].endswith("BadRequest")]
    return [v["field"] for v in bad["fieldViolations"]]


async def test_tenant_ids_are_validated_and_echoed_but_scope_nothing(
    admin: httpx.AsyncClient, controller: LiveController
) -> None:
    agent = await new_agent(admin, controller, "tenants", loadout="echo")
    async with agent.client(controller, **ACTIVATED) as client:
        # MT-D-01: a valid tenant is echoed on the task (send and get) and on the stored message.
        sent = await client.post("/message:send", json=tenant_body("prod", "aiwg-prod"))
        assert sent.status_code == 200, sent.text
        assert sent.headers["a2a-extensions"] == ACTIVATED["A2A-Extensions"]
        task = sent.json()["task"]
        assert task["metadata"]["tenant_id"] == "aiwg-prod"
        jsonschema.validate(task["metadata"], SCHEMA)
        assert task["history"][0]["metadata"]["tenant_id"] == "aiwg-prod"
        assert (await client.get(f"/tasks/{task['id']}")).json()["metadata"]["tenant_id"] == "aiwg-prod"
        # MT-D-02: none given is "default".
        default = (await client.post("/message:send", json=tenant_body("none"))).json()["task"]
        assert default["metadata"]["tenant_id"] == "default"
        assert default["history"][0]["metadata"]["tenant_id"] == "default"
        # MT-D-03..05: empty, spaces, too long, not a string: 400 naming metadata.tenant_id, nothing done.
        for bad in ("", "has spaces", "a" * 129, "-leading", 7):
            refused = await client.post("/message:send", json=tenant_body("bad", bad))
            assert refused.status_code == 400, bad
            assert error_reason(refused) == "INVALID_PARAMS"
            assert violation_fields(refused) == ["metadata.tenant_id"]
        longest = (await client.post("/message:send", json=tenant_body("long", "a" * 128))).json()["task"]
        assert longest["metadata"]["tenant_id"] == "a" * 128
        rpc = await client.post(
            "",
            json={"jsonrpc": "2.0", "id": 9, "method": "SendMessage", "params": tenant_body("rpc", "has spaces")},
        )
        error = rpc.json()["error"]
        assert error["code"] == -32602
        [info] = [d for d in error["data"] if d["@type"].endswith("ErrorInfo")]
        assert info["metadata"]["field"] == "metadata.tenant_id"
        # MT-D-06: another tenant lists every task, its own and the others'.
        other = (await client.post("/message:send", json=tenant_body("dev", "aiwg-dev"))).json()["task"]
        listed = (await client.get("/tasks")).json()
        assert {t["id"] for t in listed["tasks"]} >= {task["id"], default["id"], other["id"]}
        assert listed["totalSize"] == 4
    # Without the activation the value is the caller's own metadata: not checked, not added.
    async with agent.client(controller) as plain:
        untouched = (await plain.post("/message:send", json=tenant_body("plain", "has spaces"))).json()["task"]
        assert "tenant_id" not in untouched["metadata"]
        assert (await plain.post("/message:send", json=tenant_body("plain"))).status_code == 200

    # MT-D-07: the card's params, exactly; declared, not enforced.
    response = await admin.get(f"/agents/{agent.instance_id}/.well-known/agent-card.json")
    assert response.status_code == 200, response.text
    [ext] = [e for e in response.json()["capabilities"]["extensions"] if e["uri"] == MULTI_TENANT_EXTENSION]
    assert "required" not in ext  # false, the default (a card holds no false outside the capability flags)
    assert ext["params"] == {
        "enforcement": "declared",
        "default_tenant": "default",
        "quota_response": {"status": 429, "header": "Retry-After"},
    }
    assert "not enforced" in ext["description"].lower()


async def test_no_quota_no_isolation_and_host_disclosure(admin: httpx.AsyncClient, controller: LiveController) -> None:
    agent = await new_agent(admin, controller, "tenants-quota", loadout="shell")
    async with agent.client(controller, **ACTIVATED) as client:
        # MT-D-08: more dispatches than v2.2's 100 per minute, at once: none is refused with 429.
        statuses: list[int] = []

        async def dispatch(index: int) -> None:
            body = tenant_body("true", "burst", configuration={"returnImmediately": True})
            statuses.append((await client.post("/message:send", json=body)).status_code)

        async with trio.open_nursery() as nursery:
            for index in range(120):
                nursery.start_soon(dispatch, index)
        assert statuses == [200] * 120

        # MT-D-09: a subscriber of tenant "a" follows a task of tenant "b" to its end.
        task = (
            await client.post(
                "/message:send",
                json=tenant_body("sleep 0.5; echo done", "b", configuration={"returnImmediately": True}),
            )
        ).json()["task"]
        async with client.stream(
            "POST", f"/tasks/{task['id']}:subscribe", json={"id": task["id"], "metadata": {"tenant_id": "a"}}
        ) as response:
            events = await read_stream(response)
        assert events[0]["task"]["metadata"]["tenant_id"] == "b"
        assert events[-1]["statusUpdate"]["status"]["state"] == "TASK_STATE_COMPLETED"

    # runtime/v1 §8.2: with multi-tenant/v1 active only the admin token sees runtime.host.
    for token, activated, sees_host in (
        (OPERATOR_TOKEN, True, False),
        (ADMIN_TOKEN, True, True),
        (OPERATOR_TOKEN, False, True),
        (agent.token, True, False),
    ):
        headers = ACTIVATED if activated else {}
        async with agent.client(controller, token=token, **headers) as client:
            metadata = (await client.get(f"/tasks/{task['id']}")).json()["metadata"]
            assert ("runtime.host" in metadata) is sees_host, (token, activated)
