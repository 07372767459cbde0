"""Under systemd (Delegate=yes) hostd keeps its instances inside its own unit's cgroup."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
import trio

from agentic_sandbox.proto import messages as m
from agentic_sandbox.proto import open_hostd
from tests.hostd_process import ROOT

UNIFIED = Path("/sys/fs/cgroup/unified")


def _answers(path: Path) -> bool:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        try:
            s.connect(str(path))
        except OSError:
            return False
        return True


@pytest.mark.skipif(os.geteuid() != 0 or not (UNIFIED / "cgroup.procs").exists(), reason="needs root and cgroup v2")
async def test_delegated_unit_cgroup_is_split_into_supervisor_and_instances(tmp_path: Path) -> None:
    unit = UNIFIED / f"test-unit-{os.getpid()}-{time.monotonic_ns()}.service"
    unit.mkdir()
    state = tmp_path / "state"
    env = {
        **os.environ,
        "AIWG_STATE_DIR": str(state),
        "AIWG_HOSTD_SOCKET": str(tmp_path / "h.sock"),
        "INVOCATION_ID": "0123456789abcdef0123456789abcdef",  # what systemd sets for a service
        "AIWG_LIBVIRT_URI": "",
        "PYTHONPATH": str(ROOT),
    }

    def join_unit() -> None:
        (unit / "cgroup.procs").write_text("0")

    proc = subprocess.Popen(
        [sys.executable, "-m", "agentic_sandbox.hostd.main", "--dev"],
        env=env,
        preexec_fn=join_unit,
        cwd=ROOT,
        stderr=subprocess.PIPE,
    )
    try:
        # The socket file exists from bind() on; hostd answers only once it listens.
        with trio.fail_after(15):
            while not _answers(tmp_path / "h.sock"):
                assert proc.poll() is None, proc.stderr.read() if proc.stderr else b""
                await trio.sleep(0.05)
        async with open_hostd(tmp_path / "h.sock") as client:
            status = await client.call(m.StatusRequest())
            assert status.cgroup_root == str(unit / "instances")
            info = (
                await client.call(m.InstanceProvisionRequest(instance_id="d", name="d", command=["sleep", "60"]))
            ).instance
            host = info.host
            assert host is not None and host.cgroup and host.cgroup.startswith(str(unit / "instances"))
            # The main process is born in its cgroup (hostd/procspawn.py: born_in).
            assert str(host.pid) in Path(host.cgroup, "main", "cgroup.procs").read_text().split()
            own = Path(f"/proc/{proc.pid}/cgroup").read_text()
            assert f"0::/{unit.name}/supervisor" in own
            await client.call(m.InstanceDestroyRequest(instance_id="d", grace_s=0.5))
    finally:
        proc.terminate()
        proc.wait(20)
        for path in sorted(unit.rglob("*"), key=lambda p: len(p.parts), reverse=True):
            if path.is_dir():
                path.rmdir()
        unit.rmdir()
