"""Upstream's ``operator-tokens.toml``: operator bearer tokens with their roles, as digests.

The file (``<secrets dir>/operator-tokens.toml``, or ``AIWG_OPERATOR_TOKENS_FILE``) holds
``[[tokens]]`` tables, each with the token and its role, as upstream writes it::

    [[tokens]]
    token = "..."            # or token_sha256 = "<64 hex>": the file then holds no token at all
    role = "admin"           # or "operator"
    label = "ci"             # optional (ours): how logs and the admin views name the caller

Only the SHA-256 digests are kept (the store's ``tokens`` table, the authenticator). A file that is
missing is no tokens; one that cannot be read or parsed, an unknown key, a role other than the two,
a token shorter than 16 characters or named twice is :class:`OperatorTokensError`, naming the file
and the table: at start the controller refuses to run, on SIGHUP it keeps the tokens it has.
A file group or others may read is used, with a warning: it holds credentials.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import stat
import tomllib
from typing import Any

import trio

from ..config import ConfigError
from ..store import TokenRecord
from ..store.tokens import TokenTable
from .tokens import ROLE_ADMIN, ROLE_OPERATOR, Authenticator

log = logging.getLogger(__name__)

#: The ``source`` of these rows in the store's ``tokens`` table.
SOURCE = "operator-tokens"
MIN_TOKEN_CHARS = 16
_KEYS = frozenset({"token", "token_sha256", "role", "label"})
_DIGEST = re.compile(r"^[0-9a-f]{64}$")
_LABEL = re.compile(r"^[A-Za-z0-9._:@-]{1,64}$")


class OperatorTokensError(ConfigError):
    """The operator tokens file is unusable; the message names the file and the entry."""


def read_operator_tokens(path: str | None) -> list[TokenRecord]:
    """The file's tokens as digests; [] when ``path`` is None or names no file."""
    if path is None:
        return []
    try:
        with open(path, "rb") as fh:
            mode = os.fstat(fh.fileno()).st_mode
            data = tomllib.load(fh)
    except FileNotFoundError:
        return []
    except OSError as exc:
        raise OperatorTokensError(f"{path}: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise OperatorTokensError(f"{path} is not valid TOML: {exc}") from None
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        log.warning("%s may be read by others (mode %o): it holds credentials, make it 0600", path, mode & 0o777)
    extra = set(data) - {"tokens"}
    if extra:
        raise OperatorTokensError(f"{path}: unknown key(s) {', '.join(sorted(extra))} (only [[tokens]] tables)")
    tables = data.get("tokens", [])
    if not isinstance(tables, list):
        raise OperatorTokensError(f"{path}: tokens must be [[tokens]] tables")
    records: list[TokenRecord] = []
    for index, table in enumerate(tables, 1):
        records.append(_record(f"{path}: [[tokens]] #{index}", table, index))
    digests = [r.hash for r in records]
    if len(set(digests)) != len(digests):
        raise OperatorTokensError(f"{path}: a token is named twice")
    return records


def _record(where: str, table: Any, index: int) -> TokenRecord:
    if not isinstance(table, dict):
        raise OperatorTokensError(f"{where} is not a table")
    unknown = set(table) - _KEYS
    if unknown:
        raise OperatorTokensError(f"{where}: unknown key(s) {', '.join(sorted(unknown))}")
    role = table.get("role")
    if role not in (ROLE_ADMIN, ROLE_OPERATOR):
        raise OperatorTokensError(f'{where}: role must be "admin" or "operator", not {role!r}')
    token, digest = table.get("token"), table.get("token_sha256")
    if (token is None) == (digest is None):
        raise OperatorTokensError(f"{where}: give one of token or token_sha256")
    if token is not None:
        if not isinstance(token, str) or len(token) < MIN_TOKEN_CHARS:
            raise OperatorTokensError(f"{where}: token must be a string of at least {MIN_TOKEN_CHARS} characters")
        digest = hashlib.sha256(token.encode()).hexdigest()
    elif not isinstance(digest, str) or not _DIGEST.match(digest):
        raise OperatorTokensError(f"{where}: token_sha256 must be 64 lowercase hex digits")
    label = table.get("label", f"{role}-{index}")
    if not isinstance(label, str) or not _LABEL.match(label):
        raise OperatorTokensError(f"{where}: label must be 1-64 of letters, digits and ._:@-")
    return TokenRecord(hash=digest, role=role, label=label, source=SOURCE)


async def reload_operator_tokens(path: str | None, tokens: TokenTable, auth: Authenticator) -> list[TokenRecord]:
    """Read the file again and make its tokens the only ones of its kind (SIGHUP); returns them.

    :class:`OperatorTokensError` leaves every token as it was: a file that does not parse, or one
    that would leave no admin (the file held the only one and lost it), changes nothing."""
    records = await trio.to_thread.run_sync(read_operator_tokens, path)
    current = await trio.to_thread.run_sync(tokens.list)
    others = [t for t in current if t.source != SOURCE]
    if not any(t.role == ROLE_ADMIN for t in [*others, *records]):
        raise OperatorTokensError(f"{path}: names no admin, and no other admin token is configured")
    await trio.to_thread.run_sync(tokens.replace, SOURCE, records)
    auth.replace_tokens(await trio.to_thread.run_sync(tokens.list))
    return records
