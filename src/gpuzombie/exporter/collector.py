"""The Prometheus collector: one node scan per scrape at most every ``min_interval`` seconds.

A scrape storm (several Prometheus replicas, a dashboard refreshing) then reads the cached scan
instead of walking /proc again; a failed scan is cached the same way and counted. The health probes
read the same results: ready once a scan has read the node (and while the last one did), live until
``unhealthy_after`` scans in a row have failed.
"""

from __future__ import annotations

import platform
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from gpuzombie import __version__
from gpuzombie.exporter.metrics import node_metrics
from gpuzombie.trace.scan import NodeScan

DEFAULT_MIN_INTERVAL = 10.0
DEFAULT_UNHEALTHY_AFTER = 5


@dataclass(frozen=True)
class ScanResult:
    """The last attempt: a scan, or the one-line reason it failed."""

    at: float
    """Monotonic time of the attempt (the cache's clock)."""
    taken_at: float
    """Wall time of the attempt (exposed)."""
    scan: NodeScan | None
    error: str | None


class NodeCollector(Collector):
    def __init__(
        self,
        scan: Callable[[], NodeScan],
        *,
        min_interval: float = DEFAULT_MIN_INTERVAL,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
        on_result: Callable[[ScanResult], None] | None = None,
        unhealthy_after: int = DEFAULT_UNHEALTHY_AFTER,
    ) -> None:
        self._scan = scan
        self.min_interval = min_interval
        self._clock = clock
        self._wall_clock = wall_clock
        self._on_result = on_result
        self._lock = threading.Lock()
        self._last: ScanResult | None = None
        self._last_good_at: float | None = None
        self.unhealthy_after = unhealthy_after
        self.scans = 0
        self.errors = 0
        self.errors_in_a_row = 0

    def latest(self) -> ScanResult:
        """The cached result while it is younger than ``min_interval``, else a new scan. Scrapes that
        arrive during a scan wait for it rather than starting their own."""
        with self._lock:
            now = self._clock()
            if self._last is not None and now - self._last.at < self.min_interval:
                return self._last
            self.scans += 1
            try:
                result = ScanResult(now, self._wall_clock(), self._scan(), None)
            except Exception as exc:  # noqa: BLE001  an unreadable /proc or a driver bug: a metric, never a 500
                self.errors += 1
                self.errors_in_a_row += 1
                result = ScanResult(now, self._wall_clock(), None, f"{type(exc).__name__}: {exc}")
            else:
                self.errors_in_a_row = 0
                self._last_good_at = result.taken_at
            self._last = result
        if self._on_result is not None:
            self._on_result(result)
        return result

    def readiness(self) -> tuple[bool, str]:
        """Ready while the latest scan (made now when the cached one is stale) read the node."""
        result = self.latest()
        if result.scan is None:
            return False, f"not ready: the last scan failed: {result.error}"
        return True, f"ready: last scan {result.scan.duration_s:.3f} s"

    def liveness(self) -> tuple[bool, str]:
        """Live until ``unhealthy_after`` scans in a row failed; never scans (a probe must be cheap)."""
        failed, last = self.errors_in_a_row, self._last  # no lock: a scan in progress must not block the probe
        if failed >= self.unhealthy_after and last is not None:
            return False, f"unhealthy: {failed} scans in a row failed, the last: {last.error}"
        return True, f"live: {failed} failed scans in a row (unhealthy at {self.unhealthy_after})"

    def describe(self) -> list[Metric]:
        return []  # registering must not scan the node

    def collect(self) -> Iterator[Metric]:
        result = self.latest()
        ok = result.scan is not None
        # Served whatever the scan did, so a rollout is followed on broken nodes too:
        # count by (version) (gpuzombie_build_info).
        build = GaugeMetricFamily(
            "gpuzombie_build_info",
            "1, labelled with the running gpuzombie's version and its Python's.",
            labels=["version", "python_version"],
        )
        build.add_metric([__version__, platform.python_version()], 1.0)
        yield build
        yield GaugeMetricFamily(
            "gpuzombie_scan_success",
            "1 when the last scan read the node, 0 when it failed (then the node metrics are absent).",
            value=float(ok),
        )
        yield GaugeMetricFamily(
            "gpuzombie_scan_timestamp_seconds",
            "Wall time of the last scan (cached for --min-interval seconds).",
            value=result.taken_at,
        )
        if self._last_good_at is not None:
            yield GaugeMetricFamily(
                "gpuzombie_last_successful_scan_timestamp_seconds",
                "Wall time of the last scan that read the node (absent until one has).",
                value=self._last_good_at,
            )
        if result.scan is not None:
            yield GaugeMetricFamily(
                "gpuzombie_scan_duration_seconds", "How long the last scan took.", value=result.scan.duration_s
            )
        yield CounterMetricFamily(
            "gpuzombie_scans", "Node scans done (scrapes within --min-interval reuse the last one).", value=self.scans
        )
        yield CounterMetricFamily("gpuzombie_scan_errors", "Node scans that failed.", value=self.errors)
        if result.scan is not None:
            yield from node_metrics(result.scan)
