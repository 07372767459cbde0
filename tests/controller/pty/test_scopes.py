"""The one map from principals to PTY scopes."""

from __future__ import annotations

from agentic_sandbox.controller.auth.tokens import Principal
from agentic_sandbox.controller.pty.scopes import PTY_ADMIN, PTY_CONTROL, PTY_OBSERVE, pty_scopes


def test_roles_map_to_scopes() -> None:
    assert pty_scopes(Principal(role="admin", label="a"), "i") == {PTY_ADMIN, PTY_CONTROL, PTY_OBSERVE}
    assert pty_scopes(Principal(role="operator", label="o"), "i") == {PTY_CONTROL, PTY_OBSERVE}
    assert pty_scopes(Principal(role="someone", label="x"), "i") == frozenset()


def test_an_instance_token_reaches_its_own_instance_only() -> None:
    own = Principal(role="instance", label="instance:i", instance_id="i")
    assert pty_scopes(own, "i") == {PTY_CONTROL, PTY_OBSERVE}
    assert pty_scopes(own, "j") == frozenset()
