"""Runtime discovery from hostd's ProviderList, bootstrap readiness and MCP discovery answering
what this deployment has, and the Cloud Hypervisor verbs answering a clear 501."""

from __future__ import annotations

import platform

import httpx
import msgspec

from agentic_sandbox.controller.admin.discovery import describe
from agentic_sandbox.proto import messages as m
from agentic_sandbox.proto import open_hostd
from tests.contracts import component, validate

from ..conftest import LiveController, LiveHostd
from ..http.test_problems import assert_problem

ADMIN = "/api/v2/admin"


def test_unknown_families_providers_and_capabilities_are_kept() -> None:
    providers = [
        m.ProviderInfo(
            runtime="host", provider="hostd", available=True, capabilities=["session.pty", "x.new"], default=True
        ),
        m.ProviderInfo(
            runtime="vm", provider="libvirt", available=False, reason="libvirtd is not running", default=True
        ),
        m.ProviderInfo(runtime="worker-celld", provider="celld", available=True, capabilities=["wasm.exec"]),
    ]
    doc = describe(providers, architecture="x86_64")
    validate(msgspec.to_builtins(doc), component("RuntimeProvidersResponse"))
    assert [(p.id, p.runtime, p.capabilities) for p in doc.providers] == [
        ("hostd", "host", ["session.pty", "x.new"]),
        ("libvirt", "vm", []),
        ("celld", "worker-celld", ["wasm.exec"]),
    ]
    libvirt = doc.providers[1]
    assert (libvirt.unavailable_code, libvirt.unavailable_reason) == ("provider.unavailable", "libvirtd is not running")
    kinds = {k.id: k for k in doc.runtimes}
    assert set(kinds) == {"host", "docker", "qemu"}  # a family with no admin kind is a provider only
    assert kinds["host"].available and kinds["host"].capabilities == ["session.pty", "x.new"]
    assert kinds["qemu"].unavailable_code == "provider.unavailable" and not kinds["qemu"].available
    assert kinds["docker"].unavailable_code == "provider.absent" and not kinds["docker"].available
    assert doc.default_vm_provider == "libvirt"
    # Without any host provider the host kind says so.
    assert describe([], architecture="x").runtimes[0].unavailable_code == "provider.absent"


async def test_runtime_providers_is_what_hostd_offers_now(admin: httpx.AsyncClient, hostd: LiveHostd) -> None:
    r = await admin.get(f"{ADMIN}/runtime/providers")
    assert r.status_code == 200, r.text
    body = r.json()
    validate(body, component("RuntimeProvidersResponse"))
    async with open_hostd(hostd.socket_path) as client:
        offered = (await client.call(m.ProviderListRequest())).providers
    assert [(p["id"], p["runtime"], p["capabilities"], p["available"]) for p in body["providers"]] == [
        (p.provider, p.runtime, p.capabilities, p.available) for p in offered
    ]
    kinds = {k["id"]: k for k in body["runtimes"]}
    assert kinds["host"]["available"] is True and kinds["host"]["isolation_tier"] == "full-host-access"
    assert kinds["host"]["architecture"] == platform.machine()
    # The suite's hostd has no podman socket and no libvirt URI: said, not hidden.
    assert kinds["docker"]["available"] is False and kinds["docker"]["unavailable_code"] == "provider.unavailable"
    assert kinds["qemu"]["available"] is False and kinds["qemu"]["unavailable_code"] == "provider.absent"


async def test_runtime_providers_fails_closed_without_hostd(controller: LiveController, hostd: LiveHostd) -> None:
    await hostd.stop()
    async with controller.client() as admin:
        assert_problem(await admin.get(f"{ADMIN}/runtime/providers"), 503, "internal.unavailable")


async def test_bootstrap_and_mcp_say_disabled_in_upstreams_shapes(
    admin: httpx.AsyncClient, anon: httpx.AsyncClient
) -> None:
    bootstrap = await admin.get(f"{ADMIN}/bootstrap/readiness")
    assert bootstrap.status_code == 200
    validate(bootstrap.json(), component("BootstrapReadinessResponse"))
    assert (bootstrap.json()["status"], bootstrap.json()["reason_code"]) == ("disabled", "bootstrap.not_supported")
    assert bootstrap.json()["ca_provider"]["configured"] is False

    mcp = await admin.get(f"{ADMIN}/mcp/discovery")
    assert mcp.status_code == 200
    validate(mcp.json(), component("McpDiscoveryResponse"))
    body = mcp.json()
    assert (body["enabled"], body["status"], body["reason_code"]) == (False, "disabled", "mcp.adapter_absent")
    assert body["auth"]["principals"] == [] and body["tools"] == [] and body["protocol"]["supported"] == []
    # ... and the endpoint it describes is indeed not served.
    assert (await admin.post("/mcp", json={})).status_code == 404

    assert_problem(await anon.get(f"{ADMIN}/bootstrap/readiness"), 401, "auth.unauthorized")
    assert_problem(await anon.get(f"{ADMIN}/mcp/discovery"), 401, "auth.unauthorized")


async def test_cloud_hypervisor_verbs_say_the_provider_is_not_here(
    admin: httpx.AsyncClient, operator: httpx.AsyncClient, anon: httpx.AsyncClient
) -> None:
    paths = [
        "cloud-hypervisor/snapshots",
        "cloud-hypervisor/snapshots/snap-1/restore",
        "cloud-hypervisor/snapshots/snap-1/fork",
        "cloud-hypervisor/warm-pools",
        "cloud-hypervisor/warm-pools/pool-a/handoff",
    ]
    for path in paths:
        r = await admin.post(f"{ADMIN}/{path}", json={"anything": True})
        assert_problem(r, 501, "provider.unavailable")
        assert "cloud-hypervisor" in r.json()["detail"]
        assert_problem(await operator.post(f"{ADMIN}/{path}"), 403, "auth.forbidden")
        assert_problem(await anon.post(f"{ADMIN}/{path}"), 401, "auth.unauthorized")
