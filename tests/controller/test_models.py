"""The admin surface's JSON shapes, in memory: every input Struct refuses a field it does not know
(found by walking the module), outputs leave unset optional fields out, the constraints of a
provision request hold at their edges, and times are RFC 3339 with milliseconds."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from agentic_sandbox.controller import models
from agentic_sandbox.controller.models import (
    INSTANCE_STATES,
    RUNTIME_ALIASES,
    RUNTIMES,
    InstanceView,
    OperationView,
    ProvisionRequest,
    WarmPoolView,
    iso,
)

STRUCTS = [
    v
    for v in vars(models).values()
    if isinstance(v, type) and issubclass(v, msgspec.Struct) and v.__module__ == models.__name__
]
INPUTS = [s for s in STRUCTS if s.__struct_config__.forbid_unknown_fields]
OUTPUTS = [s for s in STRUCTS if s.__struct_config__.omit_defaults]


def test_every_struct_is_an_input_or_an_output() -> None:
    assert ProvisionRequest in INPUTS and InstanceView in OUTPUTS and len(INPUTS) >= 6
    lists = {s for s in STRUCTS if s.__name__.endswith("List") or s.__name__ == "HostDaemon"}
    assert set(STRUCTS) == set(INPUTS) | set(OUTPUTS) | lists
    assert not set(INPUTS) & set(OUTPUTS)


@pytest.mark.parametrize("cls", INPUTS, ids=lambda c: c.__name__)
def test_an_input_refuses_a_field_it_does_not_know(cls: type[msgspec.Struct]) -> None:
    with pytest.raises(msgspec.ValidationError, match="unknown field `typo`"):
        msgspec.json.decode(b'{"typo": 1}', type=cls)


def test_outputs_leave_unset_optional_fields_out() -> None:
    view = InstanceView(id="i", name="n", runtime="host", state="running", agent_card_url="/c", created_at=iso(0))
    assert set(msgspec.to_builtins(view)) == {"id", "name", "runtime", "state", "agent_card_url", "created_at"}
    op = OperationView(id="op", kind="k", state="pending", created_at=iso(0))
    assert set(msgspec.to_builtins(op)) == {"id", "kind", "state", "created_at"}
    pool = WarmPoolView(
        pool="p", runtime="r", provider="x", source="s", size=1, ready=0, filling=1, hits=0, misses=0,
        refills=0, failures=0, configured=False,
    )  # fmt: skip
    shown = msgspec.to_builtins(pool)
    assert shown["configured"] is False and shown["hits"] == 0  # required fields stay, falsy or not
    assert "last_error" not in shown and "loadout" not in shown


@pytest.mark.parametrize(
    ("body", "ok"),
    [
        ({"name": "ab", "runtime": "host"}, True),
        ({"name": "a" + "b" * 62, "runtime": "host"}, True),
        ({"name": "a" + "b" * 63, "runtime": "host"}, False),
        ({"name": "a", "runtime": "host"}, False),
        ({"name": "1ab", "runtime": "host"}, False),
        ({"name": "ab", "runtime": "container"}, True),
        ({"name": "ab", "runtime": "lxc"}, False),
        ({"name": "ab", "runtime": "docker", "resources": {"cpus": 0}}, False),
        ({"name": "ab", "runtime": "docker", "resources": {"cpus": 0.5, "memory_bytes": 4 * 1024 * 1024}}, True),
        ({"name": "ab", "runtime": "docker", "resources": {"memory_bytes": 4 * 1024 * 1024 - 1}}, False),
        ({"name": "ab", "runtime": "docker", "resources": {"pids": 7}}, False),
        ({"name": "ab", "runtime": "host", "labels": {"": "v"}}, False),
        ({"name": "ab", "runtime": "host", "mounts": [""]}, False),
    ],
)
def test_provision_request_edges(body: dict[str, Any], ok: bool) -> None:
    if ok:
        msgspec.convert(body, ProvisionRequest)
    else:
        with pytest.raises(msgspec.ValidationError):
            msgspec.convert(body, ProvisionRequest)


def test_runtimes_and_states() -> None:
    assert set(RUNTIME_ALIASES) <= set(RUNTIMES) and set(RUNTIME_ALIASES.values()) <= set(RUNTIMES)
    assert INSTANCE_STATES[0] == "provisioning" and "destroyed" in INSTANCE_STATES


def test_iso_is_utc_with_milliseconds() -> None:
    assert iso(0) == "1970-01-01T00:00:00.000Z"
    assert iso(1_778_335_260.0125) == "2026-05-09T14:01:00.012Z"
