"""Transcripts across controller restarts: ``--cycles`` SIGKILLs of the controller (default 100).

Several sessions each run a shell printing a counter; one client per session follows it over the
binary subprotocol, and each cycle the controller is SIGKILLed and started again and every client
reconnects with ``replay_from`` its last sequence. At the end each client's transcript must be
byte-identical to hostd's own record of the session (read over the proto socket), its sequences
gap-free and its counts consecutive, and every shell still running with its first pid. Prints the
reconnect time (kill to first output on the new controller) per cycle beside the controller's
start time (process start to ready), measured in the same run.
"""

from __future__ import annotations

import re
import time
from typing import Any

import trio
from bench_admin import Controller, admin_client, wait_ready
from bench_pty_ws import Api, frame, output_bytes, ws_open
from common import Report, Target, emit, latency_result, parser, print_versions, running_hostd
from trio_websocket import ConnectionClosed, HandshakeError

from agentic_sandbox.proto import messages as m
from agentic_sandbox.proto import open_hostd

COUNTER = 'i=0; while :; do i=$((i+1)); echo "count $i"; sleep 0.01; done'


class Follower:
    def __init__(self, sid: str) -> None:
        self.sid = sid
        self.last = 0
        self.data = bytearray()
        self.first_output = trio.Event()

    async def follow(self, api: Api) -> None:
        try:
            async with ws_open(api, self.sid, query=f"replay_from={self.last}") as ws:
                await ws.send_message(frame("pty.join_session", {"role": "observer"}))
                while True:
                    got = await output_bytes(ws)
                    if got is None:
                        continue
                    seq, data = got
                    if seq != self.last + 1:
                        raise AssertionError(f"{self.sid}: seq {seq} after {self.last}")
                    self.last = seq
                    self.data += data
                    self.first_output.set()
        except (ConnectionClosed, HandshakeError, OSError):
            return


async def record(socket_path: str, sid: str, upto: int) -> bytes:
    data = bytearray()
    request = m.SessionSubscribeRequest(session_id=sid, from_seq=1)
    async with open_hostd(socket_path, client_name="bench") as client, client.stream(request) as events:
        async for event in events:
            if isinstance(event, m.SessionOutput):
                data += event.data
                if event.seq >= upto:
                    break
    return bytes(data)


async def run(args: Any) -> Report:
    with running_hostd() as hostd:
        state_dir = hostd.state_dir.parent / "controller"
        controller = Controller(state_dir, hostd.socket_path)
        client = admin_client(controller.url, controller.token)
        await wait_ready(client)
        response = await client.post("/api/v2/admin/instances", json={"name": "busy", "runtime": "host", "start": True})
        op = response.json()
        while op["state"] not in ("succeeded", "failed"):
            await trio.sleep(0.05)
            op = (await client.get(f"/api/v2/admin/operations/{op['id']}")).json()
        api = Api(controller, client, op["result"]["instance_id"])
        sessions = [await api.session(["/bin/sh", "-c", COUNTER]) for _ in range(args.sessions)]
        pids = {s["id"]: s["pid"] for s in sessions}
        followers = [Follower(s["id"]) for s in sessions]
        reconnect_ns: list[int] = []
        start_ns: list[int] = []
        killed_at = time.perf_counter_ns()
        try:
            for _cycle in range(args.cycles):
                async with trio.open_nursery() as nursery:
                    for f in followers:
                        f.first_output = trio.Event()
                        nursery.start_soon(f.follow, api)
                    with trio.fail_after(30):
                        for f in followers:
                            await f.first_output.wait()
                    if _cycle:
                        reconnect_ns.append(time.perf_counter_ns() - killed_at)
                    await trio.sleep(args.live_s)
                    killed_at = time.perf_counter_ns()
                    api.controller.proc.kill()
                    api.controller.proc.wait(5)
                await api.client.aclose()
                t0 = time.perf_counter_ns()
                controller = Controller(state_dir, hostd.socket_path)
                client = admin_client(controller.url, controller.token)
                await wait_ready(client)
                start_ns.append(time.perf_counter_ns() - t0)
                api = Api(controller, client, api.iid)
            problems = []
            for f in followers:
                info = await api.info(f.sid)
                if info["state"] != "running" or info["pid"] != pids[f.sid]:
                    problems.append(f"{f.sid}: shell changed: {info['state']} pid {info['pid']}")
                if bytes(f.data) != await record(str(hostd.socket_path), f.sid, f.last):
                    problems.append(f"{f.sid}: transcript differs from hostd's record")
                counts = [int(n) for n in re.findall(rb"count (\d+)\r\n", bytes(f.data))]
                if counts != list(range(1, len(counts) + 1)):
                    problems.append(f"{f.sid}: counts not consecutive")
        finally:
            await api.client.aclose()
            api.controller.stop()
    reconnect = latency_result("kill to first output again", reconnect_ns, unit="cycles/s")
    baseline = latency_result("controller start to ready", start_ns, unit="starts/s")
    reconnect.baseline = baseline.case
    reconnect.vs = (reconnect.p50_us or 0) / (baseline.p50_us or 1)
    total = sum(f.last for f in followers)
    return Report(
        bench="bench_restarts",
        title=f"{args.sessions} busy shells followed across {args.cycles} controller SIGKILLs",
        vs_of="p50",
        params={"cycles": args.cycles, "sessions": args.sessions},
        results=[reconnect, baseline],
        targets=[
            Target(
                description="every transcript byte-identical to hostd's record, gap-free, shells untouched",
                measured="; ".join(problems) or f"{total} frames checked",
                met=not problems,
            )
        ],
    )


def main() -> None:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--cycles", type=int, default=100)
    p.add_argument("--sessions", type=int, default=3)
    p.add_argument("--live-s", type=float, default=0.2, help="live output between reconnect and the next kill")
    args = p.parse_args()
    if args.versions:
        print_versions()
        return
    emit(trio.run(run, args), as_json=args.json)


if __name__ == "__main__":
    main()
