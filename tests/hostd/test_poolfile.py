"""The warm pool file (hostd.poolfile) on a real directory: definitions and counters read back
whether written durably or quickly, the file is private, an unreadable or unwritable one is logged
and never fatal. Pools across a real hostd restart: tests/hostd/test_pools.py."""

from __future__ import annotations

import logging
import stat
from pathlib import Path

import pytest

from agentic_sandbox.hostd import poolfile
from agentic_sandbox.hostd.poolfile import PoolRecord
from agentic_sandbox.proto import messages as m
from tests.hostd.sizelimit import run_capped


def pools() -> list[PoolRecord]:
    template = m.PoolTemplate(runtime="host", command=["sleep", "600"], loadout="default")
    return [
        PoolRecord(pool="warm", runtime="host", provider="hostd", source="template", size=2, template=template, hits=3),
        PoolRecord(pool="cps", runtime="vm", provider="libvirt", source="checkpoints", size=1, last_error="boom"),
    ]


@pytest.mark.parametrize("durable", [True, False])
def test_what_is_written_reads_back_in_a_private_file(tmp_path: Path, durable: bool) -> None:
    path = tmp_path / "state" / "warm-pools.json"
    poolfile.write(path, pools(), durable=durable)
    assert poolfile.read(path) == pools()
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and stat.S_IMODE(path.parent.stat().st_mode) == 0o700
    assert [p.name for p in path.parent.iterdir()] == ["warm-pools.json"]  # no temporary file left
    poolfile.write(path, pools()[:1], durable=not durable)
    assert poolfile.read(path) == pools()[:1]


def test_no_file_is_no_pools(tmp_path: Path) -> None:
    assert poolfile.read(tmp_path / "warm-pools.json") == []


@pytest.mark.parametrize(
    "text", ["{not json", '{"pools": [{"pool": "p"}]}', '{"pools": [{"pool": "p", "runtime": "host", "size": "2"}]}']
)
def test_an_unreadable_file_is_logged_and_means_no_pools(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, text: str
) -> None:
    path = tmp_path / "warm-pools.json"
    path.write_text(text)
    with caplog.at_level(logging.ERROR, logger=poolfile.__name__):
        assert poolfile.read(path) == []
    assert "unreadable" in caplog.text
    assert path.read_text() == text  # left for an operator to look at


@pytest.mark.parametrize("durable", [True, False])
def test_a_failed_write_is_logged_not_raised(tmp_path: Path, caplog: pytest.LogCaptureFixture, durable: bool) -> None:
    blocker = tmp_path / "state"
    blocker.write_text("a file where the state dir should be")
    with caplog.at_level(logging.ERROR, logger=poolfile.__name__):
        poolfile.write(blocker / "warm-pools.json", pools(), durable=durable)
    assert "cannot write warm pool file" in caplog.text


@pytest.mark.parametrize("durable", [True, False])
def test_a_write_cut_short_leaves_the_previous_file_whole(tmp_path: Path, durable: bool) -> None:
    path = tmp_path / "warm-pools.json"
    poolfile.write(path, pools(), durable=True)
    before = path.read_bytes()
    run_capped(
        f"""
        from pathlib import Path
        from agentic_sandbox.hostd import poolfile
        from tests.hostd.test_poolfile import pools
        records = pools() * 50
        poolfile.write(Path({str(path)!r}), records, durable={durable!r})
        """,
        limit=len(before) + 100,
    )
    assert path.read_bytes() == before
