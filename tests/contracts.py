"""Upstream's contracts, vendored byte for byte in ``contracts/upstream/`` (its README names the source).

Tests validate what we emit against these files rather than against schemas of our own: if
upstream's schema and our output part ways, the test says so.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

import jsonschema
import yaml

ROOT = Path(__file__).resolve().parent.parent
CONTRACTS = ROOT / "contracts" / "upstream"


def _require(path: Path) -> Path:
    assert path.exists(), f"vendored upstream contract {path} is missing (see contracts/upstream/README.md)"
    return path


@functools.cache
def error_envelope() -> dict[str, Any]:
    return json.loads(_require(CONTRACTS / "admin-api" / "error-envelope.schema.json").read_text())


@functools.cache
def admin_openapi() -> dict[str, Any]:
    return yaml.safe_load(_require(CONTRACTS / "admin-api.openapi.yaml").read_text())


#: Files the OpenAPI document refers to by relative path, and the $defs name each becomes.
_EXTERNAL = {"./admin-api/error-envelope.schema.json": "_ErrorEnvelopeFile"}


def _ref(target: str) -> str:
    if target in _EXTERNAL:
        return f"#/$defs/{_EXTERNAL[target]}"
    return target.replace("#/components/schemas/", "#/$defs/")


def _rewrite_refs(node: Any) -> Any:
    if isinstance(node, dict):
        return {k: (_ref(v) if k == "$ref" and isinstance(v, str) else _rewrite_refs(v)) for k, v in node.items()}
    if isinstance(node, list):
        return [_rewrite_refs(v) for v in node]
    return node


@functools.cache
def _defs() -> dict[str, Any]:
    defs = _rewrite_refs(admin_openapi()["components"]["schemas"])
    envelope = {k: v for k, v in error_envelope().items() if k not in ("$schema", "$id")}
    defs[_EXTERNAL["./admin-api/error-envelope.schema.json"]] = envelope
    return defs


def component(name: str) -> dict[str, Any]:
    """A component schema of the admin OpenAPI as a standalone JSON schema (2020-12)."""
    defs = _defs()
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", **defs[name], "$defs": defs}


def response_schema(path: str, method: str = "get", status: str = "200") -> dict[str, Any]:
    """The JSON schema of one documented response, refs resolved against the components."""
    op = admin_openapi()["paths"][path][method]
    schema = _rewrite_refs(op["responses"][status]["content"]["application/json"]["schema"])
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", **schema, "$defs": _defs()}


def validate(instance: Any, schema: dict[str, Any]) -> None:
    """Validate with format checks (uuid, date-time, uri, ...) switched on."""
    cls = jsonschema.validators.validator_for(schema)
    cls(schema, format_checker=cls.FORMAT_CHECKER).validate(instance)


def validate_problem(body: Any) -> None:
    validate(body, error_envelope())


# -- pty-ws/v1 and pty-extensions/v1 ------------------------------------------------------------


@functools.cache
def pty_ws_schema() -> dict[str, Any]:
    return json.loads(_require(CONTRACTS / "bindings" / "pty-ws" / "v1" / "frames.schema.json").read_text())


@functools.cache
def pty_session_frame_schema() -> dict[str, Any]:
    """pty-extensions/v1's ``SessionFramePayload`` (the payload of ``pty.session_frame``), standalone."""
    ext = json.loads(_require(CONTRACTS / "extensions" / "pty-extensions" / "v1" / "frames.schema.json").read_text())
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$ref": "#/$defs/SessionFramePayload",
        "$defs": ext["$defs"],
    }


def validate_pty_frame(frame: Any) -> None:
    """A server frame against the pty-ws/v1 envelope and, for ``pty.session_frame``, its payload."""
    validate(frame, pty_ws_schema())
    if frame.get("op") == "pty.session_frame":
        validate(frame["payload"], pty_session_frame_schema())


@functools.cache
def runtime_schema(name: str) -> dict[str, Any]:
    """A runtime/v1 schema: ``params`` or ``task-metadata``."""
    return json.loads(_require(CONTRACTS / "extensions" / "runtime" / "v1" / f"{name}.schema.json").read_text())


def validate_runtime(name: str, instance: Any) -> None:
    schema = runtime_schema(name)
    jsonschema.Draft202012Validator(schema, format_checker=jsonschema.FormatChecker()).validate(instance)


# -- hitl-prompt/v1 ------------------------------------------------------------------------------


@functools.cache
def hitl_file(name: str) -> dict[str, Any]:
    """A hitl-prompt/v1 file: ``envelope.schema.json``, ``response.schema.json``, ``examples/...``."""
    data: dict[str, Any] = json.loads(_require(CONTRACTS / "extensions" / "hitl-prompt" / "v1" / name).read_text())
    return data


def validate_hitl(name: str, instance: Any) -> None:
    """``instance`` against the ``envelope`` or ``response`` schema, with format checks."""
    validate(instance, hitl_file(f"{name}.schema.json"))
