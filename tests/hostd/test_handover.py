"""The handover document: written to a memfd, read back whole, refused by version before anything."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import msgspec
import pytest

from agentic_sandbox.hostd import handover
from agentic_sandbox.hostd.config import from_env
from agentic_sandbox.hostd.handover import Document, EndState, RingState, SessionRecord, SessionState
from agentic_sandbox.proto import messages as m


def _document(**fields: object) -> Document:
    session = SessionState(
        session=SessionRecord(
            id="s1",
            instance_id="i1",
            argv=["bash"],
            cwd="/",
            cols=80,
            rows=24,
            created_at=1.0,
            launch=m.SessionCreateRequest(instance_id="i1", argv=["bash"]),
            pid=123,
        ),
        master_fd=7,
        pending_input=b"ls\n",
        end=EndState(),
        ring=RingState(next_seq=3, entries=[(1, 0, b"a"), (2, 0, b"\x00\xff")]),
    )
    values: dict[str, object] = {
        "version": handover.VERSION,
        "written_by": "test",
        "written_at": time.time(),
        "pid": os.getpid(),
        "listener_fd": 5,
        "socket_path": "/run/x.sock",
        "socket_ino": (1, 2),
        "started_at": 1.0,
        "upgrades": 3,
        "sessions": [session],
        "execs": [],
    }
    values.update(fields)
    return Document(**values)  # type: ignore[arg-type]


def test_a_document_reads_back_whole_and_names_its_fds() -> None:
    document = _document()
    fd = handover.write(document)
    assert os.get_inheritable(fd), "the new image could not read it"
    back = handover.read(fd)
    assert back == document
    assert back.sessions[0].ring.entries[1] == (2, 0, b"\x00\xff")
    assert document.fds() == [5, 7]
    with pytest.raises(OSError):
        os.fstat(fd)  # read() closed it


@pytest.mark.parametrize("version", [handover.VERSION + 1, 0])
def test_a_version_it_does_not_read_is_refused_before_decoding(version: int) -> None:
    # Only the version decodes: the rest may be anything a future layout holds.
    data = msgspec.msgpack.encode({"version": version, "sessions": "a future layout"})
    fd = os.memfd_create("doc", 0)
    os.write(fd, data)
    os.lseek(fd, 0, os.SEEK_SET)
    with pytest.raises(handover.HandoverRefused, match=f"version {version} is (newer|older) than"):
        handover.read(fd)


def test_garbage_is_refused() -> None:
    fd = os.memfd_create("doc", 0)
    os.write(fd, b"\xc1 not msgpack")
    os.lseek(fd, 0, os.SEEK_SET)
    with pytest.raises(handover.HandoverRefused, match="not one"):
        handover.read(fd)


def test_the_fd_variable_is_taken_out_of_the_environment() -> None:
    env = {handover.FD_ENV: "9", "OTHER": "1"}
    assert handover.take_fd(env) == 9
    assert env == {"OTHER": "1"}
    assert handover.take_fd(env) is None
    with pytest.raises(handover.HandoverRefused):
        handover.take_fd({handover.FD_ENV: "nine"})


_TAKE_OVER = """
import os, sys
import msgspec
from agentic_sandbox.hostd import handover
from agentic_sandbox.hostd.config import from_env
from agentic_sandbox.hostd.main import take_over
config = from_env({"AIWG_STATE_DIR": sys.argv[1], "AIWG_HOSTD_SOCKET": sys.argv[1] + "/s"}, dev=True)
passed = int(sys.argv[2])
kept = os.open("/dev/null", os.O_RDONLY)  # hostd's own: close-on-exec, so not the handover's
fd = os.memfd_create("doc", 0)
os.write(fd, msgspec.msgpack.encode({"version": handover.VERSION + 7}))
os.lseek(fd, 0, os.SEEK_SET)
env = {handover.FD_ENV: str(fd)}
assert take_over(env, config) is None
assert handover.FD_ENV not in env
try:
    os.fstat(passed)
    sys.exit("the fd the handover passed is still open")
except OSError:
    pass
os.fstat(kept)
print("ok")
"""


def test_a_refused_document_ends_its_trees_and_closes_what_it_passed(tmp_path: Path) -> None:
    """The new image cannot serve what it cannot read: the session trees go (no orphans) and the fds
    handed over are closed (the listening socket among them, so a fresh bind finds the path free).
    Run in a process of its own: it closes every inheritable fd of the process it runs in."""
    config = from_env({"AIWG_STATE_DIR": str(tmp_path), "AIWG_HOSTD_SOCKET": str(tmp_path / "s")}, dev=True)
    marked = subprocess.Popen(["sleep", "60"], env={**os.environ, "AIWG_TREE": config.tree_id("session", "orphan")})
    bystander = subprocess.Popen(["sleep", "60"], env={**os.environ, "AIWG_TREE": "other:session:x"})
    passed_r, passed_w = os.pipe()
    try:
        done = subprocess.run(
            [sys.executable, "-c", _TAKE_OVER, str(tmp_path), str(passed_r)],
            pass_fds=(passed_r,),
            capture_output=True,
            timeout=60,
        )
        assert done.returncode == 0 and done.stdout == b"ok\n", done.stderr
        assert marked.wait(5) == -9
        assert bystander.poll() is None, "a tree of another hostd was touched"
    finally:
        for proc in (bystander, marked):
            proc.kill()
            proc.wait()
        os.close(passed_r)
        os.close(passed_w)


def test_the_check_flag_says_which_versions_this_code_takes() -> None:
    env = {**os.environ, "AIWG_STATE_DIR": "/nonexistent-is-fine"}
    ok = subprocess.run(
        [sys.executable, "-m", "agentic_sandbox.hostd.main", "--check-handover", str(handover.VERSION)],
        env=env,
        capture_output=True,
        timeout=60,
    )
    assert ok.returncode == 0, ok.stderr
    refused = subprocess.run(
        [sys.executable, "-m", "agentic_sandbox.hostd.main", "--check-handover", str(handover.VERSION + 1)],
        env=env,
        capture_output=True,
        timeout=60,
    )
    assert refused.returncode == 3
    assert b"newer than what this hostd reads" in refused.stderr
