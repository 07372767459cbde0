"""Shared parts of the ``bench/`` scripts: a throwaway hostd, statistics, the result table.

Each script measures a case through hostd and a baseline doing the same job without hostd, in
the same run, and prints one table. Latencies are sampled per operation with
``time.perf_counter_ns`` (``timeit.autorange`` gives a mean, and the targets are percentiles).
Nothing here asserts a target: a missed target is printed, not raised.

The bench depends on ``proto`` and on ``python -m hostd.main`` only, never on ``tests/``.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import platform
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Literal

import msgspec
import psutil

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    # Run as ``python bench/bench_x.py``: make ``proto`` importable without installing.
    sys.path.insert(0, str(ROOT))

from agentic_sandbox.proto import FrameBuffer, FrameEncoder, HostdClient  # noqa: E402
from agentic_sandbox.proto import messages as m  # noqa: E402

MIB = 1024 * 1024
BENCH_INSTANCE = "bench"
LIBRARIES = ("trio", "msgspec", "psutil", "ptyprocess", "httpx", "hypercorn", "quart-trio")


# ---------------------------------------------------------------------------------------------
# Results


class Result(msgspec.Struct, kw_only=True):
    """One row of the table. Latencies in microseconds; ``throughput`` in ``unit``."""

    case: str
    n: int
    p50_us: float | None = None
    p99_us: float | None = None
    throughput: float | None = None
    unit: str = ""
    #: Name of the baseline row this row is compared with (None for a baseline itself).
    baseline: str | None = None
    #: ``p50 / baseline p50`` (latency benches) or ``throughput / baseline throughput``.
    vs: float | None = None
    extra: dict[str, object] = {}


class Target(msgspec.Struct, kw_only=True):
    """An issue's target and whether this run met it (reported, never asserted)."""

    description: str
    measured: str
    met: bool


class Report(msgspec.Struct, kw_only=True):
    bench: str
    title: str
    #: Which column ``vs.`` divides: "p50" (lower is better) or "throughput" (higher is better).
    vs_of: Literal["p50", "throughput"]
    params: dict[str, object]
    results: list[Result]
    targets: list[Target]
    notes: list[str] = []
    versions: dict[str, str] = {}


def plural(n: int, word: str) -> str:
    """``1 caller``, ``8 callers``."""
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def percentile(sorted_values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile of an already sorted, non-empty sequence."""
    if not sorted_values:
        raise ValueError("no samples")
    rank = max(1, min(len(sorted_values), round(q / 100 * len(sorted_values) + 0.5)))
    return sorted_values[rank - 1]


def latency_result(
    case: str, samples_ns: Sequence[int], *, wall_s: float | None = None, unit: str = "ops/s", **extra: object
) -> Result:
    """A row from per-operation samples; throughput is ops over ``wall_s`` (default: sum)."""
    values = sorted(samples_ns)
    total_s = wall_s if wall_s is not None else sum(values) / 1e9
    return Result(
        case=case,
        n=len(values),
        p50_us=percentile(values, 50) / 1e3,
        p99_us=percentile(values, 99) / 1e3,
        throughput=len(values) / total_s if total_s > 0 else None,
        unit=unit,
        extra=dict(extra),
    )


def compare(row: Result, baseline: Result, vs_of: Literal["p50", "throughput"]) -> Result:
    """Set ``row.baseline`` and ``row.vs`` against ``baseline``."""
    row.baseline = baseline.case
    if vs_of == "p50" and row.p50_us and baseline.p50_us:
        row.vs = row.p50_us / baseline.p50_us
    elif vs_of == "throughput" and row.throughput and baseline.throughput:
        row.vs = row.throughput / baseline.throughput
    return row


# ---------------------------------------------------------------------------------------------
# Command line and output


def parser(description: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--json", action="store_true", help="print the results as JSON")
    p.add_argument("--versions", action="store_true", help="print library versions and exit")
    p.add_argument("--seed", type=int, default=1234, help="seed of the generated data")
    return p


def versions() -> dict[str, str]:
    out = {
        "python": platform.python_version(),
        "implementation": platform.python_implementation(),
        "kernel": platform.release(),
        "machine": platform.machine(),
        "cpus": str(os.cpu_count()),
    }
    for name in LIBRARIES:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = "-"
    try:
        out["agentic-sandbox-executor"] = importlib.metadata.version("agentic-sandbox-executor")
    except importlib.metadata.PackageNotFoundError:
        pass
    return out


def print_versions() -> None:
    for name, value in versions().items():
        print(f"{name:<26} {value}")


def _fmt_us(value: float | None) -> str:
    if value is None:
        return "-"
    if value >= 10_000:
        return f"{value / 1000:,.1f} ms"
    if value >= 1000:
        return f"{value / 1000:,.2f} ms"
    return f"{value:,.1f} µs"


def _fmt_tp(value: float | None, unit: str) -> str:
    if value is None:
        return "-"
    return f"{value:,.1f} {unit}" if value < 100 else f"{value:,.0f} {unit}"


def emit(report: Report, *, as_json: bool) -> None:
    """Print the report as a table (or JSON)."""
    if as_json:
        report.versions = versions()
        sys.stdout.write(msgspec.json.format(msgspec.json.encode(report).decode()) + "\n")
        return
    print(f"{report.bench}: {report.title}")
    if report.params:
        print("  " + ", ".join(f"{k}={v}" for k, v in report.params.items()))
    header = ("case", "n", "p50", "p99", "throughput", "baseline", "vs.")
    rows = [
        (
            r.case,
            str(r.n),
            _fmt_us(r.p50_us),
            _fmt_us(r.p99_us),
            _fmt_tp(r.throughput, r.unit),
            r.baseline or "(baseline)",
            "-" if r.vs is None else f"{r.vs:.2f}x",
        )
        for r in report.results
    ]
    widths = [max(len(h), *(len(row[i]) for row in rows)) for i, h in enumerate(header)]
    right = {1, 2, 3, 4, 6}

    def line(cells: Sequence[str]) -> str:
        return "  ".join(
            c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        )

    print(line(header))
    print("  ".join("-" * w for w in widths))
    for row in rows:
        print(line(row))
    vs_meaning = "p50 / baseline p50" if report.vs_of == "p50" else "throughput / baseline throughput"
    print(f"vs. = {vs_meaning}")
    for r in report.results:
        if r.extra:
            print(f"  {r.case}: " + ", ".join(f"{k}={v}" for k, v in r.extra.items()))
    for note in report.notes:
        print(f"note: {note}")
    for t in report.targets:
        print(f"target: {t.description}: {t.measured} -> {'MET' if t.met else 'MISSED'}")


# ---------------------------------------------------------------------------------------------
# A throwaway hostd


class Hostd:
    """``python -m hostd.main --dev`` in a temp state dir, stopped (and its tree killed) on exit.

    ``new_session``: hostd in a session of its own, so a Ctrl-C at the terminal reaches the bench
    only and the bench's cleanup still finds hostd serving (to destroy the instances it made)."""

    def __init__(self, state_dir: Path, env: dict[str, str] | None = None, *, new_session: bool = False) -> None:
        self.state_dir = state_dir
        self.new_session = new_session
        self.socket_path = state_dir / "hostd.sock"
        self.log_path = state_dir.parent / "hostd.log"
        self.env = {
            **os.environ,
            "AIWG_STATE_DIR": str(state_dir),
            "AIWG_HOSTD_SOCKET": str(self.socket_path),
            "AIWG_STOP_GRACE_S": "1",
            "PYTHONPATH": str(ROOT),
            **(env or {}),
        }
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout: float = 15.0) -> None:
        self.state_dir.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "agentic_sandbox.hostd.main", "--dev"],
                env=self.env,
                stdout=log,
                stderr=log,
                cwd=ROOT,
                start_new_session=self.new_session,
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"hostd exited with {self.proc.returncode}:\n{self.log()}")
            if _answers(self.socket_path):
                return
            time.sleep(0.02)
        raise RuntimeError(f"hostd did not listen within {timeout} s:\n{self.log()}")

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-5000:]
        except FileNotFoundError:
            return ""

    def stop(self, timeout: float = 20.0) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        kill_later = _descendants(self.proc.pid)
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)
        # hostd ends its sessions itself; instance main processes outlive it by design, and a
        # bench leaves nothing behind, so whatever of its tree is still there goes now.
        for proc in kill_later:
            try:
                proc.kill()  # psutil checks the pid still names the same process
            except psutil.Error:
                pass


def _answers(path: Path) -> bool:
    """hostd says Hello back (a full handshake, not a bare connect, so it is really serving)."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.settimeout(2.0)
    try:
        s.connect(str(path))
        s.sendall(FrameEncoder().encode(m.HelloRequest(id=1, protocol_version=m.PROTOCOL_VERSION, client_name="bench")))
        buffer = FrameBuffer()
        decoder = msgspec.msgpack.Decoder(m.ServerFrame)
        while (frame := buffer.next_message(decoder)) is None:
            data = s.recv(65536)
            if not data:
                return False
            buffer.feed(data)
        return isinstance(frame, m.HelloResponse)
    except (OSError, msgspec.DecodeError):
        return False
    finally:
        s.close()


def _descendants(pid: int) -> list[psutil.Process]:
    try:
        return psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return []


@contextmanager
def temp_dir(prefix: str) -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@contextmanager
def running_hostd(env: dict[str, str] | None = None, *, new_session: bool = False) -> Iterator[Hostd]:
    """A hostd for one bench run, in its own temp dir (removed afterwards)."""
    with temp_dir("aiwg-bench-") as tmp:
        hostd = Hostd(tmp / "state", env, new_session=new_session)
        try:
            hostd.start()
            yield hostd
        finally:
            hostd.stop()


async def provision_instance(client: HostdClient, instance_id: str = BENCH_INSTANCE) -> None:
    """Provision and start the instance every session of a bench runs in."""
    await client.call(m.InstanceProvisionRequest(instance_id=instance_id, name=instance_id, start=True))


async def destroy_instance(client: HostdClient, instance_id: str = BENCH_INSTANCE) -> None:
    await client.call(m.InstanceDestroyRequest(instance_id=instance_id, grace_s=0))


# ---------------------------------------------------------------------------------------------
# Direct PTY children for the baselines


class DirectPty:
    """``argv`` on a fresh PTY, spawned straight from the bench: the floor hostd is compared with."""

    def __init__(self, argv: Sequence[str], *, cwd: str | None = None) -> None:
        master, slave = os.openpty()
        try:
            self.proc = subprocess.Popen(
                list(argv), stdin=slave, stdout=slave, stderr=slave, start_new_session=True, cwd=cwd, close_fds=True
            )
        except BaseException:
            os.close(master)
            raise
        finally:
            os.close(slave)
        self.master = master

    def read(self, max_bytes: int = 65536) -> bytes:
        """Blocking read; b"" once every slave end is closed (Linux reports EIO)."""
        try:
            return os.read(self.master, max_bytes)
        except OSError:
            return b""

    def close(self) -> None:
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except OSError:
                pass
        self.proc.wait(5)
        os.close(self.master)

    def __enter__(self) -> DirectPty:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
