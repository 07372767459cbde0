"""Instances that sleep when idle and wake on traffic (hostd/sleeping.py), with a real hostd on real
cgroups: host instances freeze in the cgroup v2 freezer."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio

from agentic_sandbox.proto import ErrorCode, HostdClient, HostdRemoteError, new_id
from agentic_sandbox.proto import messages as m
from tests.hostd_process import HostdProcess

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="the cgroup freezer needs root")

#: A main process that leaves a tick in a file every 20 ms: frozen, the file stops growing.
TICKER = ["sh", "-c", "while :; do echo t >> ticks; sleep 0.02; done"]


@pytest.fixture
def hostd(tmp_path: Path) -> Iterator[HostdProcess]:
    proc = HostdProcess(tmp_path / "state").start()
    if proc.cgroup is None:
        proc.cleanup()
        pytest.skip("no cgroup v2 hierarchy to freeze in")
    yield proc
    proc.cleanup()


async def provision(
    client: HostdClient, *, idle: m.IdlePolicy | None = None, command: list[str] | None = None
) -> m.InstanceInfo:
    iid = new_id()
    req = m.InstanceProvisionRequest(instance_id=iid, name=f"i-{iid[-6:]}", command=command or TICKER, idle=idle)
    return (await client.call(req)).instance


async def get(client: HostdClient, iid: str) -> m.InstanceInfo:
    return (await client.call(m.InstanceGetRequest(instance_id=iid))).instance


async def wait_state(client: HostdClient, iid: str, state: str, within: float = 10.0) -> m.InstanceInfo:
    with trio.fail_after(within):
        while (info := await get(client, iid)).state != state:
            await trio.sleep(0.05)
    return info


def ticks(info: m.InstanceInfo) -> int:
    path = Path(info.working_dir) / "ticks"
    return path.stat().st_size if path.exists() else 0


def frozen(info: m.InstanceInfo) -> bool:
    assert info.host is not None and info.host.cgroup is not None
    return "frozen 1" in (Path(info.host.cgroup) / "cgroup.events").read_text().splitlines()


async def run_exec(client: HostdClient, iid: str, argv: list[str], **kw: object) -> tuple[int | None, bytes]:
    ex = (await client.call(m.ExecStartRequest(instance_id=iid, argv=argv, **kw))).exec  # type: ignore[arg-type]
    out, code = b"", None
    async with client.stream(m.ExecSubscribeRequest(exec_id=ex.exec_id, from_seq=1)) as events:
        async for ev in events:
            if isinstance(ev, m.ExecOutput):
                out += ev.data
            elif isinstance(ev, m.ExecExited):
                code = ev.exit_code
    return code, out


async def assert_still(info: m.InstanceInfo) -> None:
    before = ticks(info)
    await trio.sleep(0.3)
    assert ticks(info) == before, "a frozen instance's main process went on"


async def test_an_idle_instance_freezes_and_an_exec_wakes_it(hostd: HostdProcess) -> None:
    async with hostd.client() as client:
        providers = (await client.call(m.ProviderListRequest())).providers
        assert "instance.sleep.freeze" in next(p for p in providers if p.runtime == "host").capabilities
        info = await provision(client, idle=m.IdlePolicy(after_s=1))
        assert info.idle == m.IdlePolicy(after_s=1) and info.state == "running"
        started = time.monotonic()
        info = await wait_state(client, info.instance_id, "sleeping")
        assert time.monotonic() - started >= 0.9
        assert info.sleep is not None and (info.sleep.how, info.sleep.cause) == ("freeze", "idle")
        assert info.sleeps == 1 and frozen(info)
        await assert_still(info)

        code, out = await run_exec(client, info.instance_id, ["sh", "-c", "echo awake; exit 3"])
        assert (code, out) == (3, b"awake\n")
        info = await get(client, info.instance_id)
        assert info.state == "running" and info.sleep is None and not frozen(info)
        assert info.wakes == 1 and info.last_wake is not None
        assert (info.last_wake.cause, info.last_wake.how) == ("exec", "freeze")
        assert info.asleep_s > 0.2
        before = ticks(info)
        await trio.sleep(0.3)
        assert ticks(info) > before, "the woken main process did not go on"


async def test_work_keeps_an_instance_awake_and_an_operator_sleep_is_refused_under_it(hostd: HostdProcess) -> None:
    async with hostd.client() as client:
        info = await provision(client, idle=m.IdlePolicy(after_s=1))
        iid = info.instance_id
        # A running exec keeps it awake past after_s, and refuses an operator's sleep.
        ex = (await client.call(m.ExecStartRequest(instance_id=iid, argv=["sleep", "2.5"]))).exec
        with pytest.raises(HostdRemoteError) as refused:
            await client.call(m.InstanceSleepRequest(instance_id=iid))
        assert refused.value.code == ErrorCode.INSTANCE_BUSY.value and ex.exec_id in refused.value.message
        await trio.sleep(2)
        assert (await get(client, iid)).state == "running"
        # An attached terminal keeps it awake too.
        session = (await client.call(m.SessionCreateRequest(instance_id=iid, argv=["cat"]))).session
        async with client.stream(m.SessionSubscribeRequest(session_id=session.session_id)):
            await trio.sleep(2)
            assert (await get(client, iid)).state == "running"
        # Detached and idle: it sleeps (the session lives on, frozen).
        info = await wait_state(client, iid, "sleeping", within=5)
        assert (await client.call(m.SessionGetRequest(session_id=session.session_id))).session.state == "running"


async def test_a_parked_exec_does_not_keep_it_awake_and_its_timeout_does_not_count_the_sleep(
    hostd: HostdProcess,
) -> None:
    async with hostd.client() as client:
        info = await provision(client)
        iid = info.instance_id
        ex = (await client.call(m.ExecStartRequest(instance_id=iid, argv=["sleep", "30"], timeout_s=2.0))).exec
        # The controller says its task waits for an answer (input-required): it is parked.
        await client.call(m.InstanceActivityRequest(parked_execs=[ex.exec_id]))
        info = (await client.call(m.InstanceSleepRequest(instance_id=iid))).instance
        assert info.state == "sleeping"
        await trio.sleep(2.5)  # past the exec's deadline, asleep
        assert (await client.call(m.ExecGetRequest(exec_id=ex.exec_id))).exec.state == "running"
        woke = await client.call(m.InstanceWakeRequest(instance_id=iid))
        assert woke.woke and woke.instance.last_wake is not None and woke.instance.last_wake.cause == "operator"
        await trio.sleep(0.5)  # 0.5 s of its 2 s awake so far: it runs on
        assert (await client.call(m.ExecGetRequest(exec_id=ex.exec_id))).exec.state == "running"
        with trio.fail_after(5):
            while (done := (await client.call(m.ExecGetRequest(exec_id=ex.exec_id))).exec).state == "running":
                await trio.sleep(0.05)
        assert done.end_reason == "timeout"
        # A wake of an awake instance has nothing to do.
        again = await client.call(m.InstanceWakeRequest(instance_id=iid))
        assert not again.woke and again.instance.wakes == 1


async def test_concurrent_callers_share_one_wake(hostd: HostdProcess) -> None:
    async with hostd.client() as client:
        info = await provision(client)
        iid = info.instance_id
        await client.call(m.InstanceSleepRequest(instance_id=iid))
        results: list[tuple[int | None, bytes]] = []

        async def one(n: int) -> None:
            results.append(await run_exec(client, iid, ["sh", "-c", f"echo {n}"]))

        async with trio.open_nursery() as nursery:
            for n in range(10):
                nursery.start_soon(one, n)
        assert sorted(results) == sorted((0, f"{n}\n".encode()) for n in range(10))
        info = await get(client, iid)
        assert (info.state, info.wakes, info.sleeps) == ("running", 1, 1)


async def test_a_keystroke_wakes_the_instance_without_waiting(hostd: HostdProcess) -> None:
    async with hostd.client() as client:
        info = await provision(client)
        iid = info.instance_id
        session = (await client.call(m.SessionCreateRequest(instance_id=iid, argv=["cat"]))).session
        await client.call(m.InstanceSleepRequest(instance_id=iid))
        await client.call(m.SessionWriteRequest(session_id=session.session_id, data=b"hello\n"))
        info = await wait_state(client, iid, "running", within=5)
        assert info.last_wake is not None and info.last_wake.cause == "pty.input"
        out = b""
        with trio.fail_after(5):
            async with client.stream(m.SessionSubscribeRequest(session_id=session.session_id, from_seq=1)) as events:
                async for ev in events:
                    if isinstance(ev, m.SessionOutput):
                        out += ev.data
                        if out.count(b"hello") >= 2:  # the echo and cat's answer
                            break


async def test_an_instance_that_does_not_wake_on_traffic_refuses_until_woken(hostd: HostdProcess) -> None:
    async with hostd.client() as client:
        info = await provision(client, idle=m.IdlePolicy(after_s=1, wake_on_traffic=False))
        iid = info.instance_id
        await wait_state(client, iid, "sleeping")
        with pytest.raises(HostdRemoteError) as refused:
            await client.call(m.ExecStartRequest(instance_id=iid, argv=["true"]))
        assert refused.value.code == ErrorCode.INSTANCE_SLEEPING.value and iid in refused.value.message
        # An operator's start wakes it whatever the policy says; the policy can be changed later.
        info = (await client.call(m.InstanceStartRequest(instance_id=iid))).instance
        assert info.state == "running" and info.last_wake is not None and info.last_wake.cause == "start"
        info = (await client.call(m.InstanceIdleSetRequest(instance_id=iid, idle=None))).instance
        assert info.idle is None
        await trio.sleep(1.5)
        assert (await get(client, iid)).state == "running"


async def test_refusals(hostd: HostdProcess) -> None:
    async with hostd.client() as client:
        info = await provision(client)
        iid = info.instance_id
        with pytest.raises(HostdRemoteError) as refused:
            await client.call(m.InstanceSleepRequest(instance_id=iid, how="save"))
        assert refused.value.code == ErrorCode.UNSUPPORTED.value and "save" in refused.value.message
        # A policy that says save falls back to what the runtime can do.
        await client.call(m.InstanceIdleSetRequest(instance_id=iid, idle=m.IdlePolicy(after_s=60, sleep="save")))
        info = (await client.call(m.InstanceSleepRequest(instance_id=iid))).instance
        assert info.sleep is not None and info.sleep.how == "freeze"
        # Stop wakes it first, then stops it; a stopped instance cannot sleep.
        info = (await client.call(m.InstanceStopRequest(instance_id=iid))).instance
        assert info.state == "stopped" and info.last_wake is not None and info.last_wake.cause == "stop"
        with pytest.raises(HostdRemoteError) as refused:
            await client.call(m.InstanceSleepRequest(instance_id=iid))
        assert refused.value.code == ErrorCode.INSTANCE_INVALID_STATE.value
        with pytest.raises(HostdRemoteError) as refused:
            await client.call(m.InstanceSleepRequest(instance_id="nope"))
        assert refused.value.code == ErrorCode.INSTANCE_NOT_FOUND.value


async def test_a_hostd_restart_or_upgrade_keeps_it_asleep_and_wakeable(hostd: HostdProcess) -> None:
    async with hostd.client() as client:
        info = await provision(client)
        iid = info.instance_id
        await client.call(m.InstanceSleepRequest(instance_id=iid))
        await client.call(m.UpgradeRequest())
    async with hostd.client() as client:
        info = await wait_state(client, iid, "sleeping")
        assert frozen(info)
    hostd.stop()
    hostd.start()
    async with hostd.client() as client:
        info = await get(client, iid)
        assert info.state == "sleeping" and info.sleep is not None and frozen(info)
        await assert_still(info)
        code, out = await run_exec(client, iid, ["echo", "back"])
        assert (code, out) == (0, b"back\n")
        info = await get(client, iid)
        assert info.state == "running" and info.wakes == 1 and not frozen(info)
    # hostd went down between freezing an instance and writing it down: the next one thaws it.
    hostd.stop()
    assert info.host is not None and info.host.cgroup is not None
    (Path(info.host.cgroup) / "cgroup.freeze").write_text("1")
    hostd.start()
    async with hostd.client() as client:
        info = await get(client, iid)
        assert info.state == "running" and not frozen(info)
        # Destroying a sleeping instance leaves nothing frozen behind.
        await client.call(m.InstanceSleepRequest(instance_id=iid))
        assert info.host is not None and info.host.cgroup is not None
        await client.call(m.InstanceDestroyRequest(instance_id=iid))
        assert not Path(info.host.cgroup).exists()


async def test_an_attach_wakes_the_instance_and_keeps_it_awake(hostd: HostdProcess) -> None:
    async with hostd.client() as client:
        info = await provision(client, idle=m.IdlePolicy(after_s=1))
        iid = info.instance_id
        session = (await client.call(m.SessionCreateRequest(instance_id=iid, argv=["cat"]))).session
        await wait_state(client, iid, "sleeping")
        async with client.stream(m.SessionSubscribeRequest(session_id=session.session_id)) as events:
            info = await wait_state(client, iid, "running", within=5)
            assert info.last_wake is not None and info.last_wake.cause == "attach"
            await client.call(m.SessionWriteRequest(session_id=session.session_id, data=b"still here\n"))
            out = b""
            with trio.fail_after(5):
                async for ev in events:
                    if isinstance(ev, m.SessionOutput):
                        out += ev.data
                        if out.count(b"still here") >= 2:
                            break
            await trio.sleep(1.5)  # past after_s, attached: awake
            assert (await get(client, iid)).state == "running"


async def test_ending_a_child_of_a_sleeping_instance_wakes_it_first(hostd: HostdProcess) -> None:
    async with hostd.client() as client:
        info = await provision(client, idle=m.IdlePolicy(after_s=3600, wake_on_traffic=False))
        iid = info.instance_id
        ex = (await client.call(m.ExecStartRequest(instance_id=iid, argv=["sleep", "60"]))).exec
        await client.call(m.InstanceActivityRequest(parked_execs=[ex.exec_id]))
        await client.call(m.InstanceSleepRequest(instance_id=iid))
        with trio.fail_after(5):
            ended = (await client.call(m.ExecCancelRequest(exec_id=ex.exec_id, grace_s=1))).exec
        assert ended.end_reason == "canceled" and ended.signal == 15  # SIGTERM, handled awake
        info = await get(client, iid)
        assert info.state == "running" and info.last_wake is not None and info.last_wake.cause == "exec.cancel"
