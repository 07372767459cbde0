"""Pages of an instance's PTY sessions: a real hostd, the controller on a loopback port, real HTTP.
(The session routes themselves are tested in tests/controller/instances/test_sessions.py.)"""

from __future__ import annotations

import httpx
import trio

from ..conftest import LiveController, wait_operation
from ..http.test_problems import assert_problem
from .pages import all_pages

SESSIONS = "/api/v2/admin/instances/{}/sessions"


async def _running(admin: httpx.AsyncClient, name: str) -> tuple[str, str]:
    """A running host instance: its id and its A2A token."""
    response = await admin.post("/api/v2/admin/instances", json={"name": name, "runtime": "host", "start": True})
    assert response.status_code == 202, response.text
    op = await wait_operation(admin, response.json()["id"])
    assert op["state"] == "succeeded", op
    return op["result"]["instance_id"], response.json()["a2a_token"]


async def test_pages_of_sessions_filters_and_the_unpaged_shape(controller: LiveController) -> None:
    async with controller.client() as admin:
        iid, token = await _running(admin, "sess-pages")
        other, _ = await _running(admin, "sess-other")
        path = SESSIONS.format(iid)

        async def new(**body: object) -> str:
            response = await admin.post(path, json=body)
            assert response.status_code == 201, response.text
            return str(response.json()["id"])

        pending = [await new(start=False) for _ in range(4)]
        running = await new(argv=["/bin/cat"])
        exited = await new(argv=["/bin/true"])
        assert (await admin.post(SESSIONS.format(other), json={"start": False})).status_code == 201
        with trio.fail_after(10):
            while (await admin.get(f"{path}/{exited}")).json()["state"] != "exited":
                await trio.sleep(0.05)
        everything = [*pending, running, exited]

        whole = (await admin.get(path)).json()
        assert list(whole) == ["items"] and sorted(i["id"] for i in whole["items"]) == sorted(everything)

        for limit in (1, 2, 6, 7):
            assert [s["id"] for s in await all_pages(admin, path, limit=limit)] == everything
        assert (await admin.get(path, params={"limit": 6})).json()["next_page_token"] == ""
        assert [s["id"] for s in await all_pages(admin, path, limit=1, state="pending")] == pending
        assert [s["id"] for s in await all_pages(admin, path, limit=1, state="running")] == [running]
        assert [s["id"] for s in await all_pages(admin, path, limit=1, state="exited")] == [exited]
        assert [s["id"] for s in (await admin.get(path, params={"state": "exited"})).json()["items"]] == [exited]

        assert_problem(await admin.get(path, params={"state": "asleep"}), 422, "validation.failed")
        for params in ({"limit": "0"}, {"limit": "x"}, {"limit": "1", "page_token": "nope"}):
            assert_problem(await admin.get(path, params=params), 400, "validation.failed")
        first = (await admin.get(path, params={"limit": 1})).json()
        foreign = {"limit": 1, "page_token": first["next_page_token"]}
        problem = assert_problem(await admin.get(SESSIONS.format(other), params=foreign), 400, "validation.failed")
        assert problem["errors"][0]["field"] == "page_token"

    # An instance token pages its own instance's sessions; another instance is not there to it.
    async with controller.client(token) as own:
        assert [s["id"] for s in await all_pages(own, path, limit=4)] == everything
        assert_problem(await own.get(SESSIONS.format(other), params={"limit": 1}), 404, "instance.not_found")
