"""The controller's one error family: every service raises these, and only these.

Services know nothing of HTTP. Each surface translates this family once, at its edge, into its
own error body: the admin and v1 surfaces into problem+json (:mod:`controller.http.problems`, one table
class -> status), the A2A surface into its ``{"error": {code, status, message, details}}``. So a
service failure reads the same on every surface, and no service picks a status code::

    ControllerError                 code, message, details, fields
    ├── NotFound                    the thing named does not exist (instance.not_found, ...)
    │   └── storage.ObjectNotFound  (storage.not_found)
    ├── Conflict                    the request clashes with what exists (instance.already_exists)
    │   ├── InvalidState            ... with the target's current state (instance.invalid_state)
    │   └── loadouts.LoadoutExists  (loadout.already_exists)
    ├── ValidationFailed            input that was read but breaks a rule; ``fields`` say where
    │   ├── storage.InvalidPath     (field "path")
    │   └── loadouts.LoadoutInvalid (field "manifest.<path>", "name")
    ├── MalformedInput              input that cannot be read at all (not JSON, not UTF-8)
    │   └── UnsupportedMedia        input in a form this call does not take
    ├── TooLarge                    input over a configured bound
    │   └── storage.ObjectTooLarge  (storage.too_large)
    ├── LimitReached                a configured limit is full (limit.sessions, limit.execs, ...,
    │                               rate_limit.exceeded): 429, Retry-After where waiting helps
    ├── Unauthenticated             no credential, or an unknown one (auth.unauthorized)
    ├── Forbidden                   the caller may not do this (auth.forbidden)
    │   └── storage.ScopeReadOnly   (storage.scope_disabled)
    ├── Gone                        the feature was retired for good
    ├── Unimplemented               not implemented yet (runtime.not_implemented)
    ├── OperationFailed             the work ran and failed (instance.start_failed, .spawn_failed)
    ├── Unavailable                 a dependency cannot serve now (internal.unavailable: hostd)
    │   ├── OutcomeUnknown          ... and the call may or may not have taken effect
    │   └── storage.StorageUnavailable  (storage.unavailable: the storage root)
    └── InternalError               our own fault (internal.error, operation.interrupted)

hostd's failures enter the family in one place, :mod:`controller.hostlink`.

``code`` is the stable dotted upstream code (``instance.not_found``, ``validation.failed``,
``storage.scope_disabled``, ...); it is what clients branch on. ``message`` is for people.
``fields`` lists ``{field, message, code}`` for input errors. ``details`` carries machine-readable
extras for surfaces that show them (A2A ErrorInfo metadata), e.g. ``{"hostd_code": ...}`` for a
failure hostd reported; the problem+json envelope does not show them.

Names say who caused it, as in trio: a caller mistake (ValidationFailed, NotFound) versus the far
side (Unavailable, with the original exception kept as ``__cause__``).
"""

from __future__ import annotations

from collections.abc import Mapping


class ControllerError(Exception):
    """Base of the family. ``code`` is the dotted upstream code; ``message`` the human text."""

    def __init__(
        self,
        code: str,
        message: str,
        *,
        details: Mapping[str, str] | None = None,
        fields: list[dict[str, str]] | None = None,
    ) -> None:
        super().__init__(f"{code}: {message}")
        self.code = code
        self.message = message
        self.details: dict[str, str] = dict(details or {})
        self.fields: list[dict[str, str]] = list(fields or [])


class NotFound(ControllerError):
    """The named object does not exist (or no longer does)."""


class Conflict(ControllerError):
    """The request clashes with something that exists (a taken name, a busy target)."""


class InvalidState(Conflict):
    """The target is in a state that does not allow this."""


class ValidationFailed(ControllerError):
    """Input that was read but breaks a rule. ``fields`` name the offending fields.

    Without a ``message`` the first field error is the message, ``"<field>: <message>"``.
    """

    def __init__(
        self,
        fields: list[dict[str, str]],
        message: str | None = None,
        *,
        code: str = "validation.failed",
        details: Mapping[str, str] | None = None,
    ) -> None:
        if message is None:
            message = f"{fields[0]['field']}: {fields[0]['message']}" if fields else "the input is not valid"
        super().__init__(code, message, details=details, fields=fields)


class MalformedInput(ControllerError):
    """Input that could not be read at all (a body that is not JSON, text that is not UTF-8)."""

    def __init__(
        self,
        message: str,
        *,
        code: str = "validation.failed",
        fields: list[dict[str, str]] | None = None,
        details: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(code, message, details=details, fields=fields)


class UnsupportedMedia(MalformedInput):
    """Input in a media type this call does not take."""


class TooLarge(ControllerError):
    """Input above a configured bound."""


class LimitReached(ControllerError):
    """A configured limit is full (hostd's session or exec table, stream followers, ...): an answer,
    not an outage. ``code`` names the limit (``limit.<what is full>``); the message says the bound
    and the setting that raises it; ``retry_after_s`` is set where waiting helps (something running
    ends and frees a slot) and None where it does not (something must be deleted first)."""

    def __init__(
        self,
        code: str,
        message: str,
        *,
        retry_after_s: int | None = None,
        details: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(code, message, details=details)
        self.retry_after_s = retry_after_s


class Unauthenticated(ControllerError):
    """No credential, or one we do not know."""


class Forbidden(ControllerError):
    """The caller is known but may not do this (its role, a read-only scope)."""


class Gone(ControllerError):
    """The feature was retired for good; the message says what replaced it."""


class Unimplemented(ControllerError):
    """Not implemented yet (e.g. a runtime whose provider does not exist)."""


class OperationFailed(ControllerError):
    """The work was done and failed (the agent command did not start, the instance failed)."""


class Unavailable(ControllerError):
    """A dependency cannot serve now (hostd is unreachable, the storage root is unusable)."""


class OutcomeUnknown(Unavailable):
    """The dependency went away during the call (timeout, connection lost, garbage reply): the
    call may or may not have taken effect, so the caller must not assume nothing happened."""


class InternalError(ControllerError):
    """Our own fault; the message says only what is safe to show."""


# Codes of the A2A operations (services and the A2A edge raise them; controller.a2a.errors maps
# each onto its A2A error).
TASK_NOT_FOUND = "task.not_found"
TASK_NOT_CANCELABLE = "task.not_cancelable"
TASK_FILE_NOT_FOUND = "task.file_not_found"
UNSUPPORTED_OPERATION = "a2a.unsupported_operation"
PUSH_NOT_SUPPORTED = "push.not_supported"
VERSION_NOT_SUPPORTED = "a2a.version_not_supported"
EXTENSION_REQUIRED = "extension.required_not_activated"
CONTENT_TYPE_NOT_SUPPORTED = "a2a.content_type_not_supported"
EXTENDED_CARD_NOT_CONFIGURED = "a2a.extended_card_not_configured"
METHOD_NOT_FOUND = "a2a.method_not_found"
METHOD_NOT_ALLOWED = "a2a.method_not_allowed"
IDEMPOTENCY_KEY_REUSED = "idempotency.key_reused"
IDEMPOTENCY_MESSAGE_ID_MALFORMED = "idempotency.message_id_malformed"
EXTENSION_UNSUPPORTED = "extension.unsupported_on_binding"
# hitl-prompt/v1 (its spec: 409 / -32010, 422 / -32011; the other two name what the answer lacks).
HITL_UNKNOWN = "hitl.already_answered_or_unknown"
HITL_RESPONSE_INVALID = "hitl.response_invalid"
HITL_NOT_ACTIVATED = "hitl.extension_not_activated"
HITL_MISSING_TASK_ID = "hitl.missing_task_id"
