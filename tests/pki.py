"""A test PKI made with ``cryptography``: a CA, and server and client certificates it signs.

Real certificates, real TLS: the controller's listener verifies them with OpenSSL exactly as it
would verify an operator's. Each :class:`Pki` writes its files under the directory it is given.
"""

from __future__ import annotations

import datetime
import ipaddress
import ssl
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


@dataclass(frozen=True)
class Issued:
    cert: Path
    key: Path

    def client_context(self, ca: Path) -> ssl.SSLContext:
        """A client's TLS context: trusts ``ca`` for the server, presents this certificate."""
        context = ssl.create_default_context(cafile=str(ca))
        context.load_cert_chain(str(self.cert), str(self.key))
        return context


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _write(directory: Path, name: str, cert: x509.Certificate, key: ec.EllipticCurvePrivateKey) -> Issued:
    directory.mkdir(parents=True, exist_ok=True)
    cert_path, key_path = directory / f"{name}.pem", directory / f"{name}.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    key_path.chmod(0o600)
    return Issued(cert_path, key_path)


class Pki:
    """A CA named ``name`` in ``directory`` (``ca.pem``), issuing certificates valid for a day."""

    def __init__(self, directory: Path, name: str = "test-ca") -> None:
        self.directory = directory
        self._key = _key()
        self._name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
        now = datetime.datetime.now(datetime.UTC)
        self._cert = (
            x509.CertificateBuilder()
            .subject_name(self._name)
            .issuer_name(self._name)
            .public_key(self._key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=1))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True)
            .sign(self._key, hashes.SHA256())
        )
        self.ca = _write(directory, "ca", self._cert, self._key).cert

    def _issue(self, name: str, cn: str, san: list[x509.GeneralName], usage: x509.ObjectIdentifier) -> Issued:
        key = _key()
        now = datetime.datetime.now(datetime.UTC)
        builder = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)]))
            .issuer_name(self._name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=1))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        )
        if san:
            builder = builder.add_extension(x509.SubjectAlternativeName(san), critical=False)
        return _write(self.directory, name, builder.sign(self._key, hashes.SHA256()), key)

    def server(self, name: str = "server") -> Issued:
        """For ``localhost`` and ``127.0.0.1``."""
        san: list[x509.GeneralName] = [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
        return self._issue(name, "localhost", san, ExtendedKeyUsageOID.SERVER_AUTH)

    def client(self, cn: str, *, dns: tuple[str, ...] = (), uris: tuple[str, ...] = ()) -> Issued:
        san: list[x509.GeneralName] = [x509.DNSName(d) for d in dns]
        san += [x509.UniformResourceIdentifier(u) for u in uris]
        return self._issue(f"client-{cn}", cn, san, ExtendedKeyUsageOID.CLIENT_AUTH)
