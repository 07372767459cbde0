"""fleet-workload/v1 test documents: upstream's fixtures, and admissions made from their records."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[3]
CONTRACT = ROOT / "contracts" / "upstream" / "fleet-workload" / "v1"


def fixture(name: str) -> dict[str, Any]:
    loaded: dict[str, Any] = json.loads((CONTRACT / "fixtures" / f"{name}.json").read_text())
    return loaded


def records() -> dict[str, dict[str, Any]]:
    """The records of mixed-workload-inventory.json by child id."""
    return {r["lineage"]["child_id"]: r for r in fixture("mixed-workload-inventory")["records"]}


def admission(record: dict[str, Any], **lineage: Any) -> dict[str, Any]:
    """``record`` as an orchestrator admits it: pending at revision 0 (a daemon with unknown health)."""
    doc = copy.deepcopy(record)
    doc["lineage"].update(lineage)
    status: dict[str, Any] = {"observed_state": "pending", "revision": 0, "last_seen": "2026-08-02T14:00:00Z"}
    status["artifacts"] = []
    if doc["kind"] == "daemon":
        status["health"] = "unknown"
    doc["status"] = status
    return doc
