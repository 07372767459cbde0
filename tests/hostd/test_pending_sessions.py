"""Pending sessions (created ``deferred``, started by ``SessionStartRequest``) in a real
SessionRegistry with real PTYs: what they hold, what they refuse, how they start and how they end."""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import pytest
import trio

from agentic_sandbox.hostd.errors import SLOT_RETRY_S, RpcError
from agentic_sandbox.proto import ErrorCode, Limit
from agentic_sandbox.proto import messages as m

from .test_sessions import (  # noqa: F401  (fixtures)
    TIMEOUT,
    Harness,
    assert_tree_gone,
    collect,
    harness,
    make_harness,
    watch,
)


async def hold(h: Harness, *argv: str, **kw: object) -> m.SessionInfo:
    return await h.create(*argv, deferred=True, **kw)


async def start(h: Harness, sid: str, **kw: object) -> tuple[m.SessionInfo, bool]:
    return await h.registry.start(m.SessionStartRequest(session_id=sid, **kw))  # type: ignore[arg-type]


async def test_a_pending_session_starts_with_the_start_fields_over_the_creation_ones(harness: Harness) -> None:  # noqa: F811
    (harness.workdir / "sub").mkdir()
    info = await hold(harness, "sh", "-c", "echo created", cwd="sub", cols=90, rows=20, env={"X": "created"})
    sid = info.session_id
    assert (info.pending, info.state, info.pid) == (True, "running", None)
    assert (info.argv, info.cwd, info.cols, info.rows) == (
        ["sh", "-c", "echo created"],
        str(harness.workdir / "sub"),
        90,
        20,
    )
    assert harness.registry.counts() == (1, 0)  # held, not running
    for refused in (
        lambda: harness.registry.resize(sid, 80, 24),
        lambda: harness.registry.signal(sid, "INT"),
    ):
        with pytest.raises(RpcError) as err:
            refused()
        assert err.value.code is ErrorCode.SESSION_PENDING
    with pytest.raises(RpcError) as err:
        await harness.registry.write(sid, b"x")
    assert err.value.code is ErrorCode.SESSION_PENDING

    async with trio.open_nursery() as nursery:
        w = watch(nursery, harness, sid)  # a follower from before the start sees all of it
        await trio.sleep(0.05)
        assert w.outputs() == []
        started, did = await start(
            harness, sid, argv=["sh", "-c", 'echo "started $X in $(pwd)"; stty size; exec cat'], cols=100
        )
        assert did and not started.pending and started.pid
        assert (started.cols, started.rows, started.cwd) == (100, 20, str(harness.workdir / "sub"))
        await w.wait_for(b"started created in " + str(harness.workdir / "sub").encode())
        await w.wait_for(b"20 100")  # rows from the creation, cols from the start
        assert w.outputs()[0].seq == 1

        again, did = await start(harness, sid, argv=["sh", "-c", "echo second"])  # the first start won
        assert not did and again.argv[-1].endswith("exec cat") and again.pid == started.pid
        await harness.registry.write(sid, b"typed\n")
        await w.wait_for(b"typed")
        await harness.registry.kill(sid, 0)
        with trio.fail_after(TIMEOUT):
            await w.finished.wait()
    assert not (await start(harness, sid))[1]  # an ended session is never started again
    assert harness.registry.get(sid).state == "exited"


async def test_two_starts_at_once_start_it_once(harness: Harness) -> None:  # noqa: F811
    sid = (await hold(harness, "sleep", "300")).session_id
    results: list[tuple[m.SessionInfo, bool]] = []
    async with trio.open_nursery() as nursery:
        for _ in range(3):
            nursery.start_soon(lambda: _collect_start(harness, sid, results))
    assert sorted(did for _info, did in results) == [False, False, True]
    assert len({info.pid for info, _did in results}) == 1
    assert harness.registry.counts() == (1, 1)


async def _collect_start(h: Harness, sid: str, into: list[tuple[m.SessionInfo, bool]]) -> None:
    into.append(await start(h, sid))


async def test_checks_at_creation_and_at_start(make_harness: Callable[..., Awaitable[Harness]]) -> None:  # noqa: F811
    h = await make_harness(max_sessions=1)
    running = await h.create("sleep", "300")
    pending = await hold(h, "sleep", "300")  # one may run and one wait: pending does not count as running
    with pytest.raises(RpcError) as err:
        await hold(h, "sleep", "300")  # pending ones have their own bound
    assert err.value.code is ErrorCode.LIMIT_REACHED
    assert Limit.from_details(err.value.details) == Limit(
        name="pending_sessions", limit=1, setting="AIWG_MAX_SESSIONS", retry_after_s=SLOT_RETRY_S
    )
    with pytest.raises(RpcError) as err:
        await start(h, pending.session_id)  # starting it would run two
    assert err.value.code is ErrorCode.LIMIT_REACHED
    assert Limit.from_details(err.value.details) == Limit(
        name="sessions", limit=1, setting="AIWG_MAX_SESSIONS", retry_after_s=SLOT_RETRY_S
    )
    assert h.registry.get(pending.session_id).pending  # and it still waits
    await h.registry.kill(running.session_id, 0)

    with pytest.raises(RpcError) as err:
        await start(h, pending.session_id, cwd="/nonexistent/dir")
    assert err.value.code is ErrorCode.WORKING_DIR_NOT_FOUND
    with pytest.raises(RpcError) as err:
        await start(h, pending.session_id, env={"AIWG_TREE": "x"})  # as strict as a create
    assert err.value.code is ErrorCode.REQUEST_INVALID
    with pytest.raises(RpcError) as err:
        await start(h, pending.session_id, argv=["/nonexistent/program"])
    assert err.value.code is ErrorCode.SPAWN_FAILED
    assert h.registry.get(pending.session_id).pending  # a failed start leaves it pending
    assert (await start(h, pending.session_id))[1]

    await h.registry.delete(pending.session_id)
    for kw, code in (
        ({"cwd": "/nonexistent/dir"}, ErrorCode.WORKING_DIR_NOT_FOUND),
        ({"env": {"AIWG_TREE": "x"}}, ErrorCode.REQUEST_INVALID),  # hostd sets it
        ({"session_id": running.session_id}, ErrorCode.REQUEST_INVALID),  # the id is taken
    ):
        with pytest.raises(RpcError) as err:
            await hold(h, "true", **kw)
        assert err.value.code is code, kw
    with pytest.raises(RpcError) as err:
        await h.registry.create(m.SessionCreateRequest(instance_id="other", argv=["true"], deferred=True))
    assert err.value.code is ErrorCode.INSTANCE_NOT_FOUND


async def test_kill_delete_instance_stop_and_shutdown_end_pending_sessions(harness: Harness) -> None:  # noqa: F811
    reg = harness.registry
    killed = await hold(harness, "sleep", "300")
    deleted = await hold(harness, "sleep", "300")
    async with trio.open_nursery() as nursery:
        w_killed = watch(nursery, harness, killed.session_id)
        w_deleted = watch(nursery, harness, deleted.session_id)
        await trio.sleep(0.05)
        info = await reg.kill(killed.session_id, None)
        assert (info.state, info.pending, info.end_reason, info.exit_code, info.pid) == (
            "exited",
            False,
            "killed",
            None,
            None,
        )
        await reg.delete(deleted.session_id)
        with trio.fail_after(TIMEOUT):
            await w_killed.finished.wait()
            await w_deleted.finished.wait()
    exited = w_killed.of(m.SessionExited)
    assert [(e.reason, e.exit_code, e.last_seq) for e in exited] == [("killed", None, 0)]
    assert w_deleted.of(m.StreamEnd) == [m.StreamEnd(id=7, reason="deleted")]
    with pytest.raises(RpcError) as err:
        reg.get(deleted.session_id)
    assert err.value.code is ErrorCode.SESSION_NOT_FOUND
    assert not (await start(harness, killed.session_id))[1]  # ended before it ever ran

    stopped = await hold(harness, "sleep", "300")
    await reg.kill_instance("other-instance", 0)
    assert reg.get(stopped.session_id).pending
    await reg.kill_instance(harness.instance_id, 0)
    assert reg.get(stopped.session_id).end_reason == "killed"

    last = await hold(harness, "sleep", "300")
    with trio.fail_after(TIMEOUT):
        await reg.shutdown()
    assert reg.get(last.session_id).state == "exited"
    assert_tree_gone(last.session_id)
