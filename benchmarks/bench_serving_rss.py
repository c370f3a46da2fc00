"""The serving module alone, no node scan: N sequential requests (TLS or plain) against
``gpuzombie.serving.Server`` in a subprocess, its RSS and fds every 2,000 requests.

    python benchmarks/bench_serving_rss.py [--requests 16000]

Tells the server's own memory from the scan's in the exporter soak (whose RSS also carries process
and PID-namespace churn). Each request is a new connection, a full TLS handshake with TLS.
"""

from __future__ import annotations

import argparse
import http.client
import os
import ssl
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
from pki import make_pki  # tests/pki.py: the CA and server certificate, made by openssl

SERVE = """
import sys, threading
from gpuzombie.serving import Server, TlsFiles, parse_listen
tls = TlsFiles(sys.argv[1] + "/server.pem", sys.argv[1] + "/server.key") if sys.argv[2] == "tls" else None
server = Server({}, listen=parse_listen("127.0.0.1:0"), probes={"/healthz": lambda: (True, "ok")}, tls=tls)
print(server.start().port, flush=True)
threading.Event().wait()
"""


def measure(kind: str, requests: int, pki: Path) -> list[tuple[int, int, int]]:
    """(requests so far, RSS KiB, fds) of the server every 2,000 requests."""
    env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
    server = subprocess.Popen([sys.executable, "-c", SERVE, str(pki), kind], stdout=subprocess.PIPE, text=True, env=env)
    try:
        port = int(server.stdout.readline())  # type: ignore[union-attr]
        context = ssl.create_default_context(cafile=str(pki / "ca.pem"))
        samples = []
        for i in range(requests + 1):
            if i % 2000 == 0:
                status = Path(f"/proc/{server.pid}/status").read_text()
                rss = int(next(line for line in status.splitlines() if line.startswith("VmRSS")).split()[1])
                samples.append((i, rss, len(os.listdir(f"/proc/{server.pid}/fd"))))
            if kind == "tls":
                conn: http.client.HTTPConnection = http.client.HTTPSConnection(
                    "127.0.0.1", port, timeout=10, context=context
                )
            else:
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
            conn.request("GET", "/healthz")
            conn.getresponse().read()
            conn.close()
        return samples
    finally:
        server.kill()
        server.wait()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--requests", type=int, default=16000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="gpuzombie-rss-pki-") as d:
        pki = make_pki(Path(d))
        for kind in ("tls", "plain"):
            samples = measure(kind, args.requests, pki)
            print(f"{kind}: requests/RSS KiB/fds " + " ".join(f"{i}/{r}/{f}" for i, r, f in samples))
            growth = samples[-1][1] - samples[1][1]
            print(
                f"{kind}: RSS after the first 2,000 -> the end: {growth:+} KiB; fds {samples[1][2]} -> {samples[-1][2]}"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
