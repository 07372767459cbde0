"""Bearer tokens: two operator roles and the instances' own tokens, stored hashed, compared in constant time.

Roles and what they may do (``require_role`` on each route says which applies; the instance
column is an instance's own A2A token, on its own instance only):

==============================================================  =====  ========  =========
verb                                                            admin  operator  instance
==============================================================  =====  ========  =========
read anything under ``/api/v2/admin`` (GET) but logs            yes    yes       see below
list instances, read one (``GET /instances[/{id}]``)            yes    yes       its own
PTY sessions: list, read, create, delete                        yes    yes       its own
events (``GET /events``, snapshot and stream)                   yes    yes       no
logs (``GET /logs``: module names, paths and errors in detail)  yes    no        no
lifecycle ``start`` / ``stop`` / ``restart``                    yes    yes       no
storage writes and deletes (inbox/outbox)                       yes    yes       no
provision, ``destroy``, decommission (DELETE), reprovision      yes    no        no
Cloud Hypervisor verbs (answered 501 after the role check)      yes    no        no
create loadouts (``POST /loadouts``)                            yes    no        no
fleet-workload/v1: read workloads and the inventory             yes    yes       no
fleet-workload/v1: admit, observe, reconcile                    yes    no        no
==============================================================  =====  ========  =========

Tokens come from configuration: the admin token (``AIWG_ADMIN_TOKEN``, else the admin token file,
written with a fresh random token in dev mode) and the optional operator token
(``AIWG_OPERATOR_TOKEN``), and upstream's operator tokens file (``operator-tokens.toml``,
:mod:`controller.auth.operatortokens`; read again on SIGHUP). Only their SHA-256 digests are kept
(in memory and in the store's ``tokens`` table, replaced at every start and reload so a rotated
token stops working); a presented token is hashed and compared with every known digest by
``hmac.compare_digest``, without an early exit.

No or a wrong token → 401 with ``WWW-Authenticate: Bearer``; a role that may not → 403.

A verified client certificate (mTLS, :mod:`controller.auth.mtls`) comes before any token: a name
on the admin allow-list is the admin role, any other certificate the ``refused`` role, which may
do nothing (403), whatever token is sent beside it.

Instance tokens (role ``instance``): each instance has its own bearer token for the A2A surface
(issued at provisioning, see :mod:`controller.auth.credentials`), valid under that instance's
``/agents/{id}/`` prefix and on the few admin routes marked ``own_instance`` (its own catalog entry
and its PTY sessions, which its token already drives over the attach socket: what the web console
needs to show an instance to its own token). Another instance is a 404 to it there, as on the A2A
surface: it learns nothing of other instances, not even that they exist.
:meth:`Authenticator.authenticate` is the one token check of the controller: it returns a typed
:class:`Principal` (``admin``, ``operator``, or ``instance`` with its ``instance_id``) and every
surface decides from that (admin routes with
:func:`~agentic_sandbox.controller.http.roles.require_role`; the A2A and PTY surfaces with
:func:`may_use_instance`). Nothing here knows HTTP.

A request another controller forwarded here (an instance of this host, asked at a controller of
another host: :mod:`controller.hosts.router`) carries the caller that controller authenticated, in
a header only a peer can sign; the router checks it and sets :data:`FORWARDED` for the request, and
:meth:`Authenticator.authenticate` answers that caller, whatever ``Authorization`` says (the edge
sends none).
"""

from __future__ import annotations

import hashlib
import hmac
import os
import secrets
from contextvars import ContextVar

import msgspec

from ..config import ConfigError, ControllerConfig
from ..store import TokenRecord
from .mtls import CLIENT_CERT

ROLE_ADMIN = "admin"
ROLE_OPERATOR = "operator"
ROLE_INSTANCE = "instance"
#: A client certificate that is not on the admin allow-list: it may do nothing, and the bearer
#: token beside it is not looked at (:mod:`controller.auth.mtls`).
ROLE_REFUSED = "refused"

#: Role sets used by the routes.
READ = (ROLE_ADMIN, ROLE_OPERATOR)
OPERATE = (ROLE_ADMIN, ROLE_OPERATOR)
ADMIN_ONLY = (ROLE_ADMIN,)


class Principal(msgspec.Struct, frozen=True, kw_only=True):
    role: str
    label: str
    #: The instance an ``instance`` token belongs to (None for operator tokens).
    instance_id: str | None = None


class Forwarded(msgspec.Struct, frozen=True, kw_only=True):
    """What a peer controller vouches for about a request it forwarded (checked by its signature)."""

    #: The caller it authenticated (None: no valid credentials, as for a public path).
    principal: Principal | None
    #: The origin the client asked at (AgentCards name it when ``AIWG_CARD_URLS=edge``).
    edge_url: str | None = None


#: Set by the router for the tasks serving a forwarded request (None: not forwarded).
FORWARDED: ContextVar[Forwarded | None] = ContextVar("aiwg_forwarded", default=None)


def may_use_instance(principal: Principal, instance_id: str) -> bool:
    """Operator tokens (admin, operator) reach every instance; an instance token only its own."""
    if principal.role == ROLE_INSTANCE:
        return principal.instance_id == instance_id
    return principal.role in (ROLE_ADMIN, ROLE_OPERATOR)


def hash_token(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


def resolve_admin_token(config: ControllerConfig, *, file_has_admin: bool = False) -> str | None:
    """The admin token: from the config, else the token file; dev mode writes a fresh one (0600).
    None when neither is there but the operator tokens file names an admin (``file_has_admin``)."""
    if config.admin_token:
        return config.admin_token
    path = config.admin_token_file
    try:
        with open(path) as fh:
            token = fh.read().strip()
    except FileNotFoundError:
        if file_has_admin:
            return None
        if not config.dev:
            raise ConfigError(
                f"no admin token: set AIWG_ADMIN_TOKEN, create AIWG_ADMIN_TOKEN_FILE={path}, "
                "or name an admin in the operator tokens file"
            ) from None
        token = secrets.token_urlsafe(32)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as fh:
            fh.write(token + "\n")
        return token
    except OSError as exc:
        raise ConfigError(f"AIWG_ADMIN_TOKEN_FILE={path}: {exc.strerror}") from None
    if len(token) < 16:
        raise ConfigError(f"AIWG_ADMIN_TOKEN_FILE={path} must hold a token of at least 16 characters")
    return token


def config_tokens(config: ControllerConfig, admin_token: str | None) -> list[TokenRecord]:
    tokens = []
    if admin_token:
        tokens.append(TokenRecord(hash=hash_token(admin_token), role=ROLE_ADMIN, label="admin", source="config"))
    if config.operator_token:
        tokens.append(
            TokenRecord(hash=hash_token(config.operator_token), role=ROLE_OPERATOR, label="operator", source="config")
        )
    return tokens


class Authenticator:
    """Maps a presented bearer token to a :class:`Principal`, or None.

    Operator tokens are few and compared one by one; instance tokens may be many, so they are
    found by their digest (a dict lookup on a SHA-256 digest says nothing about the token) and the
    hit is compared in constant time again.
    """

    def __init__(
        self,
        tokens: list[TokenRecord],
        instance_tokens: dict[str, str] | None = None,
        *,
        certificate_admins: frozenset[str] = frozenset(),
    ) -> None:
        self._tokens: list[tuple[bytes, Principal]] = []
        self.replace_tokens(tokens)
        self._certificate_admins = certificate_admins
        self._instances: dict[bytes, str] = {}
        self._digest_of: dict[str, bytes] = {}
        for instance_id, digest in (instance_tokens or {}).items():
            self.set_instance_token(instance_id, digest)

    def replace_tokens(self, tokens: list[TokenRecord]) -> None:
        """The operator tokens (admin, operator) from now on: a token not in ``tokens`` stops working
        with the next request (a reload of the operator tokens file)."""
        self._tokens = [(bytes.fromhex(t.hash), Principal(role=t.role, label=t.label)) for t in tokens]

    def set_instance_token(self, instance_id: str, digest: str) -> None:
        """Make ``digest`` the instance's only valid token (a previous one stops working)."""
        self.forget_instance(instance_id)
        raw = bytes.fromhex(digest)
        self._instances[raw] = instance_id
        self._digest_of[instance_id] = raw

    def forget_instance(self, instance_id: str) -> None:
        old = self._digest_of.pop(instance_id, None)
        if old is not None:
            self._instances.pop(old, None)

    def replace_instance_tokens(self, digests: dict[str, str]) -> None:
        """Every instance's token at once, as the store holds them (instances not named lose theirs)."""
        instances: dict[bytes, str] = {}
        digest_of: dict[str, bytes] = {}
        for instance_id, digest in digests.items():
            raw = bytes.fromhex(digest)
            instances[raw] = instance_id
            digest_of[instance_id] = raw
        self._instances, self._digest_of = instances, digest_of

    def authenticate(self, authorization: str | None) -> Principal | None:
        forwarded = FORWARDED.get()
        if forwarded is not None:
            return forwarded.principal
        certificate = CLIENT_CERT.get()
        if certificate is not None:  # it decides; the bearer token is not looked at
            if certificate.allowed(self._certificate_admins):
                return Principal(role=ROLE_ADMIN, label=f"mtls:{certificate.label}")
            return Principal(role=ROLE_REFUSED, label=f"mtls:{certificate.label}")
        if not authorization:
            return None
        scheme, _, token = authorization.partition(" ")
        token = token.strip()
        if scheme.lower() != "bearer" or not token:
            return None
        digest = hashlib.sha256(token.encode()).digest()
        found: Principal | None = None
        for known, principal in self._tokens:
            # Every digest is compared, so the time taken does not depend on which one matched.
            if hmac.compare_digest(digest, known):
                found = principal
        instance_id = self._instances.get(digest)
        if found is None and instance_id is not None and hmac.compare_digest(digest, self._digest_of[instance_id]):
            found = Principal(role=ROLE_INSTANCE, label=f"instance:{instance_id}", instance_id=instance_id)
        return found
