"""Admin PTY session routes end to end: a real hostd, the controller on a loopback port, real HTTP."""

from __future__ import annotations

import httpx
import trio

from ..conftest import LiveController, provision
from ..http.test_problems import assert_problem

SESSIONS = "/api/v2/admin/instances/{}/sessions"


async def running_instance(admin: httpx.AsyncClient, name: str) -> str:
    return str((await provision(admin, name, start=True))["result"]["instance_id"])


async def new_session(admin: httpx.AsyncClient, iid: str, **body: object) -> dict[str, object]:
    response = await admin.post(SESSIONS.format(iid), json=body)
    assert response.status_code == 201, response.text
    return dict(response.json())


async def test_create_get_list_delete(controller: LiveController, admin: httpx.AsyncClient) -> None:
    iid = await running_instance(admin, "pty-one")
    response = await admin.post(
        SESSIONS.format(iid),
        json={"argv": ["/bin/sh", "-c", "echo $GREETING; exec cat"], "env": {"GREETING": "hi"}, "size": {"cols": 100}},
    )
    assert response.status_code == 201, response.text
    body = response.json()
    sid = body["id"]
    assert response.headers["Location"] == f"/api/v2/admin/instances/{iid}/sessions/{sid}"
    assert body["instance_id"] == iid and body["state"] == "running"
    assert (body["cols"], body["rows"]) == (100, 30)
    assert body["argv"][0] == "/bin/sh"
    ws = "ws" + controller.url.removeprefix("http")
    assert body["attach"] == {
        "url": f"{ws}/agents/{iid}/sessions/{sid}/attach",
        "subprotocols": ["pty-ws.v1", "pty-ws.v1.binary"],
    }

    with trio.fail_after(10):  # the greeting reaches hostd's ring
        while (await admin.get(f"{SESSIONS.format(iid)}/{sid}")).json()["next_seq"] < 2:
            await trio.sleep(0.02)
    listed = (await admin.get(SESSIONS.format(iid))).json()["items"]
    assert [item["id"] for item in listed] == [sid]

    assert (await admin.delete(f"{SESSIONS.format(iid)}/{sid}")).status_code == 204
    assert_problem(await admin.get(f"{SESSIONS.format(iid)}/{sid}"), 404, "session.not_found")
    assert (await admin.get(SESSIONS.format(iid))).json()["items"] == []


async def test_defaults_and_who_may(
    admin: httpx.AsyncClient, operator: httpx.AsyncClient, anon: httpx.AsyncClient
) -> None:
    iid = await running_instance(admin, "pty-two")
    response = await operator.post(SESSIONS.format(iid))  # no body: bash -l at 120x30
    assert response.status_code == 201, response.text
    body = response.json()
    assert body["argv"] == ["/bin/bash", "-l"] and (body["cols"], body["rows"]) == (120, 30)
    assert_problem(await anon.get(SESSIONS.format(iid)), 401, "auth.unauthorized")
    assert_problem(await anon.post(SESSIONS.format(iid), json={}), 401, "auth.unauthorized")
    assert (await operator.delete(f"{SESSIONS.format(iid)}/{body['id']}")).status_code == 204


async def test_bad_input(admin: httpx.AsyncClient) -> None:
    iid = await running_instance(admin, "pty-three")
    base = SESSIONS.format(iid)
    for body, field in (
        ({"argv": []}, "argv"),
        ({"argv": "bash"}, "argv"),
        ({"size": {"cols": 0}}, "size.cols"),
        ({"size": {"cols": 100000, "rows": 10}}, "size.cols"),
        ({"env": {"A": 1}}, "env[...]"),
        ({"shell": "bash"}, "shell"),
        ({"start": "later"}, "start"),
    ):
        problem = assert_problem(await admin.post(base, json=body), 422, "validation.failed")
        assert problem["errors"][0]["field"] == field, (body, problem)
    assert_problem(await admin.post(base, content=b"{nope"), 400, "validation.failed")
    problem = assert_problem(await admin.post(base, json={"cwd": "/no/such/dir"}), 422, "validation.failed")
    assert problem["errors"][0]["field"] == "working_dir"

    unknown = "0190a000-0000-7000-8000-000000000000"
    assert_problem(await admin.post(SESSIONS.format(unknown), json={}), 404, "instance.not_found")
    assert_problem(await admin.get(f"{base}/{unknown}"), 404, "session.not_found")
    assert_problem(await admin.get(f"{base}/-not-an-id"), 404, "session.not_found")
    assert_problem(await admin.delete(f"{base}/{unknown}"), 404, "session.not_found")


async def test_a_session_belongs_to_its_instance(admin: httpx.AsyncClient) -> None:
    first = await running_instance(admin, "pty-a")
    second = await running_instance(admin, "pty-b")
    sid = (await new_session(admin, first, argv=["/bin/cat"]))["id"]
    assert_problem(await admin.get(f"{SESSIONS.format(second)}/{sid}"), 404, "session.not_found")
    assert_problem(await admin.delete(f"{SESSIONS.format(second)}/{sid}"), 404, "session.not_found")
    assert (await admin.get(f"{SESSIONS.format(first)}/{sid}")).status_code == 200
    assert (await admin.get(SESSIONS.format(second))).json()["items"] == []


async def test_stopped_instance_refuses(admin: httpx.AsyncClient) -> None:
    iid = str((await provision(admin, "pty-cold"))["result"]["instance_id"])
    response = await admin.post(SESSIONS.format(iid), json={})
    assert_problem(response, 409, "instance.invalid_state")
