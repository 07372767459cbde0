"""Surface 1, admin: ``/api/v2/admin/...`` (operator bearer tokens, ``application/problem+json`` errors).

The blueprint and its error handlers live in ``blueprint``; route modules register on it and are
imported here: ``instances``, ``operations``, ``deprecation`` (instances and their lifecycle, operation
polling, v1 counters), ``storage``, ``catalog`` (agentshare storage, container images, loadouts),
``libvirt`` (VM checkpoints and warm pools), ``warmpools`` (every warm pool), ``sessions`` (PTY
sessions), ``streams`` (events and logs), ``tasks`` (an agent's task logs), ``discovery`` (runtime
providers, bootstrap readiness, MCP discovery) and ``cloudhypervisor`` (upstream's CH verbs, answered 501);
``hosts`` (the hosts of a shared store, cordon and drain); ``views`` turns the services' records
into the contract's shapes. Handlers decode into a typed
object, call one service method, and return its view.

Errors: a ``controller.errors`` error answers as problem+json through ``controller.http.problems`` (hostd
being away is 503 ``internal.unavailable``: fail closed); an HTTP error (413 from the body limit)
with its status; anything else as 500 ``internal.error``, logged with its traceback. Routing 404/405
under the prefix carry no blueprint, so the app's handler answers those in the same shape (see
``controller.app``).
"""

from __future__ import annotations

from . import (  # noqa: F401  (routes register on import)
    catalog,
    cloudhypervisor,
    deprecation,
    discovery,
    hosts,
    instances,
    libvirt,
    operations,
    sessions,
    storage,
    streams,
    tasks,
    warmpools,
)
from .blueprint import admin

__all__ = ["admin"]
