"""Admin operations, listed and polled: a real hostd, the controller on a loopback port, real HTTP."""

from __future__ import annotations

from typing import Any

import httpx

from tests.contracts import component, validate

from ..conftest import OPERATOR_TOKEN, LiveController, wait_operation
from ..http.test_problems import assert_problem
from .pages import all_pages

OPERATIONS = "/api/v2/admin/operations"


async def _submit(admin: httpx.AsyncClient, path: str, **body: object) -> dict[str, Any]:
    response = await admin.post(path, json=body) if body else await admin.post(path)
    assert response.status_code == 202, response.text
    op = await wait_operation(admin, response.json()["id"])
    assert op["state"] == "succeeded", op
    return {**response.json(), **op}


async def test_pages_of_operations_newest_first_with_filters(controller: LiveController) -> None:
    async with controller.client() as admin:
        made = []
        for name in ("op-a", "op-b", "op-c"):
            made.append(await _submit(admin, "/api/v2/admin/instances", name=name, runtime="host", start=True))
        a, b = made[0]["result"]["instance_id"], made[1]["result"]["instance_id"]
        stop = await _submit(admin, f"/api/v2/admin/instances/{a}/stop")
        newest_first = [stop["id"], *(op["id"] for op in reversed(made))]

        for limit in (1, 2, 4, 100):
            items = await all_pages(admin, OPERATIONS, limit=limit)
            assert [op["id"] for op in items] == newest_first
            for item in items:
                validate(item, component("OperationStatus"))
        # Without limit: a page of the default size, with the token field all the same.
        whole = (await admin.get(OPERATIONS)).json()
        assert [op["id"] for op in whole["items"]] == newest_first and whole["next_page_token"] == ""

        async def ids(**params: object) -> list[str]:
            return [op["id"] for op in await all_pages(admin, OPERATIONS, limit=1, **params)]

        assert await ids(kind="instance.stop") == [stop["id"]]
        assert await ids(kind="instance.provision") == [op["id"] for op in reversed(made)]
        assert await ids(instance_id=a) == [stop["id"], made[0]["id"]]
        assert await ids(instance_id=a, kind="instance.provision") == [made[0]["id"]]
        assert await ids(state="succeeded") == newest_first
        assert await ids(state="running") == []

        problem = assert_problem(await admin.get(OPERATIONS, params={"state": "done"}), 422, "validation.failed")
        assert problem["errors"][0]["field"] == "state"
        for params, field in (
            ({"limit": "0"}, "limit"),
            ({"limit": "501"}, "limit"),
            ({"limit": "1", "page_token": "x"}, "page_token"),
        ):
            problem = assert_problem(await admin.get(OPERATIONS, params=params), 400, "validation.failed")
            assert problem["errors"][0]["field"] == field
        token = (await admin.get(OPERATIONS, params={"limit": 1})).json()["next_page_token"]
        other = {"limit": 1, "kind": "instance.stop", "page_token": token}
        assert_problem(await admin.get(OPERATIONS, params=other), 400, "validation.failed")

    async with controller.client(OPERATOR_TOKEN) as operator:
        assert [op["id"] for op in await all_pages(operator, OPERATIONS, limit=3)] == newest_first
    # An instance token sees the operations on its own instance only.
    async with controller.client(made[1]["a2a_token"]) as own:
        assert [op["id"] for op in await all_pages(own, OPERATIONS, limit=1)] == [made[1]["id"]]
        assert await all_pages(own, OPERATIONS, limit=1, instance_id=a) == []
        assert [op["id"] for op in await all_pages(own, OPERATIONS, limit=1, instance_id=b)] == [made[1]["id"]]
