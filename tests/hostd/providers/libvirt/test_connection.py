"""hostd's libvirt connection (hostd.providers.libvirt.connection.LibvirtLink) against libvirt's
built-in test hypervisor (``test:///default``): errors told apart (libvirt's refusal, a connection
that broke, a call that never answers), reopened after it broke or was closed, domains looked up.
An unreachable libvirtd through the VM provider: tests/hostd/providers/libvirt/test_provider.py."""

from __future__ import annotations

import threading
from typing import Any

import pytest
import trio

from agentic_sandbox.hostd.errors import RpcError
from agentic_sandbox.hostd.providers.libvirt import connection
from agentic_sandbox.hostd.providers.libvirt.connection import LibvirtLink
from agentic_sandbox.proto import ErrorCode
from agentic_sandbox.proto import messages as m

libvirt = pytest.importorskip("libvirt")

URI = "test:///default"
#: The one domain the test hypervisor starts with.
DOMAIN = "test"


async def test_calls_share_one_connection_opened_on_first_use() -> None:
    link = LibvirtLink(URI)
    assert link.reason is None  # not refused before the first attempt
    first = await link.call(lambda conn: conn)
    assert await link.call(lambda conn: conn) is first
    assert await link.probe() is None
    link.close()
    assert link.reason == "hostd closed the libvirt connection"
    assert await link.call(lambda conn: conn) is not first and link.reason is None  # reopened


async def test_a_refusal_on_a_live_connection_is_provider_failed_and_keeps_it() -> None:
    link = LibvirtLink(URI)
    conn = await link.call(lambda conn: conn)
    with pytest.raises(RpcError) as refused:
        await link.call(lambda conn: conn.lookupByName("no-such-domain"))
    assert refused.value.code is ErrorCode.PROVIDER_FAILED and refused.value.details == {"uri": URI}
    assert refused.value.message.startswith("libvirt: ") and "not found" in refused.value.message.lower()
    assert await link.call(lambda conn: conn) is conn and link.reason is None
    link.close()


async def test_a_broken_connection_is_provider_unavailable_and_reopened_next_call() -> None:
    link = LibvirtLink(URI)

    def break_it(conn: Any) -> None:
        conn.close()  # as if libvirtd went away under it
        conn.getLibVersion()

    first = await link.call(lambda conn: conn)
    with pytest.raises(RpcError) as broke:
        await link.call(break_it)
    assert broke.value.code is ErrorCode.PROVIDER_UNAVAILABLE
    assert link.reason is not None and link.reason.startswith(f"the libvirt connection to {URI} broke")
    assert broke.value.message == link.reason
    assert await link.probe() is None and await link.call(lambda conn: conn) is not first
    link.close()


async def test_a_call_that_never_answers_is_abandoned(autojump_clock: trio.abc.Clock) -> None:
    link = LibvirtLink(URI)
    release = threading.Event()
    try:
        with pytest.raises(RpcError, match="did not answer within 5 s") as slow:
            await link.call(lambda conn: release.wait(), timeout_s=5)
        assert slow.value.code is ErrorCode.PROVIDER_UNAVAILABLE
    finally:
        release.set()
    # The link itself is fine (called in this thread: a worker thread would let the clock jump too).
    assert link.call_sync(lambda conn: conn.getLibVersion()) > 0
    link.close()


async def test_unreachable_libvirt_gives_the_reason_to_probe_and_calls(tmp_path: Any) -> None:
    uri = f"qemu+unix:///system?socket={tmp_path / 'none.sock'}"
    link = LibvirtLink(uri)
    reason = await link.probe()
    assert reason is not None and reason.startswith(f"cannot connect to libvirt at {uri}: ")
    with pytest.raises(RpcError) as unavailable:
        await link.call(lambda conn: conn)
    assert unavailable.value.code is ErrorCode.PROVIDER_UNAVAILABLE and unavailable.value.details == {"uri": uri}


async def test_domains_are_looked_up_by_uuid() -> None:
    link = LibvirtLink(URI)
    uuid = await link.call(lambda conn: conn.lookupByName(DOMAIN).UUIDString())
    assert await link.call(lambda conn: connection.lookup(conn, uuid).name()) == DOMAIN
    assert await link.call(lambda conn: connection.is_active(connection.lookup(conn, uuid)))
    missing = "00000000-0000-4000-8000-000000000000"
    assert await link.call(lambda conn: connection.lookup(conn, missing)) is None
    for vm in (m.VmDetail(uri=URI, domain="gone", uuid=missing), m.VmDetail(uri=URI, domain="gone")):
        with pytest.raises(RpcError, match="domain gone no longer exists") as gone:
            await link.call(lambda conn, vm=vm: connection.existing(conn, vm))
        assert gone.value.code is ErrorCode.PROVIDER_FAILED
    with pytest.raises(RpcError):  # anything but "no such domain" is not an absent domain
        await link.call(lambda conn: connection.lookup(conn, "not a uuid"))
    link.close()


def test_a_libvirt_error_is_one_bounded_line() -> None:
    assert connection.libvirt_error(ValueError("  spaced  ")) == "spaced"
    assert connection.libvirt_error(ValueError()) == "ValueError"
    long = connection.libvirt_error(ValueError("x" * 1000))
    assert len(long) == 300 and long.endswith("...")
    no_domain = libvirt.libvirtError("gone")
    assert not connection.is_no_domain(ValueError("gone")) and not connection.is_no_domain(no_domain)
