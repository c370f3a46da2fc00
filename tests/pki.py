"""A throwaway PKI made by the real openssl: a CA, a server certificate for 127.0.0.1 and a client
certificate (shared by the serving tests)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path


def make_pki(directory: Path) -> Path:
    """ca.pem/ca.key, server.pem/server.key (SAN IP:127.0.0.1) and client.pem/client.key in
    ``directory``; a skip where openssl is not installed (pytest is imported only then: the soak
    benchmark uses this too)."""
    if shutil.which("openssl") is None:
        import pytest

        pytest.skip("openssl is not installed")

    def run(*args: str) -> None:
        subprocess.run(["openssl", *args], cwd=directory, check=True, capture_output=True, timeout=60)

    run(
        *[
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "2",
            "-subj",
            "/CN=test-ca",
            "-keyout",
            "ca.key",
            "-out",
            "ca.pem",
        ]
    )
    for name, ext in (("server", "subjectAltName=IP:127.0.0.1"), ("client", "extendedKeyUsage=clientAuth")):
        run(*f"req -newkey rsa:2048 -nodes -subj /CN={name} -keyout {name}.key -out {name}.csr".split())
        (directory / f"{name}.ext").write_text(ext + "\n")
        run(
            *f"x509 -req -in {name}.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 2 -out {name}.pem "
            f"-extfile {name}.ext".split()
        )
    return directory
