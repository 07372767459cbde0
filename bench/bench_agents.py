"""Agents speaking A2A from inside an instance: an agent's artifact event to an SSE client.

Starts its own hostd and controller in a temp dir and, in one run, measures each artifact update
from the moment the agent made it (``time.time_ns()`` in its text) to its arrival at an SSE client
of ``message:stream``:

* an agent on the agent protocol (``agentic_sandbox_agent``, an ``artifact`` line per event), on a
  host instance; baseline: the same agent printing each stamp to stdout, the way output reached a
  client before the protocol;
* an unmodified a2a-sdk ``AgentExecutor`` (``bench/timestamp_executor.py``) run by
  ``python -m agentic_sandbox_agent.a2a`` on a host instance; baseline: the same executor in
  a2a-sdk's own server, in-process (``bench/peer_a2a_server.py``, Starlette on uvicorn: the peer a
  user would pick to host it without a sandbox). Needs the ``bench`` extra; otherwise not measured.

Then two loads, from one task on the protocol: ``--burst`` artifact events sent as fast as the
agent can (events/s as the SSE client receives them), and a ``--file-mib`` file sent in chunks
while an SSE client follows, with the controller's RSS sampled every 20 ms (its growth over the
idle figure before the task).

Targets (the issue's): adapter p50 at most 2x the peer's; at least 1,000 events/s from one task; a
64 MiB file with the controller's RSS growing by less than 16 MiB.
"""

from __future__ import annotations

import json
import sys
import textwrap
import time
import uuid
from pathlib import Path
from typing import Any

import httpx
import psutil
import trio
from bench_a2a import RUNTIME_EXTENSION, free_port, peer_available
from bench_admin import Controller, admin_client, wait_operation, wait_ready
from common import (
    MIB,
    ROOT,
    Report,
    Result,
    Target,
    compare,
    emit,
    latency_result,
    parser,
    print_versions,
    running_hostd,
    temp_dir,
)

EXECUTOR = Path(__file__).with_name("timestamp_executor.py")
PROTOCOL_AGENT = textwrap.dedent(
    """
    import time, agentic_sandbox_agent as agent
    channel = agent.connect(name="bench")
    events, interval_ms = (int(x) for x in channel.task.text().split())
    for i in range(events):
        if interval_ms:
            time.sleep(interval_ms / 1000)
        channel.artifact("stamps", [agent.text_part(str(time.time_ns()))], append=i > 0)
    channel.complete()
    """
)
STDOUT_AGENT = textwrap.dedent(
    """
    import sys, time
    events, interval_ms = (int(x) for x in sys.stdin.read().split())
    for i in range(events):
        time.sleep(interval_ms / 1000)
        print(time.time_ns(), flush=True)
    """
)
FILE_AGENT = textwrap.dedent(
    """
    import agentic_sandbox_agent as agent
    channel = agent.connect(name="bench-file")
    channel.send_file(channel.task.text().strip(), "big.bin", "application/octet-stream", artifact_id="file")
    channel.complete()
    """
)


def message(text: str) -> dict[str, Any]:
    return {"message": {"messageId": str(uuid.uuid4()), "role": "ROLE_USER", "parts": [{"text": text}]}}


async def stream_stamps(url: str, headers: dict[str, str], text: str) -> tuple[list[int], float, int]:
    """Send ``text`` on ``url``'s message:stream; (latency of each stamp, seconds from the first
    artifact update to the last, how many updates)."""
    samples: list[int] = []
    first = last = 0.0
    count = 0
    async with (
        httpx.AsyncClient(headers=headers, timeout=120) as client,
        client.stream("POST", f"{url}/message:stream", json=message(text)) as response,
    ):
        if response.status_code != 200:
            raise RuntimeError(f"{url}: {response.status_code} {(await response.aread())[:300]!r}")
        async for line in response.aiter_lines():
            if not line.startswith("data: "):
                continue
            now = time.time_ns()
            update = json.loads(line[6:]).get("artifactUpdate")
            if update is None:
                continue
            count += 1
            first = first or time.perf_counter()
            last = time.perf_counter()
            for part in update["artifact"]["parts"]:
                for stamp in part.get("text", "").split():
                    samples.append(now - int(stamp))
    return samples, last - first, count


async def loadout_instance(admin: httpx.AsyncClient, name: str, command: list[str]) -> tuple[str, str]:
    import yaml

    manifest = yaml.safe_dump({"name": name, "version": "1", "runtime": "host", "command": command})
    response = await admin.post("/api/v2/admin/loadouts", json={"name": name, "manifest": manifest})
    if response.status_code not in (200, 201):
        raise RuntimeError(f"loadout {name}: {response.status_code} {response.text}")
    response = await admin.post(
        "/api/v2/admin/instances", json={"name": name, "runtime": "host", "start": True, "loadout": name}
    )
    op = await wait_operation(admin, response.json()["id"], 0.01)
    return str(op["result"]["instance_id"]), str(response.json()["a2a_token"])  # type: ignore[index]


def rss(pid: int) -> int:
    return int(psutil.Process(pid).memory_info().rss)


async def file_case(ctl: Controller, url: str, headers: dict[str, str], path: Path) -> tuple[int, int, float]:
    """(idle RSS, peak RSS during the transfer, seconds) while a file goes through."""
    idle = rss(ctl.proc.pid)
    peak = idle
    done = trio.Event()

    async def sample() -> None:
        nonlocal peak
        while not done.is_set():
            peak = max(peak, rss(ctl.proc.pid))
            await trio.sleep(0.02)

    started = time.perf_counter()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(sample)
        await stream_stamps(url, headers, str(path))
        done.set()
    return idle, peak, time.perf_counter() - started


async def measure(ctl: Controller, args: Any, tmp: Path, peer_url: str | None) -> tuple[list[Result], dict[str, Any]]:
    scripts = {}
    for name, body in (("protocol", PROTOCOL_AGENT), ("stdout", STDOUT_AGENT), ("file", FILE_AGENT)):
        scripts[name] = tmp / f"{name}_agent.py"
        scripts[name].write_text(body)
    async with admin_client(ctl.url, ctl.token) as admin:
        await wait_ready(admin)
        py = sys.executable
        instances = {
            "protocol": await loadout_instance(admin, "bench-protocol", [py, str(scripts["protocol"])]),
            "stdout": await loadout_instance(admin, "bench-stdout", [py, str(scripts["stdout"])]),
            "adapter": await loadout_instance(
                admin, "bench-adapter", [py, "-m", "agentic_sandbox_agent.a2a", f"{EXECUTOR}:TimestampExecutor"]
            ),
            "file": await loadout_instance(admin, "bench-file", [py, str(scripts["file"])]),
        }

    def target(name: str) -> tuple[str, dict[str, str]]:
        instance_id, token = instances[name]
        headers = {"Authorization": f"Bearer {token}", "A2A-Extensions": RUNTIME_EXTENSION, "A2A-Version": "1.0"}
        return f"{ctl.url}/agents/{instance_id}", headers

    work = f"{args.events} {args.interval_ms}"
    await stream_stamps(*target("protocol"), "5 1")  # warm up each path once
    await stream_stamps(*target("adapter"), "5 1")
    protocol, _, _ = await stream_stamps(*target("protocol"), work)
    stdout, _, _ = await stream_stamps(*target("stdout"), work)
    adapter, _, _ = await stream_stamps(*target("adapter"), work)
    results = [
        compare(latency_result("protocol artifact line -> SSE client", protocol, unit="events/s"),
                baseline := latency_result("stdout line -> SSE client (before the protocol)", stdout, unit="events/s"),
                "p50"),
        baseline,
    ]  # fmt: skip
    adapter_row = latency_result("a2a-sdk executor via the adapter -> SSE client", adapter, unit="events/s")
    if peer_url is not None:
        headers = {"A2A-Version": "1.0"}
        await stream_stamps(peer_url, headers, "5 1")
        peer = latency_result(
            "same executor in a2a-sdk's server, in-process",
            (await stream_stamps(peer_url, headers, work))[0],
            unit="events/s",
        )
        results += [compare(adapter_row, peer, "p50"), peer]
    else:
        results.append(adapter_row)
    _, seconds, count = await stream_stamps(*target("protocol"), f"{args.burst} 0")
    burst = Result(
        case=f"burst of {args.burst} artifact events, one task",
        n=count,
        throughput=count / seconds if seconds else None,
        unit="events/s",
    )
    results.append(burst)
    path = tmp / "big.bin"
    with path.open("wb") as f:
        for _ in range(args.file_mib):
            f.write(bytes(range(256)) * 4096)
    idle, peak, seconds = await file_case(ctl, *target("file"), path)
    results.append(
        Result(case=f"{args.file_mib} MiB file, chunked, SSE client following", n=1, throughput=args.file_mib / seconds,
               unit="MiB/s", extra={"controller RSS growth MiB": round((peak - idle) / MIB, 1)})
    )  # fmt: skip
    return results, {"rss_growth": peak - idle}


def main() -> None:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--events", type=int, default=200, help="timed artifact events per case (default 200)")
    p.add_argument("--interval-ms", type=int, default=10, help="pause between timed events (default 10 ms)")
    p.add_argument("--burst", type=int, default=20000, help="events of the throughput case (default 20000)")
    p.add_argument("--file-mib", type=int, default=64, help="size of the file case (default 64 MiB)")
    args = p.parse_args()
    if args.versions:
        print_versions()
        return
    import subprocess

    peer_proc = None
    peer_url = None
    with running_hostd() as hostd, temp_dir("aiwg-bench-agents-") as tmp:
        if peer_available(False):
            port = free_port()
            peer_proc = subprocess.Popen(
                [sys.executable, str(Path(__file__).with_name("peer_a2a_server.py")), str(port),
                 "--executor", "timestamp_executor:TimestampExecutor"],
                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, cwd=Path(__file__).parent,
            )  # fmt: skip
            assert peer_proc.stdout is not None
            if peer_proc.stdout.readline().strip() == b"ready":
                peer_url = f"http://127.0.0.1:{port}/agents/peer"
        ctl = Controller(tmp / "state", hostd.socket_path)
        try:
            results, figures = trio.run(measure, ctl, args, tmp, peer_url)
        except BaseException:
            print(ctl.log(), file=sys.stderr)
            raise
        finally:
            ctl.stop()
            if peer_proc is not None:
                peer_proc.terminate()
                peer_proc.wait(10)
            from bench_admin import _destroy_leftovers

            trio.run(_destroy_leftovers, hostd.socket_path)
    by_case = {r.case: r for r in results}
    burst = next(r for r in results if r.case.startswith("burst"))
    targets = [
        Target(
            description="at least 1,000 events/s sustained from one task",
            measured=f"{burst.throughput or 0:.0f} events/s",
            met=(burst.throughput or 0) >= 1000,
        ),
        Target(
            description=f"a {args.file_mib} MiB file with the controller's RSS growing by less than 16 MiB",
            measured=f"{figures['rss_growth'] / MIB:.1f} MiB",
            met=figures["rss_growth"] < 16 * MIB,
        ),
    ]
    adapter = by_case["a2a-sdk executor via the adapter -> SSE client"]
    if adapter.vs is not None:
        targets.insert(
            0,
            Target(
                description="adapter p50 at most 2x a2a-sdk's own server in-process",
                measured=f"{adapter.vs:.2f}x",
                met=adapter.vs <= 2,
            ),
        )
    notes = (
        []
        if peer_url
        else ["a2a-sdk's server (the peer) not measured: needs the bench extra (uvicorn, a2a-sdk[http-server])"]
    )
    report = Report(
        bench="bench_agents",
        title="An agent's artifact event to an SSE client: the protocol, stdout, the a2a-sdk adapter, a2a-sdk's server",
        vs_of="p50",
        params={"events": args.events, "interval_ms": args.interval_ms, "burst": args.burst, "file_mib": args.file_mib},
        results=results,
        targets=targets,
        notes=notes,
    )
    emit(report, as_json=args.json)


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    main()
