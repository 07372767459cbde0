"""Container provision to running through the admin API (cold, from a warm pool, by fork), against
``podman run -d`` of the same image.

Starts its own hostd (which starts its own ``podman system service`` on a private socket, vfs
storage in the temp dir, runc, cgroupfs) and ``python -m controller.main`` with a warm pool of the
``busybox`` loadout (``AIWG_WARM_POOLS=busybox=2``); the busybox image is built into that storage
first by ``scripts/busybox_image.py`` (nothing is pulled).

* Case: ``POST /api/v2/admin/instances {"runtime": "container", "image": ...}`` (no loadout, so
  cold), then poll the operation every ``--poll-ms`` until it ends and ``GET /instances/{id}``
  until ``running``; the clock stops there. Decommissioned outside the clock.
* Case, warm: the same with ``{"loadout": "busybox"}``, whose pool hands out a running slot (the
  pool is full and idle when the clock starts; every sample is checked to be a hit).
* Case, fork (a loop of its own, after): ``runtime_options.launch_strategy {mode: fork}`` of a
  running container (its files committed into an image, a container started of it); baseline
  ``podman commit`` + ``podman run -d`` of the same container from the shell.
* Baseline, same run, same podman service: ``podman --url <socket> run -d`` of the same image with
  the same rlimits and idle command, from the shell (the clock stops when the CLI returns, i.e.
  once the container runs). Removed outside the clock.
* Info rows: hostd's own ``InstanceProvisionRequest(runtime="container")`` and ``PoolClaimRequest``
  over ``proto``.

Targets (issue 12): admin provision-to-running p50 within 1.3x of ``podman run -d``; a provision
from the warm pool p50 under 50 ms.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import trio
from bench_admin import (
    Controller,
    admin_client,
    admin_decommission,
    admin_provision,
    admin_provision_by_op,
    wait_ready,
)
from common import ROOT, Report, Result, Target, compare, emit, latency_result, parser, print_versions, temp_dir
from common import Hostd as BenchHostd

from agentic_sandbox.proto import messages as m
from agentic_sandbox.proto import open_hostd

API = "/api/v2/admin"
IMAGE = "localhost/busybox:latest"
IDLE = "trap 'exit 0' TERM INT; while :; do sleep 3600 & wait $!; done"
TARGET_RATIO = 1.3
TARGET_WARM_MS = 50.0
STEP_TIMEOUT_S = 60.0
POOL = "busybox"
POOL_SIZE = 2


def podman_env(tmp: Path, runroot: Path) -> dict[str, str]:
    return {
        "AIWG_PODMAN_SOCKET": str(tmp / "podman.sock"),
        "AIWG_PODMAN_SERVICE": "1",
        "AIWG_PODMAN_ROOT": str(tmp / "podman-root"),
        "AIWG_PODMAN_RUNROOT": str(runroot),
        "AIWG_PODMAN_STORAGE_DRIVER": "vfs",
    }


def build_image(env: dict[str, str]) -> None:
    built = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "busybox_image.py"), "--image", IMAGE],
        env={**os.environ, **env},
        capture_output=True,
        timeout=120,
    )
    if built.returncode != 0:
        raise RuntimeError(f"busybox image: {built.stderr.decode(errors='replace')}")


async def admin_container(client: httpx.AsyncClient, name: str, poll_s: float) -> str:
    fields: dict[str, object] = {"runtime": "container", "image": IMAGE}
    return await admin_provision(client, name, poll_s, fields=fields, timeout_s=STEP_TIMEOUT_S)


def podman_run(url: str, name: str) -> int:
    """``podman run -d`` from the shell; ns until the CLI returned (the container runs then)."""
    argv = [
        "podman",
        "--url",
        url,
        "run",
        "-d",
        "--name",
        name,
        "--ulimit",
        "nofile=4096:4096",
        "--ulimit",
        "nproc=4096:4096",
        IMAGE,
        "/bin/sh",
        "-c",
        IDLE,
    ]
    t0 = time.perf_counter_ns()
    done = subprocess.run(argv, capture_output=True, timeout=STEP_TIMEOUT_S)
    elapsed = time.perf_counter_ns() - t0
    if done.returncode != 0:
        raise RuntimeError(f"podman run: {done.stderr.decode(errors='replace')}")
    return elapsed


def podman_rm(url: str, name: str) -> None:
    subprocess.run(["podman", "--url", url, "rm", "-f", "-t", "0", name], capture_output=True, timeout=STEP_TIMEOUT_S)


def podman_fork(url: str, source: str, name: str) -> int:
    """``podman commit`` of ``source`` then ``podman run -d`` of the image, from the shell (ns)."""
    image = f"localhost/bench-fork:{name}"
    t0 = time.perf_counter_ns()
    for argv in (
        ["podman", "--url", url, "commit", "-q", source, image],
        ["podman", "--url", url, "run", "-d", "--name", name, "--ulimit", "nofile=4096:4096",
         "--ulimit", "nproc=4096:4096", image],
    ):  # fmt: skip
        done = subprocess.run(argv, capture_output=True, timeout=STEP_TIMEOUT_S)
        if done.returncode != 0:
            raise RuntimeError(f"{argv[3]}: {done.stderr.decode(errors='replace')}")
    elapsed = time.perf_counter_ns() - t0
    podman_rm(url, name)
    subprocess.run(["podman", "--url", url, "rmi", "-f", image], capture_output=True, timeout=STEP_TIMEOUT_S)
    return elapsed


async def pool_full(client: httpx.AsyncClient) -> None:
    """Outside the clock: the pool holds all its slots and is making none."""
    with trio.fail_after(STEP_TIMEOUT_S):
        while True:
            pool = (await client.get(f"{API}/warm-pools/{POOL}")).json()
            if pool.get("ready") == POOL_SIZE and not pool.get("filling"):
                return
            await trio.sleep(0.05)


async def admin_warm(client: httpx.AsyncClient, name: str, poll_s: float) -> str:
    fields: dict[str, object] = {"runtime": "container", "loadout": POOL}
    response = await client.post(f"{API}/instances", json={"name": name, **fields})
    op_id = response.json()["id"]
    instance_id = await admin_provision_by_op(client, op_id, poll_s)
    op = (await client.get(f"{API}/operations/{op_id}")).json()
    if op["result"]["launch"] != {"mode": "warm_pool", "asset_ref": POOL, "launched_from": f"warm_pool:{POOL}"}:
        raise RuntimeError(f"{name} was not a warm pool hit: {op['result']}")
    return instance_id


async def measure(ctl: Controller, hostd: BenchHostd, url: str, args: argparse.Namespace) -> list[Result]:
    poll_s = args.poll_ms / 1000
    async with admin_client(ctl.url, ctl.token) as probe:
        await wait_ready(probe)
    admin: list[int] = []
    baseline: list[int] = []
    warm: list[int] = []
    fork: list[int] = []
    fork_base: list[int] = []
    # Interleaved, so a change in the machine's load shows in every column alike. Forks (a commit
    # and an image removal on vfs storage keep podman busy a while after) get a loop of their own.
    async with admin_client(ctl.url, ctl.token) as client:
        for i in range(args.warmup + args.iterations):
            t0 = time.perf_counter_ns()
            instance_id = await admin_container(client, f"bench-c-{i}", poll_s)
            elapsed = time.perf_counter_ns() - t0
            await admin_decommission(client, instance_id, poll_s)
            shell = await trio.to_thread.run_sync(podman_run, url, f"bench-run-{i}")
            await trio.to_thread.run_sync(podman_rm, url, f"bench-run-{i}")

            await pool_full(client)
            t0 = time.perf_counter_ns()
            warm_id = await admin_warm(client, f"bench-w-{i}", poll_s)
            warm_elapsed = time.perf_counter_ns() - t0
            await admin_decommission(client, warm_id, poll_s)
            if i >= args.warmup:
                admin.append(elapsed)
                baseline.append(shell)
                warm.append(warm_elapsed)
        source = await admin_container(client, "bench-fork-source", poll_s)
        for i in range(args.warmup + args.iterations):
            await pool_full(client)
            t0 = time.perf_counter_ns()
            strategy = {"launch_strategy": {"mode": "fork", "asset_ref": source}}
            body: dict[str, object] = {"runtime": "container", "runtime_options": strategy}
            fork_id = await admin_provision(client, f"bench-f-{i}", poll_s, fields=body, timeout_s=STEP_TIMEOUT_S)
            fork_elapsed = time.perf_counter_ns() - t0
            await admin_decommission(client, fork_id, poll_s)
            shell_fork = await trio.to_thread.run_sync(podman_fork, url, f"aiwg-{source}", f"bench-pf-{i}")
            if i >= args.warmup:
                fork.append(fork_elapsed)
                fork_base.append(shell_fork)
        await admin_decommission(client, source, poll_s)
    direct: list[int] = []
    async with open_hostd(hostd.socket_path, client_name="bench_container") as client:
        for i in range(args.warmup + args.iterations):
            iid = f"bench-direct-{i}"
            t0 = time.perf_counter_ns()
            req = m.InstanceProvisionRequest(instance_id=iid, name=iid, runtime="container", image=IMAGE)
            info = (await client.call(req, timeout=STEP_TIMEOUT_S)).instance
            elapsed = time.perf_counter_ns() - t0
            if info.state != "running":
                raise RuntimeError(f"hostd provisioned {iid} as {info.state}")
            await client.call(m.InstanceDestroyRequest(instance_id=iid, grace_s=0), timeout=STEP_TIMEOUT_S)
            if i >= args.warmup:
                direct.append(elapsed)
    claims: list[int] = []
    async with open_hostd(hostd.socket_path, client_name="bench_container") as client:
        for i in range(args.warmup + args.iterations):
            async with admin_client(ctl.url, ctl.token) as probe:
                await pool_full(probe)
            iid = f"bench-claim-{i}"
            t0 = time.perf_counter_ns()
            info = (await client.call(m.PoolClaimRequest(pool=POOL, instance_id=iid, name=iid))).instance
            elapsed = time.perf_counter_ns() - t0
            await client.call(m.InstanceDestroyRequest(instance_id=info.instance_id, grace_s=0), timeout=STEP_TIMEOUT_S)
            if i >= args.warmup:
                claims.append(elapsed)
    base_row = latency_result("podman run -d (shell)", baseline, unit="containers/s")
    admin_row = latency_result(
        "admin POST /instances -> running", admin, unit="containers/s", poll_interval_ms=args.poll_ms
    )
    warm_row = latency_result(
        "admin POST /instances (warm pool) -> running", warm, unit="containers/s", poll_interval_ms=args.poll_ms
    )
    fork_base_row = latency_result("podman commit + run -d (shell)", fork_base, unit="containers/s")
    fork_row = latency_result("admin fork -> running", fork, unit="containers/s", poll_interval_ms=args.poll_ms)
    direct_row = latency_result("hostd InstanceProvisionRequest (info)", direct, unit="containers/s")
    claim_row = latency_result("hostd PoolClaimRequest (info)", claims, unit="containers/s")
    return [
        compare(admin_row, base_row, "p50"),
        base_row,
        compare(warm_row, base_row, "p50"),
        compare(direct_row, base_row, "p50"),
        compare(claim_row, base_row, "p50"),
        fork_base_row,
        compare(fork_row, fork_base_row, "p50"),
    ]


def main() -> None:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--iterations", type=int, default=10, help="measured provisions per case (default 10)")
    p.add_argument("--warmup", type=int, default=1, help="unmeasured provisions before each case")
    p.add_argument("--poll-ms", type=float, default=5.0, help="operation poll interval in ms (default 5)")
    args = p.parse_args()
    if args.versions:
        print_versions()
        return
    if shutil.which("podman") is None or not Path("/bin/busybox").exists():
        sys.exit("bench_container: needs podman, runc and busybox-static")

    # podman refuses a run root longer than 50 characters: it gets a short dir of its own.
    runroot = Path(tempfile.mkdtemp(prefix="aiwg-bpd-", dir="/tmp"))
    try:
        with temp_dir("aiwg-bench-ctr-") as tmp:
            env = podman_env(tmp, runroot)
            build_image(env)
            hostd = BenchHostd(tmp / "state", env)
            hostd.start(timeout=40)
            ctl = None
            try:
                ctl = Controller(tmp / "controller", hostd.socket_path, {"AIWG_WARM_POOLS": f"{POOL}={POOL_SIZE}"})
                results = trio.run(measure, ctl, hostd, f"unix://{env['AIWG_PODMAN_SOCKET']}", args)
            except BaseException:
                print(hostd.log(), file=sys.stderr)
                if ctl is not None:
                    print(ctl.log(), file=sys.stderr)
                raise
            finally:
                if ctl is not None:
                    ctl.stop()
                hostd.stop()
                # hostd leaves containers running by design; the bench leaves none.
                storage = ["--root", env["AIWG_PODMAN_ROOT"], "--runroot", str(runroot), "--storage-driver", "vfs"]
                runtime = ["--runtime", "runc", "--cgroup-manager", "cgroupfs", "--events-backend", "file"]
                subprocess.run(["podman", *storage, *runtime, "rm", "-af", "-t", "0"], capture_output=True, timeout=120)
    finally:
        shutil.rmtree(runroot, ignore_errors=True)

    ratio = results[0].vs
    warm_p50_ms = results[2].p50_us / 1e3 if results[2].p50_us is not None else None
    report = Report(
        bench="bench_container",
        title="container provision to running: admin API vs. podman run -d of the same image",
        vs_of="p50",
        params={"iterations": args.iterations, "poll_ms": args.poll_ms, "image": IMAGE},
        results=results,
        targets=[
            Target(
                description=f"issue 12: admin provision-to-running p50 <= {TARGET_RATIO}x podman run -d",
                measured=f"{ratio:.2f}x" if ratio is not None else "n/a",
                met=ratio is not None and ratio <= TARGET_RATIO,
            ),
            Target(
                description=f"issue 12: provision from the warm pool p50 < {TARGET_WARM_MS:g} ms",
                measured=f"{warm_p50_ms:.1f} ms" if warm_p50_ms is not None else "n/a",
                met=warm_p50_ms is not None and warm_p50_ms < TARGET_WARM_MS,
            ),
        ],
        notes=[
            "baselines and cases run interleaved against the same podman service",
            "warm: the pool is full and idle when the clock starts; every sample was a hit (checked)",
            "fork copies the container's files (podman commit, paused), not its processes",
        ],
    )
    emit(report, as_json=args.json)


if __name__ == "__main__":
    main()
