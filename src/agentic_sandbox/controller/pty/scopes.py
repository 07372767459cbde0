"""Who may do what on a PTY attach socket: the one map from an authenticated principal to scopes.

pty-ws/v1 names three scopes:

* ``pty:observe``: attach, read output, replay, keyframes;
* ``pty:control``: observe, plus the controller role (input and resize);
* ``pty:admin``: control, plus (in a later version of the binding) forced transfer.

The tokens that exist today map as follows (the admin surface's roles, :mod:`controller.auth.tokens`):

==========  ==========================================  =============================
principal   scopes                                      on which instances
==========  ==========================================  =============================
admin       ``pty:admin``, ``pty:control``, ``pty:observe``  every instance
operator    ``pty:control``, ``pty:observe``                 every instance
instance    ``pty:control``, ``pty:observe``                 its own instance only
==========  ==========================================  =============================

Operators run lifecycle verbs and storage writes on every instance, so they may drive its shells
too (upstream's management server maps them the same way). An instance's own bearer token (the
A2A surface's, :mod:`controller.auth.credentials`) drives that instance's shells and reaches no other
instance's (the attach answers 404 there, as the A2A surface does). There is no observe-only
token yet.
"""

from __future__ import annotations

from ..auth.tokens import ROLE_ADMIN, Principal, may_use_instance

PTY_OBSERVE = "pty:observe"
PTY_CONTROL = "pty:control"
PTY_ADMIN = "pty:admin"


def pty_scopes(principal: Principal, instance_id: str) -> frozenset[str]:
    """The scopes ``principal`` holds on the PTY sessions of ``instance_id`` (empty: none)."""
    if not may_use_instance(principal, instance_id):
        return frozenset()
    if principal.role == ROLE_ADMIN:
        return frozenset({PTY_ADMIN, PTY_CONTROL, PTY_OBSERVE})
    return frozenset({PTY_CONTROL, PTY_OBSERVE})  # an operator, or the instance's own token
