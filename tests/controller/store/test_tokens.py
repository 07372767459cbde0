"""The operator token table: rows are replaced per source, in one transaction."""

from __future__ import annotations

from agentic_sandbox.controller.store import Store, TokenRecord


def test_tokens_are_replaced_per_source(store: Store) -> None:
    store.tokens.replace("config", [TokenRecord(hash="aa", role="admin", label="admin", source="config")])
    store.tokens.replace("issued", [TokenRecord(hash="bb", role="operator", label="ci", source="issued")])
    store.tokens.replace("config", [TokenRecord(hash="cc", role="admin", label="admin", source="config")])
    assert {t.hash for t in store.tokens.list()} == {"bb", "cc"}


def test_a_source_can_be_emptied_and_the_list_is_ordered(store: Store) -> None:
    store.tokens.replace(
        "issued",
        [
            TokenRecord(hash="b", role="operator", label="zed", source="issued"),
            TokenRecord(hash="a", role="viewer", label="amy", source="issued"),
        ],
    )
    store.tokens.replace("config", [TokenRecord(hash="c", role="admin", label="admin", source="config")])
    assert [(t.source, t.label) for t in store.tokens.list()] == [
        ("config", "admin"),
        ("issued", "amy"),
        ("issued", "zed"),
    ]
    store.tokens.replace("issued", [])
    assert store.tokens.list() == [TokenRecord(hash="c", role="admin", label="admin", source="config")]
