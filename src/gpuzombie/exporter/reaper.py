"""``exporter --reap-stale-after D``: the node agent reaps a stale pod's processes itself, opt-in.

Every scan (the collector's ``on_result``) times each pod that has a stale GPU holder in it; a pod
not stale in a scan, or a scan that could not judge staleness (failed, no runtime, runtime and
kubelet disagreeing), starts its clock over, so only a pod stale *continuously* for D is due. A due
pod is reaped through ``reap.run_reap``, the path and every safety of ``gpuzombie reap --yes
--pod-uid``: a fresh read of the node, the runtime and the kubelet asked again (refused when they
cannot tell stale from unknown), only processes in the cgroups of pods still stale then, signalled
through pidfds only. Every action is one log line and each process's outcome is counted; after an
attempt the pod's clock starts over (a survivor in state D is tried again after another D, not on
every scan).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import KW_ONLY, dataclass, field

from prometheus_client.core import CounterMetricFamily, Metric
from prometheus_client.registry import Collector

from gpuzombie.errors import GpuzombieError
from gpuzombie.escape import escape
from gpuzombie.exporter.collector import ScanResult
from gpuzombie.prestop.terminate import Outcome, PrestopEvent
from gpuzombie.reap import ReapReport
from gpuzombie.trace.stale import Dirty

OUTCOMES = tuple(o for o in Outcome if o is not Outcome.WOULD_SIGNAL)
"""What a process reaped for real can come to (never a dry run's)."""
Reap = Callable[[frozenset[str], Callable[[PrestopEvent], None]], ReapReport]
"""Reap these pod UIDs, reporting each action: ``run_reap(only=..., dry_run=False, on_event=...)``."""


def stale_pod_uids(result: ScanResult) -> frozenset[str] | None:
    """The pods with a stale GPU holder in this scan; None when it could not tell (no clock may run)."""
    scan = result.scan
    if scan is None or not scan.trace.checks.stale:
        return None
    return frozenset(r.pod_uid for r in scan.trace.rows if r.dirty == Dirty.STALE and r.pod_uid and r.pid is not None)


@dataclass(eq=False)
class StaleReaper(Collector):
    """The stale pods' clocks, the reaps, and ``gpuzombie_reaped_processes_total{outcome}``."""

    after: float
    reap: Reap
    _: KW_ONLY
    log: Callable[[str], None]
    clock: Callable[[], float] = time.monotonic
    only: frozenset[str] | None = None
    """Keep to these pod UIDs (tests on a machine where other runtimes' pods look stale)."""
    reaped: dict[Outcome, int] = field(default_factory=lambda: dict.fromkeys(OUTCOMES, 0), init=False)
    refusals: int = field(default=0, init=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False)
    _since: dict[str, float] = field(default_factory=dict, init=False)

    def observe(self, result: ScanResult) -> None:
        """Time the pods stale in this scan (its monotonic ``at``); forget the others."""
        stale = stale_pod_uids(result)
        if stale is not None and self.only is not None:
            stale &= self.only
        with self._lock:
            self._since = {uid: self._since.get(uid, result.at) for uid in stale or ()}

    def due(self) -> frozenset[str]:
        """The pods stale continuously for ``after`` seconds by now."""
        now = self.clock()
        with self._lock:
            return frozenset(uid for uid, since in self._since.items() if now - since >= self.after)

    def reap_due(self) -> ReapReport | None:
        """Reap the due pods (None when none is due, or the reap was refused: logged and counted)."""
        due = self.due()
        if not due:
            return None
        self.log(f"reaping stale pod(s) {escape(', '.join(sorted(due)), 1000)}: stale for {self.after:g} s or more")
        report: ReapReport | None = None
        try:
            report = self.reap(due, self._on_event)
        except (GpuzombieError, OSError) as exc:
            self.refusals += 1
            self.log(f"reap refused, nothing signalled: {escape(str(exc), 1000)}")
        if report is not None:
            for r in report.results:
                self.reaped[r.outcome] = self.reaped.get(r.outcome, 0) + 1
                self.log(f"reaped pid {r.target.pid} ({escape(r.target.comm, 16)}): {r.outcome.value}")
            self.log(f"reap: {report.survivors} of {len(report.results)} process(es) left alive")
        now = self.clock()
        with self._lock:
            self._since.update({uid: now for uid in due if uid in self._since})
        return report

    def start(self, scan: Callable[[], object], every: float) -> threading.Event:
        """From a daemon thread, every ``every`` seconds: ``scan`` (the collector's ``latest``, whose new
        results come here through ``observe``), then reap the due pods; until the returned event is set.
        Scrapes alone would leave the clocks still when nobody scrapes."""
        stop = threading.Event()

        def loop() -> None:
            while not stop.wait(every):
                try:
                    scan()
                    self.reap_due()
                except Exception as exc:  # noqa: BLE001  a bug here must not end the loop unseen
                    self.log(f"reaper: {type(exc).__name__}: {escape(str(exc), 1000)}")

        threading.Thread(target=loop, name="gpuzombie-reaper", daemon=True).start()
        return stop

    def _on_event(self, event: PrestopEvent) -> None:
        self.log(f"reap: {escape(event.message, 1000)}")

    def describe(self) -> list[Metric]:
        return []

    def collect(self) -> Iterator[Metric]:
        reaped = CounterMetricFamily(
            "gpuzombie_reaped_processes",
            "Processes of stale pods the exporter reaped (--reap-stale-after), by outcome.",
            labels=["outcome"],
        )
        for outcome, count in self.reaped.items():
            reaped.add_metric([outcome.value], count)
        yield reaped
        yield CounterMetricFamily(
            "gpuzombie_reap_refusals",
            "Reaps of due stale pods refused (the runtime or the kubelet could not tell stale from unknown).",
            value=self.refusals,
        )
