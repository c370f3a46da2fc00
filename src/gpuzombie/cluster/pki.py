"""The cluster's throwaway PKI: one CA, the serving and client certificates each component needs,
and the service-account signing key. Made with the ``cryptography`` library, ECDSA P-256, valid for
the days a test cluster lives; nothing here is meant to outlive ``cluster down``."""

from __future__ import annotations

import datetime
import ipaddress
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

VALID_DAYS = 30


@dataclass(frozen=True)
class CertRequest:
    """One certificate: its file stem, subject, groups (the O= Kubernetes reads as groups) and SANs."""

    stem: str
    common_name: str
    organizations: tuple[str, ...] = ()
    dns_names: tuple[str, ...] = ()
    ip_addresses: tuple[str, ...] = ()
    server: bool = False
    client: bool = False


@dataclass(frozen=True)
class Pki:
    """Where the files are: ``<stem>.pem`` and ``<stem>.key`` under ``directory``."""

    directory: Path
    stems: tuple[str, ...] = field(default_factory=tuple)

    def cert(self, stem: str) -> Path:
        return self.directory / f"{stem}.pem"

    def key(self, stem: str) -> Path:
        return self.directory / f"{stem}.key"

    @property
    def ca(self) -> Path:
        return self.cert("ca")


def _write_key(path: Path, key: ec.EllipticCurvePrivateKey) -> None:
    data = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(data)


def _name(common_name: str, organizations: Sequence[str] = ()) -> x509.Name:
    attributes = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, o) for o in organizations]
    return x509.Name([*attributes, x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _builder(
    subject: x509.Name,
    issuer: x509.Name,
    key: ec.EllipticCurvePrivateKey,
    now: datetime.datetime,
    until: datetime.datetime,
    *,
    ca: bool,
) -> x509.CertificateBuilder:
    """What the CA's and every leaf certificate share: names, key, serial, validity, CA or not."""
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(until)
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )


def make_pki(directory: Path, requests: Sequence[CertRequest]) -> Pki:
    """A new CA in ``directory`` and every requested certificate signed by it, plus ``sa.key`` and
    ``sa.pub`` (the service-account token key pair)."""
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    now = datetime.datetime.now(datetime.UTC) - datetime.timedelta(minutes=5)  # a little clock skew
    until = now + datetime.timedelta(days=VALID_DAYS)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = _name("gpuzombie-cluster-ca")
    ca = (
        _builder(ca_name, ca_name, ca_key, now, until, ca=True)
        .add_extension(x509.KeyUsage(True, False, False, False, False, True, True, False, False), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    pki = Pki(directory, tuple(r.stem for r in requests))
    _write_key(pki.key("ca"), ca_key)
    pki.ca.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    for request in requests:
        key = ec.generate_private_key(ec.SECP256R1())
        usages = [ExtendedKeyUsageOID.SERVER_AUTH] * request.server + [ExtendedKeyUsageOID.CLIENT_AUTH] * request.client
        builder = (
            _builder(_name(request.common_name, request.organizations), ca_name, key, now, until, ca=False)
            .add_extension(x509.KeyUsage(True, False, True, False, False, False, False, False, False), critical=True)
            .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
        )
        sans: list[x509.GeneralName] = [x509.DNSName(n) for n in request.dns_names]
        sans += [x509.IPAddress(ipaddress.ip_address(a)) for a in request.ip_addresses]
        if sans:
            builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
        _write_key(pki.key(request.stem), key)
        pki.cert(request.stem).write_bytes(
            builder.sign(ca_key, hashes.SHA256()).public_bytes(serialization.Encoding.PEM)
        )
    sa_key = ec.generate_private_key(ec.SECP256R1())
    _write_key(directory / "sa.key", sa_key)
    (directory / "sa.pub").write_bytes(
        sa_key.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    )
    return pki
