"""A throwaway PKI made by the real openssl: a CA, a server certificate for 127.0.0.1 and a client
certificate (shared by the serving tests)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path


def make_pki(directory: Path, *, ecdsa: bool = False) -> Path:
    """ca.pem/ca.key, server.pem/server.key (SAN IP:127.0.0.1 and the webhook's service name) and
    client.pem/client.key in ``directory``: RSA 2048, or ECDSA P-256 as the chart's cert-manager
    Certificate asks for. A skip where openssl is not installed (pytest is imported only then: the
    benchmarks use this too)."""
    if shutil.which("openssl") is None:
        import pytest

        pytest.skip("openssl is not installed")

    def run(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=directory, check=True, capture_output=True, timeout=60)

    key = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1"] if ecdsa else ["-newkey", "rsa:2048"]
    run("req", "-x509", *key, "-nodes", "-days", "2", "-subj", "/CN=test-ca", "-keyout", "ca.key", "-out", "ca.pem")
    for name, subject, ext in (
        ("server", "gpuzombie-webhook", "subjectAltName=IP:127.0.0.1,DNS:gpuzombie-webhook.gpuzombie.svc"),
        ("client", "client", "extendedKeyUsage=clientAuth"),
    ):
        run("req", *key, "-nodes", "-subj", f"/CN={subject}", "-keyout", f"{name}.key", "-out", f"{name}.csr")
        (directory / f"{name}.ext").write_text(ext + "\n")
        run(
            *["x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial"],
            *["-days", "2", "-out", f"{name}.pem", "-extfile", f"{name}.ext"],
        )
    return directory


def make_dated_certificate(directory: Path, not_before: str, not_after: str) -> tuple[Path, Path]:
    """A self-signed certificate for 127.0.0.1 valid from ``not_before`` to ``not_after``
    (``YYYYMMDDHHMMSSZ``, e.g. an expired one), signed by ``openssl ca`` (``req -x509`` takes only
    a number of days from now); returns (certificate, key)."""
    if shutil.which("openssl") is None:
        import pytest

        pytest.skip("openssl is not installed")
    (directory / "index.txt").write_text("")
    (directory / "serial").write_text("01\n")
    (directory / "ca.cnf").write_text(
        "[ca]\ndefault_ca = d\n[d]\ndatabase = index.txt\nnew_certs_dir = .\nserial = serial\n"
        "default_md = sha256\npolicy = p\nunique_subject = no\ncopy_extensions = copy\n[p]\ncommonName = supplied\n"
    )

    def run(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=directory, check=True, capture_output=True, timeout=60)

    run(
        *["req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-subj", "/CN=dated"],
        *["-addext", "subjectAltName=IP:127.0.0.1", "-keyout", "dated.key", "-out", "dated.csr"],
    )
    run(
        *[
            "ca",
            "-batch",
            "-config",
            "ca.cnf",
            "-selfsign",
            "-keyfile",
            "dated.key",
            "-in",
            "dated.csr",
            "-out",
            "dated.pem",
            "-notext",
        ],
        *["-startdate", not_before, "-enddate", not_after],
    )
    return directory / "dated.pem", directory / "dated.key"
