"""PTY attach over WebSocket (pty-ws/v1 through the controller and hostd), beside its baselines.

Starts its own hostd and ``python -m controller.main`` (bench_admin's Controller), a bare hypercorn
WebSocket echo server (bench/ws_echo_server.py) and a tmux server, then in one run:

* **echo**: one keystroke from the send until its echo is read back, cases taking turns keystroke
  by keystroke: the controller over the binary and the JSON subprotocol (``sh -c 'stty raw -echo;
  exec cat'`` in hostd), a direct PTY, a tmux client, and the hypercorn echo server (the floor of
  any WebSocket route on this stack). Baseline: the tmux client.
* **throughput**: a session writes ``--mib`` MiB at once; one client, ten clients (each on its own
  socket, all on one session), and one reading client beside one that joined and reads nothing.
  Baseline: the same command on a direct PTY read by this process.
* **reattach**: ``--sessions`` sessions, the controller SIGKILLed and restarted, then every session
  attached at once with ``replay_from`` its previous sequence: connect to first replayed byte.

Targets (issue 10): echo p50 < 1.5 ms and p99 < 5 ms; >= 30 MB/s to one client; ten clients
together >= the one-client rate; a client that stops reading does not lower the other's rate;
100 sessions reattached in < 2 s.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import struct
import subprocess
import sys
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx
import trio
from bench_admin import Controller, admin_client, wait_ready
from bench_typing import CAT, Pty, Tmux, keystrokes
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
)
from trio_websocket import WebSocketConnection, open_websocket_url

from agentic_sandbox.proto import new_id

OUTPUT = struct.Struct(">4sQB")
DONE = b"BENCH-DONE"


def say(stage: str) -> None:
    print(f"bench_pty_ws: {stage}...", file=sys.stderr, flush=True)


def frame(op: str, payload: dict[str, Any] | None = None, **extra: Any) -> str:
    ts = datetime.now(UTC).isoformat().replace("+00:00", "Z")
    return json.dumps({"op": op, "id": new_id(), "ts": ts, "payload": payload or {}, **extra})


class Api:
    def __init__(self, controller: Controller, client: httpx.AsyncClient, iid: str) -> None:
        self.controller, self.client, self.iid = controller, client, iid

    async def session(self, argv: list[str]) -> dict[str, Any]:
        response = await self.client.post(f"/api/v2/admin/instances/{self.iid}/sessions", json={"argv": argv})
        response.raise_for_status()
        return dict(response.json())

    async def info(self, sid: str) -> dict[str, Any]:
        return dict((await self.client.get(f"/api/v2/admin/instances/{self.iid}/sessions/{sid}")).json())

    def url(self, sid: str, query: str = "") -> str:
        base = self.controller.url.replace("http", "ws", 1)
        return f"{base}/agents/{self.iid}/sessions/{sid}/attach" + (f"?{query}" if query else "")


def ws_open(api: Api, sid: str, *, binary: bool = True, query: str = "") -> Any:
    return open_websocket_url(
        api.url(sid, query),
        subprotocols=["pty-ws.v1.binary" if binary else "pty-ws.v1"],
        extra_headers=[(b"Authorization", f"Bearer {api.controller.token}".encode())],
        max_message_size=16 * MIB,
        receive_buffer_size=256 * 1024,
    )


async def output_bytes(ws: WebSocketConnection) -> tuple[int, bytes] | None:
    """The next output frame's (seq, data), answering pings; None for other frames."""
    message = await ws.get_message()
    if isinstance(message, bytes):
        _, seq, _ = OUTPUT.unpack_from(message)
        return seq, message[OUTPUT.size :]
    parsed = json.loads(message)
    if parsed["op"] == "ping":
        await ws.send_message(frame("pong", {"client_ts": parsed["payload"]["client_ts"]}))
    elif parsed["op"] == "pty.session_frame" and parsed["payload"]["kind"] == "Output":
        import base64

        return int(parsed["sequence"]), base64.b64decode(parsed["payload"]["data"])
    return None


async def wait_for(ws: WebSocketConnection, wanted: bytes) -> None:
    seen = b""
    while wanted not in seen:
        got = await output_bytes(ws)
        if got is not None:
            seen = seen[-4096:] + got[1]


# -- echo ---------------------------------------------------------------------------------------


async def echo_cases(api: Api, echo_url: str, keys: list[bytes], warmup: int) -> list[Result]:
    samples: dict[str, list[int]] = {}
    sessions = [await api.session(["/bin/sh", "-c", CAT]) for _ in range(2)]
    direct, tmux = Pty(["sh", "-c", CAT]), Tmux()
    direct.wait_for(b"READY")
    try:
        async with (
            ws_open(api, sessions[0]["id"], binary=True) as binary,
            ws_open(api, sessions[1]["id"], binary=False) as text,
            open_websocket_url(echo_url) as echo,
        ):
            for ws in (binary, text):
                await ws.send_message(frame("pty.join_session", {"role": "controller"}, replay_from=0))
                await wait_for(ws, b"READY")

            async def ws_binary(key: bytes) -> int:
                t0 = time.perf_counter_ns()
                await binary.send_message(b"PW1I" + key)
                await wait_for(binary, key)
                return time.perf_counter_ns() - t0

            async def ws_json(key: bytes) -> int:
                import base64

                t0 = time.perf_counter_ns()
                await text.send_message(frame("pty.session_input", {"data": base64.b64encode(key).decode()}))
                await wait_for(text, key)
                return time.perf_counter_ns() - t0

            async def bare(key: bytes) -> int:
                t0 = time.perf_counter_ns()
                await echo.send_message(key)
                await echo.get_message()
                return time.perf_counter_ns() - t0

            for i, key in enumerate(keys):
                for case, value in (
                    ("controller WS binary", await ws_binary(key)),
                    ("controller WS JSON", await ws_json(key)),
                    ("hypercorn WS echo", await bare(key)),
                    ("direct PTY", direct.echo(key)),
                    ("tmux client", tmux.echo(key)),
                ):
                    if i >= warmup:
                        samples.setdefault(case, []).append(value)
    finally:
        direct.close()
        tmux.close()
    return [latency_result(case, values) for case, values in samples.items()]


# -- throughput ---------------------------------------------------------------------------------


def flood_command(mib: int) -> list[str]:
    return [
        "/bin/sh",
        "-c",
        f"stty raw -echo; read go; head -c {mib * MIB} /dev/zero | tr '\\0' x; echo {DONE.decode()}; exec cat",
    ]


async def drain_until_done(ws: WebSocketConnection, counts: list[int], index: int) -> None:
    tail = b""
    while DONE not in tail:
        got = await output_bytes(ws)
        if got is not None:
            counts[index] += len(got[1])
            tail = (tail + got[1])[-64:]


async def throughput_case(api: Api, clients: int, mib: int, *, stalled: int = 0) -> tuple[float, list[int]]:
    """Total MB/s of ``clients`` reading one session's flood; each client's byte count."""
    sid = (await api.session(flood_command(mib)))["id"]
    counts = [0] * clients
    async with trio.open_nursery() as nursery:
        sockets = []
        for _ in range(clients + stalled):
            ws = await nursery.start(_hold, api, sid)
            sockets.append(ws)
        for ws in sockets[:clients]:
            await ws.send_message(frame("pty.join_session", {"role": "observer"}))
        for ws in sockets[clients:]:
            await ws.send_message(frame("pty.join_session", {"role": "observer"}))  # and never read again
        await trio.sleep(0.3)  # joins done
        controller = await nursery.start(_hold, api, sid)
        await controller.send_message(frame("pty.join_session", {"role": "controller"}))
        await trio.sleep(0.2)
        t0 = time.perf_counter()
        await controller.send_message(b"PW1I" + b"go\n")
        async with trio.open_nursery() as readers:
            for i, ws in enumerate(sockets[:clients]):
                readers.start_soon(drain_until_done, ws, counts, i)
        wall = time.perf_counter() - t0
        nursery.cancel_scope.cancel()
    return sum(counts) / wall / 1e6, counts


async def _hold(api: Api, sid: str, task_status: Any = trio.TASK_STATUS_IGNORED) -> None:
    async with ws_open(api, sid) as ws:
        task_status.started(ws)
        await trio.sleep_forever()


def direct_throughput(mib: int) -> float:
    pty = Pty(flood_command(mib))
    try:
        time.sleep(0.2)
        t0 = time.perf_counter()
        os.write(pty.master, b"go\n")
        total, tail = 0, b""
        while DONE not in tail:
            chunk = os.read(pty.master, 65536)
            total += len(chunk)
            tail = (tail + chunk)[-64:]
        return total / (time.perf_counter() - t0) / 1e6
    finally:
        pty.close()


# -- reattach -----------------------------------------------------------------------------------


async def reattach_case(api: Api, state_dir: Path, hostd_socket: Path, sessions: int) -> tuple[Api, list[int], float]:
    sids = []
    for i in range(sessions):
        sids.append((await api.session(["/bin/sh", "-c", f"echo session-{i}; exec cat"]))["id"])
    positions = {}
    for sid in sids:
        while (info := await api.info(sid))["next_seq"] < 2:
            await trio.sleep(0.01)
        positions[sid] = info["next_seq"] - 2  # replay the last chunk
    api.controller.proc.kill()
    api.controller.proc.wait(5)
    await api.client.aclose()
    controller = Controller(state_dir, hostd_socket)
    client = admin_client(controller.url, controller.token)
    await wait_ready(client)
    api = Api(controller, client, api.iid)
    samples: list[int] = []

    async def one(sid: str) -> None:
        t0 = time.perf_counter_ns()
        async with ws_open(api, sid, query=f"replay_from={positions[sid]}") as ws:
            await ws.send_message(frame("pty.join_session", {"role": "observer"}))
            while await output_bytes(ws) is None:
                pass
            samples.append(time.perf_counter_ns() - t0)

    t0 = time.perf_counter()
    async with trio.open_nursery() as nursery:
        for sid in sids:
            nursery.start_soon(one, sid)
    return api, samples, time.perf_counter() - t0


async def run(args: Any) -> Report:
    with running_hostd({"AIWG_MAX_SESSIONS": "512"}) as hostd:
        state_dir = hostd.state_dir.parent / "controller"
        controller = Controller(state_dir, hostd.socket_path)
        echo_server = subprocess.Popen(
            [sys.executable, str(ROOT / "bench" / "ws_echo_server.py")], stdout=subprocess.PIPE, cwd=ROOT
        )
        try:
            assert echo_server.stdout is not None
            echo_url = re.search(r"listening on (\S+)", echo_server.stdout.readline().decode())[1]  # type: ignore[index]
            client = admin_client(controller.url, controller.token)
            await wait_ready(client)
            response = await client.post(
                "/api/v2/admin/instances", json={"name": "bench", "runtime": "host", "start": True}
            )
            op = response.json()
            while op["state"] not in ("succeeded", "failed"):
                await trio.sleep(0.05)
                op = (await client.get(f"/api/v2/admin/operations/{op['id']}")).json()
            api = Api(controller, client, op["result"]["instance_id"])

            say("echo round trips")
            results = await echo_cases(api, echo_url, keystrokes(args.seed, args.keys + args.warmup), args.warmup)
            rows = {r.case: r for r in results}
            for case in ("controller WS binary", "controller WS JSON", "hypercorn WS echo", "direct PTY"):
                compare(rows[case], rows["tmux client"], "p50")

            say("throughput")
            base_tp = direct_throughput(args.mib)
            one_tp, _ = await throughput_case(api, 1, args.mib)
            ten_tp, ten_counts = await throughput_case(api, 10, args.mib)
            stalled_tp, _ = await throughput_case(api, 1, args.mib, stalled=1)
            tp_rows = [
                Result(case="direct PTY read", n=1, throughput=base_tp, unit="MB/s"),
                Result(case="1 WS client", n=1, throughput=one_tp, unit="MB/s", baseline="direct PTY read"),
                Result(
                    case="10 WS clients (total)",
                    n=10,
                    throughput=ten_tp,
                    unit="MB/s",
                    baseline="direct PTY read",
                    extra={"min_client_mib": round(min(ten_counts) / MIB, 1)},
                ),
                Result(
                    case="1 WS client + 1 stalled", n=1, throughput=stalled_tp, unit="MB/s", baseline="direct PTY read"
                ),
            ]
            for row in tp_rows[1:]:
                row.vs = (row.throughput or 0) / base_tp

            say("reattach")
            api, samples, wall = await reattach_case(api, state_dir, hostd.socket_path, args.sessions)
            reattach = latency_result(
                f"reattach x{args.sessions}", samples, wall_s=wall, unit="attach/s", wall_s_total=round(wall, 3)
            )
            await api.client.aclose()
        finally:
            echo_server.kill()
            echo_server.wait(5)
            api_controller = locals().get("api")
            (api_controller.controller if api_controller else controller).stop()
    ws_bin = rows["controller WS binary"]
    targets = [
        Target(
            description="echo p50 < 1.5 ms (binary)",
            measured=f"{ws_bin.p50_us:.0f} µs",
            met=(ws_bin.p50_us or 1e9) < 1500,
        ),
        Target(
            description="echo p99 < 5 ms (binary)",
            measured=f"{ws_bin.p99_us:.0f} µs",
            met=(ws_bin.p99_us or 1e9) < 5000,
        ),
        Target(description=">= 30 MB/s to one client", measured=f"{one_tp:.1f} MB/s", met=one_tp >= 30),
        Target(
            description="ten clients together >= one client",
            measured=f"{ten_tp:.1f} vs {one_tp:.1f} MB/s",
            met=ten_tp >= one_tp,
        ),
        Target(
            description="a stalled client does not lower the other's rate",
            measured=f"{stalled_tp:.1f} vs {one_tp:.1f} MB/s",
            met=stalled_tp >= 0.8 * one_tp,
        ),
        Target(
            description=f"{args.sessions} sessions reattached after a restart in < 2 s",
            measured=f"{wall:.2f} s",
            met=wall < 2.0,
        ),
    ]
    return Report(
        bench="bench_pty_ws",
        title="PTY attach over WebSocket vs. direct PTY, tmux and a bare hypercorn WS echo",
        vs_of="p50",
        params={"keys": args.keys, "mib": args.mib, "sessions": args.sessions},
        results=[*results, *tp_rows, reattach],
        targets=targets,
        notes=["throughput rows: vs. = throughput / direct PTY read"],
    )


def main() -> None:
    p = parser(__doc__.splitlines()[0])
    p.add_argument("--keys", type=int, default=300, help="keystrokes per echo case")
    p.add_argument("--warmup", type=int, default=20)
    p.add_argument("--mib", type=int, default=64, help="MiB each throughput case writes")
    p.add_argument("--sessions", type=int, default=100, help="sessions reattached after the restart")
    args = p.parse_args()
    if args.versions:
        print_versions()
        return
    if shutil.which("tmux") is None:
        raise SystemExit("bench_pty_ws needs tmux for its baseline")
    emit(trio.run(run, args), as_json=args.json)


if __name__ == "__main__":
    main()
