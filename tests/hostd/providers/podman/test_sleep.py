"""Sleep and wake of container instances (hostd/providers/podman/provider.py: ``podman pause``) for
real, through a hostd process with its own podman service: a frozen PTY loop that makes no progress
and picks up where it was, wakes by an operator and by an exec, the refusals (busy, stopped, ``save``),
a container paused behind hostd's back, and a hostd restart while instances sleep."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import trio

from agentic_sandbox.proto import HostdClient, HostdRemoteError, open_hostd
from agentic_sandbox.proto import messages as m
from tests.hostd.providers.podman.test_provider import container_names, podman, provision, read_session, run_exec
from tests.hostd_process import HostdProcess
from tests.podman_service import BUSYBOX_IMAGE, PodmanStorage, start_hostd

pytestmark = pytest.mark.podman

#: Prints a counter every 50 ms, forever.
TICKER = ["sh", "-c", "i=0; while :; do i=$((i+1)); echo tick-$i; sleep 0.05; done"]


def status_of(storage: PodmanStorage, container: str) -> str:
    return podman(storage, "inspect", "--format", "{{.State.Status}}", container).stdout.strip()


def ticks(output: bytes) -> list[int]:
    return [int(n) for n in re.findall(rb"tick-(\d+)\r?\n", output)]


async def get(client: HostdClient, instance_id: str) -> m.InstanceInfo:
    return (await client.call(m.InstanceGetRequest(instance_id=instance_id))).instance


async def sleep_instance(client: HostdClient, instance_id: str, **kw: object) -> m.InstanceInfo:
    return (await client.call(m.InstanceSleepRequest(instance_id=instance_id, **kw), timeout=60)).instance  # type: ignore[arg-type]


async def refused(client: HostdClient, req: m.Request) -> HostdRemoteError:
    with pytest.raises(HostdRemoteError) as caught:
        await client.call(req, timeout=60)
    return caught.value


async def detached(client: HostdClient, sid: str) -> m.SessionInfo:
    """The session, once no terminal is attached to it any more (a closed stream ends a moment later)."""
    with trio.fail_after(10):
        while (session := (await client.call(m.SessionGetRequest(session_id=sid))).session).subscribers:
            await trio.sleep(0.05)
    return session


async def test_a_frozen_container_makes_no_progress_and_wakes_where_it_was(
    container_hostd: HostdProcess, podman_storage: PodmanStorage
) -> None:
    async with open_hostd(str(container_hostd.socket_path), client_name="test") as client:
        providers = (await client.call(m.ProviderListRequest())).providers
        capabilities = next(p for p in providers if p.runtime == "container").capabilities
        assert "instance.sleep.freeze" in capabilities and "instance.sleep.save" not in capabilities
        info = await provision(client, "sleeper", image=BUSYBOX_IMAGE)
        iid, container = info.instance_id, info.container.container_name  # type: ignore[union-attr]
        assert "instance.sleep.freeze" in info.capabilities

        # No CRIU here: a save is refused, naming the provider; the container goes on running.
        save = await refused(client, m.InstanceSleepRequest(instance_id=iid, how="save"))
        assert save.code == "capability.unsupported" and "podman" in save.message
        assert (await get(client, iid)).state == "running"

        # A loop in a PTY session, ticking; the terminal detached, so the instance may sleep.
        sid = (await client.call(m.SessionCreateRequest(instance_id=iid, argv=TICKER))).session.session_id
        await read_session(client, sid, 1, b"tick-3\r\n")
        await detached(client, sid)

        asleep = await sleep_instance(client, iid)
        assert asleep.state == "sleeping" and asleep.sleeps == 1
        assert asleep.sleep is not None and (asleep.sleep.how, asleep.sleep.cause) == ("freeze", "operator")
        assert asleep.container is not None and asleep.container.status == "paused"
        assert status_of(podman_storage, container) == "paused"
        # Frozen: no output after what the PTY held when it froze; asking about it wakes nothing.
        await trio.sleep(0.3)
        frozen_at = (await detached(client, sid)).next_seq
        await trio.sleep(1.0)
        assert (await detached(client, sid)).next_seq == frozen_at
        assert (await get(client, iid)).state == "sleeping"

        woken = await client.call(m.InstanceWakeRequest(instance_id=iid, cause="test"), timeout=60)
        assert woken.woke and woken.instance.state == "running" and woken.instance.sleep is None
        assert woken.instance.wakes == 1 and woken.instance.last_wake is not None
        assert (woken.instance.last_wake.cause, woken.instance.last_wake.how) == ("test", "freeze")
        assert woken.instance.container is not None and woken.instance.container.status == "running"
        assert status_of(podman_storage, container) == "running"
        # The same process goes on from where it froze: every tick once, in order, none lost.
        out = await read_session(client, sid, frozen_at, b"\r\n")
        out = await read_session(client, sid, 1, f"tick-{ticks(out)[-1] + 3}\r\n".encode())
        seen = ticks(out)
        assert seen == list(range(1, len(seen) + 1)), seen
        await client.call(m.SessionKillRequest(session_id=sid, grace_s=1))

        # An exec wakes a sleeping instance and runs as usual.
        assert (await sleep_instance(client, iid)).state == "sleeping"
        assert await run_exec(client, iid, "sh", "-c", "echo awake; exit 3") == (3, b"awake\n", b"")
        after = await get(client, iid)
        assert after.state == "running" and (after.sleeps, after.wakes) == (2, 2)
        assert after.last_wake is not None and after.last_wake.cause == "exec"

        # No sleep while an exec runs.
        ex = (await client.call(m.ExecStartRequest(instance_id=iid, argv=["sleep", "60"]))).exec
        busy = await refused(client, m.InstanceSleepRequest(instance_id=iid))
        assert busy.code == "instance.busy"
        await client.call(m.ExecCancelRequest(exec_id=ex.exec_id, grace_s=1))
        await client.call(m.ExecDeleteRequest(exec_id=ex.exec_id))

        # Paused behind hostd's back: the watcher sees it paused, neither ended nor thawed; a stop
        # still stops it.
        assert podman(podman_storage, "pause", container).returncode == 0
        with trio.fail_after(15):
            while (seen_paused := await get(client, iid)).container.status != "paused":  # type: ignore[union-attr]
                await trio.sleep(0.2)
        assert seen_paused.state == "running" and status_of(podman_storage, container) == "paused"
        stopped = (await client.call(m.InstanceStopRequest(instance_id=iid, grace_s=1), timeout=60)).instance
        assert stopped.state == "stopped" and stopped.container is not None and stopped.container.status == "exited"

        # Only a running instance sleeps.
        not_running = await refused(client, m.InstanceSleepRequest(instance_id=iid))
        assert not_running.code == "instance.invalid_state"
        await client.call(m.InstanceDestroyRequest(instance_id=iid, grace_s=1), timeout=60)
        assert container not in container_names(podman_storage)


async def test_instances_asleep_across_a_hostd_restart(tmp_path: Path, podman_storage: PodmanStorage) -> None:
    """hostd stopped while three instances sleep: one still paused stays asleep (and wakes), one
    unpaused meanwhile runs, one removed meanwhile has failed; the watcher of the new hostd leaves a
    sleeping instance asleep and notices one whose container is removed."""
    state = tmp_path / "state"
    proc = start_hostd(state, podman_storage)
    try:
        async with open_hostd(str(proc.socket_path), client_name="test") as client:
            made = {name: await provision(client, name, image=BUSYBOX_IMAGE) for name in ("asleep", "woken", "gone")}
            for info in made.values():
                assert (await sleep_instance(client, info.instance_id)).state == "sleeping"
        assert proc.stop() == 0  # its podman service goes with it; the paused containers stay
        names = {name: info.container.container_name for name, info in made.items()}  # type: ignore[union-attr]
        assert status_of(podman_storage, names["asleep"]) == "paused"
        assert podman(podman_storage, "unpause", names["woken"]).returncode == 0
        assert podman(podman_storage, "rm", "-f", names["gone"]).returncode == 0

        proc = start_hostd(state, podman_storage)
        async with open_hostd(str(proc.socket_path), client_name="test") as client:
            again = {i.name: i for i in (await client.call(m.InstanceListRequest())).instances}
            asleep, woken, gone = again["asleep"], again["woken"], again["gone"]
            assert asleep.state == "sleeping" and asleep.adopted is True
            assert asleep.sleep is not None and asleep.sleep.how == "freeze" and asleep.sleeps == 1
            assert asleep.container is not None and asleep.container.status == "paused"
            assert woken.state == "running" and woken.sleep is None and woken.adopted is True
            assert gone.state == "failed" and gone.sleep is None and "no longer exists" in (gone.note or "")

            # Removed while asleep, hostd running: the watcher takes it for gone, and in the same
            # round leaves the paused one asleep.
            assert (await sleep_instance(client, woken.instance_id)).state == "sleeping"
            assert podman(podman_storage, "rm", "-f", names["woken"]).returncode == 0
            with trio.fail_after(15):
                while (removed := await get(client, woken.instance_id)).state == "sleeping":
                    await trio.sleep(0.2)
            assert removed.state == "failed" and removed.sleep is None and "no longer exists" in (removed.note or "")
            assert (await get(client, asleep.instance_id)).state == "sleeping"
            assert status_of(podman_storage, names["asleep"]) == "paused"

            reply = await client.call(m.InstanceWakeRequest(instance_id=asleep.instance_id), timeout=60)
            assert reply.woke and reply.instance.state == "running" and reply.instance.wakes == 1
            assert await run_exec(client, asleep.instance_id, "echo", "back") == (0, b"back\n", b"")
            # Destroyed asleep: woken to be ended, then removed.
            assert (await sleep_instance(client, asleep.instance_id)).state == "sleeping"
            for info in again.values():
                await client.call(m.InstanceDestroyRequest(instance_id=info.instance_id, grace_s=1), timeout=60)
        assert not set(names.values()) & container_names(podman_storage)
    finally:
        proc.cleanup()
