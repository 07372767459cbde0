"""Where placement puts a new instance, and why it refuses."""

from __future__ import annotations

import pytest

from agentic_sandbox.controller.errors import Conflict, NotFound, Unavailable
from agentic_sandbox.controller.hosts.placement import choose
from agentic_sandbox.controller.store import HostCapacity, HostRecord

NOW = 1_000_000.0
GIB = 1 << 30


def host(
    host_id: str,
    *,
    free_gib: int = 8,
    runtimes: tuple[str, ...] = ("host", "docker"),
    labels: dict[str, str] | None = None,
    seen_ago: float = 1.0,
    cordoned: bool = False,
    draining: bool = False,
    max_instances: int = 0,
) -> HostRecord:
    return HostRecord(
        id=host_id,
        boot_id="b",
        name=f"name-{host_id}",
        labels=labels or {},
        runtimes=list(runtimes),
        capacity=HostCapacity(
            cpus=2, memory_bytes=16 * GIB, memory_available_bytes=free_gib * GIB, max_instances=max_instances
        ),
        cordoned=cordoned,
        draining=draining,
        registered_at=0.0,
        heartbeat_at=NOW - seen_ago,
    )


def place(hosts: list[HostRecord], counts: dict[str, dict[str, int]] | None = None, **kw: str) -> str:
    runtime = kw.pop("runtime", "host")
    return choose(hosts, counts or {}, runtime=runtime, now=NOW, timeout_s=10.0, **kw).id


def test_the_most_free_memory_then_the_fewest_live_instances_then_the_lowest_id() -> None:
    assert place([host("a", free_gib=4), host("b", free_gib=6)]) == "b"
    about_as_free = host("a", free_gib=6)
    about_as_free.capacity.memory_available_bytes += GIB // 2  # within the same GiB: a tie
    assert place([about_as_free, host("b", free_gib=6)], {"a": {"running": 1}}) == "b"
    counts = {"a": {"running": 3, "stopped": 9}, "b": {"running": 1}}
    assert place([host("a"), host("b")], counts) == "b"
    assert place([host("a"), host("b")], {"a": {"stopped": 5}}) == "a"  # stopped ones hold nothing
    assert place([host("b"), host("a")]) == "a"


def test_a_named_host_by_id_or_name_and_a_label() -> None:
    hosts = [host("a", labels={"zone": "eu"}), host("b", free_gib=1, labels={"zone": "us", "gpu": ""})]
    assert place(hosts, host="b") == "b"
    assert place(hosts, host="name-b") == "b"
    assert place(hosts, label="zone=us") == "b"
    assert place(hosts, label="gpu") == "b"
    assert place(hosts, label="zone") == "a"


def test_only_hosts_offering_the_runtime() -> None:
    hosts = [host("a", free_gib=9, runtimes=("host",)), host("b", runtimes=("host", "qemu"))]
    assert place(hosts, runtime="qemu") == "b"


def test_no_host_with_the_label_is_a_conflict_none_with_the_runtime_unavailable_an_unknown_host_not_found() -> None:
    hosts = [host("a", labels={"zone": "eu"})]
    with pytest.raises(Unavailable) as down:  # a runtime is offered while its provider answers
        place(hosts, runtime="qemu")
    assert down.value.code == "placement.unavailable" and "qemu" in down.value.message
    with pytest.raises(Conflict) as info:  # waiting does not help
        place(hosts, label="zone=mars")
    assert info.value.code == "placement.no_host" and "zone=mars" in info.value.message
    with pytest.raises(NotFound) as missing:
        place(hosts, host="elsewhere")
    assert missing.value.code == "host.not_found"


def test_hosts_that_cannot_now_are_skipped_and_named_when_none_is_left() -> None:
    hosts = [
        host("gone", free_gib=99, seen_ago=60),
        host("cordoned", free_gib=98, cordoned=True),
        host("draining", free_gib=97, draining=True),
        host("full", free_gib=96, max_instances=2),
        host("ok", free_gib=1),
    ]
    counts = {"full": {"running": 1, "starting": 1}}
    assert place(hosts, counts) == "ok"
    with pytest.raises(Unavailable) as info:
        place(hosts[:4], counts)
    assert info.value.code == "placement.unavailable"
    for why in ("gone", "unavailable", "cordoned", "draining", "full (2 of 2 instances)"):
        assert why in info.value.message
    assert place([host("full", max_instances=2)], {"full": {"running": 1}}) == "full"
