"""The store tests' database: a real SQLite file under the test's tmp_path, closed after the test."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from agentic_sandbox.controller.store import Store


@pytest.fixture
def store(tmp_path: Path) -> Iterator[Store]:
    s = Store.open(tmp_path / "db" / "controller.db")
    yield s
    s.close()
