"""Instances that sleep when idle and wake on traffic: how long a wake takes, and what a sleeper holds.

One run per runtime (``--runtime host|container|vm|all``), each on a hostd of its own (container:
its own podman service, vfs storage in a temp dir, runc, cgroupfs, the busybox image built there by
``scripts/busybox_image.py``, as ``bench_container.py``; vm: libvirt's ``qemu:///system``, the
built guest image, software emulation by default, as ``bench_vm.py``), talking to hostd over its
socket (``proto.open_hostd``):

* **Wake**: an instance put to sleep (``InstanceSleepRequest``, ``freeze``; for VMs also ``save``,
  libvirt's managed save), then ``ExecStartRequest(["echo", "x"])`` sent, clock stopped at the first
  ``ExecOutput`` byte of an ``ExecSubscribeRequest(from_seq=1)``: the request wakes the instance
  first. p50/p90/max over ``--rounds`` (20 host and container, 5 vm), after ``--warmup`` unmeasured
  rounds, each sleep lasting ``--asleep-s`` (0.2 s). Baseline, same rounds, interleaved: the same
  exec on the instance awake after as long idle (an exec after idle time is slower than one right
  after another, frozen or not: idle CPUs, cold caches; that one is an info row). Beside them
  hostd's own ``last_wake.took_s`` (the provider's thaw alone).
* **Beside**: a cold provision (``InstanceProvisionRequest(start=True)`` -> first byte of the same
  exec) and a warm pool claim (``PoolSetRequest`` of one slot, ready and idle when the clock starts,
  ``PoolClaimRequest`` -> first byte of the exec; refills stopped while measuring), ``--cold`` and
  ``--warm`` times each (5; 2 for VMs, whose cold boot takes seconds).
* **Memory held**, awake and asleep: host: the instance's cgroup ``memory.current`` where the v2
  memory controller is enabled, else the RSS of the processes in its cgroup; its main process holds
  ``--alloc-mib`` (64) MiB it has written. Container: its memory cgroup (``memory.usage_in_bytes``
  on v1, ``memory.current`` on v2; page cache included) and the RSS of its processes; a busybox
  shell holding a ``--alloc-mib`` string. A frozen process keeps its memory: freeze saves CPU, not
  RAM. VM: the RSS of the domain's QEMU process (found by the domain name in its command line)
  awake, frozen (``virDomainSuspend``: the same process) and saved (no QEMU process: 0; the save
  file's size on disk printed).
* Host only (``--a2a``, default on): a blocking A2A ``message:send`` to an ``echo`` loadout
  instance through ``python -m controller.main``, sent -> first byte of the answer, with the
  instance frozen beside the same send to it awake.

Targets (issue 27): a host or container instance wakes under 50 ms p50 (exec sent -> first byte);
a VM from freeze under 100 ms; a VM from save under 0.5x its cold boot; a saved VM holds under 10%
of its awake memory. Reported, never asserted.

Everything started (hostd in a session of its own, so a Ctrl-C at the terminal leaves it serving
for the cleanup; its instances, pool slots, containers, domains and their managed-save images;
the controller; temp dirs) is removed on the way out, also on Ctrl-C or SIGTERM. ``virtlogd`` and
``libvirtd`` are started when nothing answers on ``qemu:///system`` and stopped again if the bench
started them and no domain is left on them.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from contextlib import ExitStack
from pathlib import Path

import httpx
import psutil
import trio
from bench_admin import Controller, admin_client, admin_provision, wait_ready
from bench_container import IMAGE, build_image, podman_env
from common import MIB, Hostd, Report, Result, Target, compare, emit, latency_result, parser, percentile, temp_dir
from common import print_versions as print_library_versions

from agentic_sandbox.proto import ErrorCode, HostdClient, HostdRemoteError, new_id, open_hostd
from agentic_sandbox.proto import messages as m

RUNTIMES = ("host", "container", "vm")
ECHO = ["echo", "x"]
POOL = "bench-sleep"
URI = "qemu:///system"
SAVE_DIR = Path("/var/lib/libvirt/qemu/save")
RUNTIME_EXTENSION = "https://agentic-sandbox.aiwg.io/extensions/runtime/v1"
#: A step that may boot a VM under software emulation.
STEP_TIMEOUT_S = 300.0
LIBVIRT_WAIT_S = 20.0
TARGET_WAKE_MS = {"host": 50.0, "container": 50.0, "vm": 100.0}
TARGET_SAVE_VS_COLD = 0.5
TARGET_SAVED_MEMORY = 0.10


def say(stage: str) -> None:
    print(f"bench_sleep: {stage}...", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------------
# What each runtime's instances are made of


def alloc_command(runtime: str, mib: int) -> list[str] | None:
    """A main process that writes ``mib`` MiB and keeps them (written: untouched pages hold nothing)."""
    if runtime == "host":
        code = f"import time\nb = bytes(range(256)) * ({mib} << 12)\nwhile True: time.sleep(3600)"
        return [sys.executable, "-c", code]
    if runtime == "container":
        script = (
            f"x=$(head -c {mib * MIB} /dev/zero | tr '\\000' x); "
            "trap 'exit 0' TERM INT; while :; do sleep 3600 & wait $!; done"
        )
        return ["/bin/sh", "-c", script]
    return None  # a VM: its memory is the guest's


def provision_request(runtime: str, iid: str, args: argparse.Namespace, *, alloc: bool) -> m.InstanceProvisionRequest:
    command = alloc_command(runtime, args.alloc_mib) if alloc else None
    if runtime == "container":
        return m.InstanceProvisionRequest(
            instance_id=iid, name=iid, runtime="container", image=IMAGE, command=command, start=True
        )
    if runtime == "vm":
        vm = m.VmSpec(memory_mib=args.memory_mib)
        return m.InstanceProvisionRequest(instance_id=iid, name=iid, runtime="vm", vm=vm, start=True)
    return m.InstanceProvisionRequest(instance_id=iid, name=iid, command=command, start=True)


def pool_template(runtime: str, args: argparse.Namespace) -> m.PoolTemplate:
    if runtime == "container":
        return m.PoolTemplate(runtime="container", image=IMAGE)
    if runtime == "vm":
        return m.PoolTemplate(runtime="vm", vm=m.VmSpec(memory_mib=args.memory_mib))
    return m.PoolTemplate(runtime="host")


# ---------------------------------------------------------------------------------------------
# Memory


def _rss(pids: list[int]) -> int:
    total = 0
    for pid in pids:
        with contextlib.suppress(psutil.Error):
            total += psutil.Process(pid).memory_info().rss
    return total


def _cgroup_pids(cgroup: Path) -> list[int]:
    pids: list[int] = []
    for procs in cgroup.rglob("cgroup.procs"):
        with contextlib.suppress(OSError):
            pids += [int(p) for p in procs.read_text().split()]
    return pids


def host_memory(info: m.InstanceInfo) -> dict[str, int]:
    """The host instance's cgroup's memory.current if the memory controller is on there, and the
    RSS of the processes in its cgroup."""
    assert info.host is not None and info.host.cgroup is not None
    cgroup = Path(info.host.cgroup)
    out = {"RSS of its processes": _rss(_cgroup_pids(cgroup))}
    with contextlib.suppress(OSError, ValueError):
        out["cgroup memory.current"] = int((cgroup / "memory.current").read_text())
    return out


def container_memory(info: m.InstanceInfo) -> dict[str, int]:
    """The container's memory cgroup (v1 ``memory.usage_in_bytes`` or v2 ``memory.current``, found
    from its main process) and the RSS of its processes."""
    assert info.container is not None and info.container.pid
    pid = info.container.pid
    out: dict[str, int] = {}
    try:
        main = psutil.Process(pid)
        out["RSS of its processes"] = _rss([pid] + [c.pid for c in main.children(recursive=True)])
    except psutil.Error:
        out["RSS of its processes"] = 0
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
            _, controllers, path = line.split(":", 2)
            rel = path.lstrip("/")
            candidates: list[tuple[str, Path]] = []
            if "memory" in controllers.split(","):
                candidates.append(
                    ("cgroup memory.usage_in_bytes", Path("/sys/fs/cgroup/memory", rel, "memory.usage_in_bytes"))
                )
            elif controllers == "":
                for base in ("/sys/fs/cgroup/unified", "/sys/fs/cgroup"):
                    candidates.append(("cgroup memory.current", Path(base, rel, "memory.current")))
            for name, file in candidates:
                with contextlib.suppress(OSError, ValueError):
                    out[name] = int(file.read_text())
                    break
    return out


def qemu_process(domain: str) -> psutil.Process | None:
    """The QEMU process of ``domain`` (``-name guest=<domain>,...`` in its command line)."""
    for proc in psutil.process_iter(["name", "cmdline"]):
        cmdline = proc.info.get("cmdline") or []
        if any(arg == f"guest={domain}" or arg.startswith(f"guest={domain},") for arg in cmdline):
            return proc
    return None


def vm_memory(info: m.InstanceInfo) -> dict[str, int]:
    assert info.vm is not None
    proc = qemu_process(info.vm.domain)
    rss = 0
    if proc is not None:
        with contextlib.suppress(psutil.Error):
            rss = proc.memory_info().rss
    return {"RSS of its QEMU process": rss}


def memory_of(runtime: str, info: m.InstanceInfo) -> dict[str, int]:
    return {"host": host_memory, "container": container_memory, "vm": vm_memory}[runtime](info)


def save_file(domain: str) -> Path:
    return SAVE_DIR / f"{domain}.save"


def mib(value: int) -> str:
    return f"{value / MIB:,.1f} MiB"


# ---------------------------------------------------------------------------------------------
# hostd calls


async def get(client: HostdClient, iid: str) -> m.InstanceInfo:
    info: m.InstanceInfo = (await client.call(m.InstanceGetRequest(instance_id=iid))).instance
    return info


async def exec_first_byte(client: HostdClient, iid: str, t0: int | None = None) -> int:
    """ns from ``t0`` (default: now) until the first output byte of ``echo x`` in ``iid``; the exec
    is run to its end and deleted outside the clock."""
    start = time.perf_counter_ns() if t0 is None else t0
    exec_id = new_id()
    await client.call(m.ExecStartRequest(instance_id=iid, argv=ECHO, exec_id=exec_id), timeout=STEP_TIMEOUT_S)
    first: int | None = None
    out, exited = b"", None
    async with client.stream(m.ExecSubscribeRequest(exec_id=exec_id, from_seq=1)) as events:
        with trio.fail_after(STEP_TIMEOUT_S):
            async for event in events:
                if isinstance(event, m.ExecOutput) and event.data:
                    if first is None:
                        first = time.perf_counter_ns() - start
                    out += event.data
                elif isinstance(event, m.ExecExited):
                    exited = event
                    break
    await client.call(m.ExecDeleteRequest(exec_id=exec_id))
    if first is None or not out.startswith(b"x"):
        raise RuntimeError(f"{ECHO} in {iid}: output {out[:200]!r}, {exited}")
    return first


async def sleep_instance(client: HostdClient, iid: str, how: m.SleepForm) -> m.InstanceInfo:
    """Put ``iid`` to sleep by ``how`` (again while an exec just ended still counts as running)."""
    with trio.fail_after(STEP_TIMEOUT_S):
        while True:
            try:
                request = m.InstanceSleepRequest(instance_id=iid, how=how)
                info: m.InstanceInfo = (await client.call(request, timeout=STEP_TIMEOUT_S)).instance
            except HostdRemoteError as exc:
                if exc.error_code != ErrorCode.INSTANCE_BUSY:
                    raise
                await trio.sleep(0.01)
                continue
            if info.state != "sleeping" or info.sleep is None or info.sleep.how != how:
                raise RuntimeError(f"{iid} did not sleep by {how}: {info.state} {info.sleep}")
            return info


async def wait_pool(client: HostdClient, size: int) -> None:
    """The bench pool holds ``size`` ready slots and is making none (outside the clock)."""
    with trio.fail_after(STEP_TIMEOUT_S * 2):
        while True:
            pools = [p for p in (await client.call(m.PoolListRequest())).pools if p.pool == POOL]
            if pools and pools[0].failures:
                raise RuntimeError(f"the bench pool cannot make a slot: {pools[0].last_error}")
            if pools and pools[0].ready == size and not pools[0].filling:
                return
            await trio.sleep(0.05)


async def destroy(client: HostdClient, iid: str) -> None:
    await client.call(m.InstanceDestroyRequest(instance_id=iid, grace_s=0), timeout=STEP_TIMEOUT_S)


# ---------------------------------------------------------------------------------------------
# The measurements


class Run:
    """What one runtime's run measured."""

    def __init__(self, runtime: str) -> None:
        self.runtime = runtime
        self.awake: list[int] = []
        self.hot: list[int] = []
        self.wake: dict[str, list[int]] = {}
        self.took: dict[str, list[float]] = {}
        self.cold: list[int] = []
        self.warm: list[int] = []
        self.memory: dict[str, dict[str, int]] = {}
        self.save_bytes: list[int] = []
        self.a2a_awake: list[int] = []
        self.a2a_hot: list[int] = []
        self.a2a_asleep: list[int] = []
        self.a2a_took: list[float] = []
        self.notes: list[str] = []


async def measure(runtime: str, hostd: Hostd, args: argparse.Namespace, domains: set[str], tmp: Path) -> Run:
    run = Run(runtime)
    forms: list[m.SleepForm] = ["freeze", "save"] if runtime == "vm" else ["freeze"]
    for how in forms:
        run.wake[how], run.took[how] = [], []
    async with open_hostd(hostd.socket_path, client_name="bench_sleep", connect_timeout=30) as client:
        [provider] = [
            p for p in (await client.call(m.ProviderListRequest())).providers if p.runtime == runtime and p.default
        ]
        if not provider.available:
            raise RuntimeError(f"hostd's {runtime} provider is not available: {provider.reason}")
        missing = [f for f in forms if f"instance.sleep.{f}" not in provider.capabilities]
        if missing:
            raise RuntimeError(
                f"{runtime} instances cannot sleep by {', '.join(missing)} yet ({provider.capabilities})"
            )

        iid = f"bench-sleep-{runtime}"
        say(f"{runtime}: provisioning the sleeper")
        info = (await client.call(provision_request(runtime, iid, args, alloc=True), timeout=STEP_TIMEOUT_S)).instance
        if info.vm is not None:
            domains.add(info.vm.domain)
        await exec_first_byte(client, iid)  # it answers (a VM: its guest agent is up)

        # -- memory held --------------------------------------------------------------------
        say(f"{runtime}: memory awake and asleep")
        if runtime != "vm":
            with trio.fail_after(60):  # the main process has written what it holds
                while max(memory_of(runtime, info).values()) < args.alloc_mib * MIB:
                    await trio.sleep(0.1)
        await trio.sleep(1.0)
        run.memory["awake"] = memory_of(runtime, await get(client, iid))
        for how in forms:
            asleep = await sleep_instance(client, iid, how)
            await trio.sleep(1.0)
            run.memory[f"asleep ({how})"] = memory_of(runtime, asleep)
            if how == "save" and asleep.vm is not None:
                file = save_file(asleep.vm.domain)
                run.save_bytes.append(file.stat().st_size if file.exists() else -1)
            await client.call(m.InstanceWakeRequest(instance_id=iid), timeout=STEP_TIMEOUT_S)
            await exec_first_byte(client, iid)

        # -- wake latency, beside the same exec awake -------------------------------------
        for i in range(args.warmup + args.rounds):
            say(f"{runtime}: wake round {i + 1}/{args.warmup + args.rounds}")
            await trio.sleep(args.asleep_s)  # idle as long as a sleep lasts, awake
            awake = await exec_first_byte(client, iid)
            hot = await exec_first_byte(client, iid)  # right after another
            for how in forms:
                await sleep_instance(client, iid, how)
                await trio.sleep(args.asleep_s)
                woke = await exec_first_byte(client, iid)
                last = (await get(client, iid)).last_wake
                if last is None or last.how != how:
                    raise RuntimeError(f"{iid}: no wake from {how} recorded: {last}")
                if i >= args.warmup:
                    run.wake[how].append(woke)
                    run.took[how].append(last.took_s)
            if i >= args.warmup:
                run.awake.append(awake)
                run.hot.append(hot)
        final = await get(client, iid)
        run.notes.append(
            f"the sleeper slept {final.sleeps} times, woke {final.wakes} times, {final.asleep_s:.1f} s asleep"
        )
        await destroy(client, iid)

        # -- cold provision, and a warm pool's claim ---------------------------------------
        for i in range(args.cold):
            say(f"{runtime}: cold provision {i + 1}/{args.cold}")
            cid = f"bench-cold-{i}"
            await trio.sleep(args.asleep_s)  # as idle as the wakes' baseline
            t0 = time.perf_counter_ns()
            info = (
                await client.call(provision_request(runtime, cid, args, alloc=False), timeout=STEP_TIMEOUT_S)
            ).instance
            if info.vm is not None:
                domains.add(info.vm.domain)
            run.cold.append(await exec_first_byte(client, cid, t0))
            await destroy(client, cid)
        template = pool_template(runtime, args)
        try:
            for i in range(args.warm):
                try:
                    await client.call(m.PoolSetRequest(pool=POOL, template=template, size=1))
                except HostdRemoteError as exc:
                    if exc.error_code != ErrorCode.UNSUPPORTED:
                        raise
                    run.notes.append(f"no warm pool row: {exc.message}")
                    break
                say(f"{runtime}: warm pool claim {i + 1}/{args.warm}")
                await wait_pool(client, 1)
                wid = f"bench-warm-{i}"
                await trio.sleep(args.asleep_s)
                t0 = time.perf_counter_ns()
                info = (
                    await client.call(m.PoolClaimRequest(pool=POOL, instance_id=wid, name=wid), timeout=STEP_TIMEOUT_S)
                ).instance
                if info.vm is not None:
                    domains.add(info.vm.domain)
                run.warm.append(await exec_first_byte(client, wid, t0))
                # No refill while the next one is set up: it would run beside the clock.
                await client.call(m.PoolSetRequest(pool=POOL, template=template, size=0))
                await destroy(client, wid)
        finally:
            with trio.CancelScope(shield=True), trio.move_on_after(120), contextlib.suppress(HostdRemoteError):
                await client.call(m.PoolDeleteRequest(pool=POOL))

    if runtime == "host" and args.a2a:
        await measure_a2a(run, hostd, args, tmp)
    return run


# ---------------------------------------------------------------------------------------------
# A2A through the controller (host)


async def send_first_byte(client: httpx.AsyncClient) -> int:
    """A blocking ``message:send``: ns from the request sent to the first byte of the answer (the
    rest read and checked outside the clock)."""
    body = {"message": {"messageId": str(uuid.uuid4()), "role": "ROLE_USER", "parts": [{"text": "ping"}]}}
    t0 = time.perf_counter_ns()
    async with client.stream("POST", "/message:send", json=body) as response:
        first: int | None = None
        data = b""
        async for chunk in response.aiter_raw():
            if first is None and chunk:
                first = time.perf_counter_ns() - t0
            data += chunk
    if response.status_code != 200 or b"TASK_STATE_COMPLETED" not in data or first is None:
        raise RuntimeError(f"message:send: {response.status_code} {data[:300]!r}")
    return first


async def measure_a2a(run: Run, hostd: Hostd, args: argparse.Namespace, tmp: Path) -> None:
    say("host: A2A message:send through the controller")
    ctl = Controller(tmp / "controller", hostd.socket_path)
    try:
        async with admin_client(ctl.url, ctl.token) as admin:
            await wait_ready(admin)
            iid = await admin_provision(
                admin, "bench-a2a", 0.01, fields={"runtime": "host", "start": True, "loadout": "echo"}
            )
            headers = {
                "Authorization": f"Bearer {ctl.token}",
                "A2A-Version": "1.0",
                "A2A-Extensions": RUNTIME_EXTENSION,
            }
            async with (
                open_hostd(hostd.socket_path, client_name="bench_sleep") as client,
                httpx.AsyncClient(base_url=f"{ctl.url}/agents/{iid}", headers=headers, timeout=60) as agent,
            ):
                for i in range(args.warmup + args.rounds):
                    await trio.sleep(args.asleep_s)
                    awake = await send_first_byte(agent)
                    hot = await send_first_byte(agent)
                    await sleep_instance(client, iid, "freeze")
                    await trio.sleep(args.asleep_s)
                    asleep = await send_first_byte(agent)
                    last = (await get(client, iid)).last_wake
                    if i >= args.warmup:
                        run.a2a_awake.append(awake)
                        run.a2a_hot.append(hot)
                        run.a2a_asleep.append(asleep)
                        run.a2a_took.append(last.took_s if last is not None else float("nan"))
                await destroy(client, iid)
    except Exception:
        print(ctl.log(), file=sys.stderr)
        raise
    finally:
        ctl.stop()


# ---------------------------------------------------------------------------------------------
# The report


def _ms(ns: float) -> str:
    return f"{ns / 1e6:,.1f} ms"


def wake_row(case: str, samples: list[int], baseline: Result | None, unit: str, **extra: object) -> Result:
    values = sorted(samples)
    row = latency_result(case, samples, unit=unit)
    row.extra = {"p90": _ms(percentile(values, 90)), "max": _ms(values[-1]), **extra}
    return compare(row, baseline, "p50") if baseline is not None else row


def report(run: Run, args: argparse.Namespace, elapsed_s: float) -> Report:
    runtime = run.runtime
    unit = "wakes/s"
    idle = f"{args.asleep_s:g} s idle"
    base = wake_row(f"exec, instance awake, after {idle}", run.awake, None, "execs/s")
    rows = [base, wake_row("exec, instance awake, right after another (info)", run.hot, base, "execs/s")]
    targets: list[Target] = []
    for how, samples in run.wake.items():
        took = sorted(run.took[how])
        took_ms = f"p50 {percentile(took, 50) * 1e3:.1f} ms, max {took[-1] * 1e3:.1f} ms"
        row = wake_row(f"exec, instance asleep ({how}) {idle}", samples, base, unit, hostd_took=took_ms)
        rows.append(row)
        p50_ms = (row.p50_us or 0) / 1e3
        base_ms = (base.p50_us or 0) / 1e3
        added = p50_ms - base_ms
        if how == "freeze":
            limit = TARGET_WAKE_MS[runtime]
            targets.append(
                Target(
                    description=f"issue 27: a {runtime} instance wakes from freeze under {limit:g} ms p50"
                    " (exec sent -> first byte)",
                    measured=f"{p50_ms:.1f} ms (the same exec awake: {base_ms:.1f} ms)",
                    met=p50_ms < limit,
                )
            )
            targets.append(
                Target(
                    description=f"issue 27, the wake's own share: it adds under {limit:g} ms to the exec's p50"
                    " (asleep minus awake after the same idle)",
                    measured=f"{added:+.1f} ms (hostd's thaw alone p50 {percentile(took, 50) * 1e3:.1f} ms)",
                    met=added < limit,
                )
            )
    cold = wake_row("cold: provision + start -> exec's first byte", run.cold, base, "instances/s")
    rows.append(cold)
    if run.warm:
        rows.append(wake_row("warm pool: claim -> exec's first byte", run.warm, base, "instances/s"))
    if "save" in run.wake:
        save_p50 = percentile(sorted(run.wake["save"]), 50)
        cold_p50 = percentile(sorted(run.cold), 50)
        targets.append(
            Target(
                description=f"issue 27: a VM wakes from save under {TARGET_SAVE_VS_COLD}x its cold boot (p50)",
                measured=f"{_ms(save_p50)} vs cold {_ms(cold_p50)}: {save_p50 / cold_p50:.2f}x",
                met=save_p50 < TARGET_SAVE_VS_COLD * cold_p50,
            )
        )
    if run.a2a_awake:
        a2a_base = wake_row(f"A2A message:send (echo), awake, after {idle}", run.a2a_awake, None, "sends/s")
        a2a_hot = wake_row(
            "A2A message:send (echo), awake, right after another (info)", run.a2a_hot, a2a_base, "sends/s"
        )
        took = sorted(run.a2a_took)
        a2a = wake_row(
            f"A2A message:send (echo), asleep (freeze) {idle}",
            run.a2a_asleep,
            a2a_base,
            "sends/s",
            hostd_took=f"p50 {percentile(took, 50) * 1e3:.1f} ms, max {took[-1] * 1e3:.1f} ms",
        )
        rows += [a2a_base, a2a_hot, a2a]
    for row in rows:
        row.throughput = None  # paced by sleeps: no rate to speak of

    notes = []
    awake_mem = run.memory.get("awake", {})
    for state, figures in run.memory.items():
        parts = []
        for name, value in figures.items():
            share = f" ({value / awake_mem[name]:.0%} of awake)" if state != "awake" and awake_mem.get(name) else ""
            parts.append(f"{name} {mib(value)}{share}")
        notes.append(f"memory {state}: " + ", ".join(parts))
    if run.save_bytes:
        notes.append(f"memory asleep (save): the managed save file holds {mib(run.save_bytes[-1])} on disk")
    if runtime in ("host", "container"):
        notes.append(
            f"the sleeper's main process holds {args.alloc_mib} MiB it wrote; a frozen process keeps its memory"
            " (freeze saves CPU, not RAM)"
        )
    if runtime == "vm" and "asleep (save)" in run.memory:
        awake_rss = awake_mem.get("RSS of its QEMU process", 0)
        saved_rss = run.memory["asleep (save)"].get("RSS of its QEMU process", 0)
        targets.append(
            Target(
                description=f"issue 27: a saved VM holds under {TARGET_SAVED_MEMORY:.0%} of its awake memory",
                measured=f"{mib(saved_rss)} of {mib(awake_rss)} ({saved_rss / awake_rss:.0%})" if awake_rss else "n/a",
                met=bool(awake_rss) and saved_rss < TARGET_SAVED_MEMORY * awake_rss,
            )
        )
    notes.append(
        f"each round: {idle} awake, the exec (the baseline: an exec after the same idle time as a sleep), the exec"
        f" again at once (info: warm caches, no idle CPU), then per form: sleep, {idle} asleep, the exec (it wakes"
        " the instance); the warm pool's slot was ready and idle when the clock started"
    )
    notes += run.notes
    notes.append(f"this run took {elapsed_s:.0f} s")
    params: dict[str, object] = {
        "runtime": runtime,
        "rounds": args.rounds,
        "warmup": args.warmup,
        "cold": args.cold,
        "warm": args.warm,
    }
    if runtime == "vm":
        params.update(memory_mib=args.memory_mib, domain_type=args.domain_type)
    else:
        params["alloc_mib"] = args.alloc_mib
    return Report(
        bench="bench_sleep",
        title=f"{runtime} instances asleep: exec sent -> first byte (it wakes them) vs awake, cold, warm pool;"
        " memory held",
        vs_of="p50",
        params=params,
        results=rows,
        targets=targets,
        notes=notes,
    )


# ---------------------------------------------------------------------------------------------
# Setting up and leaving nothing behind


def libvirt_answers() -> bool:
    return subprocess.run(["virsh", "-c", URI, "version"], capture_output=True, check=False).returncode == 0


def ensure_libvirtd(stack: ExitStack) -> None:
    """libvirt's QEMU driver answering; started here (and stopped on the way out) if it was not."""
    if libvirt_answers():
        return
    for daemon in ("virtlogd", "libvirtd"):
        if shutil.which(daemon) is None:
            raise RuntimeError(f"{daemon} is not installed")
    started: list[str] = []
    for daemon in ("virtlogd", "libvirtd"):
        if _daemon(daemon) is None:
            subprocess.run([daemon, "-d"], check=False, stdin=subprocess.DEVNULL)
            started.append(daemon)
    stack.callback(stop_libvirtd, started)
    deadline = time.monotonic() + LIBVIRT_WAIT_S
    while not libvirt_answers():
        if time.monotonic() > deadline:
            raise RuntimeError(f"libvirtd did not answer on {URI} within {LIBVIRT_WAIT_S:g} s")
        time.sleep(0.1)


def _daemon(name: str) -> psutil.Process | None:
    """The running ``name`` daemon by its pid file (a stale file's pid may name another process)."""
    try:
        proc = psutil.Process(int(Path(f"/run/{name}.pid").read_text().split()[0]))
        return proc if proc.name() == name else None
    except (OSError, ValueError, IndexError, psutil.Error):
        return None


def stop_libvirtd(started: list[str]) -> None:
    """Stop the daemons this bench started (by the pid each wrote), unless a domain is defined on
    them or a client is connected (someone else's, who came meanwhile: theirs to keep)."""
    if not started:
        return
    virsh = ["virsh", "-c", URI, "list", "--all", "--name"]
    listed = subprocess.run(virsh, capture_output=True, text=True, check=False)
    clients = subprocess.run(["virt-admin", "client-list", "libvirtd"], capture_output=True, text=True, check=False)
    connected = [line for line in clients.stdout.splitlines()[2:] if line.strip()]
    if (listed.returncode == 0 and listed.stdout.strip()) or connected:
        print(f"bench_sleep: leaving {', '.join(started)} running: someone else uses them", file=sys.stderr)
        return
    for daemon in reversed(started):  # libvirtd before virtlogd
        proc = _daemon(daemon)
        if proc is not None:
            with contextlib.suppress(psutil.Error):
                proc.terminate()
                proc.wait(15)


def remove_domains(namespace: str, seen: set[str]) -> None:
    """Destroy and undefine (managed save image included) every domain of this run's hostd."""
    listed = subprocess.run(
        ["virsh", "-c", URI, "list", "--all", "--name"], capture_output=True, text=True, check=False
    )
    names = {n for n in listed.stdout.split() if n.startswith(f"aiwg-{namespace}-")} | seen
    for name in sorted(names):
        subprocess.run(["virsh", "-c", URI, "destroy", name], capture_output=True, check=False)
        subprocess.run(
            ["virsh", "-c", URI, "undefine", "--managed-save", "--snapshots-metadata", name],
            capture_output=True,
            check=False,
        )
        save_file(name).unlink(missing_ok=True)


def remove_containers(env: dict[str, str], runroot: Path) -> None:
    """hostd leaves containers running by design (a paused one too); the bench leaves none."""
    storage = ["--root", env["AIWG_PODMAN_ROOT"], "--runroot", str(runroot), "--storage-driver", "vfs"]
    runtime = ["--runtime", "runc", "--cgroup-manager", "cgroupfs", "--events-backend", "file"]
    podman = ["podman", *storage, *runtime]
    paused = subprocess.run(
        [*podman, "ps", "-q", "--filter", "status=paused"], capture_output=True, text=True, check=False
    )
    for cid in paused.stdout.split():
        subprocess.run([*podman, "unpause", cid], capture_output=True, check=False, timeout=60)
    subprocess.run([*podman, "rm", "-af", "-t", "0"], capture_output=True, timeout=120, check=False)
    # Each exec's conmon waits 30 s (--exit-delay) after its exec ended before it goes: those of this
    # run (their command lines name its storage) go now.
    marks = (env["AIWG_PODMAN_ROOT"], str(runroot))
    strays = []
    for proc in psutil.process_iter(["pid", "cmdline"]):
        cmdline = " ".join(proc.info.get("cmdline") or [])
        if proc.pid != os.getpid() and any(mark in cmdline for mark in marks):
            strays.append(proc)
    for proc in strays:
        with contextlib.suppress(psutil.Error):
            proc.terminate()
    _, alive = psutil.wait_procs(strays, timeout=5)
    for proc in alive:
        with contextlib.suppress(psutil.Error):
            proc.kill()


async def _leave_no_instance(socket_path: Path) -> None:
    async with open_hostd(socket_path, client_name="bench_sleep", connect_timeout=10) as client:
        with contextlib.suppress(HostdRemoteError):
            await client.call(m.PoolDeleteRequest(pool=POOL), timeout=STEP_TIMEOUT_S)
        with trio.move_on_after(STEP_TIMEOUT_S):
            while any(c.pool for c in (await client.call(m.CheckpointListRequest())).checkpoints):
                await trio.sleep(0.2)
        for info in (await client.call(m.InstanceListRequest(pool_slots=True))).instances:
            if info.state != "destroyed":
                with contextlib.suppress(HostdRemoteError):
                    await destroy(client, info.instance_id)


def leave_no_instance(hostd: Hostd) -> None:
    if hostd.proc is None or hostd.proc.poll() is not None:
        return
    try:
        trio.run(_leave_no_instance, hostd.socket_path)
    except Exception as exc:  # hostd is gone: its stop kills what is left of its tree
        print(f"bench_sleep: could not destroy leftover instances: {exc!r}", file=sys.stderr)


def unavailable(runtime: str) -> str | None:
    """Why ``runtime`` cannot be measured here (None if it can)."""
    if runtime == "host":
        return None if os.geteuid() == 0 else "the cgroup freezer needs root"
    if runtime == "container":
        if shutil.which("podman") is None or shutil.which("runc") is None or not Path("/bin/busybox").exists():
            return "needs podman, runc and busybox-static"
        return None
    if os.geteuid() != 0:
        return "needs root (qemu:///system)"
    if shutil.which("virsh") is None or shutil.which("libvirtd") is None:
        return "needs libvirt (virsh, libvirtd)"
    return None


def run_runtime(runtime: str, args: argparse.Namespace) -> Report:
    started = time.monotonic()
    with ExitStack() as stack:
        tmp = stack.enter_context(temp_dir(f"aiwg-bench-sleep-{runtime}-"))
        env: dict[str, str] = {}
        domains: set[str] = set()
        state = tmp / "state"
        if runtime == "container":
            # podman refuses a run root longer than 50 characters: it gets a short dir of its own.
            runroot = Path(tempfile.mkdtemp(prefix="aiwg-bsl-", dir="/tmp"))
            stack.callback(shutil.rmtree, runroot, True)
            env = podman_env(tmp, runroot)
            say("container: building the busybox image")
            build_image(env)
            stack.callback(remove_containers, env, runroot)
        elif runtime == "vm":
            ensure_libvirtd(stack)
            os.chmod(tmp, 0o755)  # QEMU runs as libvirt's user
            env = {
                "AIWG_LIBVIRT_URI": URI,
                "AIWG_VM_DOMAIN_TYPE": args.domain_type,
                "AIWG_WAKE_TIMEOUT_S": str(STEP_TIMEOUT_S),
            }
            if args.image_dir:
                env["AIWG_VM_IMAGE_DIR"] = args.image_dir
            namespace = hashlib.sha256(str(state).encode()).hexdigest()[:12]
            stack.callback(remove_domains, namespace, domains)
        # hostd in a session of its own: a Ctrl-C at the terminal reaches the bench only, and hostd
        # is still serving when the cleanup asks it to destroy what it made.
        hostd = Hostd(state, env, new_session=True)
        stack.callback(hostd.stop)
        say(f"{runtime}: starting hostd")
        hostd.start(timeout=60)
        stack.callback(leave_no_instance, hostd)
        try:
            run = trio.run(measure, runtime, hostd, args, domains, tmp)
        except Exception:
            print(hostd.log(), file=sys.stderr)
            raise
    # The run's time includes setting up and cleaning up.
    return report(run, args, time.monotonic() - started)


def main() -> None:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--runtime", choices=(*RUNTIMES, "all"), default="host", help="which runtime (default host)")
    p.add_argument("--rounds", type=int, help="measured wakes per form (default 20; vm 5)")
    p.add_argument("--warmup", type=int, default=1, help="unmeasured rounds first (default 1)")
    p.add_argument("--cold", type=int, help="cold provisions measured (default 5; vm 2)")
    p.add_argument("--warm", type=int, help="warm pool claims measured (default 5; vm 2)")
    p.add_argument(
        "--asleep-s", type=float, default=0.2, help="how long each sleep lasts before the exec (default 0.2)"
    )
    p.add_argument("--alloc-mib", type=int, default=64, help="memory the sleeper's main process holds (default 64)")
    p.add_argument("--memory-mib", type=int, default=192, help="a VM's memory (default 192)")
    p.add_argument("--domain-type", default="qemu", choices=("qemu", "kvm"), help="VMs: software emulation (default)")
    p.add_argument("--image-dir", default="", help="guest image directory (default: hostd's AIWG_VM_IMAGE_DIR)")
    p.add_argument(
        "--a2a", action=argparse.BooleanOptionalAction, default=True, help="host: the controller's A2A send too"
    )
    args = p.parse_args()
    if args.versions:
        print_library_versions()
        return
    # SIGTERM as a Ctrl-C: raised as SIGINT, which trio turns into KeyboardInterrupt at a safe point
    # (a KeyboardInterrupt raised straight from a handler can land inside trio's own loop and wreck
    # it, and then the cleanup could not talk to hostd). SIGINT is restored where it was ignored (a
    # background job of a script).
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, lambda _signum, _frame: signal.raise_signal(signal.SIGINT))
    runtimes = RUNTIMES if args.runtime == "all" else (args.runtime,)
    for runtime in runtimes:
        reason = unavailable(runtime)
        if reason is not None:
            print(f"bench_sleep: {runtime} skipped: {reason}")
            continue
        vm = runtime == "vm"
        per_runtime = argparse.Namespace(**vars(args))
        per_runtime.rounds = args.rounds if args.rounds is not None else (5 if vm else 20)
        per_runtime.cold = args.cold if args.cold is not None else (2 if vm else 5)
        per_runtime.warm = args.warm if args.warm is not None else (2 if vm else 5)
        try:
            result = run_runtime(runtime, per_runtime)
        except KeyboardInterrupt:
            sys.exit("bench_sleep: interrupted (what it started is removed)")
        emit(result, as_json=args.json)


if __name__ == "__main__":
    main()
