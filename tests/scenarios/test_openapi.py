"""The served OpenAPI document: it covers every route we serve, and schemathesis finds no 5xx and no
response that breaks it, against a live controller and a real hostd.

schemathesis runs as its own process (its CLI, installed with the test extras) because its client is
blocking and the controller under test is served by this test's trio loop. Its seed is printed and
can be pinned with ``AIWG_SCHEMATHESIS_SEED``.

Bounds: 20 examples per operation in the examples, coverage and fuzzing phases (no stateful phase:
the document has no links), one worker, 10 s per request. Provisioning is included: fuzzed names
provision real host instances (no agent command unless a fuzzed loadout happens to name a built-in);
the ``hostd`` fixture destroys them all at teardown and checks that no process is left.
"""

from __future__ import annotations

import re
from pathlib import Path

import httpx
import pytest
import yaml

from agentic_sandbox.controller.app import create_app
from agentic_sandbox.controller.config import load_config
from agentic_sandbox.proto import messages as m
from agentic_sandbox.proto import open_hostd
from tests import contracts
from tests.controller import schemathesis_run
from tests.controller.conftest import ROOT, LiveController, LiveHostd, controller_env

DOCUMENT = ROOT / "src" / "agentic_sandbox" / "controller" / "openapi.yaml"
CHECKS = "not_a_server_error,response_schema_conformance,status_code_conformance,content_type_conformance"
METHODS = {"GET", "POST", "PUT", "DELETE", "PATCH"}


def _document() -> dict:
    return yaml.safe_load(DOCUMENT.read_text())


def _rule_paths(rule: str) -> list[str]:
    """``/a/<any(x, y):verb>/<conv:name>`` → ``["/a/x/{name}", "/a/y/{name}"]``."""
    choices = re.search(r"<any\(([^)]*)\):[^>]+>", rule)
    if choices:
        head, tail = rule[: choices.start()], rule[choices.end() :]
        return [p for option in choices.group(1).split(",") for p in _rule_paths(head + option.strip() + tail)]
    return [re.sub(r"<(?:[^:<>]+:)?([^<>]+)>", r"{\1}", rule)]


def _normalize(path: str) -> str:
    """Parameter names differ between the rules and the document (``instance_id`` vs ``id``)."""
    return re.sub(r"\{[^}]+\}", "{}", path)


def test_document_covers_every_route(tmp_path: Path) -> None:
    config = load_config(env=controller_env(tmp_path, str(tmp_path / "hostd.sock")))
    app = create_app(config)
    documented = {
        (_normalize(path), method.upper())
        for path, item in _document()["paths"].items()
        for method in item
        if method.upper() in METHODS
    }
    served = set()
    for rule in app.url_map.iter_rules():
        if rule.websocket:  # WebSocket routes (PTY attach) are not HTTP operations
            continue
        if rule.endpoint.startswith("a2a."):
            continue  # the A2A surface is specified by A2A v1.0 (its AgentCard), not this document
        if rule.endpoint.startswith("console."):
            continue  # the web console's static files are a page, not API operations
        for path in _rule_paths(rule.rule):
            served |= {(_normalize(path), method) for method in rule.methods or () if method in METHODS}
    app.extensions["aiwg"].tasks.store.close()  # never served: nothing else closes it
    assert served - documented == set(), "served but not documented"
    assert documented - served == set(), "documented but not served"


def test_error_envelope_matches_the_contract() -> None:
    """Our ErrorEnvelope component is the contract's schema (same required fields and properties)."""
    contract = contracts.error_envelope()
    ours = _document()["components"]["schemas"]["ErrorEnvelope"]
    assert ours["required"] == contract["required"]
    assert set(ours["properties"]) == set(contract["properties"])
    assert ours["properties"]["errors"]["items"]["required"] == contract["properties"]["errors"]["items"]["required"]


async def test_served_document_is_the_yaml(admin: httpx.AsyncClient) -> None:
    for path in ("/openapi.json", "/api/v2/admin/openapi.json"):
        r = await admin.get(path)
        assert r.status_code == 200 and r.json() == _document()


@pytest.mark.slow
async def test_schemathesis(controller: LiveController, admin: httpx.AsyncClient, hostd: LiveHostd, tmp_path: Path):
    # Seed a few real resources so the examples phase reaches the 200 paths too.
    iid = "0190f5d2-6a4b-7c3d-8e9f-0a1b2c3d4e5f"  # the document's example instance id
    async with open_hostd(hostd.socket_path) as client:  # in the catalog, so its boxes take writes
        await client.call(m.InstanceProvisionRequest(instance_id=iid, name="example", start=False))
    assert (await admin.get(f"/api/v2/admin/instances/{iid}")).status_code == 200
    r = await admin.put(f"/api/v2/admin/storage/inbox/{iid}/missions/m-001.json", json={"content": '{"m": 1}'})
    assert r.status_code in (200, 201)
    global_dir = Path(controller.config.storage_dir) / "global"
    global_dir.mkdir(parents=True, exist_ok=True)
    (global_dir / "readme.txt").write_text("shared\n")

    seed = schemathesis_run.seed()
    config = tmp_path / "schemathesis.toml"
    # 501 is the documented, deliberate answer for what this executor lacks (the Cloud Hypervisor
    # verbs, checkpoints without a VM runtime); every other 5xx is a failure.
    config.write_text(
        '[checks.not_a_server_error]\nexpected-statuses = ["2xx", "3xx", "4xx", "501"]\n'
        # A stream with follow=true never ends by itself, so schemathesis asks for snapshots only;
        # the streams are checked by tests/controller/test_admin_streams.py.
        '[[operations]]\ninclude-operation-id-regex = "^stream(Events|Logs)$"\n'
        'parameters = { "query.follow" = "false" }\n'
        # Cordon and drain change what every later request may do (a drained host takes no new
        # work): tests/controller/admin/test_hosts.py and tests/scenarios/test_hosts.py check them.
        '[[operations]]\ninclude-operation-id-regex = "^(cordon|drain)Host$"\nenabled = false\n'
        # This hostd has no VM runtime: the libvirt probe's documented answer is its 503.
        '[[operations]]\ninclude-operation-id = "healthzLibvirt"\n'
        'checks.not_a_server_error.expected-statuses = ["2xx", "4xx", "503"]\n'
    )
    await schemathesis_run.run(
        config,
        f"{controller.url}/openapi.json",
        controller.url,
        tmp_path,
        seed=seed,
        max_examples=20,
        timeout_s=110,
        extra=["--checks", CHECKS],
    )
