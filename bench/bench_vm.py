"""VM provision to a console prompt (cold, from a warm pool's saved slot, by fork), and VM
save/restore, through hostd against libvirt alone.

Cases, alternating iteration by iteration (``--iterations``, default 3):

* ``hostd provision->prompt``: ``InstanceProvisionRequest(runtime="vm", start=True)`` (the tiny
  guest of ``scripts/build-guest-image.py``, direct boot), ``SessionCreateRequest`` (the serial
  console) and ``SessionSubscribeRequest``, then ``echo $((N))`` typed every 0.3 s until the
  guest's shell prints the value: the clock stops at the first output that holds it.
* baseline ``virsh create->prompt``: ``virsh create`` of the same domain XML (hostd's domain,
  dumped, renamed, its UUID and metadata dropped), then the console opened with libvirt-python
  from the bench (``virDomainOpenConsole``, read in a thread) and the same typing.
* ``hostd warm pool claim->prompt``: ``PoolClaimRequest`` of a pool of one slot (booted and saved
  beforehand, outside the clock; its refill is stopped while the other cases run), then the same
  console typing: a provision from a saved memory image.
* ``hostd fork->prompt``: ``InstanceForkRequest`` of the running hostd guest (live memory
  snapshot, restamped, restored as a new domain), then the same console typing in the fork.
* ``hostd checkpoint`` / ``hostd restore``: ``CheckpointCreateRequest`` (libvirt save) and
  ``CheckpointRestoreRequest`` of the hostd guest; baseline ``virsh save`` / ``virsh restore``
  of the baseline guest into a file of the bench's.

Needs root and libvirt's QEMU driver answering on ``qemu:///system`` (``virtlogd -d; libvirtd -d``)
and the guest image (``--image-dir``, default hostd's). Software emulation (``--domain-type qemu``)
by default, as on hosts where KVM guests hang. Every domain it made is destroyed before it exits.
"""

from __future__ import annotations

import os
import re
import subprocess
import tempfile
import threading
import time
from pathlib import Path

import trio
from common import Report, Result, compare, emit, latency_result, parser, print_versions, running_hostd

from agentic_sandbox.proto import HostdClient, open_hostd
from agentic_sandbox.proto import messages as m

URI = "qemu:///system"
POOL = "bench-vm"
TYPE_EVERY_S = 0.3
PROMPT_WAIT_S = 180.0


def unavailable() -> str | None:
    """Why this bench cannot run here (None if it can)."""
    if os.geteuid() != 0:
        return "needs root (qemu:///system)"
    try:
        virsh("version")
    except (OSError, subprocess.CalledProcessError):
        return f"libvirt does not answer on {URI} (start virtlogd and libvirtd)"
    return None


def virsh(*args: str) -> str:
    return subprocess.run(["virsh", "-c", URI, *args], check=True, capture_output=True, text=True).stdout


async def hostd_to_prompt(client: HostdClient, iid: str, memory_mib: int, token: int) -> int:
    t0 = time.perf_counter_ns()
    await client.call(
        m.InstanceProvisionRequest(
            instance_id=iid, name=iid, runtime="vm", vm=m.VmSpec(memory_mib=memory_mib), start=True
        ),
        timeout=120,
    )
    return await prompt_since(client, iid, token, t0)


async def claim_to_prompt(client: HostdClient, iid: str, token: int) -> int:
    t0 = time.perf_counter_ns()
    await client.call(m.PoolClaimRequest(pool=POOL, instance_id=iid, name=iid), timeout=120)
    return await prompt_since(client, iid, token, t0)


async def fork_to_prompt(client: HostdClient, source: str, iid: str, token: int) -> int:
    t0 = time.perf_counter_ns()
    await client.call(m.InstanceForkRequest(source_instance_id=source, instance_id=iid, name=iid), timeout=300)
    return await prompt_since(client, iid, token, t0)


async def pool_ready(client: HostdClient, memory_mib: int) -> None:
    """The bench pool holds one saved slot and is making none (outside the clock)."""
    template = m.PoolTemplate(runtime="vm", vm=m.VmSpec(memory_mib=memory_mib))
    await client.call(m.PoolSetRequest(pool=POOL, template=template, size=1))
    with trio.fail_after(PROMPT_WAIT_S * 2):
        while True:
            [pool] = [p for p in (await client.call(m.PoolListRequest())).pools if p.pool == POOL]
            if pool.failures:
                raise RuntimeError(f"the bench pool cannot make a slot: {pool.last_error}")
            if pool.ready == 1 and not pool.filling:
                return
            await trio.sleep(0.2)


async def prompt_since(client: HostdClient, iid: str, token: int, t0: int) -> int:
    """ns from ``t0`` until the console of ``iid`` echoes ``token`` typed into it."""
    sid = (await client.call(m.SessionCreateRequest(instance_id=iid, argv=["console"]))).session.session_id
    expect, out = str(token).encode(), bytearray()
    async with client.stream(m.SessionSubscribeRequest(session_id=sid, from_seq=None)) as events:
        with trio.fail_after(PROMPT_WAIT_S):
            async with trio.open_nursery() as nursery:

                async def typing() -> None:
                    while True:
                        await client.call(m.SessionWriteRequest(session_id=sid, data=f"echo $(({token}))\n".encode()))
                        await trio.sleep(TYPE_EVERY_S)

                nursery.start_soon(typing)
                async for ev in events:
                    if isinstance(ev, m.SessionOutput):
                        out += ev.data
                        if re.search(rb"(?<![\d(])" + expect + rb"\r?\n", out):
                            elapsed = time.perf_counter_ns() - t0
                            nursery.cancel_scope.cancel()
                            break
    await client.call(m.SessionDeleteRequest(session_id=sid))
    return elapsed


def direct_to_prompt(xml_path: Path, name: str, token: int) -> int:
    import libvirt

    t0 = time.perf_counter_ns()
    virsh("create", str(xml_path))
    conn = libvirt.open(URI)
    try:
        dom = conn.lookupByName(name)
        stream = conn.newStream(0)
        dom.openConsole(None, stream, 0)
        out, seen = bytearray(), threading.Event()
        pattern = re.compile(rb"(?<![\d(])" + str(token).encode() + rb"\r?\n")

        def reader() -> None:
            while not seen.is_set():
                data = stream.recv(65536)
                if not data or isinstance(data, int):
                    return
                out.extend(data)
                if pattern.search(out):
                    seen.set()

        threading.Thread(target=reader, daemon=True).start()
        deadline = time.monotonic() + PROMPT_WAIT_S
        while not seen.wait(TYPE_EVERY_S):
            if time.monotonic() > deadline:
                raise TimeoutError("no prompt from the baseline guest")
            stream.send(f"echo $(({token}))\n".encode())
        elapsed = time.perf_counter_ns() - t0
        stream.abort()
        return elapsed
    finally:
        conn.close()


def baseline_xml(hostd_domain: str, name: str, out: Path) -> None:
    """hostd's domain XML with another name and no UUID or metadata: the same machine for virsh."""
    xml = virsh("dumpxml", "--inactive", hostd_domain)
    xml = re.sub(r"<name>[^<]*</name>", f"<name>{name}</name>", xml, count=1)
    xml = re.sub(r"\s*<uuid>[^<]*</uuid>", "", xml, count=1)
    xml = re.sub(r"\s*<metadata>.*?</metadata>", "", xml, count=1, flags=re.S)
    out.write_text(xml)


async def run(args) -> Report:
    env = {"AIWG_LIBVIRT_URI": URI, "AIWG_VM_DOMAIN_TYPE": args.domain_type}
    if args.image_dir:
        env["AIWG_VM_IMAGE_DIR"] = args.image_dir
    keys = ("hostd", "direct", "claim", "fork", "h-save", "d-save", "h-restore", "d-restore")
    samples: dict[str, list[int]] = {k: [] for k in keys}
    sizes: list[int] = []
    work = Path(tempfile.mkdtemp(prefix="aiwg-bench-vm-"))
    os.chmod(work, 0o755)
    base = f"aiwg-bench-direct-{os.getpid()}"
    with running_hostd(env) as hostd:
        async with open_hostd(str(hostd.socket_path)) as client:
            try:
                for i in range(args.iterations):
                    iid = f"bench-vm-{i}"
                    await pool_ready(client, args.memory_mib)
                    samples["claim"].append(await claim_to_prompt(client, f"bench-pooled-{i}", 6000 + i))
                    # No refill while the other cases run: it would boot a VM beside them.
                    template = m.PoolTemplate(runtime="vm", vm=m.VmSpec(memory_mib=args.memory_mib))
                    await client.call(m.PoolSetRequest(pool=POOL, template=template, size=0))
                    await client.call(m.InstanceDestroyRequest(instance_id=f"bench-pooled-{i}", grace_s=0), timeout=60)
                    samples["hostd"].append(await hostd_to_prompt(client, iid, args.memory_mib, 7000 + i))
                    samples["fork"].append(await fork_to_prompt(client, iid, f"bench-fork-{i}", 9000 + i))
                    await client.call(m.InstanceDestroyRequest(instance_id=f"bench-fork-{i}", grace_s=0), timeout=60)
                    info = (await client.call(m.InstanceGetRequest(instance_id=iid))).instance
                    assert info.vm is not None
                    xml = work / "direct.xml"
                    baseline_xml(info.vm.domain, base, xml)
                    samples["direct"].append(await trio.to_thread.run_sync(direct_to_prompt, xml, base, 8000 + i))

                    t0 = time.perf_counter_ns()
                    saved = await client.call(
                        m.CheckpointCreateRequest(instance_id=iid, checkpoint_id=f"cp{i}"), timeout=300
                    )
                    samples["h-save"].append(time.perf_counter_ns() - t0)
                    sizes.append(saved.checkpoint.size_bytes)
                    t0 = time.perf_counter_ns()
                    await trio.to_thread.run_sync(virsh, "save", base, str(work / "direct.save"))
                    samples["d-save"].append(time.perf_counter_ns() - t0)

                    t0 = time.perf_counter_ns()
                    await client.call(
                        m.CheckpointRestoreRequest(checkpoint_id=f"cp{i}", instance_id=iid, name=iid), timeout=300
                    )
                    samples["h-restore"].append(time.perf_counter_ns() - t0)
                    t0 = time.perf_counter_ns()
                    await trio.to_thread.run_sync(virsh, "restore", str(work / "direct.save"))
                    samples["d-restore"].append(time.perf_counter_ns() - t0)

                    await client.call(m.InstanceDestroyRequest(instance_id=iid, grace_s=0), timeout=60)
                    await trio.to_thread.run_sync(virsh, "destroy", base)
                    (work / "direct.save").unlink(missing_ok=True)
            finally:
                subprocess.run(["virsh", "-c", URI, "destroy", base], capture_output=True, check=False)
                await client.call(m.PoolDeleteRequest(pool=POOL))
                with trio.move_on_after(60):
                    while any(c.pool for c in (await client.call(m.CheckpointListRequest())).checkpoints):
                        await trio.sleep(0.2)
                for info in (await client.call(m.InstanceListRequest())).instances:
                    await client.call(m.InstanceDestroyRequest(instance_id=info.instance_id, grace_s=0), timeout=60)
                subprocess.run(["rm", "-rf", str(work)], check=False)

    def row(case: str, key: str, save_mb: float | None = None) -> Result:
        extra = {} if save_mb is None else {"save_mb": save_mb}
        return latency_result(case, samples[key], unit="VMs/s", **extra)

    direct = row("virsh create->prompt", "direct")
    cold = row("hostd provision->prompt", "hostd")
    d_save, d_restore = row("virsh save", "d-save"), row("virsh restore", "d-restore")
    mean_mb = sum(sizes) / len(sizes) / 1e6 if sizes else 0
    return Report(
        bench="bench_vm",
        title="VM to a console prompt (cold, warm pool, fork), and save/restore, through hostd vs libvirt alone",
        vs_of="p50",
        params={"iterations": args.iterations, "memory_mib": args.memory_mib, "domain_type": args.domain_type},
        results=[
            direct,
            compare(cold, direct, "p50"),
            compare(row("hostd warm pool claim->prompt", "claim"), direct, "p50"),
            compare(row("hostd fork->prompt", "fork"), direct, "p50"),
            d_save,
            compare(row("hostd checkpoint", "h-save", save_mb=round(mean_mb, 1)), d_save, "p50"),
            d_restore,
            compare(row("hostd restore", "h-restore"), d_restore, "p50"),
        ],
        targets=[],
        notes=[
            "the warm pool's slot was booted and saved before the clock started (a refill is not timed)",
            "a fork copies the running guest's memory: its console is the source's shell, already at a prompt",
        ],
    )


def main() -> None:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--iterations", type=int, default=3)
    p.add_argument("--memory-mib", type=int, default=192)
    p.add_argument("--domain-type", default="qemu", choices=("qemu", "kvm"))
    p.add_argument("--image-dir", default="", help="guest image directory (default: hostd's AIWG_VM_IMAGE_DIR)")
    args = p.parse_args()
    if args.versions:
        print_versions()
        return
    reason = unavailable()
    if reason is not None:
        print(f"bench_vm: skipped: {reason}")
        return
    emit(trio.run(run, args), as_json=args.json)


if __name__ == "__main__":
    main()
