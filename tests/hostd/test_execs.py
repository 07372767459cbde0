"""ExecRegistry with real processes, pipes and control channels, inside a real instance."""

from __future__ import annotations

import itertools
import math
import os
import signal
import sys
import textwrap
from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import trio

from agentic_sandbox.hostd import procspawn, proctree
from agentic_sandbox.hostd.config import SETTINGS, HostdConfig
from agentic_sandbox.hostd.errors import SLOT_RETRY_S, RpcError
from agentic_sandbox.hostd.execs import ExecRegistry
from agentic_sandbox.hostd.instances import InstanceRegistry
from agentic_sandbox.hostd.proctree import Cgroups
from agentic_sandbox.proto import ErrorCode, Limit, new_id
from agentic_sandbox.proto import messages as m
from tests.hostd.registries import make_config, open_registry, real_cgroups
from tests.processes import tree_procs

WAIT_S = 10.0
PY = sys.executable
# The grandchild leaves the process group (setsid) but keeps stdout open: only the tree's marks find it.
DOUBLE_FORK = ["sh", "-c", "setsid sh -c 'sleep 300 &'; echo ready; exec sleep 300"]


class Env:
    def __init__(self, instances: InstanceRegistry, execs: ExecRegistry, instance_id: str, workdir: Path) -> None:
        self.instances = instances
        self.execs = execs
        self.instance_id = instance_id
        self.workdir = workdir

    async def start(self, argv: list[str], **fields: object) -> m.ExecInfo:
        return await self.execs.start(m.ExecStartRequest(instance_id=self.instance_id, argv=argv, **fields))  # type: ignore[arg-type]

    async def events(self, exec_id: str, from_seq: int | None = 1) -> list[m.Frame]:
        """Subscribe and collect every frame up to the end of the stream."""
        frames: list[m.Frame] = []

        async def send(frame: m.Frame | list[m.Frame]) -> None:
            frames.extend(frame if isinstance(frame, list) else [frame])

        with trio.fail_after(WAIT_S):
            await self.execs.subscribe(7, exec_id, from_seq, send)
        assert all(f.id == 7 for f in frames)
        return frames

    async def wait_exited(self, exec_id: str) -> m.ExecInfo:
        with trio.fail_after(WAIT_S):
            while (info := self.execs.get(exec_id)).state != "exited":
                await trio.sleep(0.01)
        return info


async def open_env(config: HostdConfig, cgroups: Cgroups, nursery: trio.Nursery, workdir: Path) -> Env:
    instances = open_registry(config, cgroups, nursery)
    execs = ExecRegistry(config, cgroups, nursery, instances.placement)
    instances.on_stop.append(execs.kill_instance)
    instances.count_children = lambda iid: (0, execs.count(iid))
    workdir.mkdir(exist_ok=True)
    req = m.InstanceProvisionRequest(
        instance_id=f"i-{new_id()}", name="exec test", working_dir=str(workdir), env={"FROM_INSTANCE": "yes"}
    )
    await instances.provision(req)
    return Env(instances, execs, req.instance_id, workdir)


async def close_env(env: Env) -> None:
    await env.execs.shutdown()
    for info in env.instances.list():
        await env.instances.destroy(info.instance_id, 0.5)


@pytest.fixture
def config(tmp_path: Path) -> HostdConfig:
    return make_config(tmp_path)


@pytest.fixture
async def env(config: HostdConfig, tmp_path: Path, leak_check: None) -> AsyncIterator[Env]:
    async with trio.open_nursery() as nursery:
        harness = await open_env(config, Cgroups.detect("off"), nursery, tmp_path / "wd")
        yield harness
        await close_env(harness)
        nursery.cancel_scope.cancel()


def outputs(frames: list[m.Frame], stream: str) -> bytes:
    return b"".join(f.data for f in frames if isinstance(f, m.ExecOutput) and f.stream == stream)


def seqs(frames: list[m.Frame]) -> list[int]:
    return [f.seq for f in frames if isinstance(f, m.ExecOutput | m.ExecControlMessage)]


def code_of(excinfo: pytest.ExceptionInfo[RpcError]) -> ErrorCode:
    return excinfo.value.code


# ---------------------------------------------------------------------------------------------


async def test_stdout_stderr_separated_with_seqs_and_exit_code(env: Env, config: HostdConfig) -> None:
    script = textwrap.dedent(
        """
        import os, sys
        for i in range(20):
            os.write(1, b"out%d;" % i)
            os.write(2, b"err%d;" % i)
        print(os.getcwd(), os.environ["FROM_INSTANCE"], os.environ["AIWG_TREE"], os.environ["EXTRA"], flush=True)
        sys.exit(3)
        """
    )
    info = await env.start([PY, "-c", script], env={"EXTRA": "x"})
    assert info.state == "running" and info.pid and info.cwd == str(env.workdir) and not info.control
    assert os.getpgid(info.pid) == info.pid
    frames = await env.events(info.exec_id)
    assert isinstance(frames[0], m.StreamOpened) and frames[0].first_seq == 1
    out = outputs(frames, "stdout")
    assert out.startswith(b"".join(b"out%d;" % i for i in range(20)))
    tree = config.tree_id("exec", info.exec_id)
    assert tree.endswith(f":exec:{info.exec_id}")
    assert out.endswith(f"{env.workdir} yes {tree} x\n".encode())
    assert outputs(frames, "stderr") == b"".join(b"err%d;" % i for i in range(20))
    numbers = seqs(frames)
    assert numbers == list(range(1, len(numbers) + 1))
    exited, end = frames[-2], frames[-1]
    assert isinstance(exited, m.ExecExited) and exited.exit_code == 3 and exited.signal is None
    assert exited.reason == "exited" and exited.last_seq == numbers[-1]
    assert isinstance(end, m.StreamEnd) and end.reason == "exited"
    final = env.execs.get(info.exec_id)
    assert final.state == "exited" and final.exit_code == 3 and final.end_reason == "exited"
    assert final.next_seq == numbers[-1] + 1
    assert env.execs.count(env.instance_id) == 1
    assert env.instances.get(env.instance_id).execs == 1
    await env.execs.delete(info.exec_id)
    with pytest.raises(RpcError) as excinfo:
        env.execs.get(info.exec_id)
    assert code_of(excinfo) is ErrorCode.EXEC_NOT_FOUND


async def test_stdin_initial_then_writes_then_eof(env: Env) -> None:
    info = await env.start(["cat"], stdin=b"hello\n", keep_stdin_open=True)
    assert await env.execs.write(info.exec_id, b"world\n", False) == 6
    assert await env.execs.write(info.exec_id, b"bye\n", True) == 4
    with pytest.raises(RpcError) as excinfo:
        await env.execs.write(info.exec_id, b"late", False)
    assert code_of(excinfo) in (ErrorCode.REQUEST_INVALID, ErrorCode.EXEC_EXITED)
    frames = await env.events(info.exec_id)
    assert outputs(frames, "stdout") == b"hello\nworld\nbye\n"
    assert env.execs.get(info.exec_id).exit_code == 0
    with pytest.raises(RpcError) as excinfo:
        await env.execs.write(info.exec_id, b"x", False)
    assert code_of(excinfo) is ErrorCode.EXEC_EXITED

    # Without keep_stdin_open the initial data is all the child gets.
    once = await env.start(["cat"], stdin=b"just this")
    assert outputs(await env.events(once.exec_id), "stdout") == b"just this"
    closed = await env.start(["cat"])
    assert outputs(await env.events(closed.exec_id), "stdout") == b""


async def test_cancel_kills_whole_tree(env: Env) -> None:
    info = await env.start(DOUBLE_FORK)
    ready = trio.Event()
    frames: list[m.Frame] = []

    async def send(batch: m.Frame | list[m.Frame]) -> None:
        for frame in batch if isinstance(batch, list) else [batch]:
            frames.append(frame)
            if isinstance(frame, m.ExecOutput) and b"ready" in frame.data:
                ready.set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(env.execs.subscribe, 1, info.exec_id, 1, send)
        with trio.fail_after(WAIT_S):
            await ready.wait()
            # The leader may be in the middle of its ``exec sleep`` (its environment unreadable).
            while len(tree_procs(info.exec_id)) != 2:
                await trio.sleep(0.01)
        canceled = await env.execs.kill(info.exec_id, 0.5)
    assert canceled.state == "exited" and canceled.end_reason == "canceled" and canceled.signal is not None
    assert not tree_procs(info.exec_id)
    assert isinstance(frames[-2], m.ExecExited) and frames[-2].reason == "canceled"
    # Canceling again is harmless.
    assert (await env.execs.kill(info.exec_id, None)).end_reason == "canceled"


async def test_leftover_holding_pipes_goes_with_its_leader(env: Env) -> None:
    info = await env.start(["sh", "-c", "setsid sh -c 'sleep 300 &'; echo done"])
    frames = await env.events(info.exec_id)
    assert outputs(frames, "stdout") == b"done\n"
    assert frames[-2].exit_code == 0 and frames[-2].reason == "exited"
    assert not tree_procs(info.exec_id)


async def test_timeout_kills_tree(env: Env) -> None:
    info = await env.start(["sh", "-c", "sleep 300 & sleep 300"], timeout_s=0.2)
    frames = await env.events(info.exec_id)
    exited = frames[-2]
    assert isinstance(exited, m.ExecExited) and exited.reason == "timeout"
    assert env.execs.get(info.exec_id).end_reason == "timeout"
    assert not tree_procs(info.exec_id)


CONTROL_CHILD = textwrap.dedent(
    """
    import json, os, socket
    sock = socket.socket(fileno=int(os.environ["AIWG_CONTROL_FD"]))
    sock.sendall(json.dumps({"type": "question", "text": "name?"}).encode() + b"\\n")
    sock.sendall(b"not json at all\\n[1, 2]\\n")
    buf = b""
    while not buf.endswith(b"\\n"):
        chunk = sock.recv(4096)
        if not chunk:
            break
        buf += chunk
    print("reply:", json.loads(buf)["answer"], flush=True)
    sock.sendall(b'{"type": "done"}')  # last line without a newline still counts
    """
)


async def test_control_channel_round_trip(env: Env) -> None:
    info = await env.start([PY, "-c", CONTROL_CHILD], control=True)
    assert info.control
    send_ch, receive_ch = trio.open_memory_channel[m.Frame](math.inf)
    frames: list[m.Frame] = []
    async with trio.open_nursery() as nursery:

        async def send_each(frame: m.Frame | list[m.Frame]) -> None:
            for one in frame if isinstance(frame, list) else [frame]:
                await send_ch.send(one)

        nursery.start_soon(env.execs.subscribe, 3, info.exec_id, 1, send_each)
        with trio.fail_after(WAIT_S):
            async for frame in receive_ch:
                frames.append(frame)
                if isinstance(frame, m.ExecControlMessage) and frame.message.get("type") == "question":
                    await env.execs.control_send(info.exec_id, {"answer": "bob", "n": 1})
                if isinstance(frame, m.StreamEnd):
                    break
    messages = [f.message for f in frames if isinstance(f, m.ExecControlMessage)]
    assert messages == [
        {"type": "question", "text": "name?"},
        {"type": "invalid", "raw": "not json at all"},
        {"type": "invalid", "raw": "[1, 2]"},
        {"type": "done"},
    ]
    assert outputs(frames, "stdout") == b"reply: bob\n"
    assert seqs(frames) == list(range(1, len(seqs(frames)) + 1))
    assert frames[-2].exit_code == 0
    with pytest.raises(RpcError) as excinfo:
        await env.execs.control_send(info.exec_id, {"late": True})
    assert code_of(excinfo) is ErrorCode.EXEC_EXITED

    plain = await env.start(["true"])
    with pytest.raises(RpcError) as excinfo:
        await env.execs.control_send(plain.exec_id, {"x": 1})
    assert code_of(excinfo) is ErrorCode.CONTROL_UNAVAILABLE


async def test_byte_exact_replay_from_any_seq(env: Env) -> None:
    script = "import os, time\nfor i in range(300):\n    os.write(1, bytes([i % 256]) * (i * 37 % 5000 + 1))\n"
    expected = b"".join(bytes([i % 256]) * (i * 37 % 5000 + 1) for i in range(300))
    info = await env.start([PY, "-c", script])
    full = await env.events(info.exec_id)
    assert outputs(full, "stdout") == expected
    chunks = [f for f in full if isinstance(f, m.ExecOutput)]
    for start in (chunks[len(chunks) // 2].seq, chunks[-1].seq):
        again = await env.events(info.exec_id, start)
        assert outputs(again, "stdout") == b"".join(c.data for c in chunks if c.seq >= start)
    tail = await env.events(info.exec_id, None)  # only new output: none, then the exit
    assert [type(f) for f in tail] == [m.StreamOpened, m.ExecExited, m.StreamEnd]
    with pytest.raises(RpcError) as excinfo:
        await env.events(info.exec_id, chunks[-1].seq + 2)
    assert code_of(excinfo) is ErrorCode.SEQ_OUT_OF_RANGE
    assert excinfo.value.details == {"first_seq": 1, "next_seq": chunks[-1].seq + 1}


async def test_slow_subscriber_is_told_it_lagged(tmp_path: Path, leak_check: None) -> None:
    config = make_config(tmp_path, ring_frames=16)
    script = "import os, time\nfor i in range(200):\n    os.write(1, b'%05d' % i)\n    time.sleep(0.0005)\n"
    async with trio.open_nursery() as nursery:
        env = await open_env(config, Cgroups.detect("off"), nursery, tmp_path / "wd")
        info = await env.start([PY, "-c", script])
        gate = trio.Event()
        frames: list[m.Frame] = []

        async def send(batch: m.Frame | list[m.Frame]) -> None:
            for frame in batch if isinstance(batch, list) else [batch]:
                if isinstance(frame, m.ExecOutput):
                    await gate.wait()
                frames.append(frame)

        async with trio.open_nursery() as inner:
            inner.start_soon(env.execs.subscribe, 5, info.exec_id, 1, send)
            await env.wait_exited(info.exec_id)
            gate.set()
        lagged = [f for f in frames if isinstance(f, m.ExecLagged)]
        assert lagged and lagged[0].resume_seq > lagged[0].missed_from
        got = [f for f in frames if isinstance(f, m.ExecOutput)]
        assert got[-1].seq == frames[-2].last_seq  # caught up to the end after the lag
        assert all(b.seq > a.seq for a, b in itertools.pairwise(got))
        # The evicted start can no longer be asked for.
        with pytest.raises(RpcError) as excinfo:
            await env.events(info.exec_id, 1)
        assert code_of(excinfo) is ErrorCode.SEQ_OUT_OF_RANGE
        await close_env(env)
        nursery.cancel_scope.cancel()


async def test_argument_errors(env: Env, tmp_path: Path) -> None:
    with pytest.raises(RpcError) as excinfo:
        await env.start(["/nonexistent/tool", "x"])
    assert code_of(excinfo) is ErrorCode.SPAWN_FAILED
    assert excinfo.value.details["argv0"] == "/nonexistent/tool"
    with pytest.raises(RpcError) as excinfo:
        await env.start(["true"], cwd="no-such-subdir")
    assert code_of(excinfo) is ErrorCode.WORKING_DIR_NOT_FOUND
    with pytest.raises(RpcError) as excinfo:
        await env.execs.start(m.ExecStartRequest(instance_id="i-missing", argv=["true"]))
    assert code_of(excinfo) is ErrorCode.INSTANCE_NOT_FOUND
    for call in (env.execs.get, env.execs.delete):
        with pytest.raises(RpcError) as excinfo:
            result = call("x-missing")
            if not isinstance(result, m.ExecInfo):
                await result
        assert code_of(excinfo) is ErrorCode.EXEC_NOT_FOUND
    (env.workdir / "sub").mkdir()
    info = await env.start(["pwd"], cwd="sub", exec_id="my-exec")
    assert info.exec_id == "my-exec" and info.cwd == str(env.workdir / "sub")
    with pytest.raises(RpcError) as excinfo:
        await env.start(["true"], exec_id="my-exec")
    assert code_of(excinfo) is ErrorCode.REQUEST_INVALID
    assert outputs(await env.events("my-exec"), "stdout") == f"{env.workdir / 'sub'}\n".encode()

    await env.instances.stop(env.instance_id, 0.5)
    with pytest.raises(RpcError) as excinfo:
        await env.start(["true"])
    assert code_of(excinfo) is ErrorCode.INSTANCE_INVALID_STATE


def test_the_limit_names_the_setting_that_sets_it() -> None:
    assert {row.field: row.env for row in SETTINGS}["max_execs"] == ExecRegistry.setting


async def test_limit_counts_live_execs(tmp_path: Path, leak_check: None) -> None:
    # The exec limit is its own: a session limit of 1 would have refused the second exec here.
    config = make_config(tmp_path, max_execs=1, max_sessions=100)
    async with trio.open_nursery() as nursery:
        env = await open_env(config, Cgroups.detect("off"), nursery, tmp_path / "wd")
        first = await env.start(["sleep", "300"])
        with pytest.raises(RpcError) as excinfo:
            await env.start(["true"])
        assert code_of(excinfo) is ErrorCode.LIMIT_REACHED
        assert Limit.from_details(excinfo.value.details) == Limit(
            name="execs", limit=1, setting="AIWG_MAX_EXECS", retry_after_s=SLOT_RETRY_S
        )
        await env.execs.kill(first.exec_id, 0)
        second = await env.start(["true"])  # an exited exec no longer counts
        await env.wait_exited(second.exec_id)
        # Exited execs are kept (exit status, output) up to a bound, then new ones are refused.
        kept = [first.exec_id, second.exec_id]
        while len(kept) < env.execs.max_retained:
            extra = await env.start(["true"])
            await env.wait_exited(extra.exec_id)
            kept.append(extra.exec_id)
        with pytest.raises(RpcError) as excinfo:
            await env.start(["true"])
        assert code_of(excinfo) is ErrorCode.LIMIT_REACHED
        assert Limit.from_details(excinfo.value.details) == Limit(
            name="exited_execs", limit=env.execs.max_retained, setting="AIWG_MAX_EXECS"
        )
        assert all(env.execs.get(x).state == "exited" for x in kept)  # nothing was dropped
        await env.execs.delete(kept[0])
        await env.wait_exited((await env.start(["true"])).exec_id)
        await close_env(env)
        nursery.cancel_scope.cancel()


async def test_instance_stop_and_delete_kill_execs(env: Env) -> None:
    running = await env.start(["sh", "-c", "sleep 300 & sleep 300"])
    doomed = await env.start(["sleep", "300"])
    await env.execs.delete(doomed.exec_id)
    assert not tree_procs(doomed.exec_id)
    with pytest.raises(RpcError) as excinfo:
        await env.events(doomed.exec_id)
    assert code_of(excinfo) is ErrorCode.EXEC_NOT_FOUND
    await env.instances.stop(env.instance_id, 0.5)
    info = env.execs.get(running.exec_id)
    assert info.state == "exited" and info.end_reason == "killed"
    assert not tree_procs(running.exec_id)


async def test_shutdown_kills_running_execs(env: Env) -> None:
    info = await env.start(["sh", "-c", "sleep 300 & sleep 300"])
    await env.execs.shutdown()
    assert env.execs.get(info.exec_id).state == "exited"
    assert not tree_procs(info.exec_id)
    with pytest.raises(RpcError) as excinfo:
        await env.start(["true"])
    assert code_of(excinfo) is ErrorCode.SHUTTING_DOWN


async def test_real_cgroup_per_exec(tmp_path: Path, leak_check: None) -> None:
    cgroups = real_cgroups()
    home = Path("/proc/self/cgroup").read_text()
    async with trio.open_nursery() as nursery:
        env = await open_env(make_config(tmp_path, cgroup_root=""), cgroups, nursery, tmp_path / "wd")
        info = await env.start(DOUBLE_FORK)
        host = env.instances.get(env.instance_id).host
        assert host is not None and host.cgroup is not None
        cgroup = Path(host.cgroup)
        exec_cgroup = cgroup / f"x-{info.exec_id}"
        with trio.fail_after(WAIT_S):
            while len(Cgroups.pids(exec_cgroup)) < 2:
                await trio.sleep(0.01)
        assert info.pid in Cgroups.pids(exec_cgroup)
        await env.execs.kill(info.exec_id, 0.5)
        assert not tree_procs(info.exec_id) and not exec_cgroup.exists()

        # The program is in its cgroup from its first instruction, under its own argv[0], with
        # every signal at its default; what exec would refuse is refused at the start.
        # (exec, so grep reads the mask the shell had: dash blocks every signal around its own forks.)
        script = 'cat /proc/$$/cgroup; tr "\\0" " " </proc/$$/cmdline; exec grep Sig /proc/self/status'
        info = await env.start(["sh", "-c", script])
        text = outputs(await env.events(info.exec_id), "stdout").decode()
        assert f"/x-{info.exec_id}\n" in text, text
        assert "sh -c cat /proc/$$/cgroup" in text, text
        status = dict(line.split(":\t") for line in text.splitlines() if line.startswith("Sig"))
        assert int(status["SigIgn"], 16) & ((1 << 31) - 1) == 0 and int(status["SigBlk"], 16) == 0, status
        plain = tmp_path / "not-executable"
        plain.write_text("#!/bin/sh\n")
        for argv, error in ((["no-such-program-x"], "ENOENT"), ([str(plain)], "EACCES")):
            with pytest.raises(RpcError) as excinfo:
                await env.start(argv)
            assert code_of(excinfo) is ErrorCode.SPAWN_FAILED and excinfo.value.details["errno"] == error
        # hostd steps into each child's cgroup for its start (procspawn.born_in): it is back home,
        # a refused start included.
        assert Path("/proc/self/cgroup").read_text() == home
        await close_env(env)
        nursery.cancel_scope.cancel()


async def test_a_child_is_born_in_its_cgroup_with_what_it_starts_at_once(tmp_path: Path, leak_check: None) -> None:
    """A program that double-forks before anything could move it (its intermediate gone at once)
    leaves nothing outside its cgroup; a cgroup that is gone fails the start, and hostd stays
    where it was."""
    cgroups = real_cgroups()
    home = Path("/proc/self/cgroup").read_text()
    cgroup = cgroups.create(f"born-{os.getpid()}")
    assert cgroup is not None
    try:
        proc = await procspawn.spawn(
            ["sh", "-c", "setsid sh -c 'sleep 300 &'; exec sleep 300"],
            cwd=str(tmp_path),
            env={},
            tree_id="test:exec:born",
            cgroup=cgroup,
            stdin=procspawn.DEVNULL,
            stdout=procspawn.DEVNULL,
            stderr=procspawn.DEVNULL,
        )
        assert Path("/proc/self/cgroup").read_text() == home
        with trio.fail_after(WAIT_S):
            while len(marked := tree_procs("born")) < 2:
                await trio.sleep(0.01)
        assert {p.pid for p in marked} <= Cgroups.pids(cgroup)
        Cgroups.kill(cgroup)
        await proc.wait()
        with trio.fail_after(WAIT_S):
            while tree_procs("born"):
                await trio.sleep(0.01)
    finally:
        await proctree.remove_cgroup(cgroup)
    with pytest.raises(RpcError) as excinfo:
        await procspawn.spawn(
            ["true"],
            cwd=str(tmp_path),
            env={},
            tree_id="test:exec:gone",
            cgroup=cgroup,
            stdin=None,
            stdout=None,
            stderr=None,
        )
    assert code_of(excinfo) is ErrorCode.SPAWN_FAILED and "cannot join its cgroup" in excinfo.value.message
    assert Path("/proc/self/cgroup").read_text() == home


async def test_overlong_control_line_is_recorded_as_invalid_and_skipped(env: Env) -> None:
    script = textwrap.dedent(
        """
        import os
        fd = int(os.environ["AIWG_CONTROL_FD"])
        os.write(fd, b'{"long": "' + b"x" * (1536 * 1024) + b'"}\\n{"type": "after"}\\n')
        """
    )
    info = await env.start([PY, "-c", script], control=True)
    frames = await env.events(info.exec_id)
    messages = [f.message for f in frames if isinstance(f, m.ExecControlMessage)]
    assert messages == [{"type": "invalid", "raw": '{"long": "' + "x" * 190}, {"type": "after"}]
    assert frames[-2].exit_code == 0


async def test_argv_that_exec_refuses_is_spawn_failed(env: Env) -> None:
    """A NUL byte in argv (legal in the protocol) is a typed error, not an internal one."""
    with pytest.raises(RpcError) as excinfo:
        await env.start(["sh", "-c", "true", "a\0b"])
    assert code_of(excinfo) is ErrorCode.SPAWN_FAILED
    assert env.execs.list() == []


async def test_instance_stopped_while_an_exec_starts(env: Env) -> None:
    """A stop that races an exec's start, whichever gets in first, leaves no tree running in the
    stopped instance: the start fails on the stopped instance, or the stop kills what it started."""
    result: list[object] = []

    async def start() -> None:
        try:
            result.append(await env.start(["sleep", "300"]))
        except RpcError as exc:
            result.append(exc)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(start)
        nursery.start_soon(env.instances.stop, env.instance_id, 0.5)
    if isinstance(result[0], RpcError):
        assert result[0].code is ErrorCode.INSTANCE_INVALID_STATE
        assert env.execs.list() == []
    else:
        assert [x.state for x in env.execs.list()] == ["exited"]
    assert not tree_procs(env.instance_id)


async def test_exec_gets_default_signal_actions_whatever_hostd_inherited(env: Env) -> None:
    old = signal.signal(signal.SIGINT, signal.SIG_IGN)  # as under nohup or in a background job
    try:
        info = await env.start(["sleep", "60"])
    finally:
        signal.signal(signal.SIGINT, old)
    assert info.pid is not None
    status = Path(f"/proc/{info.pid}/status").read_text()
    ignored = next(int(line.split()[1], 16) for line in status.splitlines() if line.startswith("SigIgn:"))
    assert ignored & ((1 << 31) - 1) == 0  # signals 1-31 (glibc keeps 32 and 33 for itself)
    await env.execs.kill(info.exec_id, 0.5)


async def test_control_flow_reads_the_channel_only_as_fast_as_the_subscriber_acknowledges(
    tmp_path: Path, leak_check: None
) -> None:
    # A ring of 16 frames: 8 unacknowledged control messages at most. Without flow control the
    # 40 messages would evict each other; with it the child waits (its socket full: the lines
    # are 60 KiB) and nothing is lost.
    config = make_config(tmp_path, ring_frames=16)
    script = (
        "import os, socket\n"
        "sock = socket.socket(fileno=int(os.environ['AIWG_CONTROL_FD']))\n"
        "for i in range(40):\n"
        '    sock.sendall(b\'{"n": %d, "pad": "%s"}\\n\' % (i, b\'x\' * 60000))\n'
    )
    async with trio.open_nursery() as nursery:
        env = await open_env(config, Cgroups.detect("off"), nursery, tmp_path / "wd")
        info = await env.start([PY, "-c", script], control=True, control_flow=True)
        await trio.sleep(0.5)
        held = env.execs.get(info.exec_id)
        assert held.state == "running" and held.next_seq - 1 <= 10  # it waits for an acknowledgement
        got: list[int] = []

        async def send(batch: m.Frame | list[m.Frame]) -> None:
            for frame in batch if isinstance(batch, list) else [batch]:
                assert not isinstance(frame, m.ExecLagged)
                if isinstance(frame, m.ExecControlMessage):
                    got.append(frame.message["n"])  # type: ignore[arg-type]
                    env.execs.control_ack(info.exec_id, frame.seq)

        with trio.fail_after(WAIT_S):
            await env.execs.subscribe(1, info.exec_id, 1, send)
        assert got == list(range(40))
        await close_env(env)
        nursery.cancel_scope.cancel()
