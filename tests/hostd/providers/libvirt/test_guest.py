"""Real QEMU VMs through a real hostd: the serial console as a PTY session, execs through
qemu-guest-agent, checkpoints, forks, a warm pool of saved VMs, and re-adoption after a hostd
restart (``console``, ``guestexec`` and ``provider`` of ``hostd.providers.libvirt``, on
``qemu:///system``).

One VM (the tiny guest of ``scripts/build-guest-image.py``, software emulation) is booted for the
whole module and shared by its tests, in file order; the fork runs beside it for one test, the
warm pool boots one more; the last test powers the shared one off. Needs root and libvirt (started
by the fixture when nothing answers); skips otherwise.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import trio

from agentic_sandbox.hostd.providers.libvirt.guestexec import AGENT_TIMEOUT_S
from agentic_sandbox.proto import HostdClient, open_hostd
from agentic_sandbox.proto import messages as m
from tests.hostd_process import HostdProcess
from tests.processes import alive

IID = "vm-guest"
#: Boot, console and agent waits are generous: software emulation on a loaded machine.
BOOT_WAIT_S = 120.0
RESEND_S = 3.0
#: pytest-timeout's limit per test here, above the sum of a test's own waits: a test that runs out
#: of time fails with its own TooSlowError. pytest-timeout interrupts trio.run from a signal
#: handler, which leaves trio's run state behind and fails every later test of the session.
pytestmark = pytest.mark.timeout(3 * BOOT_WAIT_S + 60)


class Guest:
    def __init__(self, proc: HostdProcess) -> None:
        self.proc = proc


@pytest.fixture(scope="module")
def guest(tmp_path_factory: pytest.TempPathFactory, libvirt_system: str, guest_image: Path) -> Iterator[Guest]:
    state = tmp_path_factory.mktemp("vmguest") / "state"
    proc = HostdProcess(state, env={"AIWG_LIBVIRT_URI": libvirt_system, "AIWG_VM_IMAGE_DIR": str(guest_image)}).start()

    async def provision() -> None:
        async with open_hostd(proc.socket_path) as client:
            await client.call(
                m.InstanceProvisionRequest(instance_id=IID, name="guest", runtime="vm", vm=m.VmSpec(memory_mib=128)),
                timeout=60,
            )

    async def destroy() -> None:
        async with open_hostd(proc.socket_path) as client:
            await client.call(m.InstanceDestroyRequest(instance_id=IID, grace_s=0.5), timeout=60)

    try:
        trio.run(provision)
        yield Guest(proc)
        trio.run(destroy)
    finally:
        proc.stop()
        proc.cleanup()


async def console_until(client: HostdClient, sid: str, line: bytes, expect: bytes) -> bytes:
    """Type ``line`` on the console every few seconds until ``expect`` shows (the guest may be booting)."""
    out = bytearray()
    async with client.stream(m.SessionSubscribeRequest(session_id=sid, from_seq=None)) as events:
        try:
            with trio.fail_after(BOOT_WAIT_S):
                async with trio.open_nursery() as nursery:

                    async def typing() -> None:
                        while True:
                            await client.call(m.SessionWriteRequest(session_id=sid, data=line))
                            await trio.sleep(RESEND_S)

                    nursery.start_soon(typing)
                    async for ev in events:
                        if isinstance(ev, m.SessionOutput):
                            out += ev.data
                            if expect in out:
                                nursery.cancel_scope.cancel()
                                break
        except trio.TooSlowError:
            # Say what the console did show: a guest that printed nothing is not one that is stuck
            # at a prompt, nor one whose console is held elsewhere.
            shown = bytes(out[-2000:])
            raise AssertionError(f"no {expect!r} on the console in {BOOT_WAIT_S:.0f} s; it showed {shown!r}") from None
    return bytes(out)


async def run_exec(client: HostdClient, argv: list[str], iid: str = IID) -> tuple[int | None, bytes, bytes]:
    started = await client.call(m.ExecStartRequest(instance_id=iid, argv=argv, timeout_s=BOOT_WAIT_S))
    out, err = bytearray(), bytearray()
    code = None
    async with client.stream(m.ExecSubscribeRequest(exec_id=started.exec.exec_id)) as events:
        async for ev in events:
            if isinstance(ev, m.ExecOutput):
                (out if ev.stream == "stdout" else err).extend(ev.data)
            elif isinstance(ev, m.ExecExited):
                code = ev.exit_code
    return code, bytes(out), bytes(err)


# ---------------------------------------------------------------------------------------------


async def test_vm_is_running_with_console_and_exec(guest: Guest) -> None:
    async with open_hostd(guest.proc.socket_path) as client:
        info = (await client.call(m.InstanceGetRequest(instance_id=IID))).instance
        providers = (await client.call(m.ProviderListRequest())).providers
    assert (info.state, info.runtime, info.provider) == ("running", "vm", "libvirt")
    assert info.vm is not None and info.vm.domain_type == "qemu" and info.vm.uri == "qemu:///system"
    assert {"session.pty", "exec"} <= set(info.capabilities)
    vm = next(p for p in providers if p.runtime == "vm")
    assert vm.available and "session.pty" in vm.capabilities


async def test_console_session_answers_typed_commands_and_replays(guest: Guest) -> None:
    async with open_hostd(guest.proc.socket_path) as client:
        created = await client.call(m.SessionCreateRequest(instance_id=IID, argv=["console"]))
        sid = created.session.session_id
        out = await console_until(client, sid, b"echo $((40+2))-ok\n", b"42-ok")
        assert b"42-ok" in out
        # Everything the console printed is in the session's ring: a new subscriber replays it.
        replayed = bytearray()
        async with client.stream(m.SessionSubscribeRequest(session_id=sid, from_seq=1)) as events:
            async for ev in events:
                if isinstance(ev, m.SessionOutput):
                    replayed += ev.data
                    if b"42-ok" in replayed:
                        break
        assert b"42-ok" in replayed
        # One console per domain: a second session cannot take it while the first holds it.
        second = await client.call(m.SessionCreateRequest(instance_id=IID, argv=["console"]))
        with trio.fail_after(30):
            while (await client.call(m.SessionGetRequest(session_id=second.session.session_id))).session.state == (
                "running"
            ):
                await trio.sleep(0.1)
        # Killing a console session ends its relay, not the VM.
        killed = (await client.call(m.SessionKillRequest(session_id=sid, grace_s=1))).session
        assert killed.state == "exited" and not alive({killed.pid})
        info = (await client.call(m.InstanceGetRequest(instance_id=IID))).instance
        assert info.state == "running"
        # The console is free again for the next session, which answers too.
        again = await client.call(m.SessionCreateRequest(instance_id=IID, argv=["console"]))
        out = await console_until(client, again.session.session_id, b"uname -n\n", b"aiwg-vm")
        assert b"aiwg-vm" in out
        for s in (sid, second.session.session_id, again.session.session_id):
            await client.call(m.SessionDeleteRequest(session_id=s))


async def test_exec_runs_in_the_guest_with_its_exit_code(guest: Guest) -> None:
    async with open_hostd(guest.proc.socket_path) as client:
        code, out, err = await run_exec(client, ["/bin/uname", "-r"])
        assert (code, err) == (0, b"")
        assert out.strip().endswith(b"cloud-amd64")
        code, out, err = await run_exec(client, ["/bin/sh", "-c", "echo to-out; echo to-err >&2; exit 3"])
        assert (code, out, err) == (3, b"to-out\n", b"to-err\n")
        started = await client.call(
            m.ExecStartRequest(instance_id=IID, argv=["/bin/sh", "-c", 'echo "$GREETING from $PWD"'], cwd="/proc",
                               env={"GREETING": "hello"})
        )  # fmt: skip
        async with client.stream(m.ExecSubscribeRequest(exec_id=started.exec.exec_id)) as events:
            out = b"".join([ev.data async for ev in events if isinstance(ev, m.ExecOutput)])
        assert out == b"hello from /proc\n"
        code, out, err = await run_exec(client, ["/no/such/program"])
        assert code == 125 and b"guest-exec of '/no/such/program' failed" in err


async def test_an_exec_in_the_guest_has_a_control_channel_through_the_agent_channel(guest: Guest) -> None:
    # A busybox shell agent on fd 3, as the guest's helper hands it over (the guest has no Python).
    script = (
        'echo "fd=$AIWG_CONTROL_FD"; echo \'{"type": "hello", "version": 2}\' >&3; '
        'read -r line <&3; echo "got $line"; echo \'{"type": "bye"}\' >&3'
    )
    async with open_hostd(guest.proc.socket_path) as client:
        info = (await client.call(m.InstanceGetRequest(instance_id=IID))).instance
        assert info.vm is not None and info.vm.agent_channel and "exec.control" in info.capabilities
        started = await client.call(
            m.ExecStartRequest(
                instance_id=IID, argv=["/bin/sh", "-c", script], control=True, control_flow=True, timeout_s=BOOT_WAIT_S
            )
        )
        exec_id = started.exec.exec_id
        messages, out, code = [], bytearray(), None
        with trio.fail_after(BOOT_WAIT_S):
            async with client.stream(m.ExecSubscribeRequest(exec_id=exec_id, from_seq=1)) as events:
                async for ev in events:
                    if isinstance(ev, m.ExecControlMessage):
                        messages.append(ev.message)
                        if ev.message.get("type") == "hello":
                            await client.call(
                                m.ExecControlSendRequest(exec_id=exec_id, message={"type": "task", "n": 1})
                            )
                    elif isinstance(ev, m.ExecOutput) and ev.stream == "stdout":
                        out += ev.data
                    elif isinstance(ev, m.ExecExited):
                        code = ev.exit_code
        assert messages == [{"type": "hello", "version": 2}, {"type": "bye"}], (bytes(out), code)
        assert (code, bytes(out)) == (0, b'fd=3\ngot {"type":"task","n":1}\n')
        # Without asking for a channel the agent runs as before: no fd 3, no helper in between.
        code, out, _err = await run_exec(client, ["/bin/sh", "-c", 'echo "fd=${AIWG_CONTROL_FD:-none}"'])
        assert (code, out) == (0, b"fd=none\n")


async def test_checkpoint_and_restore_keep_the_guest_memory(guest: Guest) -> None:
    async with open_hostd(guest.proc.socket_path) as client:
        code, _out, _err = await run_exec(client, ["/bin/sh", "-c", "echo before-save > /tmp/marker"])
        assert code == 0
        saved = (
            await client.call(m.CheckpointCreateRequest(instance_id=IID, checkpoint_id="cp-guest"), timeout=120)
        ).checkpoint
        assert saved.size_bytes > 0 and saved.domain is not None
        listed = (await client.call(m.InstanceListRequest())).instances
        assert IID not in [i.instance_id for i in listed]  # retired into the checkpoint
        # Restored (as the same id here, so the tests after this one find it) with its memory: the
        # file written before the save is there (the guest's / is a tmpfs initramfs).
        restored = (
            await client.call(
                m.CheckpointRestoreRequest(checkpoint_id="cp-guest", instance_id=IID, name="guest"), timeout=120
            )
        ).instance
        assert restored.state == "running" and restored.vm is not None and restored.vm.uuid == saved.uuid
        code, out, _err = await run_exec(client, ["/bin/cat", "/tmp/marker"])
        assert (code, out) == (0, b"before-save\n")
        assert (await client.call(m.CheckpointListRequest())).checkpoints == []


async def test_a_parked_exec_lives_through_a_sleeping_guest_and_gets_its_answer(guest: Guest) -> None:
    """A task's agent in the guest waits for an answer (its exec parked): the VM may sleep under it,
    frozen or saved to disk, and the answer wakes the VM and reaches the agent. The exec's status
    poll waits out the sleep (it ended 125 once a sleep outlasted one agent call, 10 s), and the
    agent channel's relay outlives the new QEMU of a restore."""
    script = 'echo \'{"type": "hello", "version": 2}\' >&3; read -r line <&3; echo "got $line"'
    async with open_hostd(guest.proc.socket_path) as client:
        for how in ("freeze", "save"):
            started = await client.call(
                m.ExecStartRequest(
                    instance_id=IID,
                    argv=["/bin/sh", "-c", script],
                    control=True,
                    control_flow=True,
                    timeout_s=BOOT_WAIT_S,
                )
            )
            exec_id = started.exec.exec_id
            out, code = bytearray(), None
            with trio.fail_after(BOOT_WAIT_S):
                async with client.stream(m.ExecSubscribeRequest(exec_id=exec_id, from_seq=1)) as events:
                    async for ev in events:
                        if isinstance(ev, m.ExecControlMessage) and ev.message.get("type") == "hello":
                            await client.call(m.InstanceActivityRequest(parked_execs=[exec_id]))
                            sleep = m.InstanceSleepRequest(instance_id=IID, how=how)
                            assert (await client.call(sleep, timeout=120)).instance.state == "sleeping"
                            await trio.sleep(AGENT_TIMEOUT_S + 2)  # longer than one agent call may wait
                            state = (await client.call(m.ExecGetRequest(exec_id=exec_id))).exec.state
                            assert state == "running", how
                            answer = m.ExecControlSendRequest(exec_id=exec_id, message={"type": "task"})
                            await client.call(answer, timeout=120)
                        elif isinstance(ev, m.ExecOutput) and ev.stream == "stdout":
                            out += ev.data
                        elif isinstance(ev, m.ExecExited):
                            code = ev.exit_code
            assert (code, bytes(out)) == (0, b'got {"type":"task"}\n'), how
            info = (await client.call(m.InstanceGetRequest(instance_id=IID))).instance
            assert info.state == "running" and info.last_wake is not None
            assert (info.last_wake.cause, info.last_wake.how) == ("exec.control", how)


def qemu_of(domain_name: str) -> list[int]:
    """The QEMU processes running the domain (found by its name on their command line)."""
    import psutil

    found = []
    for proc in psutil.process_iter(["cmdline"]):
        cmdline = proc.info["cmdline"] or []
        if any("qemu" in part for part in cmdline[:1]) and any(domain_name in part for part in cmdline):
            found.append(proc.pid)
    return found


async def test_a_sleeping_guest_wakes_for_an_exec_frozen_or_saved_with_its_memory(guest: Guest) -> None:
    async with open_hostd(guest.proc.socket_path) as client:
        code, _out, _err = await run_exec(client, ["/bin/sh", "-c", "echo before-sleep > /tmp/asleep"])
        assert code == 0
        info = (await client.call(m.InstanceGetRequest(instance_id=IID))).instance
        assert info.vm is not None and qemu_of(info.vm.domain)
        console = (await client.call(m.SessionCreateRequest(instance_id=IID, argv=["console"]))).session.session_id
        await console_until(client, console, b"echo up\n", b"up")
        for how in ("freeze", "save"):
            # The console's follower closed a moment ago: an attached terminal would keep it awake.
            with trio.fail_after(10):
                while (await client.call(m.SessionGetRequest(session_id=console))).session.subscribers:
                    await trio.sleep(0.05)
            info = (await client.call(m.InstanceSleepRequest(instance_id=IID, how=how), timeout=120)).instance
            assert info.state == "sleeping" and info.sleep is not None and info.sleep.how == how
            assert info.vm is not None
            if how == "save":
                assert qemu_of(info.vm.domain) == []  # its memory is on disk, QEMU is gone
            # An exec sent to the sleeping guest wakes it and runs, the guest's memory as it was.
            code, out, _err = await run_exec(client, ["/bin/cat", "/tmp/asleep"])
            assert (code, out) == (0, b"before-sleep\n")
            info = (await client.call(m.InstanceGetRequest(instance_id=IID))).instance
            assert info.state == "running" and info.last_wake is not None
            assert (info.last_wake.cause, info.last_wake.how) == ("exec", how)
            session = (await client.call(m.SessionGetRequest(session_id=console))).session
            if how == "freeze":  # the console lives through a suspend and answers after it
                assert session.state == "running"
                await console_until(client, console, b"echo awake-$((6*7))\n", b"awake-42")
            else:  # after a save the console it held is gone with its QEMU: it ended
                assert session.state == "exited"
        await client.call(m.SessionDeleteRequest(session_id=console))


async def test_a_fork_runs_beside_its_source_with_a_copy_of_its_memory(guest: Guest) -> None:
    import libvirt

    async with open_hostd(guest.proc.socket_path) as client:
        source = (await client.call(m.InstanceGetRequest(instance_id=IID))).instance
        assert "instance.fork" in source.capabilities
        assert (await run_exec(client, ["/bin/sh", "-c", "echo before-fork > /tmp/fork-marker"]))[0] == 0
        fork = (
            await client.call(
                m.InstanceForkRequest(source_instance_id=IID, instance_id="vm-fork", name="fork"), timeout=180
            )
        ).instance
        try:
            assert (fork.state, fork.launched_from) == ("running", f"fork:{IID}")
            assert fork.vm is not None and source.vm is not None
            assert fork.vm.uuid != source.vm.uuid and fork.vm.domain != source.vm.domain
            # The source never stopped: what it writes now is its own.
            assert (await run_exec(client, ["/bin/sh", "-c", "echo after-fork >> /tmp/fork-marker"]))[0] == 0
            code, out, _ = await run_exec(client, ["/bin/cat", "/tmp/fork-marker"], iid="vm-fork")
            assert (code, out) == (0, b"before-fork\n")  # the memory as it was at the fork
            code, out, _ = await run_exec(client, ["/bin/cat", "/tmp/fork-marker"])
            assert (code, out) == (0, b"before-fork\nafter-fork\n")
            conn = libvirt.open("qemu:///system")
            try:
                dom = conn.lookupByUUIDString(fork.vm.uuid)
                assert dom.isActive() and dom.isPersistent() and dom.name() == fork.vm.domain
            finally:
                conn.close()
            assert (await client.call(m.InstanceGetRequest(instance_id=IID))).instance.state == "running"
        finally:
            await client.call(m.InstanceDestroyRequest(instance_id="vm-fork", grace_s=0.5), timeout=60)


async def test_a_warm_pool_hands_out_a_saved_vm_that_answers_at_once(guest: Guest) -> None:
    """One slot: booted until its agent answers, saved; the claim restores it as the new instance."""
    template = m.PoolTemplate(runtime="vm", vm=m.VmSpec(memory_mib=128), loadout="tiny-vm")
    async with open_hostd(guest.proc.socket_path) as client:
        await client.call(m.PoolSetRequest(pool="vms", template=template, size=1))
        with trio.fail_after(BOOT_WAIT_S * 2):
            while (pool := (await client.call(m.PoolListRequest())).pools[0]).ready < 1:
                assert pool.failures == 0, pool.last_error
                await trio.sleep(0.5)
        slot = next(c for c in (await client.call(m.CheckpointListRequest())).checkpoints if c.pool == "vms")
        claimed = (
            await client.call(m.PoolClaimRequest(pool="vms", instance_id="vm-pooled", name="pooled"), timeout=120)
        ).instance
        try:
            assert (claimed.state, claimed.launched_from) == ("running", "warm_pool:vms")
            assert claimed.vm is not None and claimed.vm.uuid == slot.uuid
            # Restored booted: the agent answers without waiting for a boot.
            with trio.fail_after(30):
                code, out, _ = await run_exec(client, ["/bin/cat", "/proc/sys/kernel/hostname"], iid="vm-pooled")
            assert (code, out) == (0, b"aiwg-vm\n")
        finally:
            # Deleting the pool stops its refill (a boot under way) and removes what it made.
            await client.call(m.PoolDeleteRequest(pool="vms"))
            await client.call(m.InstanceDestroyRequest(instance_id="vm-pooled", grace_s=0.5), timeout=60)
        with trio.fail_after(60):
            while (await client.call(m.InstanceListRequest(pool_slots=True))).instances != [
                (await client.call(m.InstanceGetRequest(instance_id=IID))).instance
            ]:
                await trio.sleep(0.2)


async def test_vm_is_readopted_after_a_hostd_restart(guest: Guest) -> None:
    async with open_hostd(guest.proc.socket_path) as client:
        before = (await client.call(m.InstanceGetRequest(instance_id=IID))).instance
    guest.proc.stop()
    guest.proc.start()
    async with open_hostd(guest.proc.socket_path) as client:
        after = (await client.call(m.InstanceGetRequest(instance_id=IID))).instance
        assert (after.state, after.adopted) == ("running", True)
        assert after.vm is not None and before.vm is not None and after.vm.uuid == before.vm.uuid
        code, out, _err = await run_exec(client, ["/bin/cat", "/proc/sys/kernel/hostname"])
        assert (code, out) == (0, b"aiwg-vm\n")


async def test_guest_powering_off_ends_its_console_session_and_stops_the_instance(guest: Guest) -> None:
    """Last: it turns the shared guest off (behind hostd's back, as a guest's own poweroff would)."""
    import libvirt

    async with open_hostd(guest.proc.socket_path) as client:
        info = (await client.call(m.InstanceGetRequest(instance_id=IID))).instance
        sid = (await client.call(m.SessionCreateRequest(instance_id=IID, argv=["console"]))).session.session_id
        await console_until(client, sid, b"echo $((6*7))\n", b"42")
        assert info.vm is not None and info.vm.uuid
        conn = libvirt.open("qemu:///system")
        try:
            conn.lookupByUUIDString(info.vm.uuid).destroy()
        finally:
            conn.close()
        with trio.fail_after(30):
            while (s := (await client.call(m.SessionGetRequest(session_id=sid))).session).state == "running":
                await trio.sleep(0.1)
        assert (s.exit_code, s.end_reason) == (0, "exited")
        with trio.fail_after(30):
            while (info := (await client.call(m.InstanceGetRequest(instance_id=IID))).instance).state == "running":
                await trio.sleep(0.1)
        assert info.state == "stopped" and "shut off by itself" in (info.note or "")
