"""/metrics: request counts and latency per surface and route template, hostd RPCs, instances, sessions."""

from __future__ import annotations

import httpx
import trio
from prometheus_client.parser import text_string_to_metric_families

from agentic_sandbox.controller.metrics import Metrics
from agentic_sandbox.proto import messages as m
from agentic_sandbox.proto import open_hostd

from .conftest import LiveHostd, provision, wait_operation


def samples(text: str, name: str) -> list[tuple[dict[str, str], float]]:
    return [
        (dict(s.labels), s.value)
        for family in text_string_to_metric_families(text)
        for s in family.samples
        if s.name == name
    ]


def test_registries_are_per_app() -> None:
    a, b = Metrics(), Metrics()
    a.count_v1("/api/v1/vms")
    assert a.v1_counts() == {"/api/v1/vms": 1}
    assert b.v1_counts() == {}
    assert b"aiwg_v1_path_requests_total{" not in b.render()


async def test_request_metrics_use_route_templates(admin: httpx.AsyncClient) -> None:
    iid = (await provision(admin, "metered"))["result"]["instance_id"]
    await admin.get(f"/api/v2/admin/instances/{iid}")
    await admin.get("/api/v2/admin/instances/01900000-0000-7000-8000-00000000beef")
    await admin.get("/healthz")
    await admin.get("/no/such/path")

    text = (await admin.get("/metrics")).text
    assert iid not in text and "beef" not in text  # ids never become labels
    counts = samples(text, "aiwg_http_requests_total")
    routes = {(labels["surface"], labels["method"], labels["route"], labels["status"]) for labels, _ in counts}
    assert ("admin", "GET", "/api/v2/admin/instances/<instance_id>", "200") in routes
    assert ("admin", "GET", "/api/v2/admin/instances/<instance_id>", "404") in routes
    assert ("admin", "POST", "/api/v2/admin/instances", "202") in routes
    assert ("admin", "GET", "/api/v2/admin/operations/<op_id>", "200") in routes
    assert ("observability", "GET", "/healthz", "200") in routes
    assert ("other", "GET", "<unmatched>", "404") in routes

    buckets = samples(text, "aiwg_http_request_duration_seconds_bucket")
    assert any(labels["route"] == "/api/v2/admin/instances/<instance_id>" for labels, _ in buckets)
    count = dict(
        (labels["route"], value)
        for labels, value in samples(text, "aiwg_http_request_duration_seconds_count")
        if labels["method"] == "GET"
    )
    assert count["/api/v2/admin/instances/<instance_id>"] == 2


async def test_hostd_rpc_metrics(admin: httpx.AsyncClient) -> None:
    response = await admin.post(
        "/api/v2/admin/instances", json={"name": "bad-dir", "runtime": "host", "working_dir": "/nonexistent"}
    )
    assert (await wait_operation(admin, response.json()["id"]))["state"] == "failed"
    text = (await admin.get("/metrics")).text
    rpc = {labels["method"]: value for labels, value in samples(text, "aiwg_hostd_rpc_duration_seconds_count")}
    assert rpc["InstanceProvision"] >= 1
    assert rpc["InstanceList"] >= 1
    errors = {
        (labels["method"], labels["error"]): value for labels, value in samples(text, "aiwg_hostd_rpc_errors_total")
    }
    assert errors[("InstanceProvision", "HostdRemoteError")] == 1
    assert samples(text, "aiwg_hostd_up") == [({}, 1.0)]
    ops = {(labels["kind"], labels["state"]): v for labels, v in samples(text, "aiwg_operations_total")}
    assert ops[("instance.provision", "failed")] == 1


async def test_instance_and_session_gauges(admin: httpx.AsyncClient, hostd: LiveHostd) -> None:
    running = (await provision(admin, "gauge-run", start=True))["result"]["instance_id"]
    await provision(admin, "gauge-stop")
    async with open_hostd(hostd.socket_path) as client:
        await client.call(m.SessionCreateRequest(instance_id=running, argv=["/bin/sh", "-c", "sleep 30"]))
        text = (await admin.get("/metrics")).text
        states = {labels["state"]: value for labels, value in samples(text, "aiwg_instances")}
        assert states["running"] == 1 and states["stopped"] == 1 and states["failed"] == 0
        assert samples(text, "aiwg_open_sessions") == [({}, 1.0)]
        # Stopping the instance ends its session; the next scrape shows it.
        await client.call(m.InstanceStopRequest(instance_id=running, grace_s=0))
        with trio.fail_after(5):
            while samples((await admin.get("/metrics")).text, "aiwg_open_sessions") != [({}, 0.0)]:
                await trio.sleep(0.05)
    text = (await admin.get("/metrics")).text
    states = {labels["state"]: value for labels, value in samples(text, "aiwg_instances")}
    assert states["running"] == 0 and states["stopped"] == 2


async def test_unknown_methods_share_one_label(admin: httpx.AsyncClient) -> None:
    # Any token is a valid HTTP method; each must not become its own time series.
    for method in ("BREW", "XYZZY1", "XYZZY2"):
        assert (await admin.request(method, "/api/v2/admin/instances")).status_code == 405
        assert (await admin.request(method, "/healthz")).status_code == 405
    text = (await admin.get("/metrics")).text
    methods = {labels["method"] for labels, _ in samples(text, "aiwg_http_requests_total")}
    assert "other" in methods
    assert not methods & {"BREW", "XYZZY1", "XYZZY2"}, methods
