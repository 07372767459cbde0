"""Client certificates (mTLS): who a verified certificate names, and which names are the admin.

The HTTPS listener's TLS context (:func:`server_ssl_context`) asks for a client certificate when
``AIWG_TLS_CLIENT_AUTH`` is ``optional`` or ``required`` and lets OpenSSL verify it against
``AIWG_TLS_CLIENT_CA``: an untrusted certificate never completes the handshake. hypercorn does not
hand the peer's certificate to the app, so the context makes its TLS objects of
:class:`_PeerRecording`, which, once a handshake succeeds, sets :data:`CLIENT_CERT` in the
connection's task; hypercorn starts each request's task from there, so every request of the
connection sees the certificate it was opened with, and no other connection's.

Precedence, as upstream orders it: a presented certificate decides and the bearer token is not
looked at. A name on ``AIWG_MTLS_ADMIN_ALLOWLIST`` is the admin role
(:meth:`~controller.auth.tokens.Authenticator.authenticate`); any other certificate is refused
with 403 on every authenticated path (:mod:`controller.http.certgate`), never a fallback to the
token. Public paths (health, metrics, discovery) stay public.
"""

from __future__ import annotations

import ssl
from contextvars import ContextVar

import msgspec
from cryptography import x509
from cryptography.x509.oid import NameOID

#: ``AIWG_TLS_CLIENT_AUTH`` -> what OpenSSL asks of the client.
VERIFY_MODES = {"optional": ssl.CERT_OPTIONAL, "required": ssl.CERT_REQUIRED}


class ClientCertificate(msgspec.Struct, frozen=True, kw_only=True):
    """A verified client certificate, by the names an allow-list may hold."""

    #: Subject common names, then DNS and URI subject alternative names, in that order.
    names: tuple[str, ...]

    @property
    def label(self) -> str:
        return self.names[0] if self.names else "(unnamed)"

    @classmethod
    def from_der(cls, der: bytes) -> ClientCertificate:
        cert = x509.load_der_x509_certificate(der)
        names = [str(a.value) for a in cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)]
        try:
            san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        except x509.ExtensionNotFound:
            pass
        else:
            names += san.get_values_for_type(x509.DNSName)
            names += san.get_values_for_type(x509.UniformResourceIdentifier)
        return cls(names=tuple(names))

    def allowed(self, allowlist: frozenset[str]) -> bool:
        return any(name in allowlist for name in self.names)


#: The verified client certificate of the connection a request came on (None: none presented).
CLIENT_CERT: ContextVar[ClientCertificate | None] = ContextVar("aiwg_client_cert", default=None)


class _PeerRecording(ssl.SSLObject):
    """An SSLObject that says, once its handshake is done, which certificate the client showed."""

    def do_handshake(self) -> None:
        super().do_handshake()  # raises until it completes; a failed verification never gets here
        der = self.getpeercert(binary_form=True)
        CLIENT_CERT.set(ClientCertificate.from_der(der) if der else None)


def record_client_certificates(context: ssl.SSLContext, mode: str, ca_file: str) -> None:
    """Make ``context`` ask for (``optional``) or demand (``required``) a client certificate signed
    by a CA of ``ca_file``, and record it for the requests of its connection."""
    context.load_verify_locations(ca_file)
    context.verify_mode = VERIFY_MODES[mode]
    context.sslobject_class = _PeerRecording
