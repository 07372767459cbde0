"""The container runtime (hostd/providers/podman/provider.py) for real: a hostd process that starts its own
podman service (runc, cgroupfs) on storage holding a busybox image, containers through provision,
limits, execs, a PTY session with replay, stop, start, destroy, re-adoption after a hostd restart,
strays, and podman unreachable."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import psutil
import pytest
import trio

from agentic_sandbox.hostd.config import HostdConfig
from agentic_sandbox.hostd.providers.podman.labels import LABEL_INSTANCE, LABEL_NAMESPACE
from agentic_sandbox.proto import HostdClient, HostdRemoteError, new_id, open_hostd
from agentic_sandbox.proto import messages as m
from tests.hostd_process import HostdProcess
from tests.podman_service import BUSYBOX_IMAGE, PodmanStorage, start_hostd

pytestmark = pytest.mark.podman

LIMITS = m.ResourceLimits(cpus=0.5, memory_bytes=64 * 1024 * 1024, pids=100)


def podman(storage: PodmanStorage, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*storage.argv(), *args], capture_output=True, text=True, timeout=60)


def container_names(storage: PodmanStorage) -> set[str]:
    return set(podman(storage, "ps", "-a", "--format", "{{.Names}}").stdout.split())


async def provision(client: HostdClient, name: str, **kw: object) -> m.InstanceInfo:
    req = m.InstanceProvisionRequest(instance_id=new_id(), name=name, runtime="container", **kw)  # type: ignore[arg-type]
    reply = await client.call(req, timeout=60)
    return reply.instance


async def run_exec(client: HostdClient, instance_id: str, *argv: str, **kw: object) -> tuple[int | None, bytes, bytes]:
    ex = (await client.call(m.ExecStartRequest(instance_id=instance_id, argv=list(argv), **kw))).exec  # type: ignore[arg-type]
    out, err, code = b"", b"", None
    async with client.stream(m.ExecSubscribeRequest(exec_id=ex.exec_id)) as events:
        async for ev in events:
            if isinstance(ev, m.ExecOutput):
                if ev.stream == "stdout":
                    out += ev.data
                else:
                    err += ev.data
            elif isinstance(ev, m.ExecExited):
                code = ev.exit_code
    await client.call(m.ExecDeleteRequest(exec_id=ex.exec_id))
    return code, out, err


async def read_session(client: HostdClient, sid: str, from_seq: int, until: bytes) -> bytes:
    """Output of the session from ``from_seq`` until ``until`` appears in it."""
    out = b""
    with trio.fail_after(30):
        async with client.stream(m.SessionSubscribeRequest(session_id=sid, from_seq=from_seq)) as events:
            async for ev in events:
                if isinstance(ev, m.SessionOutput):
                    out += ev.data
                    if until in out:
                        break
    return out


async def test_container_lifecycle_limits_execs_and_a_pty_session(
    container_hostd: HostdProcess, podman_storage: PodmanStorage
) -> None:
    async with open_hostd(str(container_hostd.socket_path), client_name="test") as client:
        providers = (await client.call(m.ProviderListRequest())).providers
        podman_info = next(p for p in providers if p.runtime == "container")
        assert (podman_info.provider, podman_info.available, podman_info.default) == ("podman", True, True)
        assert "session.pty" in podman_info.capabilities and "exec.control" not in podman_info.capabilities
        status = await client.call(m.StatusRequest())
        assert any(p.runtime == "container" and p.available for p in status.providers)

        # Refusals: no image, an image podman lacks.
        with pytest.raises(HostdRemoteError) as refused:
            await provision(client, "noimage")
        assert refused.value.code == "request.invalid"
        with pytest.raises(HostdRemoteError) as bad_ref:
            await provision(client, "badref", image="Not/An:Image Ref")
        assert bad_ref.value.code == "request.invalid" and "OCI reference" in bad_ref.value.message
        with pytest.raises(HostdRemoteError) as missing:
            await provision(client, "missing", image="localhost/not-there:1")
        assert missing.value.code == "image.not_found"

        info = await provision(
            client, "c1", image=BUSYBOX_IMAGE, limits=LIMITS, labels={"team": "a"}, env={"GREETING": "hi"}
        )
        detail = info.container
        assert info.state == "running" and info.runtime == "container" and info.provider == "podman"
        assert detail is not None and detail.status == "running" and detail.limits == LIMITS
        assert detail.image == BUSYBOX_IMAGE
        assert detail.image_ref is not None and detail.image_ref.startswith("localhost/busybox@sha256:")
        assert detail.container_name in container_names(podman_storage)
        labels = podman(podman_storage, "inspect", "--format", "{{json .Config.Labels}}", detail.container_name).stdout
        assert f'"{LABEL_INSTANCE}":"{info.instance_id}"' in labels and '"team":"a"' in labels

        # Execs: separate streams, exit code, the instance's env and cwd, the limits inside.
        code, out, err = await run_exec(
            client, info.instance_id, "sh", "-c", "echo out $GREETING $X; pwd; echo err >&2; exit 3", env={"X": "y"}
        )
        assert (code, out, err) == (3, b"out hi y\n/\n", b"err\n")
        code, out, _ = await run_exec(
            client,
            info.instance_id,
            "cat",
            "/sys/fs/cgroup/pids/pids.max",
            "/sys/fs/cgroup/memory/memory.limit_in_bytes",
            "/sys/fs/cgroup/cpu/cpu.cfs_quota_us",
        )
        assert code == 0 and out.split() == [b"100", str(64 * 1024 * 1024).encode(), b"50000"], out
        # A control channel: a socket in the directory bound at /run/aiwg, named in the exec's env
        # (busybox cannot connect to it; the agent tests do, tests/scenarios/test_agents_speak_a2a.py).
        assert "exec.control" in info.capabilities
        code, out, _ = await run_exec(
            client,
            info.instance_id,
            "sh",
            "-c",
            'echo "$AIWG_CONTROL_SOCKET"; ls -l "$AIWG_CONTROL_SOCKET"',
            control=True,
        )
        path, listing = out.decode().splitlines()
        assert code == 0 and path.startswith("/run/aiwg/") and path.endswith(".sock") and listing.startswith("s")
        assert os.listdir(Path(info.instance_dir) / "control") == []  # gone with its exec, never taken

        # A PTY session: typed commands answer, replay from 1 gives the same bytes, kill ends the
        # process inside the container (not only the podman client).
        session = (await client.call(m.SessionCreateRequest(instance_id=info.instance_id, argv=["sh"]))).session
        sid = session.session_id
        await client.call(m.SessionWriteRequest(session_id=sid, data=b"tty; echo $((6*7))-marker; sleep 4242 &\n"))
        live = await read_session(client, sid, 1, b"42-marker")
        assert b"/dev/pts/" in live
        replay = await read_session(client, sid, 1, b"42-marker")
        assert replay == live[: len(replay)] and b"42-marker" in replay
        code, out, _ = await run_exec(client, info.instance_id, "ps")
        assert b"sleep 4242" in out
        ended = (await client.call(m.SessionKillRequest(session_id=sid, grace_s=1))).session
        assert ended.state == "exited"
        code, out, _ = await run_exec(client, info.instance_id, "ps")
        assert b"sleep 4242" not in out and b"{sh}" not in out
        await client.call(m.SessionDeleteRequest(session_id=sid))

        # Signals reach the process inside (not the podman client that relays it); a client that
        # dies takes what it ran inside along.
        argv = ["sh", "-c", "trap 'echo caught-int' INT; echo ready; while :; do sleep 0.2; done"]
        trap = (await client.call(m.SessionCreateRequest(instance_id=info.instance_id, argv=argv))).session
        await read_session(client, trap.session_id, 1, b"ready")
        await client.call(m.SessionSignalRequest(session_id=trap.session_id, signal="INT"))
        await read_session(client, trap.session_id, 1, b"caught-int")
        assert (await client.call(m.SessionGetRequest(session_id=trap.session_id))).session.state == "running"
        assert trap.pid is not None
        os.kill(trap.pid, signal.SIGKILL)
        with trio.fail_after(30):
            while (await client.call(m.SessionGetRequest(session_id=trap.session_id))).session.state == "running":
                await trio.sleep(0.1)
        code, out, _ = await run_exec(client, info.instance_id, "ps")
        assert b"caught-int" not in out, out

        # A session whose command exits keeps its exit code.
        short = (
            await client.call(m.SessionCreateRequest(instance_id=info.instance_id, argv=["sh", "-c", "exit 7"]))
        ).session
        with trio.fail_after(30):
            async with client.stream(m.SessionSubscribeRequest(session_id=short.session_id, from_seq=1)) as events:
                exits = [ev async for ev in events if isinstance(ev, m.SessionExited)]
        assert exits[0].exit_code == 7

        # Stop, start, destroy.
        stopped = (
            await client.call(m.InstanceStopRequest(instance_id=info.instance_id, grace_s=2), timeout=60)
        ).instance
        assert stopped.state == "stopped" and stopped.container is not None and stopped.container.status == "exited"
        with pytest.raises(HostdRemoteError) as not_running:
            await client.call(m.ExecStartRequest(instance_id=info.instance_id, argv=["true"]))
        assert not_running.value.code == "instance.invalid_state"
        started = (await client.call(m.InstanceStartRequest(instance_id=info.instance_id), timeout=60)).instance
        assert started.state == "running" and started.container is not None and started.container.status == "running"
        assert (await run_exec(client, info.instance_id, "true"))[0] == 0
        await client.call(m.InstanceDestroyRequest(instance_id=info.instance_id, grace_s=1), timeout=60)
        assert detail.container_name not in container_names(podman_storage)
        assert not Path(info.instance_dir).exists()


async def test_a_main_process_that_exits_is_noticed(container_hostd: HostdProcess) -> None:
    async with open_hostd(str(container_hostd.socket_path), client_name="test") as client:
        info = await provision(client, "short", image=BUSYBOX_IMAGE, command=["sh", "-c", "sleep 1; exit 5"])
        with trio.fail_after(30):
            while (
                got := (await client.call(m.InstanceGetRequest(instance_id=info.instance_id))).instance
            ).state == "running":
                await trio.sleep(0.2)
        assert got.state == "failed" and got.exit_code == 5 and "exited with code 5" in (got.note or "")
        await client.call(m.InstanceDestroyRequest(instance_id=info.instance_id), timeout=60)


async def test_readoption_after_a_hostd_restart_and_strays(tmp_path: Path, podman_storage: PodmanStorage) -> None:
    state = tmp_path / "state"
    namespace = HostdConfig(state_dir=str(state), socket_path="/unused").namespace
    stray = f"stray-{new_id()[:8]}"
    made = podman(
        podman_storage, "create", "--label", f"{LABEL_NAMESPACE}={namespace}", "--name", stray, BUSYBOX_IMAGE, "true"
    )
    assert made.returncode == 0, made.stderr
    proc = start_hostd(state, podman_storage)
    try:
        async with open_hostd(str(proc.socket_path), client_name="test") as client:
            keep = await provision(client, "keep", image=BUSYBOX_IMAGE)
            gone = await provision(client, "gone", image=BUSYBOX_IMAGE)
            idle = await provision(client, "idle", image=BUSYBOX_IMAGE, start=False)
            assert idle.state == "stopped" and idle.container is not None and idle.container.status == "created"
            providers = (await client.call(m.ProviderListRequest())).providers
            assert next(p for p in providers if p.runtime == "container").strays == [stray]
        assert proc.stop() == 0  # stops the podman service it started; containers go on
        assert gone.container is not None
        assert podman(podman_storage, "rm", "-f", gone.container.container_name).returncode == 0

        proc = start_hostd(state, podman_storage)
        async with open_hostd(str(proc.socket_path), client_name="test") as client:
            again = {i.name: i for i in (await client.call(m.InstanceListRequest())).instances}
            assert again["keep"].state == "running" and again["keep"].adopted is True
            assert again["gone"].state == "failed" and "no longer exists" in (again["gone"].note or "")
            assert again["idle"].state == "stopped"
            code, out, _ = await run_exec(client, keep.instance_id, "echo", "still here")
            assert (code, out) == (0, b"still here\n")
            for info in again.values():
                await client.call(m.InstanceDestroyRequest(instance_id=info.instance_id, grace_s=1), timeout=60)
        assert not {keep.container.container_name, idle.container.container_name} & container_names(podman_storage)  # type: ignore[union-attr]
    finally:
        proc.cleanup()
        podman(podman_storage, "rm", "-f", stray)


async def test_podman_unreachable_fails_the_provision_with_the_reason(tmp_path: Path) -> None:
    proc = HostdProcess(tmp_path / "state", env={"AIWG_PODMAN_SOCKET": str(tmp_path / "absent.sock")}).start()
    try:
        async with open_hostd(str(proc.socket_path), client_name="test") as client:
            providers = (await client.call(m.ProviderListRequest())).providers
            info = next(p for p in providers if p.runtime == "container")
            assert not info.available and info.reason is not None and "does not exist" in info.reason
            with pytest.raises(HostdRemoteError) as refused:
                await provision(client, "c1", image=BUSYBOX_IMAGE)
            assert refused.value.code == "provider.unavailable" and "does not exist" in refused.value.message
            assert (await client.call(m.InstanceListRequest())).instances == []
    finally:
        proc.cleanup()


async def test_an_instance_is_readopted_once_podman_answers_again(
    tmp_path: Path, podman_storage: PodmanStorage
) -> None:
    """hostd restarted while podman is away: the instance is failed with the reason, and the watcher
    re-adopts it once podman answers (here: a service the test starts, hostd starting none)."""
    state = tmp_path / "state"
    proc = start_hostd(state, podman_storage)
    service: subprocess.Popen[bytes] | None = None
    try:
        async with open_hostd(str(proc.socket_path), client_name="test") as client:
            info = await provision(client, "away", image=BUSYBOX_IMAGE)
        assert proc.stop() == 0  # its podman service goes with it; the container stays

        env = {**podman_storage.hostd_env(tmp_path / "podman.sock"), "AIWG_PODMAN_SERVICE": "0"}
        proc = HostdProcess(state, env=env).start(timeout=40)
        async with open_hostd(str(proc.socket_path), client_name="test") as client:
            got = (await client.call(m.InstanceGetRequest(instance_id=info.instance_id))).instance
            assert got.state == "failed" and "podman was not reachable" in (got.note or "")
            providers = (await client.call(m.ProviderListRequest())).providers
            assert not next(p for p in providers if p.runtime == "container").available

            service = subprocess.Popen(
                [*podman_storage.argv(), "system", "service", "--time", "0", f"unix://{tmp_path / 'podman.sock'}"],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            with trio.fail_after(30):
                while (
                    got := (await client.call(m.InstanceGetRequest(instance_id=info.instance_id))).instance
                ).state != "running":
                    await trio.sleep(0.2)
            assert got.adopted is True and got.note is None
            assert (await run_exec(client, info.instance_id, "echo", "back"))[1] == b"back\n"
            await client.call(m.InstanceDestroyRequest(instance_id=info.instance_id, grace_s=1), timeout=60)
    finally:
        proc.cleanup()
        if service is not None:
            service.terminate()
            service.wait(10)


def podman_service_pids(hostd: HostdProcess) -> set[int]:
    """Live ``podman system service`` children of hostd (a dead one awaiting its reaping is not)."""
    assert hostd.proc is not None
    pids = set()
    for child in psutil.Process(hostd.proc.pid).children():
        try:
            if child.status() != psutil.STATUS_ZOMBIE and {"system", "service"} <= set(child.cmdline()):
                pids.add(child.pid)
        except psutil.Error:
            pass
    return pids


async def test_the_service_hostd_started_is_started_again_when_it_dies(container_hostd: HostdProcess) -> None:
    [first] = podman_service_pids(container_hostd)
    psutil.Process(first).kill()
    with trio.fail_after(30):
        while not (pids := podman_service_pids(container_hostd) - {first}):
            await trio.sleep(0.2)
    assert len(pids) == 1
    async with open_hostd(str(container_hostd.socket_path), client_name="test") as client:
        # Until the new service answers, a provision is refused with the reason (never run elsewhere).
        with trio.fail_after(30):
            while True:
                try:
                    info = await provision(client, "again", image=BUSYBOX_IMAGE)
                    break
                except HostdRemoteError as exc:
                    assert exc.code == "provider.unavailable", exc
                    await trio.sleep(0.2)
        assert info.state == "running"
        await client.call(m.InstanceDestroyRequest(instance_id=info.instance_id, grace_s=1), timeout=60)
