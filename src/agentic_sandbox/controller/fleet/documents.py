"""fleet-workload/v1 documents: the contract's schema, what an admission may hold, the transport
envelopes of observations and reconciliation, and the hash that tells a replay from a clash.

The schema is upstream's file, kept beside this module byte for byte (package data; the tests
check it against ``contracts/upstream/fleet-workload/v1/``). Documents are validated with it whole
(jsonschema-rs, draft 2020-12): unknown fields anywhere, a daemon without ``health``, a scheduled
collector without ``schedule`` are refused naming the field (422).

Credential material never crosses the boundary: besides the schema's closed objects, a key
anywhere in a document whose name says it holds a secret (``token``, ``password``,
``credential``, ``api_key``, ...) is refused with ``fleet.credential_material`` before the schema
is asked, unless it is a policy reference (``*_ref``, as ``credential_policy_ref``).
"""

from __future__ import annotations

import functools
import hashlib
import json
import re
from datetime import UTC, datetime
from importlib import resources
from typing import Annotated, Any

import jsonschema_rs
import msgspec
import rfc8785

from ..decoding import json_pointer, schema_errors
from ..errors import TooLarge, ValidationFailed

API_VERSION = "agentic-orchestration/v1"
SCHEMA_FILE = "fleet-workload-v1.schema.json"
CREDENTIAL_MATERIAL = "fleet.credential_material"
IDENTITIES = ("session_id", "task_id", "command_id")
TERMINAL_STATES = frozenset({"succeeded", "failed", "cancelled", "timed-out"})
#: Words of a key (``accessToken``, ``api-key``, ``db_password``) that say it holds a secret.
_SECRET_WORDS = frozenset(
    {"token", "secret", "password", "passwd", "passphrase", "credential", "credentials", "apikey", "authorization"}
    | {"bearer", "cookie", "privatekey"}
)
_SECRET_PAIRS = ("api_key", "private_key", "access_key", "secret_key", "client_secret")
#: How a word run together from others ends when it holds a secret (``ACCESSTOKEN``, ``dbpassword``,
#: ``clientsecrets``). Not ``tokens``: ``max_tokens`` counts a model's tokens.
_SECRET_ENDINGS = (
    *("token", "secret", "secrets", "password", "passwords", "passwd", "apikey", "privatekey"),
    *("credential", "credentials"),
)
MAX_DEPTH = 32
#: The largest workload record kept (its JSON): intent and observations, not payloads.
MAX_RECORD_BYTES = 256 * 1024


@functools.cache
def schema() -> dict[str, Any]:
    text = resources.files("agentic_sandbox.controller.fleet").joinpath(SCHEMA_FILE).read_text(encoding="utf-8")
    loaded: dict[str, Any] = json.loads(text)
    return loaded


@functools.cache
def _validator(definition: str) -> Any:
    """A validator of one ``$defs`` entry (``workload_record``, ...) or a pointer below one."""
    whole = schema()
    part = {"$schema": whole["$schema"], "$defs": whole["$defs"], "$ref": f"#/$defs/{definition}"}
    return jsonschema_rs.Draft202012Validator(part, offline=True, pattern_options=jsonschema_rs.RegexOptions())


def errors(definition: str, document: Any) -> list[dict[str, str]]:
    """How ``document`` breaks the schema's ``definition`` ([] when it fits)."""
    return schema_errors(_validator(definition), document)


def check(definition: str, document: Any, *, prefix: str = "") -> None:
    """Raise :class:`ValidationFailed` (422) naming every field of ``document`` that breaks ``definition``."""
    found = errors(definition, document)
    if found:
        if prefix:
            found = [{**e, "field": prefix + e["field"]} for e in found]
        raise ValidationFailed(found)


def names_a_secret(key: str) -> bool:
    """Whether a key's name says it holds a secret; a policy reference (``*_ref``) does not."""
    name = re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", key).lower().replace("-", "_").replace(".", "_")
    if name.endswith("_ref"):
        return False
    words = name.split("_")
    if any(word in _SECRET_WORDS or word.endswith(_SECRET_ENDINGS) for word in words):
        return True
    return any(pair in name for pair in _SECRET_PAIRS)


def refuse_credentials(document: Any) -> None:
    """``fleet.credential_material`` (422) for a key anywhere that names a secret."""
    found: list[dict[str, str]] = []
    stack: list[tuple[Any, list[str | int], int]] = [(document, [], 0)]
    while stack:
        item, path, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise ValidationFailed([{"field": json_pointer(path), "code": "depth", "message": "nested too deep"}])
        if isinstance(item, dict):
            for key, value in item.items():
                if names_a_secret(str(key)):
                    found.append(
                        {
                            "field": json_pointer([*path, key]),
                            "code": "credential_material",
                            "message": "credential material does not cross the fleet contract; "
                            "send a policy reference (credential_policy_ref) instead",
                        }
                    )
                stack.append((value, [*path, key], depth + 1))
        elif isinstance(item, list):
            stack.extend((value, [*path, index], depth + 1) for index, value in enumerate(item))
    if found:
        found.sort(key=lambda e: e["field"])
        raise ValidationFailed(found, code=CREDENTIAL_MATERIAL)


def check_size(record: dict[str, Any]) -> None:
    """413 ``fleet.record_too_large`` for a record above :data:`MAX_RECORD_BYTES`."""
    size = len(json.dumps(record, separators=(",", ":")))
    if size > MAX_RECORD_BYTES:
        raise TooLarge(
            "fleet.record_too_large",
            f"a workload record is at most {MAX_RECORD_BYTES // 1024} KiB as JSON (this one: {size} bytes); "
            "artifacts are references, metadata is small",
        )


def payload_hash(workload: dict[str, Any]) -> str:
    """What makes two admissions the same: the document but its transport timestamp
    (``status.last_seen``, which a retry sends anew), canonical (RFC 8785), SHA-256."""
    status = {k: v for k, v in workload.get("status", {}).items() if k != "last_seen"}
    return hashlib.sha256(rfc8785.dumps({**workload, "status": status})).hexdigest()


def now_stamp() -> str:
    return datetime.now(UTC).isoformat(timespec="seconds").replace("+00:00", "Z")


# -- transport envelopes ---------------------------------------------------------------------------

Id = Annotated[str, msgspec.Meta(min_length=1, max_length=256, pattern=r"^[^\s]+$")]


class RuntimeIdentity(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    session_id: Id | None = None
    task_id: Id | None = None
    command_id: Id | None = None

    def given(self) -> dict[str, str]:
        return {name: value for name in IDENTITIES if (value := getattr(self, name)) is not None}


class Observation(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """``POST /workloads/{child_id}/observations``: advance by exactly one revision."""

    expected_revision: Annotated[int, msgspec.Meta(ge=0)]
    status: dict[str, Any]
    runtime_identity: RuntimeIdentity | None = None


class ReconcileRequest(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """``POST /reconcile``: the caller's previous inventory revision and the children it expects."""

    before_revision: Annotated[int, msgspec.Meta(ge=0)]
    child_ids: Annotated[list[Id], msgspec.Meta(min_length=1, max_length=1000)]
