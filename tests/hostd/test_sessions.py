"""SessionRegistry with real PTYs and real process trees.

Every child inherits a per-test marker in its environment; teardown fails the test (after
killing them) if any marked process outlives it. Zombies count as dead (PID 1 here may not
reap orphans).
"""

from __future__ import annotations

import gc
import os
import signal
import sys
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path

import psutil
import pytest
import trio

from agentic_sandbox.hostd import procspawn
from agentic_sandbox.hostd.config import RETAINED_PER_LIVE, SETTINGS
from agentic_sandbox.hostd.errors import QUEUE_RETRY_S, SLOT_RETRY_S, RpcError
from agentic_sandbox.hostd.proctree import Cgroups
from agentic_sandbox.hostd.ptysession import INPUT_BACKLOG_BYTES, parse_signal
from agentic_sandbox.hostd.sessions import SessionRegistry
from agentic_sandbox.proto import ErrorCode, Limit
from agentic_sandbox.proto import messages as m
from tests.hostd.registries import make_config, open_registry, real_cgroups
from tests.processes import procs_where, tree_procs

TIMEOUT = 10


def marked(token: str) -> list[psutil.Process]:
    """Live (non-zombie) processes carrying this test's marker."""
    return procs_where("AIWG_TEST_RUN", lambda v: v == token)


class Harness:
    """A session registry beside a real instance registry holding one running host instance."""

    def __init__(self, tmp_path: Path, nursery: trio.Nursery, cgroups: Cgroups, **config: object) -> None:
        self.token = uuid.uuid4().hex
        self.instance_id = f"inst-{self.token[:12]}"
        self.workdir = tmp_path / "work"
        self.workdir.mkdir(exist_ok=True)
        self.config = make_config(tmp_path, **config)
        self.instances = open_registry(self.config, cgroups, nursery)
        self.registry = SessionRegistry(self.config, cgroups, nursery, self.instances.placement)
        self.instances.on_stop.append(self.registry.kill_instance)

    async def open(self) -> Harness:
        await self.instances.provision(
            m.InstanceProvisionRequest(
                instance_id=self.instance_id,
                name="session test",
                working_dir=str(self.workdir),
                env={"LANG": "C", "AIWG_TEST_RUN": self.token},
            )
        )
        return self

    async def close(self) -> None:
        await self.registry.shutdown()
        for info in self.instances.list():
            await self.instances.destroy(info.instance_id, 0)

    async def create(self, *argv: str, **kw: object) -> m.SessionInfo:
        return await self.registry.create(m.SessionCreateRequest(instance_id=self.instance_id, argv=list(argv), **kw))  # type: ignore[arg-type]


@pytest.fixture
async def make_harness(tmp_path: Path) -> AsyncIterator[Callable[..., Awaitable[Harness]]]:
    harnesses: list[Harness] = []
    fds_before = _session_fds()
    async with trio.open_nursery() as nursery:

        async def make(cgroups: Cgroups | None = None, **config: object) -> Harness:
            h = Harness(tmp_path, nursery, cgroups or Cgroups.detect("off"), **config)
            harnesses.append(h)
            return await h.open()

        try:
            yield make
        finally:
            for h in harnesses:
                await h.close()
            nursery.cancel_scope.cancel()
    leftovers = [p for h in harnesses for p in marked(h.token)]
    for proc in leftovers:
        proc.kill()
    assert not leftovers, f"processes left behind: {leftovers}"
    zombies = [c.pid for c in psutil.Process().children() if c.status() == psutil.STATUS_ZOMBIE]
    assert not zombies, f"children not reaped: {zombies}"
    leaked = {fd: target for fd, target in _session_fds().items() if fds_before.get(fd) != target}
    assert not leaked, f"file descriptors leaked: {leaked}"


def _session_fds() -> dict[str, str]:
    """This process's fds of the kinds sessions open (PTY masters and slaves, pipes, pidfds), by
    number. Only those: the gRPC tests that ran earlier in this process leave gRPC's threads, which
    open and close eventfds and sockets of their own at any time."""
    kinds: dict[str, str] = {}
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue  # closed meanwhile (the listing's own fd)
        if target == "/dev/ptmx" or target.startswith(("/dev/pts/", "pipe:", "anon_inode:[pidfd]")):
            kinds[fd] = target
    return kinds


@pytest.fixture
async def harness(make_harness: Callable[..., Awaitable[Harness]]) -> Harness:
    return await make_harness()


class Watcher:
    """A subscriber's ``send``: records frames, lets the test wait for output."""

    def __init__(self) -> None:
        self.frames: list[m.Frame] = []
        self.data = bytearray()
        self.finished = trio.Event()
        self._changed = trio.Event()

    async def send(self, batch: m.Frame | list[m.Frame]) -> None:
        for frame in batch if isinstance(batch, list) else [batch]:
            self.frames.append(frame)
            if isinstance(frame, m.SessionOutput):
                self.data += frame.data
        self._changed.set()
        self._changed = trio.Event()

    async def wait_for(self, needle: bytes) -> None:
        with trio.move_on_after(TIMEOUT):
            while needle not in self.data:
                await self._changed.wait()
            return
        # Seen once in a full CI run (the output of a shell in its own cgroup not there after 10 s,
        # while other tests on the machine made and removed cgroups): say what did arrive.
        kinds = [type(f).__name__ for f in self.frames]
        raise AssertionError(f"{needle!r} not seen in {TIMEOUT} s; output so far {bytes(self.data)!r}, frames {kinds}")

    def of(self, kind: type) -> list:
        return [f for f in self.frames if isinstance(f, kind)]

    def outputs(self) -> list[m.SessionOutput]:
        return self.of(m.SessionOutput)


def watch(nursery: trio.Nursery, h: Harness, sid: str, from_seq: int | None = 1, stream_id: int = 7) -> Watcher:
    w = Watcher()

    async def run() -> None:
        try:
            await h.registry.subscribe(stream_id, sid, from_seq, w.send)
        finally:
            w.finished.set()

    nursery.start_soon(run)
    return w


async def collect(h: Harness, sid: str, from_seq: int | None = 1) -> Watcher:
    """Subscribe until the stream ends (the session exits)."""
    w = Watcher()
    with trio.fail_after(TIMEOUT):
        await h.registry.subscribe(3, sid, from_seq, w.send)
    return w


def assert_tree_gone(sid: str) -> None:
    assert _marked_tree(sid) == {}


async def test_lifecycle_output_and_exit_code_kept(harness: Harness) -> None:
    info = await harness.create("sh", "-c", "echo hi; exit 3")
    assert info.state == "running" and info.pid and info.cwd == str(harness.workdir)
    assert (info.cols, info.rows) == (80, 24)
    w = await collect(harness, info.session_id)
    assert isinstance(w.frames[0], m.StreamOpened) and w.frames[0].id == 3
    assert b"hi\r\n" in bytes(w.data)
    exited, end = w.frames[-2:]
    assert exited == m.SessionExited(id=3, exit_code=3, signal=None, reason="exited", last_seq=exited.last_seq)
    assert exited.last_seq == w.outputs()[-1].seq
    assert end == m.StreamEnd(id=3, reason="exited")
    got = harness.registry.get(info.session_id)
    assert (got.state, got.exit_code, got.signal, got.end_reason) == ("exited", 3, None, "exited")
    assert got.exited_at is not None and got.exited_at >= got.created_at
    assert got.next_seq == exited.last_seq + 1
    assert [s.session_id for s in harness.registry.list()] == [info.session_id]
    assert harness.registry.list("other") == []
    assert harness.registry.counts() == (1, 0)
    # Kept after exit, with its output, until deleted.
    again = await collect(harness, info.session_id)
    assert again.data == w.data
    await harness.registry.delete(info.session_id)
    assert harness.registry.counts() == (0, 0)
    with pytest.raises(RpcError) as err:
        harness.registry.get(info.session_id)
    assert err.value.code is ErrorCode.SESSION_NOT_FOUND


async def test_environment_cwd_and_ids(harness: Harness) -> None:
    (harness.workdir / "sub").mkdir()
    info = await harness.create(
        "sh",
        "-c",
        'echo "[$TERM|$AIWG_TREE|$FOO|$(pwd)]"',
        env={"FOO": "bar"},
        cwd="sub",
        session_id="my-session.1",
    )
    assert info.session_id == "my-session.1"
    w = await collect(harness, info.session_id)
    tree = harness.config.tree_id("session", "my-session.1")
    assert f"[xterm-256color|{tree}|bar|{harness.workdir / 'sub'}]".encode() in w.data
    info2 = await harness.create("sh", "-c", 'echo "[$TERM]"', env={"TERM": "dumb"})
    assert len(info2.session_id) == 36  # a UUIDv7 chosen by hostd
    assert b"[dumb]" in (await collect(harness, info2.session_id)).data
    with pytest.raises(RpcError) as err:
        await harness.create("true", session_id="my-session.1")
    assert err.value.code is ErrorCode.REQUEST_INVALID


async def test_create_errors(harness: Harness) -> None:
    with pytest.raises(RpcError) as err:
        await harness.create("/nonexistent/program", "x")
    assert err.value.code is ErrorCode.SPAWN_FAILED
    assert "/nonexistent/program" in err.value.message
    with pytest.raises(RpcError) as err:
        await harness.create("no-such-command-aiwg")
    assert err.value.code is ErrorCode.SPAWN_FAILED
    (harness.workdir / "plain").write_text("not executable")
    with pytest.raises(RpcError) as err:
        await harness.create("./plain")
    assert err.value.code is ErrorCode.SPAWN_FAILED
    garbage = harness.workdir / "garbage"
    garbage.write_bytes(b"\0\1 not a program")
    garbage.chmod(0o755)
    with pytest.raises(RpcError) as err:
        await harness.create("./garbage")  # fails in exec, after the fork
    assert err.value.code is ErrorCode.SPAWN_FAILED
    assert "Exec format error" in err.value.message
    assert not procspawn.FORKS.locked()
    with pytest.raises(RpcError) as err:
        await harness.create("true", cwd="/nonexistent/dir")
    assert err.value.code is ErrorCode.WORKING_DIR_NOT_FOUND
    with pytest.raises(RpcError) as err:
        await harness.registry.create(m.SessionCreateRequest(instance_id="other", argv=["true"]))
    assert err.value.code is ErrorCode.INSTANCE_NOT_FOUND
    assert harness.registry.counts() == (0, 0)


async def test_byte_exact_replay_from_any_seq(harness: Harness) -> None:
    # Printable bytes only: the PTY's output processing rewrites only newlines.
    pattern = bytes(range(33, 127)) * (200_000 // 94)
    script = f"import sys; sys.stdout.buffer.write(bytes(range(33, 127)) * {200_000 // 94}); sys.stdout.flush()"
    info = await harness.create(sys.executable, "-c", script)
    full = await collect(harness, info.session_id)
    outputs = full.outputs()
    assert bytes(full.data) == pattern
    assert [o.seq for o in outputs] == list(range(1, len(outputs) + 1))
    assert len(outputs) > 2, "expected the output in several chunks"
    middle = outputs[len(outputs) // 2].seq
    tail = await collect(harness, info.session_id, from_seq=middle)
    assert tail.frames[0] == m.StreamOpened(id=3, first_seq=1, next_seq=outputs[-1].seq + 1)
    assert bytes(tail.data) == b"".join(o.data for o in outputs if o.seq >= middle)
    assert pattern.endswith(bytes(tail.data))
    # From next_seq: nothing but the end.
    end = await collect(harness, info.session_id, from_seq=outputs[-1].seq + 1)
    assert [type(f) for f in end.frames] == [m.StreamOpened, m.SessionExited, m.StreamEnd]


async def test_seq_out_of_range_is_an_error_before_any_frame(make_harness: Callable[..., Awaitable[Harness]]) -> None:
    h = await make_harness(ring_frames=4, ring_bytes=1024 * 1024, spool_total_bytes=0)  # memory only
    info = await h.create("sh", "-c", "for i in 1 2 3 4 5 6 7 8 9 10; do echo line$i; sleep 0.01; done")
    await collect(h, info.session_id)
    got = h.registry.get(info.session_id)
    assert got.first_seq > 1
    for bad in (0, 1, got.first_seq - 1, got.next_seq + 1):
        w = Watcher()
        with pytest.raises(RpcError) as err:
            await h.registry.subscribe(1, info.session_id, bad, w.send)
        assert err.value.code is ErrorCode.SEQ_OUT_OF_RANGE
        assert err.value.details == {"first_seq": got.first_seq, "next_seq": got.next_seq}
        assert w.frames == []


async def test_blocked_subscriber_lags_while_others_and_the_reader_go_on(
    make_harness: Callable[..., Awaitable[Harness]],
) -> None:
    h = await make_harness(ring_frames=32, spool_total_bytes=0)  # memory only: lag is what is tested
    # 400 separate writes a millisecond apart: far more ring entries than the ring holds, however
    # the reader happens to coalesce them.
    script = (
        "import sys, time\n"
        "for i in range(400):\n"
        "    sys.stdout.write('%07d ' % i); sys.stdout.flush(); time.sleep(0.001)\n"
    )
    info = await h.create(sys.executable, "-c", script)
    sid = info.session_id
    gate = trio.Event()
    slow = Watcher()

    async def blocking_send(frame: m.Frame | list[m.Frame]) -> None:
        if not isinstance(frame, m.StreamOpened):
            await gate.wait()  # a client that stopped reading
        await slow.send(frame)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(h.registry.subscribe, 11, sid, 1, blocking_send)
        fast = await collect(h, sid)
        # The process ran to its end and everything was read while one subscriber was stuck.
        got = h.registry.get(sid)
        assert got.state == "exited" and got.exit_code == 0
        assert got.subscribers == 1
        assert got.first_seq > 1, "the ring must have evicted for this test to mean anything"
        assert fast.of(m.SessionLagged) == []
        assert bytes(fast.data).split() == [b"%07d" % i for i in range(400)]
        gate.set()
    frames = slow.frames
    assert isinstance(frames[0], m.StreamOpened)
    assert [type(f) for f in frames[-2:]] == [m.SessionExited, m.StreamEnd]
    # The stuck subscriber was told what it missed, every time, and never saw a gap otherwise.
    expected = 1
    lags = 0
    for frame in frames[1:-2]:
        if isinstance(frame, m.SessionLagged):
            lags += 1
            assert frame.id == 11 and frame.missed_from == expected and frame.resume_seq > expected
            expected = frame.resume_seq
        else:
            assert isinstance(frame, m.SessionOutput) and frame.seq == expected
            expected += 1
    assert lags >= 1
    assert expected == got.next_seq
    assert frames[-2].last_seq == got.next_seq - 1


async def test_only_new_output_when_from_seq_is_none(harness: Harness) -> None:
    info = await harness.create("cat")
    sid = info.session_id
    async with trio.open_nursery() as nursery:
        early = watch(nursery, harness, sid)
        await harness.registry.write(sid, b"before\n")
        await early.wait_for(b"before\r\nbefore\r\n")
        late = watch(nursery, harness, sid, from_seq=None)
        with trio.fail_after(TIMEOUT):
            while harness.registry.get(sid).subscribers < 2:
                await trio.sleep(0.01)
        await harness.registry.write(sid, b"after\n")
        await late.wait_for(b"after\r\nafter\r\n")
        assert b"before" not in late.data
        opened = late.frames[0]
        assert isinstance(opened, m.StreamOpened) and opened.next_seq > 1
        await harness.registry.kill(sid, 0)
    assert late.finished.is_set() and isinstance(late.frames[-1], m.StreamEnd)


async def test_interactive_write_and_signal_by_name(harness: Harness) -> None:
    info = await harness.create("cat")
    sid = info.session_id
    gc.collect()  # ptyprocess's object is gone: it must not have closed or killed anything
    async with trio.open_nursery() as nursery:
        w = watch(nursery, harness, sid)
        assert await harness.registry.write(sid, b"hello\n") == 6
        await w.wait_for(b"hello\r\nhello\r\n")  # the terminal's echo, then cat's output
        harness.registry.signal(sid, "INT")
        with trio.fail_after(TIMEOUT):
            await w.finished.wait()
    exited = w.of(m.SessionExited)[0]
    assert (exited.exit_code, exited.signal, exited.reason) == (None, 2, "signaled")
    got = harness.registry.get(sid)
    assert (got.state, got.signal, got.end_reason) == ("exited", 2, "signaled")
    with pytest.raises(RpcError) as err:
        await harness.registry.write(sid, b"x")
    assert err.value.code is ErrorCode.SESSION_EXITED
    with pytest.raises(RpcError) as err:
        harness.registry.signal(sid, "TERM")
    assert err.value.code is ErrorCode.SESSION_EXITED
    with pytest.raises(RpcError) as err:
        harness.registry.resize(sid, 100, 30)
    assert err.value.code is ErrorCode.SESSION_EXITED


async def test_signal_term_runs_the_trap(harness: Harness) -> None:
    info = await harness.create(
        "sh", "-c", 'trap "echo got-term; exit 7" TERM; echo ready; while :; do sleep 0.05; done'
    )
    sid = info.session_id
    async with trio.open_nursery() as nursery:
        w = watch(nursery, harness, sid)
        await w.wait_for(b"ready")
        harness.registry.signal(sid, "SIGTERM")
        await w.wait_for(b"got-term")
        with trio.fail_after(TIMEOUT):
            await w.finished.wait()
    assert harness.registry.get(sid).exit_code == 7


def test_parse_signal() -> None:
    import signal

    assert parse_signal("SIGINT") is signal.SIGINT
    assert parse_signal("int") is signal.SIGINT
    assert parse_signal(15) is signal.SIGTERM
    assert parse_signal("9") is signal.SIGKILL
    for bad in ("SIGFOO", "", "SIG_IGN", 0, 999, -1):
        with pytest.raises(RpcError) as err:
            parse_signal(bad)
        assert err.value.code is ErrorCode.SIGNAL_UNKNOWN


async def test_unknown_signal_on_a_running_session(harness: Harness) -> None:
    info = await harness.create("cat")
    with pytest.raises(RpcError) as err:
        harness.registry.signal(info.session_id, "SIGNOPE")
    assert err.value.code is ErrorCode.SIGNAL_UNKNOWN
    await harness.registry.kill(info.session_id, 0)


async def test_resize(harness: Harness) -> None:
    info = await harness.create("sh", "-c", "stty size; read x; stty size; read y", cols=100, rows=30)
    sid = info.session_id
    async with trio.open_nursery() as nursery:
        w = watch(nursery, harness, sid)
        await w.wait_for(b"30 100")
        harness.registry.resize(sid, 120, 40)
        assert (harness.registry.get(sid).cols, harness.registry.get(sid).rows) == (120, 40)
        await harness.registry.write(sid, b"\n")
        await w.wait_for(b"40 120")
        await harness.registry.write(sid, b"\n")
        with trio.fail_after(TIMEOUT):
            await w.finished.wait()
    with pytest.raises(RpcError) as err:
        harness.registry.resize(sid, 0, 10)
    assert err.value.code is ErrorCode.REQUEST_INVALID


def _marked_tree(sid: str) -> dict[int, psutil.Process]:
    return {proc.pid: proc for proc in tree_procs(sid)}


def _escapees(sid: str, leader: int) -> list[psutil.Process]:
    """Marked processes that left the session's Unix session (setsid)."""
    found = []
    for proc in _marked_tree(sid).values():
        try:
            if os.getsid(proc.pid) != leader:
                found.append(proc)
        except OSError:
            continue
    return found


async def test_kill_takes_the_whole_tree_including_a_double_forked_grandchild(harness: Harness) -> None:
    info = await harness.create("sh", "-c", '(setsid sh -c "sleep 300" &) ; echo started; sleep 300')
    sid = info.session_id
    async with trio.open_nursery() as nursery:
        w = watch(nursery, harness, sid)
        await w.wait_for(b"started")
        with trio.fail_after(TIMEOUT):  # sh, its sleep, and the escaped sleep
            while not _escapees(sid, info.pid) or len(_marked_tree(sid)) < 3:
                await trio.sleep(0.02)
        killed = await harness.registry.kill(sid, 0.5)
        assert_tree_gone(sid)
        assert (killed.state, killed.end_reason) == ("exited", "killed")
        assert killed.signal == 15 or killed.signal == 9
        with trio.fail_after(TIMEOUT):
            await w.finished.wait()
    assert w.of(m.SessionExited)[0].reason == "killed"
    # Killing an exited session is harmless.
    again = await harness.registry.kill(sid, None)
    assert again.end_reason == "killed"


async def test_exit_is_recorded_while_an_escaped_process_holds_the_pty(harness: Harness) -> None:
    # The escapee ignores SIGHUP: the hangup of the leader's exit may reach it before setsid.
    info = await harness.create("sh", "-c", "(trap '' HUP; setsid sleep 300 &); echo done; exit 5")
    w = await collect(harness, info.session_id)
    assert b"done" in w.data
    assert w.of(m.SessionExited)[0].exit_code == 5
    assert _marked_tree(info.session_id), "the escaped sleep should still run"
    await harness.registry.delete(info.session_id)  # sweeps escapees of an exited session
    assert_tree_gone(info.session_id)


async def test_delete_ends_subscribers_and_the_tree(harness: Harness) -> None:
    info = await harness.create("sh", "-c", "echo up; sleep 300")
    sid = info.session_id
    async with trio.open_nursery() as nursery:
        w1 = watch(nursery, harness, sid, stream_id=1)
        w2 = watch(nursery, harness, sid, stream_id=2)
        await w1.wait_for(b"up")
        await w2.wait_for(b"up")
        with trio.fail_after(TIMEOUT):
            await harness.registry.delete(sid)
            await w1.finished.wait()
            await w2.finished.wait()
    assert w1.frames[-1] == m.StreamEnd(id=1, reason="deleted")
    assert w2.frames[-1] == m.StreamEnd(id=2, reason="deleted")
    assert_tree_gone(sid)
    assert not psutil.pid_exists(info.pid) or psutil.Process(info.pid).status() == psutil.STATUS_ZOMBIE
    with pytest.raises(RpcError) as err:
        await harness.registry.delete(sid)
    assert err.value.code is ErrorCode.SESSION_NOT_FOUND


async def test_max_sessions(make_harness: Callable[..., Awaitable[Harness]]) -> None:
    h = await make_harness(max_sessions=2)
    a = await h.create("sleep", "300")
    await h.create("sleep", "300")
    with pytest.raises(RpcError) as err:
        await h.create("sleep", "300")
    assert err.value.code is ErrorCode.LIMIT_REACHED
    # Which limit, its setting, and that a session ending frees a slot: the controller's 429.
    assert Limit.from_details(err.value.details) == Limit(
        name="sessions", limit=2, setting="AIWG_MAX_SESSIONS", retry_after_s=SLOT_RETRY_S
    )
    await h.registry.kill(a.session_id, 0)
    await h.create("sleep", "300")  # exited sessions do not count
    assert h.registry.counts() == (3, 2)


def test_the_limit_names_the_setting_that_sets_it() -> None:
    assert {row.field: row.env for row in SETTINGS}["max_sessions"] == SessionRegistry.setting


async def test_input_a_session_does_not_read_is_refused_past_its_backlog(
    make_harness: Callable[..., Awaitable[Harness]],
) -> None:
    h = await make_harness()
    info = await h.create("sleep", "300")  # never reads its terminal
    chunk = b"x" * m.MAX_INPUT_BYTES
    with pytest.raises(RpcError) as err:
        for _ in range(INPUT_BACKLOG_BYTES // len(chunk) + 2):
            await h.registry.write(info.session_id, chunk)
    assert err.value.code is ErrorCode.LIMIT_REACHED
    # A fixed bound, worth retrying: a child that reads again drains it.
    assert Limit.from_details(err.value.details) == Limit(
        name="input_backlog", limit=INPUT_BACKLOG_BYTES, retry_after_s=QUEUE_RETRY_S
    )


async def test_exited_sessions_kept_are_bounded_not_dropped(make_harness: Callable[..., Awaitable[Harness]]) -> None:
    h = await make_harness(max_sessions=1)
    done = []
    for _ in range(RETAINED_PER_LIVE):
        info = await h.create("true")
        with trio.fail_after(TIMEOUT):
            while h.registry.get(info.session_id).state != "exited":
                await trio.sleep(0.01)
        done.append(info.session_id)
    with pytest.raises(RpcError) as err:
        await h.create("true")
    assert err.value.code is ErrorCode.LIMIT_REACHED
    # Waiting does not help here (no retry_after_s): exited sessions stay until deleted.
    assert Limit.from_details(err.value.details) == Limit(
        name="exited_sessions", limit=RETAINED_PER_LIVE, setting="AIWG_MAX_SESSIONS"
    )
    assert err.value.details["retained"] == RETAINED_PER_LIVE
    # Nothing was dropped to make room: every exit code is still there.
    assert all(h.registry.get(sid).exit_code == 0 for sid in done)
    await h.registry.delete(done[0])
    await h.create("true")


async def test_unknown_session_ids(harness: Harness) -> None:
    reg = harness.registry
    calls = [
        lambda: reg.get("nope"),
        lambda: reg.resize("nope", 80, 24),
        lambda: reg.signal("nope", "INT"),
    ]
    for call in calls:
        with pytest.raises(RpcError) as err:
            call()
        assert err.value.code is ErrorCode.SESSION_NOT_FOUND
    async_calls = [
        reg.write("nope", b"x"),
        reg.kill("nope", None),
        reg.delete("nope"),
        reg.subscribe(1, "nope", None, Watcher().send),
    ]
    for coro in async_calls:
        with pytest.raises(RpcError) as err:
            await coro
        assert err.value.code is ErrorCode.SESSION_NOT_FOUND


async def test_kill_instance_and_shutdown(harness: Harness) -> None:
    a = await harness.create("sleep", "300")
    b = await harness.create("sh", "-c", "trap '' TERM; echo ready; sleep 300")
    async with trio.open_nursery() as nursery:
        w = watch(nursery, harness, b.session_id)
        await w.wait_for(b"ready")  # SIGTERM is ignored from here on
        await harness.registry.kill_instance("other-instance", 0)
        # Seen once in a full CI run as (2, 1), not reproduced since: say which session ended and how.
        ended = [harness.registry.get(s.session_id) for s in (a, b)]
        assert harness.registry.counts() == (2, 2), [
            (i.session_id, i.state, i.end_reason, i.exit_code, i.signal) for i in ended
        ]
        await harness.registry.kill_instance(harness.instance_id, 0.2)
    assert harness.registry.counts() == (2, 0)
    assert harness.registry.get(a.session_id).end_reason == "killed"
    assert harness.registry.get(b.session_id).signal == 9
    c = await harness.create("sleep", "300")
    with trio.fail_after(TIMEOUT):
        await harness.registry.shutdown()
    assert harness.registry.get(c.session_id).state == "exited"
    assert_tree_gone(c.session_id)
    with pytest.raises(RpcError) as err:
        await harness.create("true")
    assert err.value.code is ErrorCode.SHUTTING_DOWN


async def test_spawn_failure_in_the_child_cleans_up(
    make_harness: Callable[..., Awaitable[Harness]], tmp_path: Path
) -> None:
    # A directory that is not a cgroup: the child's pre-exec join fails after the fork.
    fake_root = tmp_path / "not-a-cgroup"
    h = await make_harness(cgroups=Cgroups(fake_root))  # the host provider puts the instance in fake_root/<id>
    with pytest.raises(RpcError) as err:
        await h.create("true", session_id="s1")
    assert err.value.code is ErrorCode.SPAWN_FAILED
    assert "cgroup.procs" in err.value.message
    assert (fake_root / h.instance_id).is_dir() and not (fake_root / h.instance_id / "s-s1").exists()
    assert h.registry.counts() == (0, 0)
    assert not procspawn.FORKS.locked()  # a failed PTY spawn lets the exec starts go on


async def test_session_in_its_own_cgroup(make_harness: Callable[..., Awaitable[Harness]]) -> None:
    cgroups = real_cgroups()
    h = await make_harness(cgroups=cgroups)
    assert cgroups.root is not None
    instance_cgroup = cgroups.root / h.instance_id  # made by the host provider at provision
    assert instance_cgroup.is_dir()
    try:
        info = await h.create("sh", "-c", '(setsid sh -c "sleep 300" &) ; echo started; sleep 300')
        sid = info.session_id
        session_cgroup = instance_cgroup / f"s-{sid}"
        async with trio.open_nursery() as nursery:
            w = watch(nursery, h, sid)
            await w.wait_for(b"started")
            with trio.fail_after(TIMEOUT):
                while not _escapees(sid, info.pid):
                    await trio.sleep(0.02)
            escapee = _escapees(sid, info.pid)[0]
            assert escapee.pid in Cgroups.pids(session_cgroup)
            assert info.pid in Cgroups.pids(session_cgroup)
            await h.registry.delete(sid)
        assert_tree_gone(sid)
        assert not session_cgroup.exists()
    finally:
        Cgroups.kill(instance_cgroup)
        Cgroups.remove(instance_cgroup)


async def test_argv_and_env_that_exec_refuses_are_errors(harness: Harness) -> None:
    """execve refuses a NUL in argv and a bad env name only in the forked child, where ptyprocess
    does not catch it: the child must never go on as a copy of hostd (nor the RPC hang)."""
    with trio.fail_after(5):
        with pytest.raises(RpcError) as excinfo:
            await harness.create("sh", "-c", "echo hi", "a\0b")
        assert excinfo.value.code is ErrorCode.SPAWN_FAILED
        for env in ({"A=B": "x"}, {"A": "x\0y"}, {"": "x"}):
            with pytest.raises(RpcError) as excinfo:
                await harness.create("true", env=env)
            assert excinfo.value.code is ErrorCode.REQUEST_INVALID
    assert harness.registry.list() == []


async def test_kill_after_the_leader_exited_keeps_its_end_reason(harness: Harness) -> None:
    """A kill that only sweeps what the exited leader left behind does not make it ``killed``."""
    info = await harness.create("sh", "-c", "(trap '' HUP; sleep 300 &); exit 3")
    sid = info.session_id
    with trio.fail_after(TIMEOUT):  # the leader is reaped; the sleep holds the pty (drain)
        while (now := harness.registry.get(sid)).exit_code != 3:
            await trio.sleep(0.005)
    assert now.state == "running"
    killed = await harness.registry.kill(sid, 0.5)
    assert (killed.state, killed.exit_code, killed.end_reason) == ("exited", 3, "exited")
    assert_tree_gone(sid)


async def test_instance_stopping_while_a_session_spawns(harness: Harness) -> None:
    """The instance's stop (kill_instance) cannot see a session still being spawned: the create
    must notice the stop and not leave a session running in a stopped instance."""
    result: list[object] = []

    async def create() -> None:
        try:
            result.append(await harness.create("sleep", "300"))
        except RpcError as exc:
            result.append(exc)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(create)
        with trio.fail_after(10):  # wait until it is in the spawn thread
            while not harness.registry._starting:
                await trio.sleep(0)
        await harness.instances.stop(harness.instance_id, 0)
    assert isinstance(result[0], RpcError) and result[0].code is ErrorCode.INSTANCE_INVALID_STATE
    assert harness.registry.counts() == (0, 0)
    assert not marked(harness.token)


async def test_output_past_memory_is_replayed_byte_exact_from_the_spool(
    make_harness: Callable[..., Awaitable[Harness]],
) -> None:
    h = await make_harness(ring_bytes=64 * 1024, ring_memory_bytes=1024 * 1024, spool_session_bytes=64 * 1024 * 1024)
    lines = 250_000  # 2.5 MB through the PTY: forty times what memory may hold for it
    info = await h.create(sys.executable, "-c", f"import sys\nfor i in range({lines}): sys.stdout.write('%08d\\n' % i)")
    w = await collect(h, info.session_id, from_seq=1)
    expected = b"".join(b"%08d\r\n" % i for i in range(lines))
    assert len(w.data) == len(expected) and w.data == expected
    assert not any(isinstance(f, m.SessionLagged) for f in w.frames)
    spool_dir = h.config.spool_dir / info.session_id
    assert spool_dir.is_dir() and any(spool_dir.iterdir())
    got = h.registry.get(info.session_id)
    assert got.first_seq == 1
    await h.registry.delete(info.session_id)
    assert not spool_dir.exists()


def _sig_mask(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1], 16)
    raise AssertionError(f"no {field} in /proc/{pid}/status")


async def test_children_get_default_signal_actions_whatever_hostd_inherited(harness: Harness) -> None:
    # As under nohup or as a shell's background job: SIGINT and SIGHUP ignored, SIGUSR1 blocked.
    old = signal.signal(signal.SIGINT, signal.SIG_IGN), signal.signal(signal.SIGHUP, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})
    try:
        info = await harness.create("cat")
    finally:
        signal.signal(signal.SIGINT, old[0])
        signal.signal(signal.SIGHUP, old[1])
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGUSR1})
    assert info.pid is not None
    # Standard signals 1-31 (glibc keeps 32 and 33 for itself: no sigaction can change them).
    standard = (1 << 31) - 1
    assert (_sig_mask(info.pid, "SigIgn") & standard, _sig_mask(info.pid, "SigBlk") & standard) == (0, 0)
    harness.registry.signal(info.session_id, "INT")  # Ctrl-C works
    w = await collect(harness, info.session_id)
    assert w.of(m.SessionExited)[0].signal == 2
