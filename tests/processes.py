"""Looking for processes from tests: alive or not, and who carries which environment mark.

Zombies count as dead everywhere: PID 1 on this kind of host may not reap orphans.
"""

from __future__ import annotations

from collections.abc import Callable

import psutil

from agentic_sandbox.hostd.proctree import TREE_ENV


def running(proc: psutil.Process) -> bool:
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def alive(pids: set[int]) -> list[int]:
    """The pids still running."""
    out = []
    for pid in pids:
        try:
            if running(psutil.Process(pid)):
                out.append(pid)
        except psutil.Error:
            pass
    return out


def procs_where(key: str, match: Callable[[str], bool]) -> list[psutil.Process]:
    """Running processes whose environment variable ``key`` satisfies ``match``."""
    found = []
    for proc in psutil.process_iter():
        try:
            if match(proc.environ().get(key, "")) and running(proc):
                found.append(proc)
        except psutil.Error:
            continue
    return found


def tree_procs(ident: str) -> list[psutil.Process]:
    """Running members of the hostd process tree of instance, session or exec ``ident``, by its
    ``AIWG_TREE`` mark (``<namespace>:<kind>:<ident>``)."""
    return procs_where(TREE_ENV, lambda v: v.endswith(f":{ident}"))
