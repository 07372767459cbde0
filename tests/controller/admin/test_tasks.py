"""Admin task routes: every instance's tasks listed in pages, newest status first, over a live
controller (tasks written through the store's own write path, as the task service writes them)."""

from __future__ import annotations

import re
import time

import httpx

from agentic_sandbox.controller.store import Append

from ..conftest import OPERATOR_TOKEN, LiveController, wait_operation
from ..http.test_problems import assert_problem
from ..store.records import task
from .pages import all_pages

TASKS = "/api/v2/admin/tasks"
ISO = r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z$"


async def _instance(admin: httpx.AsyncClient, name: str) -> tuple[str, str]:
    response = await admin.post("/api/v2/admin/instances", json={"name": name, "runtime": "host"})
    assert response.status_code == 202, response.text
    op = await wait_operation(admin, response.json()["id"])
    return op["result"]["instance_id"], response.json()["a2a_token"]


async def test_pages_of_every_instances_tasks_with_filters_and_totals(controller: LiveController) -> None:
    async with controller.client() as admin:
        one, token = await _instance(admin, "tasks-one")
        two, _ = await _instance(admin, "tasks-two")
        now = time.time() - 60
        # (id, instance, context, state, status time): t3 and t4 changed at the same moment.
        rows = [
            ("t1", one, "c1", "TASK_STATE_COMPLETED", now + 1),
            ("t2", two, "c2", "TASK_STATE_FAILED", now + 2),
            ("t3", one, "c1", "TASK_STATE_COMPLETED", now + 3),
            ("t4", two, "c1", "TASK_STATE_CANCELED", now + 3),
            ("t5", one, "c3", "TASK_STATE_FAILED", now + 5),
        ]
        store = controller.state.store
        assert store is not None
        for tid, iid, ctx, state, at in rows:
            rec = task(tid, at, {"state": state}, instance_id=iid, context_id=ctx, created_at=at - 0.5)
            await store.tasks.create(rec, Append(kind="message", body={"messageId": tid, "parts": []}))
        newest_first = ["t5", "t4", "t3", "t2", "t1"]

        for limit in (1, 2, 4, 5, 100):
            assert [t["id"] for t in await all_pages(admin, TASKS, limit=limit)] == newest_first
        first = (await admin.get(TASKS, params={"limit": 2})).json()
        assert first["total_size"] == 5 and first["next_page_token"]
        t5 = first["items"][0]
        assert set(t5) == {"id", "instance_id", "context_id", "state", "created_at", "updated_at"}
        assert (t5["instance_id"], t5["context_id"], t5["state"]) == (one, "c3", "TASK_STATE_FAILED")
        assert re.match(ISO, t5["created_at"]) and re.match(ISO, t5["updated_at"])
        assert t5["updated_at"] > t5["created_at"]
        whole = (await admin.get(TASKS)).json()  # no limit: the default page
        assert [t["id"] for t in whole["items"]] == newest_first and whole["next_page_token"] == ""

        async def ids(**params: str) -> tuple[list[str], int]:
            total = (await admin.get(TASKS, params={"limit": 1, **params})).json()["total_size"]
            return [t["id"] for t in await all_pages(admin, TASKS, limit=1, **params)], total

        assert await ids(instance_id=one) == (["t5", "t3", "t1"], 3)
        assert await ids(state="TASK_STATE_COMPLETED") == (["t3", "t1"], 2)
        assert await ids(instance_id=two, state="TASK_STATE_FAILED") == (["t2"], 1)
        assert await ids(context_id="c1") == (["t4", "t3", "t1"], 3)
        assert await ids(context_id="c1", instance_id=one) == (["t3", "t1"], 2)
        assert await ids(state="TASK_STATE_WORKING") == ([], 0)

        problem = assert_problem(await admin.get(TASKS, params={"state": "completed"}), 422, "validation.failed")
        assert problem["errors"][0]["field"] == "state"
        for params, field in (({"limit": "0"}, "limit"), ({"limit": "1", "page_token": "%%"}, "page_token")):
            problem = assert_problem(await admin.get(TASKS, params=params), 400, "validation.failed")
            assert problem["errors"][0]["field"] == field
        other = {"limit": 2, "instance_id": one, "page_token": first["next_page_token"]}
        assert_problem(await admin.get(TASKS, params=other), 400, "validation.failed")

    async with controller.client(OPERATOR_TOKEN) as operator:
        assert [t["id"] for t in await all_pages(operator, TASKS, limit=2)] == newest_first
    # An instance token sees its own instance's tasks, whatever it names.
    async with controller.client(token) as own:
        assert [t["id"] for t in await all_pages(own, TASKS, limit=2)] == ["t5", "t3", "t1"]
        assert (await own.get(TASKS, params={"limit": 1})).json()["total_size"] == 3
        assert await all_pages(own, TASKS, limit=2, instance_id=two) == []
        assert_problem(await own.get(f"{TASKS}/t5/logs"), 403, "auth.forbidden")
