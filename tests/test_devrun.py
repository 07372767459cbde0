"""``make run``'s wrapper: both halves start, and every way of stopping it stops both."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import psutil
import pytest

from tests.hostd_process import ROOT
from tests.processes import alive


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start(tmp_path: Path) -> tuple[subprocess.Popen[bytes], str]:
    port = _free_port()
    env = {
        **os.environ,
        "AIWG_STATE_DIR": str(tmp_path / "run"),
        "AIWG_LISTEN": f"127.0.0.1:{port}",
        "AIWG_CGROUP_ROOT": "off",
        "PYTHONPATH": str(ROOT),
    }
    proc = subprocess.Popen(
        [sys.executable, str(ROOT / "scripts" / "devrun.py")],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        cwd=tmp_path,
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.stdout.read().decode() if proc.stdout else ""
        try:
            if httpx.get(f"{url}/readyz", timeout=1).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    proc.kill()
    raise AssertionError("make run's controller never became ready")


@pytest.mark.parametrize(
    "signals", [[signal.SIGINT], [signal.SIGTERM, signal.SIGTERM]], ids=["ctrl-c", "sigterm-twice"]
)
def test_stopping_the_wrapper_stops_both_halves(tmp_path: Path, signals: list[int]) -> None:
    proc, url = _start(tmp_path)
    children = {p.pid for p in psutil.Process(proc.pid).children()}
    try:
        assert len(children) == 2
        token = (tmp_path / "run" / "admin-token").read_text().strip()
        assert oct((tmp_path / "run" / "admin-token").stat().st_mode & 0o777) == "0o600"
        listed = httpx.get(f"{url}/api/v2/admin/instances", headers={"Authorization": f"Bearer {token}"})
        assert [item["name"] for item in listed.json()["items"]] == ["dev"]
        dev_id = listed.json()["items"][0]["id"]
        token_file = tmp_path / "run" / "instances" / "dev.token"
        deadline = time.monotonic() + 30
        while not token_file.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert oct(token_file.stat().st_mode & 0o777) == "0o600"
        card = httpx.get(
            f"{url}/agents/{dev_id}/extendedAgentCard",
            headers={"Authorization": f"Bearer {token_file.read_text().strip()}", "A2A-Version": "1.0"},
        )
        assert card.status_code == 200, card.text
        for sig in signals:  # `timeout` signals the wrapper twice: directly and through its group
            proc.send_signal(sig)
            time.sleep(0.02)  # the second one lands while the wrapper is stopping the controller
        assert proc.wait(30) == 0
        assert not alive(children), "a half of make run outlived the wrapper"
        assert not (tmp_path / "run" / "hostd.sock").exists()
    finally:
        for pid in alive(children):
            os.kill(pid, signal.SIGKILL)
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()
