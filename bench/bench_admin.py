"""Controller admin API: provision-to-running latency and admin GET throughput.

Starts its own hostd and ``python -m controller.main`` (admin token from the environment, port
chosen by the kernel) in a temp dir.

* Provision: ``POST /api/v2/admin/instances`` (host runtime, ``start: true``), then poll
  ``GET /operations/{id}`` every ``--poll-ms`` until it ends and ``GET /instances/{id}`` until
  the instance is ``running``; clock stops there. Decommissioned outside the clock.
  Baseline, same run: hostd's own ``InstanceProvisionRequest(start=True)`` over ``proto``
  (destroyed outside the clock).
* GET: ``GET /api/v2/admin/instances`` (with ``--instances`` instances registered) from N
  concurrent ``httpx.AsyncClient`` s, one keep-alive connection each. Baseline, same run: hostd's
  ``InstanceListRequest`` from N concurrent callers, one connection each. An info row shows
  ``GET /healthz`` (no auth, no store) as the floor of the HTTP stack.

Issue 3 sets no figure for these; the bench prints no target verdict.
"""

from __future__ import annotations

import argparse
import gc
import math
import os
import re
import secrets
import selectors
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable, Sequence
from contextlib import AsyncExitStack
from pathlib import Path
from typing import TypeVar

import httpx
import trio
from common import (
    ROOT,
    Report,
    Result,
    compare,
    emit,
    latency_result,
    parser,
    plural,
    print_versions,
    running_hostd,
    temp_dir,
)

from agentic_sandbox.proto import HostdClient, open_hostd
from agentic_sandbox.proto import messages as m

H = TypeVar("H")
API = "/api/v2/admin"
TERMINAL = ("succeeded", "failed", "canceled")
START_TIMEOUT_S = 30.0
STEP_TIMEOUT_S = 30.0


class Controller:
    """``python -m controller.main`` in a child process; stopped with SIGTERM (then SIGKILL).

    ``token``: the admin token (a fresh one by default; controllers sharing a store share one);
    ``log_path``: where its stderr goes (default ``controller.log`` beside the state dir)."""

    def __init__(
        self,
        state_dir: Path,
        hostd_socket: Path,
        env: dict[str, str] | None = None,
        *,
        token: str | None = None,
        log_path: Path | None = None,
    ) -> None:
        self.token = token or secrets.token_urlsafe(24)
        self.log_path = log_path or state_dir.parent / "controller.log"
        env = {
            **os.environ,
            "PYTHONPATH": str(ROOT),
            "AIWG_STATE_DIR": str(state_dir),
            "AIWG_HOSTD_SOCKET": str(hostd_socket),
            "AIWG_LISTEN": "127.0.0.1:0",
            "AIWG_ADMIN_TOKEN": self.token,
            **(env or {}),
        }
        state_dir.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "agentic_sandbox.controller.main"],
                env=env,
                cwd=ROOT,
                stdout=subprocess.PIPE,
                stderr=log,
            )
        try:
            self.url = self._wait_url()
        except BaseException:
            self.stop()
            raise

    def _wait_url(self) -> str:
        assert self.proc.stdout is not None
        deadline = time.monotonic() + START_TIMEOUT_S
        seen = b""
        with selectors.DefaultSelector() as sel:
            sel.register(self.proc.stdout, selectors.EVENT_READ)
            while (left := deadline - time.monotonic()) > 0:
                if sel.select(left):
                    chunk = os.read(self.proc.stdout.fileno(), 4096)
                    if not chunk:
                        break
                    seen += chunk
                    if match := re.search(rb"listening on (\S+)", seen):
                        return match.group(1).decode()
        raise RuntimeError(f"controller did not start:\n{seen.decode(errors='replace')}\n{self.log()}")

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-5000:]
        except FileNotFoundError:
            return ""

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        if self.proc.stdout is not None:
            self.proc.stdout.close()


def admin_client(url: str, token: str) -> httpx.AsyncClient:
    return httpx.AsyncClient(base_url=url, headers={"Authorization": f"Bearer {token}"}, timeout=STEP_TIMEOUT_S)


async def wait_ready(client: httpx.AsyncClient) -> None:
    """/readyz answers 200 once the controller's link to hostd is up."""
    with trio.fail_after(START_TIMEOUT_S):
        while (await client.get("/readyz")).status_code != 200:
            await trio.sleep(0.05)


async def wait_operation(client: httpx.AsyncClient, op_id: str, poll_s: float) -> dict[str, object]:
    with trio.fail_after(STEP_TIMEOUT_S):
        while True:
            response = await client.get(f"{API}/operations/{op_id}")
            response.raise_for_status()
            body = response.json()
            if body["state"] in TERMINAL:
                return body
            await trio.sleep(poll_s)


async def admin_provision(
    client: httpx.AsyncClient,
    name: str,
    poll_s: float,
    *,
    fields: dict[str, object] | None = None,
    timeout_s: float = STEP_TIMEOUT_S,
) -> str:
    """Provision an instance through the admin API (by default a host instance, started); its id
    once it runs. ``fields`` replaces the default runtime fields of the request."""
    body = {"name": name, **(fields if fields is not None else {"runtime": "host", "start": True})}
    response = await client.post(f"{API}/instances", json=body)
    if response.status_code != 202:
        raise RuntimeError(f"provision {name}: {response.status_code} {response.text}")
    return await admin_provision_by_op(client, response.json()["id"], poll_s, timeout_s=timeout_s)


async def admin_provision_by_op(
    client: httpx.AsyncClient, op_id: str, poll_s: float, *, timeout_s: float = STEP_TIMEOUT_S
) -> str:
    """The instance a provision operation made, once it runs (the operation polled every ``poll_s``)."""
    op = await wait_operation(client, op_id, poll_s)
    if op["state"] != "succeeded":
        raise RuntimeError(f"provision: {op}")
    instance_id = str(op["result"]["instance_id"])  # type: ignore[index]
    with trio.fail_after(timeout_s):
        while (await client.get(f"{API}/instances/{instance_id}")).json()["state"] != "running":
            await trio.sleep(poll_s)
    return instance_id


async def admin_decommission(client: httpx.AsyncClient, instance_id: str, poll_s: float) -> None:
    response = await client.delete(f"{API}/instances/{instance_id}", params={"force": "true"})
    if response.status_code == 202:
        await wait_operation(client, response.json()["id"], poll_s)


async def measure_provision(ctl: Controller, socket_path: Path, args: argparse.Namespace) -> list[Result]:
    iterations, warmup = args.iterations, args.warmup
    poll_s = args.poll_ms / 1000
    admin: list[int] = []
    async with admin_client(ctl.url, ctl.token) as client:
        for i in range(warmup + iterations):
            t0 = time.perf_counter_ns()
            instance_id = await admin_provision(client, f"bench-prov-{i}", poll_s)
            elapsed = time.perf_counter_ns() - t0
            await admin_decommission(client, instance_id, poll_s)
            if i >= warmup:
                admin.append(elapsed)
    direct: list[int] = []
    async with open_hostd(socket_path, client_name="bench_admin") as hostd:
        for i in range(warmup + iterations):
            instance_id = f"bench-direct-{i}"
            t0 = time.perf_counter_ns()
            info = (
                await hostd.call(m.InstanceProvisionRequest(instance_id=instance_id, name=instance_id, start=True))
            ).instance
            elapsed = time.perf_counter_ns() - t0
            if info.state != "running":
                raise RuntimeError(f"hostd provisioned {instance_id} as {info.state}")
            await hostd.call(m.InstanceDestroyRequest(instance_id=instance_id, grace_s=0))
            if i >= warmup:
                direct.append(elapsed)
    direct_row = latency_result("hostd InstanceProvisionRequest", direct, unit="provisions/s")
    admin_row = latency_result(
        "admin POST /instances -> running", admin, unit="provisions/s", poll_interval_ms=args.poll_ms
    )
    return [compare(admin_row, direct_row, "p50"), direct_row]


async def run_concurrent(
    callers: Sequence[H], total: int, one: Callable[[H], Awaitable[None]]
) -> tuple[list[int], float]:
    """``total`` requests spread over ``callers`` (each used by one task); ns each, wall s."""
    samples: list[int] = []
    share = math.ceil(total / len(callers))

    async def caller(handle: H, count: int) -> None:
        for _ in range(count):
            t0 = time.perf_counter_ns()
            await one(handle)
            samples.append(time.perf_counter_ns() - t0)

    gc.collect()
    t0 = time.perf_counter()
    async with trio.open_nursery() as nursery:
        for i, handle in enumerate(callers):
            nursery.start_soon(caller, handle, max(0, min(share, total - i * share)))
    return samples, time.perf_counter() - t0


async def get_instances(client: httpx.AsyncClient) -> None:
    response = await client.get(f"{API}/instances")
    if response.status_code != 200:
        raise RuntimeError(f"GET /instances: {response.status_code} {response.text}")


async def get_health(client: httpx.AsyncClient) -> None:
    (await client.get("/healthz")).raise_for_status()


async def list_hostd(client: HostdClient) -> None:
    await client.call(m.InstanceListRequest())


async def http_rows(ctl: Controller, n: int, total: int, warmup: int) -> tuple[Result, Result]:
    """(admin GET /instances, GET /healthz) rows from ``n`` concurrent keep-alive clients."""
    async with AsyncExitStack() as stack:
        clients = [await stack.enter_async_context(admin_client(ctl.url, ctl.token)) for _ in range(n)]
        for c in clients:
            for _ in range(max(1, warmup // n)):
                await get_instances(c)
        samples, wall = await run_concurrent(clients, total, get_instances)
        admin_row = latency_result(f"admin GET /instances, {plural(n, 'client')}", samples, wall_s=wall, unit="req/s")
        samples, wall = await run_concurrent(clients, total, get_health)
        health_row = latency_result(f"GET /healthz (info), {plural(n, 'client')}", samples, wall_s=wall, unit="req/s")
    return admin_row, health_row


async def hostd_row(socket_path: Path, n: int, total: int, warmup: int) -> Result:
    """hostd's InstanceListRequest from ``n`` concurrent callers, one connection each."""
    async with AsyncExitStack() as stack:
        conns = [await stack.enter_async_context(open_hostd(socket_path, client_name="bench_admin")) for _ in range(n)]
        for c in conns:
            for _ in range(max(1, warmup // n)):
                await list_hostd(c)
        samples, wall = await run_concurrent(conns, total, list_hostd)
    return latency_result(f"hostd InstanceListRequest, {plural(n, 'caller')}", samples, wall_s=wall, unit="req/s")


async def measure_gets(ctl: Controller, socket_path: Path, args: argparse.Namespace) -> list[Result]:
    poll_s = args.poll_ms / 1000
    total, warmup = args.gets, args.warmup * 10
    results: list[Result] = []
    async with admin_client(ctl.url, ctl.token) as setup:
        ids = [await admin_provision(setup, f"bench-list-{i}", poll_s) for i in range(args.instances)]
        try:
            for n in sorted({1, *args.clients}):
                admin_row, health_row = await http_rows(ctl, n, total, warmup)
                base = await hostd_row(socket_path, n, total, warmup)
                results += [compare(admin_row, base, "p50"), base, compare(health_row, base, "p50")]
        finally:
            for instance_id in ids:
                await admin_decommission(setup, instance_id, poll_s)
    return results


async def measure(ctl: Controller, socket_path: Path, args: argparse.Namespace) -> list[Result]:
    async with httpx.AsyncClient(base_url=ctl.url, timeout=STEP_TIMEOUT_S) as probe:
        await wait_ready(probe)
    return [*await measure_provision(ctl, socket_path, args), *await measure_gets(ctl, socket_path, args)]


def main() -> None:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--iterations", type=int, default=20, help="measured provisions per case (default 20)")
    p.add_argument("--warmup", type=int, default=2, help="unmeasured provisions before each case")
    p.add_argument("--poll-ms", type=float, default=5.0, help="operation poll interval in ms (default 5)")
    p.add_argument("--gets", type=int, default=2000, help="measured GETs per case (default 2000)")
    p.add_argument("--clients", type=int, nargs="+", default=[8], help="concurrent HTTP clients (default 8)")
    p.add_argument("--instances", type=int, default=10, help="instances registered during the GETs (default 10)")
    args = p.parse_args()
    if args.versions:
        print_versions()
        return

    with running_hostd() as hostd, temp_dir("aiwg-bench-ctl-") as tmp:
        ctl = Controller(tmp / "state", hostd.socket_path)
        try:
            results = trio.run(measure, ctl, hostd.socket_path, args)
        except BaseException:
            print(ctl.log(), file=sys.stderr)
            raise
        finally:
            ctl.stop()
            # Instances provisioned through the controller run on hostd; the bench leaves none.
            trio.run(_destroy_leftovers, hostd.socket_path)

    report = Report(
        bench="bench_admin",
        title="controller admin API vs. hostd's own calls (provision to running; list)",
        vs_of="p50",
        params={
            "iterations": args.iterations,
            "poll_ms": args.poll_ms,
            "gets": args.gets,
            "clients": args.clients,
            "instances": args.instances,
        },
        results=results,
        targets=[],
        notes=["issue 3 sets no figure for these benchmarks: no target verdict"],
    )
    emit(report, as_json=args.json)


async def _destroy_leftovers(socket_path: Path) -> None:
    async with open_hostd(socket_path, client_name="bench_admin") as hostd:
        for info in (await hostd.call(m.InstanceListRequest())).instances:
            if info.state != "destroyed":
                await hostd.call(m.InstanceDestroyRequest(instance_id=info.instance_id, grace_s=0))


if __name__ == "__main__":
    main()
