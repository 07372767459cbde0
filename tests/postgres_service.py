"""The suite's PostgreSQL server: one private cluster per test session (``scripts/pgcluster.py``:
``initdb`` and ``pg_ctl`` in a temp dir, removed at the end) and a fresh database per test."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

SCRIPTS = Path(__file__).resolve().parents[1] / "scripts"


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("pgcluster", SCRIPTS / "pgcluster.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("pgcluster", module)
    spec.loader.exec_module(module)
    return module


pgcluster = _load()
PgCluster = pgcluster.PgCluster
