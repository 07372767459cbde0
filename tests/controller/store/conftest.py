"""The store tests' database, on each store the controller has: a real SQLite file under the
test's tmp_path, and a fresh database on the run's real PostgreSQL server. Every test that takes
``store`` (or ``open_store``, to reopen the same database) runs on both."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from agentic_sandbox.controller.store import Store

OpenStore = Callable[[], Store]


@pytest.fixture(params=["sqlite", "postgres"])
def open_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[OpenStore]:
    """Opens the test's database (again): each store it gave is closed after the test."""
    if request.param == "sqlite":
        path = tmp_path / "db" / "controller.db"

        def opener() -> Store:
            return Store.open(path)
    else:
        url = request.getfixturevalue("pg_url")

        def opener() -> Store:
            return Store.connect(url)

    opened: list[Store] = []

    def open_one() -> Store:
        opened.append(opener())
        return opened[-1]

    yield open_one
    for s in opened:
        s.close()


@pytest.fixture
def store(open_store: OpenStore) -> Store:
    return open_store()


@pytest.fixture
def sqlite_store(tmp_path: Path) -> Iterator[Store]:
    """The embedded store alone (for what only SQLite has: its file, WAL, the lock)."""
    s = Store.open(tmp_path / "db" / "controller.db")
    yield s
    s.close()
