"""The exporter's HTTP side: ``PrometheusExporter(registry=...)`` serves /metrics and the health
probes through the one serving module (``gpuzombie.serving``, shared with the admission webhook)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from prometheus_client import CollectorRegistry, make_wsgi_app

from gpuzombie.serving import (
    DEFAULT_MAX_CONNECTIONS,
    DEFAULT_READ_TIMEOUT,
    ListenAddress,
    Probe,
    Server,
    TlsFiles,
    parse_listen,
)

DEFAULT_PORT = 9844
"""Not 9400, which is dcgm-exporter's."""
DEFAULT_LISTEN = f"127.0.0.1:{DEFAULT_PORT}"


class PrometheusExporter(Server):
    """Serves ``registry`` at /metrics and ``probes`` at their paths from daemon threads."""

    def __init__(
        self,
        registry: CollectorRegistry,
        *,
        listen: ListenAddress | Sequence[ListenAddress] | None = None,
        probes: Mapping[str, Probe] | None = None,
        read_timeout: float = DEFAULT_READ_TIMEOUT,
        max_connections: int = DEFAULT_MAX_CONNECTIONS,
        tls: TlsFiles | None = None,
    ) -> None:
        self.registry = registry
        super().__init__(
            {"/metrics": make_wsgi_app(registry)},
            listen=listen or parse_listen(DEFAULT_LISTEN),
            probes=probes,
            read_timeout=read_timeout,
            max_connections=max_connections,
            tls=tls,
            name="gpuzombie-exporter",
        )
