"""TLS files a server can use: named when they cannot (role, path, why), and a certificate's
validity read from its DER (``certificate_validity``) so an expired or not yet valid one is refused."""

from __future__ import annotations

import datetime
import os
import re
import ssl
import stat
from dataclasses import dataclass


class TlsFileError(OSError):
    """A TLS file that cannot be read or does not hold what it should; the message names it."""


def _ssl_reason(exc: ssl.SSLError) -> str:
    return exc.reason.lower().replace("_", " ") if exc.reason else str(exc)


CLOCK_SKEW = datetime.timedelta(minutes=5)
"""A certificate whose notBefore is this little ahead of our clock is served (cert-manager issues
one the moment it is asked; a node's clock may lag)."""


@dataclass(frozen=True)
class TlsFiles:
    """PEM files of the server certificate and key; ``client_ca`` makes clients show a certificate."""

    certfile: str
    keyfile: str
    client_ca: str | None = None

    def context(self, now: datetime.datetime | None = None) -> ssl.SSLContext:
        """Raises TlsFileError (an OSError) naming the file that is missing, unreadable or wrong, a
        key encrypted with a passphrase (never asked for on a terminal), or a certificate outside
        its validity at ``now`` (default: the current time)."""
        for role, path in (("certificate", self.certfile), ("key", self.keyfile), ("client CA", self.client_ca)):
            if path is not None:
                _regular_file(role, path)
        _certificates("certificate", self.certfile)
        _within_validity(self.certfile, now or datetime.datetime.now(datetime.UTC))
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2

        def no_passphrase() -> str:  # OpenSSL would prompt on the terminal, twice, then fail unnamed
            raise TlsFileError(f"key {self.keyfile}: encrypted with a passphrase; serve an unencrypted key")

        try:
            context.load_cert_chain(self.certfile, self.keyfile, password=no_passphrase)
        except ssl.SSLError as exc:  # the certificate itself loaded above: the key is what is wrong
            raise TlsFileError(
                f"key {self.keyfile}: not a PEM private key of certificate {self.certfile} ({_ssl_reason(exc)})"
            ) from exc
        if self.client_ca is not None:
            _certificates("client CA", self.client_ca, context)
            context.verify_mode = ssl.CERT_REQUIRED
        return context


def _regular_file(role: str, path: str) -> None:
    """Readable and a regular file (a Secret's symlinks are followed); never blocks on a FIFO."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise TlsFileError(f"{role} {path}: {exc.strerror or exc}") from exc
    try:
        regular = stat.S_ISREG(os.fstat(fd).st_mode)
    finally:
        os.close(fd)
    if not regular:
        raise TlsFileError(f"{role} {path}: not a regular file")


_PEM_CERTIFICATE = re.compile(r"-----BEGIN CERTIFICATE-----.*?-----END CERTIFICATE-----", re.S)


def _der_items(data: bytes, start: int, end: int) -> list[tuple[int, int, int]]:
    """(tag, start, end) of each DER item between ``start`` and ``end``; ValueError when malformed."""
    items = []
    while start < end:
        if start + 2 > end:
            raise ValueError("truncated")
        tag, length, at = data[start], data[start + 1], start + 2
        if length & 0x80:
            count = length & 0x7F
            if not 1 <= count <= 4 or at + count > end:
                raise ValueError("bad length")
            length, at = int.from_bytes(data[at : at + count], "big"), at + count
        if at + length > end:
            raise ValueError("truncated")
        items.append((tag, at, at + length))
        start = at + length
    return items


def _der_time(tag: int, text: bytes) -> datetime.datetime:
    """UTCTime (0x17, YYMMDDHHMMSSZ) or GeneralizedTime (0x18, YYYYMMDDHHMMSSZ), as RFC 5280 writes them."""
    if tag == 0x17:
        moment = datetime.datetime.strptime(text.decode("ascii"), "%y%m%d%H%M%SZ")
    elif tag == 0x18:
        moment = datetime.datetime.strptime(text.decode("ascii"), "%Y%m%d%H%M%SZ")
    else:
        raise ValueError(f"tag {tag:#x} is not a time")
    return moment.replace(tzinfo=datetime.UTC)


def certificate_validity(pem: str) -> tuple[datetime.datetime, datetime.datetime]:
    """(notBefore, notAfter) of the first certificate of ``pem``, read from its DER (the standard
    library's ssl module shows them only for a peer's certificate). ValueError when there is none."""
    match = _PEM_CERTIFICATE.search(pem)
    if match is None:
        raise ValueError("no PEM certificate")
    der = ssl.PEM_cert_to_DER_cert(match.group())
    ((_, cert_start, cert_end),) = _der_items(der, 0, len(der))[:1]
    tbs = _der_items(der, cert_start, cert_end)[0]
    fields = _der_items(der, tbs[1], tbs[2])
    if fields and fields[0][0] == 0xA0:  # [0] version
        fields = fields[1:]
    _, start, end = fields[3]  # serialNumber, signature, issuer, validity
    (before_tag, b0, b1), (after_tag, a0, a1) = _der_items(der, start, end)
    return _der_time(before_tag, der[b0:b1]), _der_time(after_tag, der[a0:a1])


def _within_validity(path: str, now: datetime.datetime) -> None:
    try:
        with open(path, encoding="ascii", errors="replace") as f:
            not_before, not_after = certificate_validity(f.read())
    except (ValueError, IndexError) as exc:
        raise TlsFileError(f"certificate {path}: its validity cannot be read ({exc})") from exc
    if now > not_after:
        raise TlsFileError(f"certificate {path}: expired (notAfter {not_after:%Y-%m-%d %H:%M:%S} UTC)")
    if now + CLOCK_SKEW < not_before:
        raise TlsFileError(f"certificate {path}: not valid yet (notBefore {not_before:%Y-%m-%d %H:%M:%S} UTC)")


def _certificates(role: str, path: str, into: ssl.SSLContext | None = None) -> None:
    """Load the PEM certificates of ``path`` as trust anchors (of a scratch context when ``into`` is
    None: only to check that the file holds one)."""
    try:
        (into or ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)).load_verify_locations(cafile=path)
    except ssl.SSLError as exc:
        raise TlsFileError(f"{role} {path}: holds no PEM certificate ({_ssl_reason(exc)})") from exc
