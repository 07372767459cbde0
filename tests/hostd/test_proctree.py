"""Whole-tree kills: every mark finds its members, and no mark reaches another tree."""

from __future__ import annotations

import os
import shutil
import subprocess
import threading
from pathlib import Path

import psutil
import trio

from agentic_sandbox.hostd.proctree import TREE_ENV, Cgroups, survey, terminate_tree
from tests.processes import alive, tree_procs


def _spawn(tree: str, *argv: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen(list(argv), env={**os.environ, TREE_ENV: tree}, start_new_session=True)


async def _wait_for(count: int, ident: str) -> None:
    with trio.fail_after(10):
        while len(tree_procs(ident)) < count:
            await trio.sleep(0.02)


async def test_marks_find_a_double_forked_escapee_without_cgroups() -> None:
    tree = f"test:exec:escape-{os.getpid()}"
    leader = _spawn(tree, "sh", "-c", "setsid sh -c 'sleep 300 &'; exec sleep 300")
    try:
        await _wait_for(2, f"escape-{os.getpid()}")
        killed_hard = await terminate_tree(leader=leader.pid, pgid=leader.pid, cgroup=None, tree_id=tree, grace_s=1)
        assert killed_hard is False  # SIGTERM was enough
        assert not tree_procs(f"escape-{os.getpid()}")
    finally:
        leader.kill()
        leader.wait()


async def test_a_reused_group_id_held_by_another_tree_is_not_signalled() -> None:
    """The group id of a reaped leader can come back as another tree's group: hands off."""
    mine = f"test:exec:mine-{os.getpid()}"
    other = _spawn(f"test:session:other-{os.getpid()}", "sleep", "300")
    try:
        # Until the child has exec'd, /proc shows the parent's environment: no mark yet.
        await _wait_for(1, f"other-{os.getpid()}")
        assert survey(leader=None, pgid=other.pid, cgroup=None, tree_id=mine) == (None, {})
        group, members = survey(leader=None, pgid=other.pid, cgroup=None, tree_id=f"test:session:other-{os.getpid()}")
        assert (group, list(members)) == (other.pid, [other.pid])
        # As if our leader had had this pid: the stale group id must not reach the other tree.
        await terminate_tree(leader=None, pgid=other.pid, cgroup=None, tree_id=mine, grace_s=0.2)
        assert alive({other.pid}) == [other.pid]
    finally:
        other.kill()
        other.wait()


async def test_a_mark_is_read_whole_wherever_it_stands_in_the_environment() -> None:
    """The mark is found first, last or alone in the environment, and only as a whole variable:
    neither a longer tree id nor a variable whose name ends in the mark's name counts."""
    tree = f"test:exec:where-{os.getpid()}"
    procs = [
        subprocess.Popen(["sleep", "300"], env={TREE_ENV: tree}, start_new_session=True),
        subprocess.Popen(["sleep", "300"], env={TREE_ENV: tree, "A": "1"}, start_new_session=True),
        subprocess.Popen(["sleep", "300"], env={"A": "1", TREE_ENV: tree}, start_new_session=True),
    ]
    lookalikes = [
        subprocess.Popen(["sleep", "300"], env={TREE_ENV: tree + "x"}, start_new_session=True),
        subprocess.Popen(["sleep", "300"], env={"X" + TREE_ENV: tree}, start_new_session=True),
    ]
    try:
        await _wait_for(3, f"where-{os.getpid()}")
        with trio.fail_after(10):  # until they have exec'd, /proc shows pytest's environment
            while any(psutil.Process(p.pid).environ().get("A") is None for p in procs[1:]) or any(
                len(psutil.Process(p.pid).environ()) != 1 for p in lookalikes
            ):
                await trio.sleep(0.01)
        _, members = survey(leader=None, pgid=None, cgroup=None, tree_id=tree)
        assert sorted(members) == sorted(p.pid for p in procs)
    finally:
        for proc in procs + lookalikes:
            proc.kill()
            proc.wait()


def test_a_cgroup_tree_removed_while_it_is_walked_is_read_as_far_as_it_stands(tmp_path: Path) -> None:
    """An exec's cgroup goes away the moment its last process exits, which may be in the middle of
    a survey of it: the walk reads what is left instead of raising (seen as an ExecCancel failing
    inside hostd). Plain directories stand in for cgroups: the walk only reads ``cgroup.procs``."""
    root = tmp_path / "instance"
    (root / "main").mkdir(parents=True)
    (root / "main" / "cgroup.procs").write_text("7\n")
    stop = threading.Event()

    def churn() -> None:  # an exec's cgroup, made and removed over and over
        while not stop.is_set():
            leaf = root / "x-exec" / "inner"
            leaf.mkdir(parents=True, exist_ok=True)
            (leaf / "cgroup.procs").write_text("9\n")
            shutil.rmtree(root / "x-exec", ignore_errors=True)

    worker = threading.Thread(target=churn)
    worker.start()
    try:
        for _ in range(3000):
            assert 7 in Cgroups.pids(root)
    finally:
        stop.set()
        worker.join()
    assert Cgroups.pids(root) == {7}
    assert Cgroups.pids(tmp_path / "gone") == set()
