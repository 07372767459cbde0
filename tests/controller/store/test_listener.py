"""LISTEN on the run's real PostgreSQL server: a write's notification arrives on the loop, a
reconnect (the listening connection cut by the server) catches up with ``on_resync``, and the poll
runs besides."""

from __future__ import annotations

import time

import trio

from agentic_sandbox.controller.store import Append, Store
from agentic_sandbox.controller.store.listener import Listener
from tests.controller.store.records import task


async def test_notifications_arrive_and_a_cut_connection_resyncs(pg_url: str) -> None:
    writer = Store.connect(pg_url)
    news: list[tuple[str, str]] = []
    resyncs = polls = 0
    arrived = trio.Event()

    def on_news(channel: str, payload: str) -> None:
        news.append((channel, payload))
        arrived.set()

    async def on_resync() -> None:
        nonlocal resyncs
        resyncs += 1

    async def on_poll() -> None:
        nonlocal polls
        polls += 1

    listener = Listener(pg_url, ("aiwg_tasks",), on_news=on_news, on_resync=on_resync, on_poll=on_poll, poll_s=0.1)
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(listener.run)
            assert listener.listening and resyncs == 1
            now = time.time()
            await writer.tasks.create(task("t-1", now), Append(kind="message", body={"messageId": "m"}))
            with trio.fail_after(5):
                await arrived.wait()
            assert news == [("aiwg_tasks", "t-1 1")]

            await writer.db.run(
                lambda db: db.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = current_database()"
                    " AND pid <> pg_backend_pid() AND query LIKE 'LISTEN%'"
                )
            )
            with trio.fail_after(10):
                while resyncs < 2 or not listener.listening:
                    await trio.sleep(0.02)
            arrived = trio.Event()
            await writer.tasks.append_many("t-1", [Append(kind="message", body={"messageId": "n"})], time.time())
            with trio.fail_after(5):
                await arrived.wait()
            assert news[-1] == ("aiwg_tasks", "t-1 2")
            assert polls >= 1
            nursery.cancel_scope.cancel()
    finally:
        writer.close()
    assert not listener.listening
