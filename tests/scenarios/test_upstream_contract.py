"""Upstream's own document drives schemathesis against the live controller (with a real hostd):
no undocumented 5xx and no response that breaks upstream's schemas, except the deliberate
differences listed below (and in docs/compatibility.md), each with its reason.

The document is ``contracts/upstream/admin-api.openapi.yaml`` as vendored (byte for byte; its
error envelope is resolved from the file beside it). schemathesis runs as its own process, as in
``test_openapi.py``; its seed is printed and can be pinned with ``AIWG_SCHEMATHESIS_SEED``.
Each difference becomes a per-operation override in schemathesis's configuration, so a check is
relaxed only where the difference is, and every other check still runs there.
"""

from __future__ import annotations

import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from agentic_sandbox.proto import messages as m
from agentic_sandbox.proto import open_hostd
from tests.controller import schemathesis_run
from tests.controller.conftest import ROOT, LiveController, LiveHostd

DOCUMENT = ROOT / "contracts" / "upstream" / "admin-api.openapi.yaml"
CHECKS = "not_a_server_error,response_schema_conformance,status_code_conformance,content_type_conformance"
EXAMPLE_INSTANCE = "8a3f8b94-1c4e-4d2b-9c1a-1ad44e6b0dfe"  # upstream's example id (not a UUIDv7)


@dataclass(frozen=True)
class Difference:
    """A deliberate difference from upstream's document on the operations ``operations`` matches
    (an operationId regex), with the reason. What it changes in the run:

    * ``statuses``: responses we give there that upstream does not list; they are added to the
      copy of the document schemathesis reads, each as ``application/problem+json`` with
      upstream's ``ErrorEnvelope``, so the status is accepted and its body is still checked;
    * ``problem_json``: statuses upstream lists with another media type, answered as problem+json;
    * ``skip``: the operations are left out of the run; ``parameters``: fixed parameter values.
    """

    operations: str
    why: str
    statuses: tuple[str, ...] = ()
    problem_json: tuple[str, ...] = ()
    skip: bool = False
    parameters: tuple[tuple[str, str], ...] = ()


DIFFERENCES: tuple[Difference, ...] = (
    Difference(
        "^(listInstances|getInstance|startInstance|stopInstance|restartInstance|destroyInstance"
        "|reprovisionInstance|listContainerImages|listRuntimeProviders)$",
        "Operations that must ask hostd fail closed with 503 internal.unavailable (Retry-After) while hostd cannot "
        "answer; upstream lists 503 for provisioning only.",
        statuses=("503",),
    ),
    Difference(
        "^(listInstances|reprovisionInstance|getStorageObject|deleteStorageObject|streamLogs|streamEvents)$",
        "Input that parses but breaks a rule (a filter outside its enum, a limit out of range, a storage path that "
        "leaves its scope, a reprovision body of the wrong shape) is a 422 validation.failed naming the field in "
        "errors[]; upstream lists 422 only where a body is validated.",
        statuses=("422",),
    ),
    Difference(
        "^(provisionInstance|reprovisionInstance|createLoadout|putStorageObject)$",
        "Bodies: 400 for one that is not JSON, 413 request.too_large above AIWG_MAX_REQUEST_BYTES, 415 for a "
        "media type the operation does not take (loadouts take JSON or YAML).",
        statuses=("400", "413", "415"),
    ),
    Difference(
        "^(putStorageObject|deleteStorageObject)$",
        "An inbox/outbox path starts with the id of an instance in the catalog (upstream says so only in prose): "
        "404 instance.not_found for an id the catalog does not know, 409 instance.invalid_state for a destroyed "
        "one, which takes no more mail.",
        statuses=("404", "409"),
    ),
    Difference(
        "^(streamLogs|streamEvents)$",
        "Followers of each stream are bounded (AIWG_MAX_STREAM_FOLLOWERS): above it 429 rate_limit.exceeded.",
        statuses=("429",),
    ),
    Difference(
        "^(streamLogs|streamEvents)$",
        "follow=true is a stream that never ends by itself, so schemathesis asks for snapshots only; the streams "
        "are checked by tests/controller/test_admin_streams.py.",
        parameters=(("query.follow", "false"),),
    ),
    Difference(
        "^(createCloudHypervisorSnapshot|restoreCloudHypervisorSnapshot|forkCloudHypervisorSnapshot"
        "|initializeCloudHypervisorWarmPool|handoffCloudHypervisorWarmPool)$",
        "This executor has no Cloud Hypervisor provider: every CH verb answers 501 provider.unavailable "
        "(documented in our OpenAPI) where upstream documents 202 with an operation.",
        statuses=("501",),
    ),
    Difference(
        "^(rotateInstanceSecret)$",
        "The retired rotate-secret answers its 410 as application/problem+json, like every error of the admin "
        "surface, where upstream's document types that 410 as application/json.",
        problem_json=("410",),
    ),
    Difference(
        "^(createLibvirtCheckpoint|restoreLibvirtCheckpoint|initializeLibvirtWarmPool|handoffLibvirtWarmPool)$",
        "The checkpoint and libvirt warm pool routes need a VM runtime and its checkpoints, which this run's hostd "
        "does not have (they would only answer 501 capability.unsupported or 404 warm_pool.not_found); they run "
        "against libvirt's test driver in test_admin_instances.py and test_admin_pools.py.",
        skip=True,
    ),
)


def _matches(diff: Difference, operation_id: str) -> bool:
    return re.match(diff.operations, operation_id) is not None


def _operations(document: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {
        op["operationId"]: op
        for item in document["paths"].values()
        for op in item.values()
        if isinstance(op, dict) and "operationId" in op
    }


def derived_document() -> dict[str, Any]:
    """Upstream's document with the differences applied (the vendored file is not touched)."""
    document = yaml.safe_load(DOCUMENT.read_text())
    problem = {"application/problem+json": {"schema": {"$ref": "#/components/schemas/ErrorEnvelope"}}}
    for operation_id, op in _operations(document).items():
        for diff in DIFFERENCES:
            if not _matches(diff, operation_id):
                continue
            for status in diff.statuses:
                op["responses"].setdefault(
                    status, {"description": f"Deliberate difference: {diff.why}", "content": problem}
                )
            for status in diff.problem_json:
                op["responses"][status].setdefault("content", {}).update(problem)
    return document


def schemathesis_config() -> str:
    """The checks, then one override per operation that a difference skips, gives fixed parameters
    or gives deliberate 5xx answers (merged over every difference naming it)."""
    # The checks are chosen here, not with --checks: a check named on the command line would
    # override the per-operation settings below.
    lines = ["[checks]", "enabled = false", ""]
    for check in CHECKS.split(","):
        lines += [f"[checks.{check}]", "enabled = true", ""]
    for operation_id in sorted(_operations(yaml.safe_load(DOCUMENT.read_text()))):
        diffs = [diff for diff in DIFFERENCES if _matches(diff, operation_id)]
        skip = any(diff.skip for diff in diffs)
        parameters = {key: value for diff in diffs for key, value in diff.parameters}
        server_errors = sorted({status for diff in diffs for status in diff.statuses if status.startswith("5")})
        if not (skip or parameters or server_errors):
            continue
        lines += ["[[operations]]", f"include-operation-id = {_toml_string(operation_id)}"]
        if skip:
            lines.append("enabled = false")
        if server_errors:
            # These 5xx are the deliberate answers listed above; every other 5xx still fails the run.
            statuses = ", ".join(_toml_string(s) for s in ("2xx", "3xx", "4xx", *server_errors))
            lines.append(f"checks.not_a_server_error.expected-statuses = [{statuses}]")
        if parameters:
            pairs = ", ".join(f"{_toml_string(k)} = {_toml_string(v)}" for k, v in parameters.items())
            lines.append(f"parameters = {{ {pairs} }}")
        lines.append("")
    return "\n".join(lines)


def _toml_string(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def test_every_difference_says_why_and_names_real_operations() -> None:
    ids = set(_operations(yaml.safe_load(DOCUMENT.read_text())))
    for diff in DIFFERENCES:
        assert len(diff.why) > 40
        assert any(_matches(diff, op) for op in ids), diff.operations
        assert diff.skip or diff.statuses or diff.problem_json or diff.parameters


@pytest.mark.slow
async def test_schemathesis_with_upstreams_document(
    controller: LiveController, admin: httpx.AsyncClient, hostd: LiveHostd, tmp_path: Path
) -> None:
    # Seed real resources behind upstream's example values, so the examples phase reaches the 200s.
    async with open_hostd(hostd.socket_path) as client:
        await client.call(m.InstanceProvisionRequest(instance_id=EXAMPLE_INSTANCE, name="example", start=False))
    assert (await admin.get(f"/api/v2/admin/instances/{EXAMPLE_INSTANCE}")).status_code == 200
    global_dir = Path(controller.config.storage_dir) / "global"
    global_dir.mkdir(parents=True, exist_ok=True)
    (global_dir / "readme.txt").write_text("shared\n")

    seed = schemathesis_run.seed()
    config = tmp_path / "schemathesis.toml"
    config.write_text(schemathesis_config())
    # The derived copy sits beside a copy of the envelope its relative $ref names.
    (tmp_path / "admin-api").mkdir()
    shutil.copy(DOCUMENT.parent / "admin-api" / "error-envelope.schema.json", tmp_path / "admin-api")
    document = tmp_path / "admin-api.openapi.yaml"
    document.write_text(yaml.safe_dump(derived_document(), sort_keys=False))
    await schemathesis_run.run(
        config,
        str(document),
        f"{controller.url}/api/v2/admin",
        tmp_path,
        seed=seed,
        max_examples=15,
        timeout_s=150,
        extra=[],
    )
