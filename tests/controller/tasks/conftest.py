"""The ``rig`` fixture: a live hostd (tests/controller/conftest.py), its link connected, a store on a
real file and a host instance on that hostd."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest
import trio

from agentic_sandbox.controller.hostlink import HostdLink
from agentic_sandbox.controller.store import Store
from agentic_sandbox.controller.tasks.agentlogs import TaskLogs
from agentic_sandbox.controller.tasks.files import TaskFiles
from agentic_sandbox.proto import messages as m
from agentic_sandbox.proto import new_id
from tests.controller.conftest import LiveHostd
from tests.controller.tasks.rig import Rig


@pytest.fixture
async def rig(hostd: LiveHostd, tmp_path: Path) -> AsyncIterator[Rig]:
    link = HostdLink(hostd.socket_path, call_timeout_s=10, connect_timeout_s=5, ping_interval_s=5, reconnect_max_s=0.5)
    store = Store.open(tmp_path / "controller.db")
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(link.run)
            with trio.fail_after(10):
                await link.wait_ready()
            instance_id = f"i-{new_id()}"
            work = tmp_path / "work"
            work.mkdir()
            await link.call(m.InstanceProvisionRequest(instance_id=instance_id, name="runner", working_dir=str(work)))
            yield Rig(link, store, instance_id, TaskFiles(tmp_path / "files"), TaskLogs(tmp_path / "logs", 4096))
            nursery.cancel_scope.cancel()
    finally:
        store.close()
