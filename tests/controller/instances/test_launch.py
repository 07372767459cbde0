"""The launch plan of a provision request (``controller.instances.launch``), in memory: every mode, the
implicit warm pool, and the contract's refusals naming their field."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from agentic_sandbox.controller.errors import ValidationFailed
from agentic_sandbox.controller.instances.launch import LaunchPlan, plan_launch
from agentic_sandbox.controller.models import ProvisionRequest


def req(**fields: Any) -> ProvisionRequest:
    return msgspec.convert({"name": "n1", **fields}, ProvisionRequest)


def strategy(mode: str, asset: str | None = None, **more: Any) -> dict[str, Any]:
    return {"launch_strategy": {"mode": mode, **({"asset_ref": asset} if asset else {})}, **more}


def test_modes() -> None:
    assert plan_launch(req(runtime="qemu"), "qemu", "libvirt", ()) == LaunchPlan(mode="cold")
    cold = req(runtime="qemu", runtime_options=strategy("cold"), loadout="tiny-vm")
    assert plan_launch(cold, "qemu", "libvirt", {"tiny-vm"}) == LaunchPlan(mode="cold")  # asked for: no pool
    implicit = plan_launch(req(runtime="qemu", loadout="tiny-vm"), "qemu", "libvirt", {"tiny-vm"})
    assert implicit == LaunchPlan(mode="warm_pool", asset="tiny-vm", fallback_cold=True, implicit=True)
    explicit = plan_launch(req(runtime="docker", runtime_options=strategy("warm_pool", "p")), "docker", "podman", ())
    assert explicit == LaunchPlan(mode="warm_pool", asset="p")
    with_fallback = req(
        runtime="qemu", runtime_options=strategy("warm_pool", "p", constraints={"fallback_mode": "cold"})
    )
    assert plan_launch(with_fallback, "qemu", "libvirt", ()).fallback_cold
    assert (
        plan_launch(req(runtime="qemu", runtime_options=strategy("restore", "cp")), "qemu", "libvirt", ()).mode
        == "restore"
    )
    fork = plan_launch(req(runtime="docker", runtime_options=strategy("fork", "src")), "docker", "podman", ())
    assert (fork.mode, fork.asset) == ("fork", "src")


@pytest.mark.parametrize(
    ("fields", "runtime", "field"),
    [
        ({"runtime": "qemu", "runtime_options": strategy("fork")}, "qemu", "runtime_options.launch_strategy.asset_ref"),
        ({"runtime": "host", "runtime_options": strategy("fork", "x")}, "host", "runtime_options.launch_strategy.mode"),
        (
            {"runtime": "docker", "runtime_options": strategy("restore", "x")},
            "docker",
            "runtime_options.launch_strategy.mode",
        ),
        ({"runtime": "qemu", "image": "x", "runtime_options": strategy("fork", "x")}, "qemu", "image"),
        ({"runtime": "qemu", "mounts": ["/a:/b"], "runtime_options": strategy("fork", "x")}, "qemu", "mounts"),
        ({"runtime": "qemu", "agentshare": True, "runtime_options": strategy("fork", "x")}, "qemu", "agentshare"),
        ({"runtime": "qemu", "runtime_options": {"provider": "cloud-hypervisor"}}, "qemu", "runtime_options.provider"),
        (
            {"runtime": "qemu", "provider": "a", "runtime_options": {"provider": "b"}},
            "qemu",
            "runtime_options.provider",
        ),
    ],
)
def test_refusals_name_the_field(fields: dict[str, Any], runtime: str, field: str) -> None:
    provider = {"qemu": "libvirt", "docker": "podman", "host": "hostd"}[runtime]
    with pytest.raises(ValidationFailed) as excinfo:
        plan_launch(req(**fields), runtime, provider, ())
    assert excinfo.value.fields[0]["field"] == field
