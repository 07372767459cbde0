"""The fleet tests' stores: the store tests' fixtures (a SQLite file and a PostgreSQL database)."""

from tests.controller.store.conftest import open_store, store

__all__ = ["open_store", "store"]
