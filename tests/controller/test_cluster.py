"""One controller among others on the run's real PostgreSQL server: what "another controller"
(a second store on the same database) writes reaches this one's waiters, its credentials and its
admin event stream, through the store's notifications."""

from __future__ import annotations

import hashlib
import time
from pathlib import Path

import trio

from agentic_sandbox.controller.auth.credentials import InstanceCredentials
from agentic_sandbox.controller.auth.tokens import Authenticator
from agentic_sandbox.controller.cluster import Cluster
from agentic_sandbox.controller.events.bus import EventBus
from agentic_sandbox.controller.hostlink import HostdLink
from agentic_sandbox.controller.loadouts.service import LoadoutService
from agentic_sandbox.controller.store import Append, Store
from agentic_sandbox.controller.tasks import TaskService
from agentic_sandbox.controller.tasks.agentlogs import TaskLogs
from agentic_sandbox.controller.tasks.files import TaskFiles
from tests.controller.store.records import task


def _message(n: int) -> Append:
    return Append(kind="message", body={"messageId": f"m{n}", "role": "ROLE_USER", "parts": [{"text": str(n)}]})


async def test_another_controllers_writes_reach_this_one(pg_url: str, tmp_path: Path) -> None:
    mine, theirs = Store.connect(pg_url), Store.connect(pg_url)
    events = EventBus(64, store=mine)
    tasks = TaskService(
        mine,
        # Never connected: nothing here talks to hostd.
        HostdLink(
            str(tmp_path / "no-hostd.sock"),
            call_timeout_s=1,
            connect_timeout_s=1,
            ping_interval_s=1,
            reconnect_max_s=1,
        ),
        LoadoutService(tmp_path / "loadouts"),
        events,
        files=TaskFiles(tmp_path / "files"),
        logs=TaskLogs(tmp_path / "logs", 1024),
    )
    auth = Authenticator([])
    cluster = Cluster(
        pg_url,
        tasks=tasks,
        events=events,
        credentials=InstanceCredentials(mine, auth),
        poll_s=0.2,
        connect_timeout_s=2,
    )
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(cluster.run)
            now = time.time()
            await theirs.tasks.create(task("t-1", now), _message(0), owner="ctl-other", until=now + 60)
            with tasks.hub.watch("t-1") as watch:
                changed = watch.changed()
                await theirs.tasks.append_many("t-1", [_message(1)], time.time())
                with trio.fail_after(5):
                    await changed.wait()  # woken: it reads the store (nothing was told here before)
                changed = watch.changed()
                await theirs.tasks.append_many("t-1", [_message(2), _message(3)], time.time())
                with trio.fail_after(5):
                    while [e.seq for e in watch.tail_after(2) or []] != [3, 4]:
                        await changed.wait()
                        changed = watch.changed()
                assert [e.body["messageId"] for e in watch.tail_after(2) or []] == ["m2", "m3"]

            token = "instance-token-of-the-other-controller"
            await theirs.credentials.set_token("inst-1", hashlib.sha256(token.encode()).hexdigest(), now)
            with trio.fail_after(5):
                while auth.authenticate(f"Bearer {token}") is None:
                    await trio.sleep(0.01)
            principal = auth.authenticate(f"Bearer {token}")
            assert principal is not None and principal.instance_id == "inst-1"
            await theirs.credentials.forget("inst-1")  # revoked there: refused here at once
            with trio.fail_after(5):
                while auth.authenticate(f"Bearer {token}") is not None:
                    await trio.sleep(0.01)
            nursery.cancel_scope.cancel()
    finally:
        mine.close()
        theirs.close()
