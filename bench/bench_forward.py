"""Two hosts on one PostgreSQL: what forwarding to the instance's host adds to an A2A send and to a
keystroke echo over the attach socket, against the same request made at the host's own controller.

Starts a private PostgreSQL cluster (``scripts/pgcluster.py``), two hostds (two hosts: each its own
state dir, socket and host id) and a controller beside each (A and B, on one database), provisions
an instance on host B (``host_label: zone=b``, the ``echo`` loadout) and measures, interleaved
round by round so both paths see the same machine:

* a blocking ``message:send`` (HTTP+JSON, keep-alive httpx) at B (direct) and at A (forwarded to B);
* a keystroke echo on a ``cat`` PTY session of that instance, attached once at B and once at A
  (binary pty-ws/v1): the time from a key sent to its echo read back.

Targets (issue 25): forwarded p50 minus direct p50 under 1 ms for a send and under 0.5 ms for a
keystroke. It also reports A's on-CPU time per send (``/proc/PID/task/*/schedstat``) when it forwards
the sends and when they are made at B, so what forwarding itself costs is their difference.
Everything started is stopped and removed on the way out, also on Ctrl-C.
"""

from __future__ import annotations

import signal
import sys
import time
import uuid
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import httpx
import trio
from bench_a2a import agent_client, on_cpu_ns, send_one
from bench_admin import Controller, admin_client, wait_ready
from bench_controllers import _leave_no_instance, load_pgcluster
from bench_pty_ws import frame, wait_for
from bench_typing import CAT, keystrokes
from common import Report, Result, Target, compare, emit, latency_result, parser, print_versions, running_hostd
from trio_websocket import open_websocket_url


async def until_hosts(client: httpx.AsyncClient, count: int) -> dict[str, str]:
    """Once ``count`` hosts are registered: zone label -> host id."""
    with trio.fail_after(30):
        while True:
            items = (await client.get("/api/v2/admin/hosts")).json().get("items", [])
            if len(items) >= count:
                return {h["labels"].get("zone", ""): h["id"] for h in items}
            await trio.sleep(0.1)


async def provision_on(client: httpx.AsyncClient, zone: str) -> tuple[str, str]:
    body = {"name": f"fwd-{zone}", "runtime": "host", "start": True, "loadout": "echo", "host_label": f"zone={zone}"}
    response = await client.post("/api/v2/admin/instances", json=body)
    if response.status_code != 202:
        raise RuntimeError(f"provision: {response.status_code} {response.text}")
    op = response.json()
    while op["state"] not in ("succeeded", "failed"):
        await trio.sleep(0.05)
        op = (await client.get(f"/api/v2/admin/operations/{op['id']}")).json()
    if op["state"] != "succeeded":
        raise RuntimeError(f"provision: {op}")
    return str(op["result"]["instance_id"]), str(response.json()["a2a_token"])


def attach(url: str, iid: str, sid: str, token: str) -> Any:
    return open_websocket_url(
        url.replace("http", "ws", 1) + f"/agents/{iid}/sessions/{sid}/attach",
        subprotocols=["pty-ws.v1.binary"],
        extra_headers=[(b"Authorization", f"Bearer {token}".encode())],
    )


async def measure(direct: Controller, edge: Controller, args: Any) -> tuple[list[Result], dict[str, float]]:
    admin = admin_client(direct.url, direct.token)
    await wait_ready(admin)
    await wait_ready(admin_client(edge.url, edge.token))
    zones = await until_hosts(admin, 2)
    iid, token = await provision_on(admin, "b")
    print(f"bench_forward: instance {iid} on host {zones['b']}", file=sys.stderr, flush=True)
    samples: dict[str, list[int]] = {}

    async with agent_client(direct.url, iid, token) as at_b, agent_client(edge.url, iid, token) as at_a:
        for _ in range(args.warmup):
            await send_one(at_b)
            await send_one(at_a)
        for _ in range(args.sends):  # interleaved: both paths see the same machine
            for case, client in (("send at the host's controller", at_b), ("send forwarded by another host's", at_a)):
                t0 = time.perf_counter_ns()
                await send_one(client)
                samples.setdefault(case, []).append(time.perf_counter_ns() - t0)
        # A's on-CPU time per send, with the sends made at B (what A does anyway: the store's news
        # of B's tasks) and made at A (that plus forwarding them).
        cpu: dict[str, float] = {}
        for name, client in (("direct", at_b), ("forwarded", at_a)):
            before = on_cpu_ns(edge.proc.pid)
            for _ in range(args.sends // 2):
                await send_one(client)
            cpu[name] = (on_cpu_ns(edge.proc.pid) - before) / (args.sends // 2) / 1e3

    sids = []
    for _ in range(2):  # one session per path: each attachment is its session's only controller
        made = await admin.post(f"/api/v2/admin/instances/{iid}/sessions", json={"argv": ["/bin/sh", "-c", CAT]})
        sids.append(made.json()["id"])
    keys = keystrokes(args.seed, args.keys + args.warmup)
    async with (
        attach(direct.url, iid, sids[0], direct.token) as at_b,
        attach(edge.url, iid, sids[1], edge.token) as at_a,
    ):
        for ws in (at_b, at_a):
            await ws.send_message(frame("pty.join_session", {"role": "controller"}, replay_from=0))
            await wait_for(ws, b"READY")
        for i, key in enumerate(keys):
            for case, ws in (("keystroke at the host's controller", at_b), ("keystroke forwarded", at_a)):
                t0 = time.perf_counter_ns()
                await ws.send_message(b"PW1I" + key)
                await wait_for(ws, key)
                if i >= args.warmup:
                    samples.setdefault(case, []).append(time.perf_counter_ns() - t0)
    rows = {case: latency_result(case, values) for case, values in samples.items()}
    compare(rows["send forwarded by another host's"], rows["send at the host's controller"], "p50")
    compare(rows["keystroke forwarded"], rows["keystroke at the host's controller"], "p50")
    return list(rows.values()), cpu


def targets(results: list[Result]) -> list[Target]:
    rows = {r.case: r for r in results}
    out = []
    for direct, forwarded, bound_ms, what in (
        ("send at the host's controller", "send forwarded by another host's", 1.0, "an A2A send"),
        ("keystroke at the host's controller", "keystroke forwarded", 0.5, "a keystroke echo"),
    ):
        extra_ms = ((rows[forwarded].p50_us or 0) - (rows[direct].p50_us or 0)) / 1e3
        out.append(
            Target(
                description=f"forwarding adds under {bound_ms:g} ms p50 to {what}",
                measured=f"+{extra_ms:.2f} ms ({rows[direct].p50_us or 0:.0f} -> {rows[forwarded].p50_us or 0:.0f} µs)",
                met=extra_ms < bound_ms,
            )
        )
    return out


def main() -> None:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--sends", type=int, default=300, help="measured sends per path (default 300)")
    p.add_argument("--keys", type=int, default=300, help="measured keystrokes per path (default 300)")
    p.add_argument("--warmup", type=int, default=20, help="unmeasured sends and keys first (default 20)")
    args = p.parse_args()
    if args.versions:
        print_versions()
        return
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    pgcluster = load_pgcluster()
    if (why := pgcluster.missing()) is not None:
        sys.exit(f"bench_forward: {why}")
    token = f"bench-{uuid.uuid4().hex}"
    with ExitStack() as stack:
        pg = pgcluster.PgCluster()
        stack.callback(pg.remove)
        pg.start()
        url = pg.create_database("forward")
        controllers: list[Controller] = []
        for zone in ("a", "b"):
            hostd = stack.enter_context(running_hostd(new_session=True))
            stack.callback(_leave_no_instance, hostd.socket_path)
            env = {"AIWG_DATABASE_URL": url, "AIWG_HOST_LABELS": f"zone={zone}", "AIWG_HOST_HEARTBEAT_S": "0.5"}
            state: Path = hostd.state_dir.parent / "controller"
            ctl = Controller(state, hostd.socket_path, env, token=token)
            stack.callback(ctl.stop)
            controllers.append(ctl)
        edge, direct = controllers
        results, figures = trio.run(measure, direct, edge, args)
    report = Report(
        bench="bench_forward",
        title="a request for another host's instance, forwarded, vs. made at its own host's controller",
        vs_of="p50",
        params={"sends": args.sends, "keys": args.keys, "warmup": args.warmup},
        results=results,
        targets=targets(results),
        notes=[
            f"controller A's on-CPU time per send: {figures['forwarded']:.0f} µs when it forwards it, "
            f"{figures['direct']:.0f} µs when the send is made at B (the news of B's tasks it takes in anyway): "
            f"forwarding costs A {figures['forwarded'] - figures['direct']:.0f} µs"
        ],
    )
    emit(report, as_json=args.json)


if __name__ == "__main__":
    main()
