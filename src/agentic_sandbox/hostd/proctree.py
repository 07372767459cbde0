"""Whole-tree process control: cgroups where the host allows, process groups and sweeps where not.

Every tree hostd starts is marked three ways so that it can be killed whole:

* its leader starts a new session, so the tree shares a process group (``pgid == leader pid``);
* its environment carries ``AIWG_TREE=<tree id>``, inherited by every descendant, including
  double-forked daemons that left the process group and were reparented to init;
* where cgroup v2 can be written, it runs in its own cgroup under hostd's subtree, and
  ``cgroup.kill`` ends everything in it, escapees included, in one write.

:func:`terminate_tree` sends SIGTERM, waits the grace period, then SIGKILLs whatever is left,
by every mark it has. Zombies count as dead: PID 1 on some hosts does not reap orphans.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import logging
import os
import signal
import time
from collections.abc import Callable, Iterable
from pathlib import Path

import psutil
import trio

log = logging.getLogger(__name__)

TREE_ENV = "AIWG_TREE"
CGROUP_SUBTREE = "agentic-sandbox"
_CGROUP_CANDIDATES = ("/sys/fs/cgroup/unified", "/sys/fs/cgroup")
_POLL_S = 0.02
_KILL_WAIT_S = 3.0


def move_self(procs: str | bytes) -> None:
    """Move the calling process (every thread of it) into the cgroup whose ``cgroup.procs`` is
    ``procs``."""
    fd = os.open(procs, os.O_WRONLY)
    try:
        os.write(fd, b"0")
    finally:
        os.close(fd)


def own_cgroup() -> str | None:
    """hostd's cgroup v2 path from ``/`` of the hierarchy (the ``0::`` line of
    ``/proc/self/cgroup``), None without one. One read, no Path: hostd asks at every start of a
    child in a cgroup (:func:`hostd.procspawn.born_in`)."""
    fd = os.open("/proc/self/cgroup", os.O_RDONLY)
    try:
        text = os.read(fd, 65536).decode()
    finally:
        os.close(fd)
    _, found, after = ("\n" + text).partition("\n0::")
    return after.partition("\n")[0] if found else None


class Cgroups:
    """hostd's cgroup v2 subtree, or nothing (``root is None``) where none can be made."""

    def __init__(self, root: Path | None) -> None:
        self.root = root

    @property
    def available(self) -> bool:
        return self.root is not None

    @classmethod
    def detect(cls, configured: str = "") -> Cgroups:
        """Find a writable cgroup v2 hierarchy and make ``agentic-sandbox/`` in it.

        ``configured``: "" tries the usual mount points, "off" disables cgroups, a path is
        used as the parent directly.
        """
        if configured == "off":
            return cls(None)
        if not configured and os.environ.get("INVOCATION_ID"):
            delegated = cls._delegated_root()
            if delegated is not None:
                return cls(delegated)
        candidates = (configured,) if configured else _CGROUP_CANDIDATES
        for base in candidates:
            base_path = Path(base)
            if not (base_path / "cgroup.procs").exists() or not (base_path / "cgroup.subtree_control").exists():
                continue  # not a cgroup v2 directory
            root = base_path if configured else base_path / CGROUP_SUBTREE
            try:
                root.mkdir(exist_ok=True)
                probe = root / f"probe-{os.getpid()}"
                probe.mkdir(exist_ok=True)
                usable = (probe / "cgroup.kill").exists() and os.access(probe / "cgroup.procs", os.W_OK)
                probe.rmdir()
            except OSError as exc:
                log.info("cgroup v2 at %s not usable: %s", base_path, exc)
                continue
            if usable:
                log.info("using cgroup v2 subtree %s", root)
                return cls(root)
        log.info("no writable cgroup v2 hierarchy; falling back to process groups and sweeps")
        return cls(None)

    @staticmethod
    def _delegated_root() -> Path | None:
        """Under systemd with ``Delegate=yes``: our unit's own cgroup, split into two leaves.

        cgroup v2 lets a cgroup hold processes or child cgroups, not both, so hostd moves
        itself into ``<unit>/supervisor`` and puts instances under ``<unit>/instances``. The
        instances stay in the unit's subtree, which is what systemd accounts and kills.
        """
        try:
            own = own_cgroup()
        except OSError:
            return None
        if not own or own == "/":
            return None
        for mount in _CGROUP_CANDIDATES:
            unit = Path(mount) / own.lstrip("/")
            if not (unit / "cgroup.procs").exists():
                continue
            try:
                (unit / "supervisor").mkdir(exist_ok=True)
                (unit / "supervisor" / "cgroup.procs").write_text(str(os.getpid()))
                root = unit / "instances"
                root.mkdir(exist_ok=True)
            except OSError as exc:
                log.warning("delegated cgroup %s not usable: %s", unit, exc)
                return None
            log.info("using delegated cgroup subtree %s", root)
            return root
        return None

    def create(self, name: str) -> Path | None:
        """Make (or reuse) the cgroup ``root/name``; None if cgroups are unavailable or it fails."""
        if self.root is None:
            return None
        path = self.root / name
        try:
            path.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            log.warning("cannot create cgroup %s: %s", path, exc)
            return None
        return path

    @staticmethod
    def join_fn(path: Path | None) -> Callable[[], None] | None:
        """A pre-exec function that moves the calling (child) process into ``path``."""
        if path is None:
            return None
        return functools.partial(move_self, os.fsencode(path / "cgroup.procs"))

    @staticmethod
    def pids(path: Path | None) -> set[int]:
        """Every pid in ``path`` and the cgroups below it.

        The tree may be removed while it is walked (its last process just exited): ``os.walk``
        skips a directory that is gone, where ``Path.rglob`` raises."""
        if path is None:
            return set()
        found: set[int] = set()
        for cgroup, _dirs, _files in os.walk(path):
            with contextlib.suppress(OSError):
                found.update(int(line) for line in Path(cgroup, "cgroup.procs").read_text().split())
        return found

    @staticmethod
    def kill(path: Path | None) -> bool:
        if path is None:
            return False
        try:
            (path / "cgroup.kill").write_text("1")
            return True
        except OSError as exc:
            if exc.errno != errno.ENOENT:
                log.warning("cgroup.kill on %s failed: %s", path, exc)
            return False

    @staticmethod
    def frozen(path: Path) -> bool:
        """Whether the kernel reports every process in ``path`` (and below) frozen."""
        try:
            return "frozen 1" in (path / "cgroup.events").read_text().splitlines()
        except OSError:
            return False

    @staticmethod
    async def freeze(path: Path, frozen: bool, *, timeout_s: float) -> None:
        """Freeze (``frozen``) or thaw every process in ``path`` and the cgroups below it, and
        return once the kernel says it is done (``cgroup.events``). The freezer takes the whole
        tree at once: no process is missed, not even one forked meanwhile. Raises OSError (with
        ``ETIMEDOUT`` when the kernel took longer than ``timeout_s``)."""
        (path / "cgroup.freeze").write_text("1" if frozen else "0")
        wait = 0.0005
        with trio.move_on_after(timeout_s):
            while Cgroups.frozen(path) != frozen:
                # Most freezes and thaws are done at once; a busy tree takes a few ms.
                await trio.sleep(wait)
                wait = min(wait * 2, _POLL_S)
            return
        state = "frozen" if frozen else "thawed"
        raise OSError(errno.ETIMEDOUT, f"cgroup {path} was not {state} within {timeout_s:g} s")

    @staticmethod
    def remove(path: Path | None) -> None:
        """Remove ``path`` and its child cgroups, deepest first; busy ones are left in place."""
        if path is None:
            return
        try:
            path.rmdir()  # the usual case, no child cgroups: one call (a cgroup's files do not count)
            return
        except FileNotFoundError:
            return
        except OSError:
            pass
        for child in sorted(_child_dirs(path), key=lambda p: len(p.parts), reverse=True):
            with contextlib.suppress(OSError):
                child.rmdir()
        with contextlib.suppress(OSError):
            path.rmdir()


def _child_dirs(path: Path) -> list[Path]:
    """Every directory below ``path`` (the entries' types come with the listing: no stat each)."""
    found: list[Path] = []
    try:
        with os.scandir(path) as entries:
            dirs = [Path(e.path) for e in entries if e.is_dir(follow_symlinks=False)]
    except OSError:
        return found
    for child in dirs:
        found.append(child)
        found += _child_dirs(child)
    return found


async def remove_cgroup(path: Path | None, *, timeout_s: float = 1.0) -> None:
    """Remove ``path`` (and child cgroups) once the kernel lets go of it.

    A cgroup stays busy for a moment after its last process died; one rmdir would leave an empty
    directory behind for every session or exec. Gives up after ``timeout_s`` with a warning.
    """
    deadline = time.monotonic() + timeout_s
    while path is not None and path.exists():
        Cgroups.remove(path)
        if not path.exists():
            return
        if time.monotonic() >= deadline:
            log.warning("cgroup %s is still busy; left in place", path)
            return
        await trio.sleep(_POLL_S)


def _alive(proc: psutil.Process) -> bool:
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


_MARK = f"{TREE_ENV}=".encode()


def _pids() -> list[int]:
    return [int(name) for name in os.listdir("/proc") if name.isdigit()]


def _read_mark(pid: int) -> str | None:
    """The tree mark in ``pid``'s environment, or None. Read raw: psutil would decode and split the
    whole environment, and these scans read every process's."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            data = f.read()
    except OSError:
        return None
    if data.startswith(_MARK):
        at = len(_MARK)
    else:
        at = data.find(b"\0" + _MARK)
        if at < 0:
            return None
        at += 1 + len(_MARK)
    end = data.find(b"\0", at)
    return data[at : end if end >= 0 else len(data)].decode(errors="replace")


def _process(pid: int, tree_id: str | None = None) -> psutil.Process | None:
    """``pid`` as a psutil process (which pins its identity against pid reuse); with ``tree_id``,
    only if it still carries that mark once pinned."""
    try:
        proc = psutil.Process(pid)
    except psutil.Error:
        return None
    if tree_id is not None and _read_mark(pid) != tree_id:
        return None
    return proc


def _tree_marked(tree_id: str) -> list[psutil.Process]:
    """Processes whose environment carries ``AIWG_TREE=tree_id`` (escapees included)."""
    found = (_process(pid, tree_id) for pid in _pids() if _read_mark(pid) == tree_id)
    return [proc for proc in found if proc is not None]


def signal_marked(tree_id: str, sig: int, *, besides: int | None) -> int:
    """Send ``sig`` to every process marked ``tree_id`` except ``besides``; how many got it (blocking)."""
    sent = 0
    for proc in _tree_marked(tree_id):
        if proc.pid == besides:
            continue
        try:
            proc.send_signal(sig)
            sent += 1
        except psutil.Error:
            continue
    return sent


def carries_mark(pid: int, tree_id: str) -> bool:
    """Whether ``pid`` runs and carries the mark ``tree_id`` (so it is that tree's, not a process that
    got its pid since)."""
    return _read_mark(pid) == tree_id


def kill_marked_with_prefix(prefix: str) -> int:
    """SIGKILL every process whose tree mark starts with ``prefix`` (a failed handover: the trees
    of sessions and execs nobody can take over); how many got it (blocking)."""
    killed = 0
    for pid in _pids():
        mark = _read_mark(pid)
        if mark is None or not mark.startswith(prefix) or pid == os.getpid():
            continue
        proc = _process(pid, mark)
        if proc is None:
            continue
        try:
            proc.kill()
            killed += 1
        except psutil.Error:
            continue
    return killed


def survey(
    *, leader: int | None, pgid: int | None, cgroup: Path | None, tree_id: str | None
) -> tuple[int | None, dict[int, psutil.Process]]:
    """One pass over the process table (blocking): the tree's group and its live members.

    The group: ``pgid`` if signalling that whole group is safe, else None. Once a tree's leader is
    reaped its pid, and so its group id, may be reused, most likely by another tree hostd just
    started. A group holding a process marked for another tree is not ours any more: its members
    are then signalled one by one, by their other marks, instead of with ``killpg``.

    The members: every live process that belongs to the tree by any of its marks. One pass, not
    one per mark: it runs in a worker thread, where every ``/proc`` read may wait for the GIL
    while hostd's event loop is busy.
    """
    members: dict[int, psutil.Process] = {}

    def add(procs: Iterable[psutil.Process | None]) -> None:
        for proc in procs:
            if proc is not None and proc.pid > 1 and proc.pid != os.getpid() and _alive(proc):
                members[proc.pid] = proc

    if leader is not None:
        with contextlib.suppress(psutil.Error):
            root = psutil.Process(leader)
            add([root, *root.children(recursive=True)])
    add(_process(pid) for pid in Cgroups.pids(cgroup))
    group = pgid is not None and pgid > 1
    unmarked: list[int] = []  # in the group, with no mark of any tree
    foreign = False
    for pid in _pids():
        try:
            in_group = group and os.getpgid(pid) == pgid
        except OSError:
            continue
        if not in_group and not tree_id:
            continue
        mark = _read_mark(pid)
        if tree_id and mark == tree_id:
            add([_process(pid, tree_id)])
        elif in_group and mark is None:
            unmarked.append(pid)
        elif in_group:
            foreign = True
    if foreign:
        log.warning("process group %s now belongs to another tree; not signalling it whole", pgid)
        return None, members
    add(_process(pid) for pid in unmarked)
    return (pgid if group else None), members


def _signal_all(members: dict[int, psutil.Process], pgid: int | None, sig: int) -> None:
    if pgid is not None and pgid > 1 and pgid != os.getpgrp():
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, sig)
    for proc in members.values():
        with contextlib.suppress(psutil.Error):
            proc.send_signal(sig)


async def _wait_gone(members: dict[int, psutil.Process], deadline: float) -> bool:
    while True:
        if not any(_alive(p) for p in members.values()):
            return True
        if time.monotonic() >= deadline:
            return False
        await trio.sleep(_POLL_S)


async def terminate_tree(
    *,
    leader: int | None,
    pgid: int | None,
    cgroup: Path | None,
    tree_id: str | None,
    grace_s: float,
) -> bool:
    """SIGTERM the whole tree, wait up to ``grace_s``, SIGKILL what is left.

    Returns True if SIGKILL was needed. Runs shielded: a cancelled caller must not leave a
    half-killed tree behind. Never signals pid 1, hostd itself or hostd's process group.
    """
    with trio.CancelScope(shield=True):
        pgid, members = await trio.to_thread.run_sync(
            lambda: survey(leader=leader, pgid=pgid, cgroup=cgroup, tree_id=tree_id)
        )
        if not members and not Cgroups.pids(cgroup):
            return False
        if grace_s > 0:
            _signal_all(members, pgid, signal.SIGTERM)
            if await _wait_gone(members, time.monotonic() + grace_s):
                # Stragglers the leader started while dying are caught by a last sweep.
                _, late = await trio.to_thread.run_sync(
                    lambda: survey(leader=None, pgid=pgid, cgroup=cgroup, tree_id=tree_id)
                )
                if not late:
                    return False
                members = late
        await kill_tree_now(leader=leader, pgid=pgid, cgroup=cgroup, tree_id=tree_id, known=members)
    return True


async def kill_tree_now(
    *,
    leader: int | None,
    pgid: int | None,
    cgroup: Path | None,
    tree_id: str | None,
    known: dict[int, psutil.Process] | None = None,
) -> None:
    """SIGKILL every member of the tree by every mark, then wait briefly for them to go."""
    with trio.CancelScope(shield=True):
        Cgroups.kill(cgroup)
        pgid, found = await trio.to_thread.run_sync(
            lambda: survey(leader=leader, pgid=pgid, cgroup=cgroup, tree_id=tree_id)
        )
        members = {**(known or {}), **found}
        _signal_all(members, pgid, signal.SIGKILL)
        if not await _wait_gone(members, time.monotonic() + _KILL_WAIT_S):
            survivors = sorted(p.pid for p in members.values() if _alive(p))
            log.error("processes %s survived SIGKILL (tree %s)", survivors, tree_id)


def pid_matches(pid: int | None, create_time: float | None) -> bool:
    """True if ``pid`` is alive and is the same process (by start time) we recorded."""
    if pid is None:
        return False
    try:
        proc = psutil.Process(pid)
        if not _alive(proc):
            return False
        return create_time is None or abs(proc.create_time() - create_time) < 0.05
    except psutil.Error:
        return False


def create_time(pid: int) -> float | None:
    try:
        return psutil.Process(pid).create_time()
    except psutil.Error:
        return None
