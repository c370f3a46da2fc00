"""The Prometheus exporter (`gpuzombie exporter`): zombies, orphans, GPU memory by pod, ghost memory
and grace-period risk of a node, scanned at most every ``min_interval`` seconds.

Needs the ``exporter`` extra (prometheus-client); the only package that imports it.
"""

from gpuzombie.exporter.collector import DEFAULT_MIN_INTERVAL, NodeCollector, ScanResult
from gpuzombie.exporter.reaper import StaleReaper
from gpuzombie.exporter.server import (
    DEFAULT_LISTEN,
    DEFAULT_PORT,
    ListenAddress,
    PrometheusExporter,
    TlsFiles,
    parse_listen,
)
from gpuzombie.exporter.warnlog import WarningLog
from gpuzombie.k8s.owner import PodLabels
from gpuzombie.serving import ListenError, TlsFileError
from gpuzombie.trace.scan import NodeScan, scan_node

__all__ = [
    "DEFAULT_LISTEN",
    "DEFAULT_MIN_INTERVAL",
    "DEFAULT_PORT",
    "ListenAddress",
    "ListenError",
    "NodeCollector",
    "NodeScan",
    "PodLabels",
    "PrometheusExporter",
    "ScanResult",
    "StaleReaper",
    "TlsFileError",
    "TlsFiles",
    "WarningLog",
    "parse_listen",
    "scan_node",
]
