"""What every table is written against: the JSON columns' codec and the store's error family."""

from __future__ import annotations

from agentic_sandbox.controller.errors import Unavailable
from agentic_sandbox.controller.store import Store, StoreUnavailable
from agentic_sandbox.controller.store.database import from_json, to_json


def test_json_columns() -> None:
    assert to_json(None) is None and from_json(None) is None
    value = {"a": [1, 2.5, None, True], "b": {"c": "é"}}
    assert from_json(to_json(value)) == value


def test_an_unreachable_database_is_the_controllers_unavailable() -> None:
    exc = StoreUnavailable("connection refused")
    assert isinstance(exc, Unavailable) and exc.code == "internal.unavailable"
    assert exc.message == "the controller's database is unavailable: connection refused"


async def test_each_store_says_what_it_is(store: Store) -> None:
    described = store.db.describe()
    assert described.startswith(("SQLite ", "PostgreSQL "))
    assert store.shared == described.startswith("PostgreSQL")
    await store.db.ping()
