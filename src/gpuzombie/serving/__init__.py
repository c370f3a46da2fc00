"""One HTTP(S) server for every port gpuzombie opens: the exporter's /metrics and the admission
webhook's /mutate, each beside the same health probes.

``Server(routes, ...)`` serves WSGI apps by path. Loopback by default; a node DaemonSet asks for its
pod IP explicitly. Hardened for a port that anything on the network can reach: each connection must
deliver its request within ``read_timeout`` seconds (a watchdog cuts slow senders, slowloris
included, whatever the pace of their bytes), at most ``max_connections`` are served at once (at the
bound a new connection evicts the oldest one still sending its request, so a held-open flood cannot
starve the scraper), the TLS handshake runs in the connection's thread under the same deadline, a
request body is bounded by ``max_body_bytes`` (over it: 413, never read) and read under the same
deadline, the bodies held by all connections together by ``max_body_bytes_held`` (over it: 503,
never read), a certificate renewal swaps the TLS context for new connections without closing the
listener (``reload_tls``), TLS files that cannot serve (encrypted key, certificate expired or not
yet valid) are refused naming the file, every connection (plain, TLS, failed handshake) is released and closed in one
``finally``, and nothing is logged per request. One server may listen on several addresses (a pod
IP and loopback) under one bound, all accepted by one loop that ``stop`` ends at once.
``serve_until_stopped`` is how a command runs one: until SIGTERM or SIGINT, whichever thread the
kernel hands it to, reloading renewed TLS files on the way. Standard library only: the webhook's image needs no extra (why
not cheroot: docs/reliability.md).

One module a job: ``server`` (the server and its routes), ``connections`` (the bounds), ``tls`` (the
TLS files, a certificate's validity from its DER), ``running`` (the signal loop).
"""

from gpuzombie.serving.running import STOP_SIGNALS, serve_until_stopped
from gpuzombie.serving.server import (
    DEFAULT_MAX_BODY_BYTES,
    DEFAULT_MAX_CONNECTIONS,
    DEFAULT_READ_TIMEOUT,
    EXAMPLE_LISTEN,
    ListenAddress,
    ListenError,
    Probe,
    Server,
    WsgiApp,
    parse_listen,
)
from gpuzombie.serving.tls import CLOCK_SKEW, TlsFileError, TlsFiles, certificate_validity

__all__ = [
    "CLOCK_SKEW",
    "DEFAULT_MAX_BODY_BYTES",
    "DEFAULT_MAX_CONNECTIONS",
    "DEFAULT_READ_TIMEOUT",
    "EXAMPLE_LISTEN",
    "STOP_SIGNALS",
    "ListenAddress",
    "ListenError",
    "Probe",
    "Server",
    "TlsFileError",
    "TlsFiles",
    "WsgiApp",
    "certificate_validity",
    "parse_listen",
    "serve_until_stopped",
]
