"""The HTTP side: ``PrometheusExporter(registry=...)`` serves one registry on one address.

Loopback by default; a node DaemonSet asks for ``0.0.0.0:9400`` explicitly.
"""

from __future__ import annotations

import ipaddress
import threading
from dataclasses import dataclass
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, start_http_server

DEFAULT_LISTEN = "127.0.0.1:9400"


@dataclass(frozen=True)
class ListenAddress:
    host: str
    port: int

    def __str__(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


def parse_listen(text: str) -> ListenAddress:
    """``HOST:PORT`` or ``[V6]:PORT``; raises ValueError with a one-line reason."""
    host, sep, port = text.rpartition(":")
    if not sep or not host:
        raise ValueError(f"{text!r} is not HOST:PORT (e.g. 127.0.0.1:9400 or [::1]:9400)")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
        ipaddress.IPv6Address(host)  # ValueError when not one
    elif ":" in host:
        raise ValueError(f"{text!r}: write an IPv6 address in brackets, e.g. [::1]:9400")
    if not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"{text!r}: port must be a number from 0 to 65535")
    return ListenAddress(host, int(port))


class PrometheusExporter:
    """Serves ``registry`` at /metrics (any path answers) from a daemon thread."""

    def __init__(self, registry: CollectorRegistry, *, listen: ListenAddress | None = None) -> None:
        self.registry = registry
        self.listen = listen or parse_listen(DEFAULT_LISTEN)
        self._server: WSGIServer | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> ListenAddress:
        """Bind and serve; returns the bound address (the real port when 0 was asked).
        Raises OSError when the address cannot be bound (in use, not local, not resolvable)."""
        self._server, self._thread = start_http_server(self.listen.port, self.listen.host, self.registry)
        return ListenAddress(self.listen.host, self._server.server_address[1])

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
