"""Pages of the admin lists: the ``limit`` and ``page_token`` query parameters, and the tokens.

Every admin list (instances, an instance's sessions, operations, tasks) reads a page in a stable
order and hands back ``next_page_token``: the sort key of the last item shown, so the next page
starts after it (keyset paging; an item added or removed meanwhile moves no other item between
pages). A token is opaque to clients: base64url of ``[list, key..., check]`` in JSON, where
``check`` is a digest of the list's name, its filters and the key. A token that does not read
back, whose check does not match (edited, from another list, or from the same list with other
filters) is 400 ``validation.failed`` naming ``page_token``. The check is not a signature: a
token made by hand with a valid check only moves where a page starts in a list its bearer may
read anyway.

``limit`` is 1..:data:`MAX_PAGE_SIZE`; anything else is 400 naming ``limit``. A list upstream
already had (instances, sessions) answers its old shape, whole, without ``limit``; the new lists
(operations, tasks) page by :data:`DEFAULT_PAGE_SIZE` without it.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
from collections.abc import Mapping, Sequence
from typing import Any, overload

import msgspec

from ..auth.tokens import ROLE_INSTANCE, Principal
from ..errors import MalformedInput

#: The largest page a client may ask for.
MAX_PAGE_SIZE = 500
#: The page size of the lists that have no unpaged shape (operations, tasks) when ``limit`` is absent.
DEFAULT_PAGE_SIZE = 100

#: What every list sorts by: a time (creation or last status change) and the id that breaks ties.
Key = tuple[float, str]


def _bad(field: str, message: str) -> MalformedInput:
    return MalformedInput(f"{field}: {message}", fields=[{"field": field, "message": message, "code": "invalid"}])


@overload
def page_size(raw: str | None, *, default: int) -> int: ...
@overload
def page_size(raw: str | None, *, default: None = None) -> int | None: ...
@overload
def page_size(raw: str | None, *, default: int | None) -> int | None: ...


def page_size(raw: str | None, *, default: int | None = None) -> int | None:
    """The ``limit`` parameter: None when absent (and no default), else 1..MAX_PAGE_SIZE."""
    if raw is None:
        return default
    if not (raw.isascii() and raw.isdigit()):
        raise _bad("limit", f"must be an integer from 1 to {MAX_PAGE_SIZE}")
    limit = int(raw)
    if not 1 <= limit <= MAX_PAGE_SIZE:
        raise _bad("limit", f"must be an integer from 1 to {MAX_PAGE_SIZE}")
    return limit


def _check(kind: str, filters: Mapping[str, Any], key: Sequence[Any]) -> str:
    blob = msgspec.json.encode([kind, sorted(filters.items()), list(key)])
    return hashlib.sha256(blob).hexdigest()[:16]


def encode_token(kind: str, filters: Mapping[str, Any], key: Key) -> str:
    """The token of the page after the item whose sort key is ``key``, for this list and filters."""
    key = (float(key[0]), key[1])  # as it reads back (an int time would not check)
    raw = msgspec.json.encode([kind, *key, _check(kind, filters, key)])
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def decode_token(raw: str | None, kind: str, filters: Mapping[str, Any]) -> Key | None:
    """The sort key a token carries (None for no token or an empty one); 400 naming
    ``page_token`` for anything this list with these filters did not give out."""
    if not raw:
        return None
    try:
        data = msgspec.json.decode(base64.urlsafe_b64decode(raw + "=" * (-len(raw) % 4)))
        if not isinstance(data, list) or len(data) < 3 or data[0] != kind or not isinstance(data[-1], str):
            raise ValueError("not this list's")
        key = msgspec.convert(data[1:-1], Key)
    except (binascii.Error, ValueError, msgspec.DecodeError, msgspec.ValidationError):
        raise _bad("page_token", "not a page token of this list") from None
    if data[-1] != _check(kind, filters, key):
        raise _bad("page_token", "not a page token of this list with these filters")
    return key


def narrowed_to(principal: Principal) -> str | None:
    """The one instance a list shows an instance token (its own); None for operator tokens, which
    see every instance (the rule of :func:`~controller.auth.tokens.may_use_instance`)."""
    return principal.instance_id if principal.role == ROLE_INSTANCE else None
