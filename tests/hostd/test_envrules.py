"""What env a caller may hand an instance, a session or an exec (hostd.envrules), in memory."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from agentic_sandbox.hostd.envrules import RESERVED_ENV, validate_child_env, validate_instance_env
from agentic_sandbox.hostd.errors import RpcError
from agentic_sandbox.proto import ErrorCode


@pytest.mark.parametrize("validate", [validate_child_env, validate_instance_env])
def test_plain_variables_pass(validate: Callable[[dict[str, str]], None]) -> None:
    validate({"PATH": "/usr/bin", "_x1": "", "LANG": "C.UTF-8", "MULTI": "a b\tc"})


@pytest.mark.parametrize("key", ["1ABC", "A-B", "A B", "", "Ä", "A=B"])
def test_keys_must_be_variable_names(key: str) -> None:
    with pytest.raises(RpcError) as caught:
        validate_child_env({key: "x"})
    assert caught.value.code is ErrorCode.REQUEST_INVALID and caught.value.details == {"key": key}


@pytest.mark.parametrize("key", sorted(RESERVED_ENV))
def test_what_hostd_sets_cannot_be_overridden(key: str) -> None:
    """A child must not pass for another instance, hide from a tree kill or fake a control fd."""
    with pytest.raises(RpcError, match="is set by hostd") as caught:
        validate_child_env({key: "forged"})
    assert caught.value.code is ErrorCode.REQUEST_INVALID


def test_the_reserved_names_cover_identity_tree_mark_and_control_fd() -> None:
    assert {"AIWG_INSTANCE_ID", "AIWG_INSTANCE_DIR"} <= RESERVED_ENV
    assert any("TREE" in key for key in RESERVED_ENV) and any("CONTROL" in key for key in RESERVED_ENV)


def test_a_nul_in_a_value_is_refused() -> None:
    with pytest.raises(RpcError, match="contains a NUL"):
        validate_child_env({"A": "x\0y"})


@pytest.mark.parametrize("value", ["a\nb", "a\rb"])
def test_an_instance_env_holds_no_newline_but_a_session_env_may(value: str) -> None:
    """An instance's env is also written one entry per line; a session's or exec's never is."""
    validate_child_env({"A": value})
    with pytest.raises(RpcError, match="contains a newline"):
        validate_instance_env({"A": value})
