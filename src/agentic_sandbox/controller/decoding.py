"""Request bodies into typed objects, with errors that name the offending field.

Used by every surface's handlers: :func:`decode_json` raises :class:`~controller.errors.MalformedInput`
(400) for a body that is not JSON and :class:`~controller.errors.ValidationFailed` (422) naming the
field, e.g. ``mounts[0]``, for JSON that does not fit the type.
"""

from __future__ import annotations

import re
from typing import Any

import jsonschema_rs
import msgspec

from .errors import MalformedInput, ValidationFailed

_AT_RE = re.compile(r" - at `\$(?P<path>[^`]*)`$")
_NAMED_RE = re.compile(r"(?:missing required field|unknown field) `(?P<name>[^`]+)`")


def _field_of(message: str) -> tuple[str, str, str]:
    """Split a msgspec validation message into (field path, message, error code)."""
    path = ""
    at = _AT_RE.search(message)
    if at is not None:
        path = at["path"].lstrip(".")
        message = message[: at.start()]
    named = _NAMED_RE.search(message)
    if named is not None:
        path = f"{path}.{named['name']}" if path else named["name"]
    if "missing required field" in message:
        code = "required"
    elif "unknown field" in message:
        code = "unknown_field"
    elif message.startswith("Expected `") and "`, got `" in message:
        code = "type"
    else:
        code = "constraint"
    return path or "$", message, code


def validation_failure(exc: msgspec.ValidationError) -> ValidationFailed:
    """The ValidationFailed naming the field a msgspec validation error points at."""
    field, message, code = _field_of(str(exc))
    return ValidationFailed([{"field": field, "message": message, "code": code}])


def decode_json(body: bytes, type_: type[Any]) -> Any:
    """Decode a JSON body into ``type_``: MalformedInput if it is not JSON, ValidationFailed naming
    the field if it does not fit."""
    try:
        return msgspec.json.decode(body, type=type_)
    except msgspec.ValidationError as exc:
        field, message, code = _field_of(str(exc))
        raise ValidationFailed([{"field": field, "message": message, "code": code}]) from None
    except msgspec.DecodeError as exc:
        message = f"body is not valid JSON: {exc}"
        raise MalformedInput(
            f"$: {message}", fields=[{"field": "$", "message": message, "code": "json.invalid"}]
        ) from None


def json_pointer(path: list[str | int]) -> str:
    return "".join("/" + str(part).replace("~", "~0").replace("/", "~1") for part in path)


def schema_errors(validator: Any, payload: Any) -> list[dict[str, str]]:
    """``{field: JSON pointer, code: keyword, message}`` for each way ``payload`` breaks the JSON
    Schema of ``validator`` (jsonschema-rs); [] when it fits."""
    out: list[dict[str, str]] = []
    for error in validator.iter_errors(payload):
        keyword = next((str(p) for p in reversed(error.schema_path) if isinstance(p, str)), "schema")
        path = list(error.instance_path)
        kind = error.kind
        if isinstance(kind, jsonschema_rs.ValidationErrorKind.AdditionalProperties):
            # One error per property that is not allowed, at the property (what a form can show).
            out += [
                {"field": json_pointer([*path, name]), "code": keyword, "message": f"property {name!r} is not allowed"}
                for name in kind.unexpected
            ]
            continue
        if isinstance(kind, jsonschema_rs.ValidationErrorKind.Required):
            path.append(str(kind.property))
        out.append({"field": json_pointer(path), "code": keyword, "message": error.message})
    return out
