"""InstanceRegistry with real processes, real files and (where possible) real cgroups."""

from __future__ import annotations

import json
import os
import resource
import signal
import stat
from collections.abc import AsyncIterator
from pathlib import Path

import msgspec
import psutil
import pytest
import trio

from agentic_sandbox.hostd import statefile
from agentic_sandbox.hostd.config import HostdConfig
from agentic_sandbox.hostd.errors import RpcError
from agentic_sandbox.hostd.instances import InstanceRegistry
from agentic_sandbox.hostd.proctree import Cgroups
from agentic_sandbox.proto import ErrorCode, new_id
from agentic_sandbox.proto import messages as m
from tests.hostd.registries import make_config, open_registry, real_cgroups
from tests.processes import running, tree_procs

WAIT_S = 10.0
SLEEPER = ["sleep", "300"]
# The grandchild leaves the process group (setsid) and is reparented: only the tree's marks find it.
DOUBLE_FORK = ["sh", "-c", "setsid sh -c 'sleep 300 &'; exec sleep 300"]


def escapees(tree_id: str, leader: int) -> list[psutil.Process]:
    """Members of the tree running ``sleep`` outside the leader's process group."""
    found = []
    for proc in tree_procs(tree_id):
        try:
            if proc.name() == "sleep" and os.getpgid(proc.pid) != leader:
                found.append(proc)
        except (psutil.Error, ProcessLookupError):
            continue
    return found


@pytest.fixture
def config(tmp_path: Path) -> HostdConfig:
    return make_config(tmp_path)


@pytest.fixture
async def registry(config: HostdConfig, leak_check: None) -> AsyncIterator[InstanceRegistry]:
    async with trio.open_nursery() as nursery:
        reg = open_registry(config, Cgroups.detect("off"), nursery)
        await reg.load()
        yield reg
        await _destroy_all(reg)
        nursery.cancel_scope.cancel()


async def _destroy_all(reg: InstanceRegistry) -> None:
    for info in reg.list():
        await reg.destroy(info.instance_id, 0.5)


def provision_req(**fields: object) -> m.InstanceProvisionRequest:
    fields.setdefault("instance_id", f"i-{new_id()}")
    fields.setdefault("name", "test instance")
    return m.InstanceProvisionRequest(**fields)  # type: ignore[arg-type]


async def wait_state(reg: InstanceRegistry, iid: str, *states: str) -> m.InstanceInfo:
    with trio.fail_after(WAIT_S):
        while (info := reg.get(iid)).state not in states:
            await trio.sleep(0.01)
    return info


async def wait_for(predicate, what: str) -> None:
    with trio.fail_after(WAIT_S):
        while not predicate():
            await trio.sleep(0.01)


def mode(path: str | Path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def rpc_code(excinfo: pytest.ExceptionInfo[RpcError]) -> ErrorCode:
    return excinfo.value.code


# ---------------------------------------------------------------------------------------------


async def test_provision_without_command_files_and_env(registry: InstanceRegistry, config: HostdConfig) -> None:
    req = provision_req(name="plain", env={"FOO": "bar baz", "EMPTY": ""}, labels={"team": "a"}, loadout="demo")
    info = await registry.provision(req)
    iid = req.instance_id
    assert info.state == "running" and info.host.pid is None and info.labels == {"team": "a"}
    inst_dir = config.instances_dir / iid
    assert info.instance_dir == str(inst_dir)
    assert mode(inst_dir) == 0o700
    assert info.working_dir == str(inst_dir / "work") and mode(info.working_dir) == 0o700
    env_file = inst_dir / "agent.env"
    assert mode(env_file) == 0o600
    lines = env_file.read_text().splitlines()
    assert f"AIWG_INSTANCE_ID={iid}" in lines
    assert f"AGENT_INSTANCE_ID={iid}" in lines
    assert f"AGENT_ID=host-{iid}" in lines
    assert "AGENT_LOADOUT=demo" in lines
    assert "FOO=bar baz" in lines and "EMPTY=" in lines
    assert mode(inst_dir / "metadata.json") == 0o600
    assert json.loads((inst_dir / "metadata.json").read_text())["runtime"] == "host"
    assert mode(config.state_file) == 0o600

    # What a session or exec started in it gets, as the host provider decides.
    spec = registry.placement(iid).spawn_spec(["true"], None, {"EXTRA": "1"}, tty=False)
    assert registry.placement(iid).instance_id == iid
    assert spec.argv == ["true"] and spec.cwd == spec.shown_cwd == info.working_dir and spec.cgroup_parent is None
    assert spec.env["HOME"] == info.working_dir and spec.env["EXTRA"] == "1"
    assert spec.env["LANG"] == "C.UTF-8" and spec.env["SHELL"] == "/bin/sh" and spec.env["PATH"]
    assert spec.env["AIWG_INSTANCE_DIR"] == str(inst_dir)
    assert spec.env["FOO"] == "bar baz" and spec.env["AGENT_ID"] == f"host-{iid}"
    assert (info.runtime, info.provider) == ("host", "hostd") and "session.pty" in info.capabilities
    assert [i.instance_id for i in registry.list()] == [iid]


async def test_provision_start_false_and_idempotent_start_stop(registry: InstanceRegistry) -> None:
    req = provision_req(command=SLEEPER, start=False)
    info = await registry.provision(req)
    iid = req.instance_id
    assert info.state == "stopped" and info.host.pid is None
    with pytest.raises(RpcError) as excinfo:
        registry.placement(iid)
    assert rpc_code(excinfo) is ErrorCode.INSTANCE_INVALID_STATE

    started = await registry.start(iid)
    assert started.state == "running" and started.host.pid is not None
    again = await registry.start(iid)
    assert again.host.pid == started.host.pid and again.started_at == started.started_at

    stopped = await registry.stop(iid, 1.0)
    assert stopped.state == "stopped" and stopped.host.pid is None and stopped.stopped_at is not None
    assert not psutil.pid_exists(started.host.pid) or not running(psutil.Process(started.host.pid))
    again = await registry.stop(iid, 1.0)
    assert again.state == "stopped" and again.stopped_at == stopped.stopped_at

    restarted = await registry.start(iid)
    assert restarted.state == "running" and restarted.host.pid not in (None, started.host.pid)


async def test_provision_refusals(registry: InstanceRegistry, tmp_path: Path, config: HostdConfig) -> None:
    req = provision_req(name="first")
    await registry.provision(req)
    with pytest.raises(RpcError) as excinfo:
        await registry.provision(provision_req(instance_id=req.instance_id, name="second"))
    assert rpc_code(excinfo) is ErrorCode.INSTANCE_EXISTS
    assert excinfo.value.details["name"] == "first"

    missing = provision_req(working_dir=str(tmp_path / "nope"))
    with pytest.raises(RpcError) as excinfo:
        await registry.provision(missing)
    assert rpc_code(excinfo) is ErrorCode.WORKING_DIR_NOT_FOUND
    with pytest.raises(RpcError) as excinfo:
        await registry.provision(provision_req(env={"BAD": "two\nlines"}))
    assert rpc_code(excinfo) is ErrorCode.REQUEST_INVALID
    with pytest.raises(RpcError) as excinfo:
        await registry.provision(provision_req(env={"AGENT_ID": "mine"}))
    assert rpc_code(excinfo) is ErrorCode.REQUEST_INVALID

    broken = provision_req(command=["/nonexistent/agent-binary"])
    with pytest.raises(RpcError) as excinfo:
        await registry.provision(broken)
    assert rpc_code(excinfo) is ErrorCode.SPAWN_FAILED
    assert "/nonexistent/agent-binary" in excinfo.value.message
    # Failed provisions leave nothing behind.
    assert [i.instance_id for i in registry.list()] == [req.instance_id]
    assert not (config.instances_dir / broken.instance_id).exists()
    assert not (config.instances_dir / missing.instance_id).exists()
    with pytest.raises(RpcError) as excinfo:
        registry.get(broken.instance_id)
    assert rpc_code(excinfo) is ErrorCode.INSTANCE_NOT_FOUND


async def test_main_process_env_cwd_and_log(registry: InstanceRegistry, tmp_path: Path, config: HostdConfig) -> None:
    workdir = tmp_path / "wd"
    workdir.mkdir()
    script = 'echo "id=$AIWG_INSTANCE_ID agent=$AGENT_ID tree=$AIWG_TREE pwd=$(pwd)"; echo oops >&2; exec sleep 300'
    req = provision_req(command=["sh", "-c", script], working_dir=str(workdir))
    info = await registry.provision(req)
    iid = req.instance_id
    assert info.state == "running" and info.host.pid == info.host.pgid and info.working_dir == str(workdir)
    assert os.getpgid(info.host.pid) == info.host.pid
    log = Path(info.instance_dir) / "main.log"
    await wait_for(lambda: "oops" in log.read_text(), "main.log output")
    assert mode(log) == 0o600
    tree = config.tree_id("instance", iid)
    assert tree.endswith(f":instance:{iid}")
    assert f"id={iid} agent=host-{iid} tree={tree} pwd={workdir}" in log.read_text()
    stopped = await registry.stop(iid, None)
    assert stopped.state == "stopped"
    assert not tree_procs(iid)


async def test_stop_kills_whole_tree_including_double_forked_grandchild(registry: InstanceRegistry) -> None:
    hook_calls: list[tuple[str, float]] = []

    async def hook(instance_id: str, grace: float) -> None:
        hook_calls.append((instance_id, grace))

    registry.on_stop.append(hook)
    req = provision_req(command=DOUBLE_FORK)
    info = await registry.provision(req)
    iid = req.instance_id
    await wait_for(lambda: escapees(iid, info.host.pid), "grandchild")
    (grandchild,) = escapees(iid, info.host.pid)

    stopped = await registry.stop(iid, 0.5)
    assert stopped.state == "stopped"
    assert hook_calls == [(iid, 0.5)]
    assert not tree_procs(iid)
    assert not running(grandchild)


async def test_main_exit_on_its_own(registry: InstanceRegistry) -> None:
    ok = provision_req(command=["sh", "-c", "exit 0"])
    bad = provision_req(command=["sh", "-c", "exit 3"])
    killed = provision_req(command=["sh", "-c", "kill -9 $$"])
    await registry.provision(ok)
    await registry.provision(bad)
    await registry.provision(killed)
    info = await wait_state(registry, ok.instance_id, "stopped")
    assert info.exit_code == 0 and info.host.pid is None and info.stopped_at is not None
    info = await wait_state(registry, bad.instance_id, "failed")
    assert info.exit_code == 3 and "code 3" in (info.note or "")
    info = await wait_state(registry, killed.instance_id, "failed")
    assert info.exit_code is None and "signal 9" in (info.note or "")
    # A failed instance can be started again.
    again = await registry.start(bad.instance_id)
    assert again.state == "running" and again.note is None
    await wait_state(registry, bad.instance_id, "failed")


async def test_destroy_removes_everything(registry: InstanceRegistry, config: HostdConfig) -> None:
    calls: list[str] = []

    async def hook(instance_id: str, grace: float) -> None:
        calls.append(instance_id)

    registry.on_stop.append(hook)
    req = provision_req(command=DOUBLE_FORK)
    pid = (await registry.provision(req)).host.pid
    iid = req.instance_id
    await wait_for(lambda: escapees(iid, pid), "grandchild")
    info = await registry.destroy(iid, 0.5)
    assert info.state == "destroyed"
    assert calls == [iid]
    assert not (config.instances_dir / iid).exists()
    assert not tree_procs(iid)
    assert registry.list() == []
    for call in (registry.get, registry.placement):
        with pytest.raises(RpcError) as excinfo:
            call(iid)
        assert rpc_code(excinfo) is ErrorCode.INSTANCE_NOT_FOUND
    with pytest.raises(RpcError) as excinfo:
        await registry.destroy(iid, 0)
    assert rpc_code(excinfo) is ErrorCode.INSTANCE_NOT_FOUND
    assert json.loads(config.state_file.read_text())["instances"] == []


async def test_concurrent_stop_and_destroy_serialize(registry: InstanceRegistry) -> None:
    req = provision_req(command=SLEEPER)
    await registry.provision(req)
    iid = req.instance_id
    results: dict[str, object] = {}

    async def run(name: str, fn) -> None:
        try:
            results[name] = await fn()
        except RpcError as exc:
            results[name] = exc.code

    async with trio.open_nursery() as nursery:
        nursery.start_soon(run, "stop", lambda: registry.stop(iid, 0.5))
        nursery.start_soon(run, "destroy", lambda: registry.destroy(iid, 0.5))
    destroyed = results["destroy"]
    assert isinstance(destroyed, m.InstanceInfo) and destroyed.state == "destroyed"
    stop = results["stop"]
    assert stop is ErrorCode.INSTANCE_NOT_FOUND or (isinstance(stop, m.InstanceInfo) and stop.state == "stopped")
    assert not tree_procs(iid)


async def test_restart_readopts_live_main_and_reports_dead_one(config: HostdConfig, leak_check: None) -> None:
    live, dead = provision_req(command=SLEEPER), provision_req(command=SLEEPER)
    plain, parked = provision_req(), provision_req(start=False)
    async with trio.open_nursery() as nursery:
        first = open_registry(config, Cgroups.detect("off"), nursery)
        await first.load()
        for req in (live, dead, plain, parked):
            await first.provision(req)
        live_pid = first.get(live.instance_id).host.pid
        dead_pid = first.get(dead.instance_id).host.pid
        await first.shutdown()
        with pytest.raises(RpcError) as excinfo:
            await first.provision(provision_req())
        assert rpc_code(excinfo) is ErrorCode.SHUTTING_DOWN
        nursery.cancel_scope.cancel()
    assert live_pid and dead_pid
    assert running(psutil.Process(live_pid)) and running(psutil.Process(dead_pid))  # shutdown left them running

    # The second main dies while no hostd is watching.
    os.kill(dead_pid, signal.SIGKILL)
    os.waitpid(dead_pid, 0)  # it is the test process's child; a real hostd would not be its parent

    async with trio.open_nursery() as nursery:
        second = open_registry(config, Cgroups.detect("off"), nursery)
        await second.load()
        info = second.get(live.instance_id)
        assert info.state == "running" and info.adopted is True and info.host.pid == live_pid
        info = second.get(dead.instance_id)
        assert info.state == "failed" and info.adopted is False and info.host.pid is None
        assert info.note == f"main process {dead_pid} ended while hostd was down"
        info = second.get(plain.instance_id)
        assert info.state == "running" and info.adopted is True
        assert info.note == "PTY sessions and execs from the previous hostd ended with it"
        assert second.get(parked.instance_id).state == "stopped"
        second.placement(plain.instance_id)  # usable again

        # The adopted main is watched: its death is noticed.
        os.kill(live_pid, signal.SIGKILL)
        info = await wait_state(second, live.instance_id, "failed")
        assert info.host.pid is None and info.note

        # And an adopted main can be stopped.
        await second.start(live.instance_id)
        await second.shutdown()
        nursery.cancel_scope.cancel()

    async with trio.open_nursery() as nursery:
        third = open_registry(config, Cgroups.detect("off"), nursery)
        await third.load()
        info = third.get(live.instance_id)
        assert info.adopted is True and info.host.pid is not None
        pid = info.host.pid
        assert (await third.stop(live.instance_id, 0.5)).state == "stopped"
        assert not running(psutil.Process(pid)) if psutil.pid_exists(pid) else True
        await _destroy_all(third)
        nursery.cancel_scope.cancel()


async def test_corrupt_state_file_is_moved_aside(config: HostdConfig, leak_check: None) -> None:
    config.state_file.parent.mkdir(parents=True)
    config.state_file.write_text("{not json")
    async with trio.open_nursery() as nursery:
        reg = open_registry(config, Cgroups.detect("off"), nursery)
        await reg.load()
        assert reg.list() == []
        aside = list(config.state_file.parent.glob(config.state_file.name + ".corrupt-*"))
        assert len(aside) == 1 and aside[0].read_text() == "{not json"
        req = provision_req()
        await reg.provision(req)
        assert json.loads(config.state_file.read_text())["instances"][0]["info"]["instance_id"] == req.instance_id
        await _destroy_all(reg)
        nursery.cancel_scope.cancel()


async def test_real_cgroups(tmp_path: Path, leak_check: None) -> None:
    cgroups = real_cgroups()
    config = make_config(tmp_path, cgroup_root="")
    async with trio.open_nursery() as nursery:
        reg = open_registry(config, cgroups, nursery)
        req = provision_req(command=DOUBLE_FORK)
        info = await reg.provision(req)
        iid = req.instance_id
        assert cgroups.root is not None and info.host.cgroup == str(cgroups.root / iid)
        spec = reg.placement(iid).spawn_spec(["true"], None, {}, tty=True)
        assert spec.cgroup_parent == cgroups.root / iid
        await wait_for(lambda: escapees(iid, info.host.pid), "grandchild")
        members = Cgroups.pids(cgroups.root / iid / "main")
        assert {p.pid for p in tree_procs(iid)} <= members
        await reg.stop(iid, 0.5)
        assert not tree_procs(iid) and not Cgroups.pids(cgroups.root / iid)
        await reg.destroy(iid, 0.5)
        assert not (cgroups.root / iid).exists()
        nursery.cancel_scope.cancel()


async def test_main_command_that_exec_refuses_is_spawn_failed(registry: InstanceRegistry) -> None:
    """A NUL byte in the command is a typed error; the instance is failed, not stuck starting."""
    bad = ["sh", "-c", "true", "a\0b"]
    with pytest.raises(RpcError) as excinfo:
        await registry.provision(provision_req(command=bad))
    assert rpc_code(excinfo) is ErrorCode.SPAWN_FAILED
    assert registry.list() == []
    req = provision_req(command=bad, start=False)
    await registry.provision(req)
    with pytest.raises(RpcError) as excinfo:
        await registry.start(req.instance_id)
    assert rpc_code(excinfo) is ErrorCode.SPAWN_FAILED
    assert registry.get(req.instance_id).state == "failed"


def test_state_file_write_cut_short_keeps_the_previous_file(tmp_path: Path) -> None:
    """A short write (disk full, file size limit) must fail the write, never replace the good
    state file with a truncated one (the next hostd would start empty and orphan every agent)."""
    path = tmp_path / "state" / "hostd-state.json"
    info = m.InstanceInfo(
        instance_id="i-1", name="x", state="running", instance_dir="/nonexistent", working_dir="/", created_at=1.0
    )
    statefile.write(path, [statefile.PersistedInstance(info=info)])
    big = msgspec.structs.replace(info, labels={f"k{i}": "v" * 100 for i in range(100)})
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (path.stat().st_size + 100, hard))
    try:
        statefile.write(path, [statefile.PersistedInstance(info=big)])
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
    records = statefile.read(path)
    assert records is not None and [r.info for r in records] == [info]


async def test_start_right_after_the_main_process_failed_is_not_killed(registry: InstanceRegistry) -> None:
    """The watcher kills what a failed main process left behind; a start that comes as soon as
    the instance shows ``failed`` must not have its new main process killed by that sweep."""
    # Fails (leaving a sleep behind) the first time, runs the second time.
    script = "if [ -e ran ]; then exec sleep 300; fi; touch ran; sleep 300 & exit 3"
    req = provision_req(command=["sh", "-c", script])
    await registry.provision(req)
    iid = req.instance_id
    with trio.fail_after(WAIT_S):
        # Not sleep(0): a loop that never blocks keeps the GIL from the sweep's worker thread,
        # which then waits a switch interval (5 ms) at every /proc read and takes seconds.
        while registry.get(iid).state != "failed":
            await trio.sleep(0.001)
    info = await registry.start(iid)
    assert info.state == "running"
    await trio.sleep(0.5)
    assert registry.get(iid).state == "running", registry.get(iid).note


# -- providers and the state file's layout ----------------------------------------------------


def _as_version_1(state: dict) -> dict:
    """The state file as a hostd before runtime providers wrote it: host fields on the info itself."""
    for record in state["instances"]:
        info = record["info"]
        for key in ("runtime", "provider", "capabilities"):
            info.pop(key)
        info.update(info.pop("host") or {})
        record["main_create_time"] = record.pop("detail").get("main_create_time")
    state["version"] = 1
    return state


async def test_state_file_version_1_is_upgraded_and_readopted(config: HostdConfig, leak_check: None) -> None:
    req = provision_req(command=SLEEPER)
    async with trio.open_nursery() as nursery:
        first = open_registry(config, Cgroups.detect("off"), nursery)
        await first.load()
        pid = (await first.provision(req)).host.pid
        await first.shutdown()
        nursery.cancel_scope.cancel()
    legacy = _as_version_1(json.loads(config.state_file.read_text()))
    assert legacy["instances"][0]["info"]["pid"] == pid and legacy["instances"][0]["main_create_time"]
    config.state_file.write_text(json.dumps(legacy))

    async with trio.open_nursery() as nursery:
        second = open_registry(config, Cgroups.detect("off"), nursery)
        await second.load()
        info = second.get(req.instance_id)
        assert (info.runtime, info.provider, info.state, info.adopted) == ("host", "hostd", "running", True)
        assert info.host is not None and info.host.pid == pid
        assert "session.pty" in info.capabilities
        rewritten = json.loads(config.state_file.read_text())
        assert rewritten["version"] == statefile.VERSION
        assert rewritten["instances"][0]["detail"]["main_create_time"] == legacy["instances"][0]["main_create_time"]
        await _destroy_all(second)
        nursery.cancel_scope.cancel()
    assert not psutil.pid_exists(pid) or not running(psutil.Process(pid))


def test_state_file_from_a_newer_hostd_is_refused(config: HostdConfig) -> None:
    config.state_file.parent.mkdir(parents=True)
    config.state_file.write_text(json.dumps({"version": statefile.VERSION + 1, "instances": []}))
    with pytest.raises(statefile.NewerStateFile, match="version 3"):
        statefile.read(config.state_file)
    assert config.state_file.exists()  # left alone for the newer hostd


async def test_instance_of_a_provider_not_offered_is_kept_failed(config: HostdConfig, leak_check: None) -> None:
    vm = m.InstanceInfo(
        instance_id="vm-1", name="vm", state="running", instance_dir="", working_dir="/",
        runtime="vm", provider="libvirt", capabilities=["session.pty"], created_at=1.0,
    )  # fmt: skip
    saved = statefile.PersistedInstance(info=vm, detail={"domain": "aiwg-vm-1"})
    statefile.write(config.state_file, [saved])
    async with trio.open_nursery() as nursery:
        reg = open_registry(config, Cgroups.detect("off"), nursery)
        await reg.load()
        info = reg.get("vm-1")
        assert (info.state, info.adopted) == ("failed", False)
        assert info.note == "provider vm/libvirt is not offered by this hostd"
        for call in (reg.start("vm-1"), reg.stop("vm-1", 0.1), reg.destroy("vm-1", 0.1)):
            with pytest.raises(RpcError) as excinfo:
                await call
            assert rpc_code(excinfo) is ErrorCode.PROVIDER_UNAVAILABLE
        with pytest.raises(RpcError) as excinfo:
            reg.placement("vm-1")
        assert rpc_code(excinfo) is ErrorCode.INSTANCE_INVALID_STATE
        # What the provider saved survives for a hostd that offers it again.
        [record] = statefile.read(config.state_file) or []
        assert record.detail == {"domain": "aiwg-vm-1"}
        nursery.cancel_scope.cancel()


async def test_providers_and_unavailable_runtimes(registry: InstanceRegistry) -> None:
    host, podman = registry.providers()
    assert (host.runtime, host.provider, host.available, host.default) == ("host", "hostd", True, True)
    assert {"instance.start", "session.pty", "exec"} <= set(host.capabilities)
    # Offered, but without a podman socket configured it says why it cannot be used.
    assert (podman.runtime, podman.provider, podman.available, podman.default) == ("container", "podman", False, True)
    assert podman.reason is not None and "no podman socket configured" in podman.reason
    for fields in ({"runtime": "vm"}, {"provider": "nope"}):
        with pytest.raises(RpcError) as excinfo:
            await registry.provision(provision_req(**fields))
        assert rpc_code(excinfo) is ErrorCode.PROVIDER_UNAVAILABLE
        assert "offered: host/hostd, container/podman" in excinfo.value.message
    with pytest.raises(RpcError) as excinfo:
        await registry.provision(provision_req(runtime="container", provider="podman"))
    assert (
        rpc_code(excinfo) is ErrorCode.PROVIDER_UNAVAILABLE and "no podman socket configured" in excinfo.value.message
    )
    assert registry.list() == []
    info = await registry.provision(provision_req(runtime="host", provider="hostd"))
    assert (info.runtime, info.provider, info.capabilities) == ("host", "hostd", host.capabilities)
