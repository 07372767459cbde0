"""Warm pools and forks of real podman containers, through a real hostd (which starts its own podman
service on storage holding the busybox image): slots run ahead of time, a claim renames one into
the new instance with its identity, the pool refills, a fork copies a container's files into a new
container, and a hostd killed while a slot is being made leaves nothing behind."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
import trio

from agentic_sandbox.hostd.config import HostdConfig
from agentic_sandbox.hostd.providers.podman.labels import LABEL_NAMESPACE
from agentic_sandbox.proto import HostdClient, HostdRemoteError, new_id, open_hostd
from agentic_sandbox.proto import messages as m
from tests.hostd.providers.podman.test_provider import container_names, podman, run_exec
from tests.hostd_process import HostdProcess
from tests.podman_service import BUSYBOX_IMAGE, PodmanStorage, start_hostd

#: Above the fork call's own 120 s deadline (see tests/hostd/test_vmguest.py on pytest-timeout and trio).
pytestmark = [pytest.mark.podman, pytest.mark.timeout(240)]

TEMPLATE = m.PoolTemplate(runtime="container", image=BUSYBOX_IMAGE, loadout="busybox")
WAIT_S = 60.0


async def pool(client: HostdClient, name: str) -> m.PoolInfo:
    return next(p for p in (await client.call(m.PoolListRequest())).pools if p.pool == name)


async def until_ready(client: HostdClient, name: str, ready: int) -> m.PoolInfo:
    with trio.fail_after(WAIT_S):
        while (info := await pool(client, name)).ready != ready or info.filling:
            await trio.sleep(0.1)
    return info


async def destroy_all(client: HostdClient) -> None:
    for name in [p.pool for p in (await client.call(m.PoolListRequest())).pools]:
        await client.call(m.PoolDeleteRequest(pool=name))
    with trio.fail_after(WAIT_S):
        while (await client.call(m.InstanceListRequest(pool_slots=True))).instances != (
            await client.call(m.InstanceListRequest())
        ).instances:
            await trio.sleep(0.1)
    for info in (await client.call(m.InstanceListRequest())).instances:
        await client.call(m.InstanceDestroyRequest(instance_id=info.instance_id, grace_s=0), timeout=60)


async def test_a_claim_takes_a_running_slot_as_the_new_instance_and_the_pool_refills(
    container_hostd: HostdProcess, podman_storage: PodmanStorage
) -> None:
    async with open_hostd(str(container_hostd.socket_path), client_name="test") as client:
        providers = (await client.call(m.ProviderListRequest())).providers
        assert "warm_pool.manage" in next(p for p in providers if p.runtime == "container").capabilities
        set_reply = await client.call(m.PoolSetRequest(pool="busybox", template=TEMPLATE, size=2))
        assert (set_reply.pool.runtime, set_reply.pool.provider) == ("container", "podman")
        info = await until_ready(client, "busybox", 2)
        assert (info.refills, info.hits, info.misses) == (2, 0, 0)
        # Slots are nobody's instances: a plain listing leaves them out, and nothing runs in one.
        assert (await client.call(m.InstanceListRequest())).instances == []
        slots = (await client.call(m.InstanceListRequest(pool_slots=True))).instances
        assert [s.pool for s in slots] == ["busybox", "busybox"] and all(s.state == "running" for s in slots)
        with pytest.raises(HostdRemoteError) as refused:
            await client.call(m.ExecStartRequest(instance_id=slots[0].instance_id, argv=["true"]))
        assert refused.value.code == "instance.invalid_state" and "claim it first" in refused.value.message

        iid = new_id()
        claimed = (
            await client.call(m.PoolClaimRequest(pool="busybox", instance_id=iid, name="tenant", labels={"t": "1"}))
        ).instance
        assert (claimed.instance_id, claimed.name, claimed.labels, claimed.state) == (
            iid,
            "tenant",
            {"t": "1"},
            "running",
        )
        assert (claimed.launched_from, claimed.pool, claimed.loadout) == ("warm_pool:busybox", None, "busybox")
        assert claimed.container is not None and claimed.container.container_name == f"aiwg-{iid}"
        assert claimed.container.container_name in container_names(podman_storage)  # renamed in podman
        oldest = min(slots, key=lambda s: s.created_at)
        assert claimed.container.container_id == oldest.container.container_id  # type: ignore[union-attr]
        assert Path(claimed.instance_dir).name == iid and Path(claimed.instance_dir).is_dir()
        # Every process hostd starts in it has the new identity (the container's env names the slot).
        code, out, _ = await run_exec(client, iid, "sh", "-c", "echo $AIWG_INSTANCE_ID $AGENT_ID $AGENT_LOADOUT")
        assert (code, out) == (0, f"{iid} container-{iid} busybox\n".encode())
        assert [i.instance_id for i in (await client.call(m.InstanceListRequest())).instances] == [iid]

        info = await until_ready(client, "busybox", 2)
        assert (info.hits, info.refills) == (1, 3)
        # A claimed slot is an instance like any: no stray, and it stops and is destroyed as one.
        providers = (await client.call(m.ProviderListRequest())).providers
        assert next(p for p in providers if p.runtime == "container").strays == []
        # A container someone runs from a commit of it carries its labels (a slot's, an instance's):
        # hostd takes it for neither, and leaves it alone (a stray, reported).
        assert podman(podman_storage, "commit", "-q", f"aiwg-{iid}", "localhost/copied:1").returncode == 0
        limits = ["--ulimit", "nofile=4096:4096", "--ulimit", "nproc=4096:4096"]  # DESIGN.md §6
        ran = podman(podman_storage, "run", "-d", "--name", "copied", *limits, "localhost/copied:1")
        assert ran.returncode == 0, ran.stderr
        try:
            with trio.fail_after(WAIT_S):
                while (
                    "copied"
                    not in next(
                        p for p in (await client.call(m.ProviderListRequest())).providers if p.runtime == "container"
                    ).strays
                ):
                    await trio.sleep(0.2)
            again = (await client.call(m.InstanceGetRequest(instance_id=iid))).instance
            assert again.container is not None and again.container.container_id == claimed.container.container_id
            assert (await run_exec(client, iid, "true"))[0] == 0
            assert "copied" in container_names(podman_storage)  # not taken for an unclaimed slot
        finally:
            podman(podman_storage, "rm", "-f", "-t", "0", "copied")
            podman(podman_storage, "rmi", "-f", "localhost/copied:1")
        await client.call(m.InstanceDestroyRequest(instance_id=iid, grace_s=0), timeout=60)
        assert f"aiwg-{iid}" not in container_names(podman_storage)

        await client.call(m.PoolSetRequest(pool="busybox", template=TEMPLATE, size=0))
        with trio.fail_after(WAIT_S):
            while (await client.call(m.InstanceListRequest(pool_slots=True))).instances:
                await trio.sleep(0.1)
        with pytest.raises(HostdRemoteError) as empty:
            await client.call(m.PoolClaimRequest(pool="busybox", instance_id=new_id(), name="late"))
        assert empty.value.code == "pool.empty"
        assert (await pool(client, "busybox")).misses == 1
        await destroy_all(client)


async def test_a_fork_copies_the_files_not_the_processes_and_takes_its_image_along(
    container_hostd: HostdProcess, podman_storage: PodmanStorage
) -> None:
    async with open_hostd(str(container_hostd.socket_path), client_name="test") as client:
        # The main process notes each start of it in a file: a fork has the file, and starts anew.
        main = ["sh", "-c", "echo boot >> /boots; trap 'exit 0' TERM; while :; do sleep 1; done"]
        req = m.InstanceProvisionRequest(
            instance_id=new_id(), name="src", runtime="container", image=BUSYBOX_IMAGE, command=main
        )
        source = (await client.call(req, timeout=60)).instance
        assert "instance.fork" in source.capabilities
        assert (await run_exec(client, source.instance_id, "sh", "-c", "echo a-file > /note"))[0] == 0
        fid = new_id()
        fork = (
            await client.call(
                m.InstanceForkRequest(source_instance_id=source.instance_id, instance_id=fid, name="fork"), timeout=120
            )
        ).instance
        assert (fork.state, fork.launched_from, fork.runtime) == ("running", f"fork:{source.instance_id}", "container")
        assert fork.container is not None and fork.container.owned_image is not None
        assert fork.container.image == f"localhost/aiwg-fork:{fid}"
        code, out, _ = await run_exec(client, fid, "sh", "-c", "cat /note /boots; echo $AIWG_INSTANCE_ID")
        assert (code, out) == (0, f"a-file\nboot\nboot\n{fid}\n".encode())
        # The source goes on as it was.
        code, out, _ = await run_exec(client, source.instance_id, "sh", "-c", "cat /note /boots")
        assert (code, out) == (0, b"a-file\nboot\n")
        images = podman(podman_storage, "images", "--format", "{{.Repository}}:{{.Tag}}").stdout
        assert f"localhost/aiwg-fork:{fid}" in images
        await client.call(m.InstanceDestroyRequest(instance_id=fid, grace_s=0), timeout=60)
        images = podman(podman_storage, "images", "--format", "{{.Repository}}:{{.Tag}}").stdout
        assert "aiwg-fork" not in images  # the fork's image went with it
        await client.call(m.InstanceStopRequest(instance_id=source.instance_id, grace_s=0), timeout=60)
        with pytest.raises(HostdRemoteError) as stopped:
            await client.call(
                m.InstanceForkRequest(source_instance_id=source.instance_id, instance_id=new_id(), name="x"), timeout=60
            )
        assert stopped.value.code == "instance.invalid_state"
        assert len((await client.call(m.InstanceListRequest())).instances) == 1  # nothing made for the refusal
        await destroy_all(client)


async def test_a_hostd_killed_while_filling_a_pool_loses_and_leaks_nothing(
    tmp_path: Path, podman_storage: PodmanStorage
) -> None:
    state = tmp_path / "state"
    proc = start_hostd(state, podman_storage)
    try:
        async with open_hostd(str(proc.socket_path), client_name="test") as client:
            await client.call(m.PoolSetRequest(pool="busybox", template=TEMPLATE, size=3))
            with trio.fail_after(WAIT_S):
                while not ((info := await pool(client, "busybox")).ready >= 1 and info.filling):
                    await trio.sleep(0.02)
            claimed = (
                await client.call(m.PoolClaimRequest(pool="busybox", instance_id=new_id(), name="kept"))
            ).instance
            before = await pool(client, "busybox")
        proc.proc.send_signal(signal.SIGKILL)  # type: ignore[union-attr]  # a crash, mid-fill
        proc.proc.wait(10)  # type: ignore[union-attr]

        proc = start_hostd(state, podman_storage)
        async with open_hostd(str(proc.socket_path), client_name="test") as client:
            info = await until_ready(client, "busybox", 3)
            assert info.hits == before.hits == 1
            slots = [i for i in (await client.call(m.InstanceListRequest(pool_slots=True))).instances if i.pool]
            assert len(slots) == 3
            assert [i.instance_id for i in (await client.call(m.InstanceListRequest())).instances] == [
                claimed.instance_id
            ]
            # Every container of this hostd is a slot or the claimed instance: the half-made one is gone.
            wanted = {i.container.container_name for i in [*slots, claimed] if i.container}
            with trio.fail_after(WAIT_S):
                while (ours := hostd_containers(podman_storage, state)) != wanted:
                    await trio.sleep(0.2)
            assert ours == wanted
            providers = (await client.call(m.ProviderListRequest())).providers
            assert next(p for p in providers if p.runtime == "container").strays == []
            await destroy_all(client)
        assert hostd_containers(podman_storage, state) == set()
    finally:
        proc.cleanup()


def hostd_containers(storage: PodmanStorage, state: Path) -> set[str]:
    """The containers labelled with the namespace of the hostd whose state dir is ``state``."""
    namespace = HostdConfig(state_dir=str(state), socket_path="/unused").namespace
    listed = podman(storage, "ps", "-a", "--filter", f"label={LABEL_NAMESPACE}={namespace}", "--format", "{{.Names}}")
    return set(listed.stdout.split())
