"""Whole-tree kills: every mark finds its members, and no mark reaches another tree."""

from __future__ import annotations

import os
import subprocess

import trio

from hostd.proctree import TREE_ENV, own_group, terminate_tree
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
        assert own_group(other.pid, mine) is None
        assert own_group(other.pid, f"test:session:other-{os.getpid()}") == other.pid
        # As if our leader had had this pid: the stale group id must not reach the other tree.
        await terminate_tree(leader=None, pgid=other.pid, cgroup=None, tree_id=mine, grace_s=0.2)
        assert alive({other.pid}) == [other.pid]
    finally:
        other.kill()
        other.wait()
