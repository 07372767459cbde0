"""What provisioning checks before hostd is asked (``controller.instances.provisioning``): the
runtime and its fields, the launch plan, a running start for an instance made from an asset, and
the name of an instance handed off from a warm pool.

A real :class:`Provisioner` on a real catalog (SQLite file, operations, the built-in loadouts) and
a hostd link that never connected: a request the checks refuse fails with its own error and
stores nothing; a request they accept gets as far as the link (``hostd is not reachable``)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import msgspec
import pytest

from agentic_sandbox.controller.admin.views import operation_path
from agentic_sandbox.controller.auth.credentials import InstanceCredentials
from agentic_sandbox.controller.auth.tokens import Authenticator
from agentic_sandbox.controller.errors import ControllerError, Unavailable, Unimplemented, ValidationFailed
from agentic_sandbox.controller.events.bus import EventBus
from agentic_sandbox.controller.hostlink import HostdLink
from agentic_sandbox.controller.http.problems import error_body
from agentic_sandbox.controller.instances.catalog import Catalog
from agentic_sandbox.controller.instances.pools import WarmPoolService
from agentic_sandbox.controller.instances.provisioning import Provisioner, pool_instance_name
from agentic_sandbox.controller.loadouts.service import LoadoutService
from agentic_sandbox.controller.metrics import Metrics
from agentic_sandbox.controller.models import ProvisionRequest
from agentic_sandbox.controller.operations import OperationService
from agentic_sandbox.controller.store import Store

ID = "0190f5a2-7b3c-7d4e-8f60-123456789abc"


@pytest.fixture
def provisioner(tmp_path: Path) -> Iterator[Provisioner]:
    store = Store.open(tmp_path / "db" / "controller.db")
    events = EventBus()
    operations = OperationService(
        store,
        Metrics(),
        events,
        retention_s=60.0,
        error_body=lambda exc, op_id: error_body(exc, operation_path(op_id)),
    )
    link = HostdLink(
        str(tmp_path / "hostd.sock"),
        call_timeout_s=1.0,
        connect_timeout_s=1.0,
        ping_interval_s=5.0,
        reconnect_max_s=1.0,
    )
    loadouts = LoadoutService(tmp_path / "loadouts")
    catalog = Catalog(store, link, operations, loadouts=loadouts, events=events)
    credentials = InstanceCredentials(store, Authenticator([]))
    yield Provisioner(catalog, credentials=credentials, pools=WarmPoolService(link, operations, loadouts, {}))
    store.close()


def req(**fields: Any) -> ProvisionRequest:
    return msgspec.convert({"name": "n1", **fields}, ProvisionRequest)


async def refusal(provisioner: Provisioner, request: ProvisionRequest) -> ControllerError:
    with pytest.raises(ControllerError) as caught:
        await provisioner.provision(request)
    assert await provisioner.catalog.store.instances.list() == []  # refused before anything is stored
    return caught.value


async def refused_field(provisioner: Provisioner, request: ProvisionRequest) -> dict[str, str]:
    exc = await refusal(provisioner, request)
    assert isinstance(exc, ValidationFailed), exc
    assert len(exc.fields) == 1
    return exc.fields[0]


def test_a_pool_instance_is_named_after_its_pool_and_the_end_of_its_id() -> None:
    assert pool_instance_name("tiny-vm", ID) == "tiny-vm-56789abc"
    assert pool_instance_name("My Pool_2!", ID) == "my-pool-2-56789abc"
    assert pool_instance_name("9lives", ID) == "pool-9lives-56789abc"  # a name starts with a letter
    assert pool_instance_name("!!!", ID) == "pool-56789abc"
    assert pool_instance_name("p" * 60, ID) == "p" * 40 + "-56789abc"


async def test_accepted_requests_get_as_far_as_hostd(provisioner: Provisioner) -> None:
    accepted = [
        req(runtime="host"),
        req(runtime="host", loadout="echo", start=True),
        req(runtime="docker", image="localhost/busybox:latest", provider="podman"),
        req(runtime="container", loadout="busybox"),  # the alias, the image from the loadout
        req(runtime="qemu", provider="libvirt", runtime_options={"kind": "vm"}),
    ]
    for request in accepted:
        exc = await refusal(provisioner, request)
        assert isinstance(exc, Unavailable) and exc.message == "hostd is not reachable: not connected to hostd yet"


async def test_a_runtime_without_a_provider_is_not_implemented(provisioner: Provisioner) -> None:
    exc = await refusal(provisioner, ProvisionRequest(name="n1", runtime="lxc"))  # type: ignore[arg-type]
    assert isinstance(exc, Unimplemented) and exc.code == "runtime.not_implemented"
    assert exc.message == "runtime 'lxc' is not implemented yet; available: 'host', 'docker', 'qemu'"


@pytest.mark.parametrize(
    ("fields", "field", "message"),
    [
        ({"runtime": "host", "provider": "hostd"}, "provider", "valid only with runtime qemu or docker"),
        ({"runtime": "docker", "provider": "libvirt", "image": "busybox"}, "provider", "must be 'podman'"),
        ({"runtime": "qemu", "provider": "podman"}, "provider", "must be 'libvirt'"),
        (
            {"runtime": "docker", "image": "busybox", "runtime_options": {"kind": "vm"}},
            "runtime_options.kind",
            "must match runtime 'docker' ('container')",
        ),
        ({"runtime": "host", "image": "busybox"}, "image", "valid only with runtime docker"),
        ({"runtime": "host", "resources": {"cpus": 1}}, "resources", "valid only with runtime docker"),
        ({"runtime": "qemu", "resources": {"cpus": 1}}, "resources", "valid only with runtime docker"),
        ({"runtime": "docker"}, "image", "runtime docker needs an image (or a loadout naming one)"),
        ({"runtime": "docker", "image": "Busybox"}, "image", "must be an OCI reference: name[:tag][@sha256:<hex>]"),
        (
            {"runtime": "docker", "image": "busybox@sha256:abc"},
            "image",
            "must be an OCI reference: name[:tag][@sha256:<hex>]",
        ),
    ],
)
async def test_runtime_fields_are_checked(
    provisioner: Provisioner, fields: dict[str, Any], field: str, message: str
) -> None:
    assert await refused_field(provisioner, req(**fields)) == {"field": field, "message": message}


async def test_a_docker_loadout_must_exist_and_be_for_docker(provisioner: Provisioner) -> None:
    unknown = await refused_field(provisioner, req(runtime="docker", loadout="nope"))
    assert unknown == {"field": "loadout", "message": "unknown loadout 'nope'", "code": "not_found"}
    other = await refused_field(provisioner, req(runtime="docker", loadout="echo", image="busybox"))
    assert other == {"field": "loadout", "message": "loadout 'echo' is for runtime 'host'", "code": "runtime_mismatch"}


async def test_the_launch_plan_is_checked_before_hostd(provisioner: Provisioner) -> None:
    no_asset = req(runtime="qemu", runtime_options={"launch_strategy": {"mode": "restore"}})
    assert (await refused_field(provisioner, no_asset))["field"] == "runtime_options.launch_strategy.asset_ref"
    host_fork = req(runtime="host", runtime_options={"launch_strategy": {"mode": "fork", "asset_ref": "src"}})
    assert await refused_field(provisioner, host_fork) == {
        "field": "runtime_options.launch_strategy.mode",
        "message": "runtime 'host' offers cold",
    }


async def test_an_instance_from_an_asset_is_handed_out_running(provisioner: Provisioner) -> None:
    from_pool = req(
        runtime="qemu", start=False, runtime_options={"launch_strategy": {"mode": "warm_pool", "asset_ref": "p"}}
    )
    assert await refused_field(provisioner, from_pool) == {
        "field": "start",
        "message": "an instance from an asset is handed out running",
    }
