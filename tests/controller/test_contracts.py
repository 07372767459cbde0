"""Every admin body we emit, checked against upstream's schemas (vendored in contracts/upstream/)."""

from __future__ import annotations

from pathlib import Path

import httpx

from tests.contracts import component, response_schema, validate, validate_problem

from .conftest import LiveController, provision, wait_operation

ADMIN = "/api/v2/admin"


async def test_instances_and_operations_match_the_contract(admin: httpx.AsyncClient) -> None:
    response = await admin.post(f"{ADMIN}/instances", json={"name": "contract-a", "runtime": "host", "start": True})
    assert response.status_code == 202
    validate(response.json(), response_schema("/instances", "post", "202"))
    done = await wait_operation(admin, response.json()["id"])
    validate(done, component("OperationStatus"))
    iid = done["result"]["instance_id"]

    validate((await admin.get(f"{ADMIN}/instances")).json(), response_schema("/instances"))
    validate((await admin.get(f"{ADMIN}/instances/{iid}")).json(), component("Instance"))
    for verb in ("stop", "start", "restart", "destroy"):
        started = await admin.post(f"{ADMIN}/instances/{iid}/{verb}")
        assert started.status_code == 202, started.text
        validate(started.json(), component("OperationStatus"))
        validate(await wait_operation(admin, started.json()["id"]), component("OperationStatus"))
    validate((await admin.get(f"{ADMIN}/instances/{iid}")).json(), component("Instance"))


async def test_failed_operation_error_is_an_envelope(admin: httpx.AsyncClient) -> None:
    response = await admin.post(
        f"{ADMIN}/instances", json={"name": "contract-b", "runtime": "host", "working_dir": "/does/not/exist"}
    )
    if response.status_code == 202:
        done = await wait_operation(admin, response.json()["id"])
        assert done["state"] == "failed"
        validate(done, component("OperationStatus"))
        validate_problem(done["error"])
    else:
        validate_problem(response.json())


async def test_storage_catalogs_and_counters_match_the_contract(
    admin: httpx.AsyncClient, controller: LiveController
) -> None:
    iid = (await provision(admin, "contract-c"))["result"]["instance_id"]
    put = await admin.put(
        f"{ADMIN}/storage/inbox/{iid}/notes/a.txt", json={"content": "hello", "media_type": "text/plain"}
    )
    assert put.status_code in (200, 201), put.text
    got = await admin.get(f"{ADMIN}/storage/inbox/{iid}/notes/a.txt")
    validate(got.json(), component("StorageObject"))
    Path(controller.config.storage_dir, "global").mkdir(parents=True, exist_ok=True)
    Path(controller.config.storage_dir, "global", "g.bin").write_bytes(b"\x00\xff")
    validate((await admin.get(f"{ADMIN}/storage/global/g.bin")).json(), component("StorageObject"))

    validate((await admin.get(f"{ADMIN}/loadouts")).json(), response_schema("/loadouts"))
    validate((await admin.get(f"{ADMIN}/container-images")).json(), response_schema("/container-images"))

    await admin.get("/api/v1/agents")
    counters = (await admin.get(f"{ADMIN}/deprecation/v1-counters")).json()
    validate(counters, response_schema("/deprecation/v1-counters"))
    assert counters["counters"]["/api/v1/agents"] >= 1


async def test_problems_match_the_contract(admin: httpx.AsyncClient, anon: httpx.AsyncClient) -> None:
    for response in (
        await anon.get(f"{ADMIN}/instances"),
        await admin.get(f"{ADMIN}/instances/01234567-89ab-7def-8123-456789abcdef"),
        await admin.get(f"{ADMIN}/operations/op_nope"),
        await admin.post(f"{ADMIN}/instances", json={"name": "Bad Name", "runtime": "host"}),
        await admin.post(f"{ADMIN}/instances", json={"name": "vm-one", "runtime": "qemu", "provider": "nope"}),
        await admin.put(f"{ADMIN}/storage/global/x.txt", json={"content": "no"}),
        await admin.get(f"{ADMIN}/storage/inbox/..%2F..%2Fetc%2Fpasswd"),
    ):
        assert response.status_code >= 400
        assert response.headers["content-type"].startswith("application/problem+json")
        validate_problem(response.json())
