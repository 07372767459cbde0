"""Who may do what on a PTY attach socket: the one map from an authenticated principal to scopes.

pty-ws/v1 names three scopes:

* ``pty:observe``: attach, read output, replay, keyframes;
* ``pty:control``: observe, plus the controller role (input and resize);
* ``pty:admin``: control, plus (in a later version of the binding) forced transfer.

The tokens that exist today map as follows (the admin surface's roles, :mod:`controller.auth`):

==========  ==========================================  =============================
principal   scopes                                      on which instances
==========  ==========================================  =============================
admin       ``pty:admin``, ``pty:control``, ``pty:observe``  every instance
operator    ``pty:control``, ``pty:observe``                 every instance
==========  ==========================================  =============================

Operators run lifecycle verbs and storage writes on every instance, so they may drive its shells
too (upstream's management server maps them the same way). There is no observe-only token yet.
Per-instance bearer tokens (the A2A surface) are meant to map here as well: an instance's own
token to ``pty:control`` on that instance only, and nothing on any other.
"""

from __future__ import annotations

from ..auth import ROLE_ADMIN, ROLE_OPERATOR, Principal

PTY_OBSERVE = "pty:observe"
PTY_CONTROL = "pty:control"
PTY_ADMIN = "pty:admin"


def pty_scopes(principal: Principal, instance_id: str) -> frozenset[str]:
    """The scopes ``principal`` holds on the PTY sessions of ``instance_id`` (empty: none)."""
    del instance_id  # every token that exists today is host-wide; instance tokens will need it
    if principal.role == ROLE_ADMIN:
        return frozenset({PTY_ADMIN, PTY_CONTROL, PTY_OBSERVE})
    if principal.role == ROLE_OPERATOR:
        return frozenset({PTY_CONTROL, PTY_OBSERVE})
    return frozenset()
