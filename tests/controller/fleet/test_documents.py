"""fleet-workload/v1 documents: the schema kept as upstream's, its fixtures as their names say, the
credential check, and what makes two admissions the same."""

from __future__ import annotations

import copy

import pytest

from agentic_sandbox.controller.errors import ValidationFailed
from agentic_sandbox.controller.fleet.documents import (
    CREDENTIAL_MATERIAL,
    SCHEMA_FILE,
    check,
    errors,
    names_a_secret,
    payload_hash,
    refuse_credentials,
)
from tests.controller.fleet.workloads import CONTRACT, ROOT, admission, fixture, records


def test_the_schema_served_is_upstreams_byte_for_byte() -> None:
    packaged = ROOT / "src" / "agentic_sandbox" / "controller" / "fleet" / SCHEMA_FILE
    assert packaged.read_bytes() == (CONTRACT / SCHEMA_FILE).read_bytes()


def test_the_fixtures_are_what_their_names_say() -> None:
    assert errors("inventory_snapshot", fixture("mixed-workload-inventory")) == []
    assert errors("reconciliation_report", fixture("reconciliation-after-restart")) == []
    # An unknown classification may not claim a terminal state.
    assert errors("reconciliation_report", fixture("invalid-unknown-completed")) != []
    credential = fixture("invalid-credential-material")
    assert [e["field"] for e in errors("workload_record", credential)] == ["/spec/credential_material"]
    with pytest.raises(ValidationFailed) as caught:
        refuse_credentials(credential)
    assert caught.value.code == CREDENTIAL_MATERIAL
    assert caught.value.fields[0]["field"] == "/spec/credential_material"


def test_each_record_admits_pending_and_the_kind_rules_hold() -> None:
    for record in records().values():
        check("workload_record", admission(record))
    daemon = admission(records()["child-daemon"])
    del daemon["status"]["health"]
    with pytest.raises(ValidationFailed, match="/status/health"):
        check("workload_record", daemon)
    collector = admission(records()["child-collector"])
    del collector["spec"]["schedule"]
    with pytest.raises(ValidationFailed, match="/spec/schedule"):
        check("workload_record", collector)


@pytest.mark.parametrize(
    ("key", "secret"),
    [
        ("credential_material", True),
        ("accessToken", True),
        ("api-key", True),
        ("db_password", True),
        ("Authorization", True),
        ("client_secret", True),
        ("ACCESSTOKEN", True),
        ("dbpassword", True),
        ("db_passwords", True),
        ("clientSecrets", True),
        ("APIKey", True),
        ("x-api-key", True),
        ("PRIVATE-KEY", True),
        ("bearer", True),
        ("passwd", True),
        ("tokens_used", False),
        ("secretary", False),
        ("credential_policy_ref", False),
        ("network_policy_ref", False),
        ("max_tokens", False),
        ("tokenizer", False),
        ("owner", False),
    ],
)
def test_a_key_that_names_a_secret(key: str, secret: bool) -> None:
    assert names_a_secret(key) is secret


def test_secrets_in_orchestrator_metadata_are_refused_at_any_depth() -> None:
    doc = admission(records()["child-agent"])
    doc["spec"]["orchestrator_metadata"] = {"aiwg": {"steps": [{"note": "ok"}, {"apiKey": "sk-..."}]}}
    with pytest.raises(ValidationFailed) as caught:
        refuse_credentials(doc)
    assert caught.value.fields[0]["field"] == "/spec/orchestrator_metadata/aiwg/steps/1/apiKey"
    doc["spec"]["orchestrator_metadata"] = {"aiwg": {"steps": [{"note": "ok"}]}, "max_tokens": 9}
    refuse_credentials(doc)


def test_a_replay_is_the_same_payload_but_its_transport_time() -> None:
    doc = admission(records()["child-command"])
    later = copy.deepcopy(doc)
    later["status"]["last_seen"] = "2026-08-02T16:00:00Z"
    assert payload_hash(later) == payload_hash(doc)
    later["spec"]["budgets"]["timeout_seconds"] = 601
    assert payload_hash(later) != payload_hash(doc)
