from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from tests.hostd_process import HostdProcess
from tests.processes import alive


@pytest.fixture
def hostd(tmp_path: Path) -> Iterator[HostdProcess]:
    """A running hostd (dev mode) with its own state dir; stopped and checked afterwards.

    Every process hostd started for PTY sessions and execs must be gone once hostd stopped.
    Instance main processes are left running by design (re-adopted by the next hostd), so a
    test that starts them destroys its instances before it ends.
    """
    proc = HostdProcess(tmp_path / "state").start()
    try:
        yield proc
    finally:
        descendants: set[int] = set()
        try:
            descendants = {p.pid for p in psutil.Process(proc.proc.pid).children(recursive=True)}
        except psutil.Error:
            pass
        proc.stop()
        left = alive(descendants)
        for pid in left:
            try:
                psutil.Process(pid).kill()
            except psutil.Error:
                pass
        proc.cleanup()
        assert not left, f"processes left behind by hostd: {left}"
