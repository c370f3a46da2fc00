"""Fleet-scale guard (issue 28), a small benchmarks/bench_fleet.py: a real Prometheus (Debian package)
scrapes 50 simulated GPU nodes on loopback (each the real exporter's text for benchmarks/fleet_node.py's
busy fake node: 8 H200s, 110 pods, ~2,100 processes; 1 in 10 with findings) and a
kube-state-metrics-shaped target (a stand-in: no cluster here), with the chart's rule files, at a 5 s
scrape and evaluation interval. Series a node, every rule group's evaluation time and every dashboard
query (all nodes and one node, over 1 h) are checked; the speed goals at 1,000 nodes are the
benchmark's (results/benchmarks/bench-fleet.log), not this test's."""

from __future__ import annotations

import itertools
import json
import shutil
import socket
import statistics
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))
import bench_fleet  # noqa: E402
import fleet_node  # noqa: E402

NODES = 50
SERIES_PER_CLEAN_NODE = 100
"""The issue's goal: half of dcgm-exporter's ~200 on an 8-GPU node (measured: 89 with issue 25's handover verdict, a series a GPU; 81 before it, 271 on 26af6ff)."""
SERIES_PER_FINDINGS_NODE = SERIES_PER_CLEAN_NODE + 10
"""The findings node adds a series for each thing found (measured: 97; 88 before issue 25)."""
RULE_GROUP_SECONDS = 0.5
"""On the median of each group's evaluations. Measured at 50 nodes (benchmarks/bench_fleet.py,
results/benchmarks/bench-fleet.log, this 2-core VM at load 3-13): the slowest group's p50 0.017 s,
its worst 0.059 s (26af6ff: 0.077 s, rising linearly with nodes); again with 1 h of history and the
rules of h26-dash (results/benchmarks/bench-fleet-50-200.log, load 0.5): 0.054 s p50, worst 0.070 s
(gpuzombie-handover; ours at most 0.019 s); 0.5 s leaves the margin for
`stress-ng --cpu 2` beside it. A guard against a rule gone pathological (a cross product, a
subquery over every series), not the speed goal: the series bounds above catch per-pod series
coming back, the benchmark the speed."""
QUERY_SECONDS = 10.0
"""Measured: the slowest dashboard query over 1 h at 50 nodes 0.01 s (26af6ff: 0.19 s); with 1 h of
history 0.02 s (241ae16: 2.36 s); a bound only against a hang or a query that grows with the
fleet's pods."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def served_series(text: str) -> int:
    return sum(1 for line in text.splitlines() if line and not line.startswith("#"))


@pytest.fixture(scope="module")
def texts() -> tuple[str, str]:
    return fleet_node.render(findings=False), fleet_node.render(findings=True)


def test_a_clean_node_serves_at_most_100_series_and_findings_add_few(texts):
    clean, findings = texts
    assert served_series(clean) <= SERIES_PER_CLEAN_NODE, served_series(clean)
    assert served_series(findings) <= SERIES_PER_FINDINGS_NODE, served_series(findings)
    for name in ("gpuzombie_zombies{", "gpuzombie_orphans{", "gpuzombie_grace_risk_gpu_memory_bytes{"):
        assert name not in clean and name in findings, name  # a finding, and only then, costs a series
    assert 'verdict="cannot_tell"' not in clean  # counted per node, never a series a pod
    assert "gpuzombie_pid1_info{" not in clean  # every GPU pod under tini: no PID 1 worth naming
    assert findings.count("gpuzombie_pid1_info{") == 2  # the GPU pod's python and the sleep with a zombie


def test_fifty_nodes_rules_and_dashboard(texts, tmp_path):
    if shutil.which("prometheus") is None:
        pytest.skip("prometheus is not installed (Debian package prometheus; make test installs it)")
    port, ksm_port, prom_port = free_port(), free_port(), free_port()
    groups = bench_fleet.rule_exprs(REPO)
    with bench_fleet.Simulator({"after": (port, *texts)}, NODES, ksm_port):
        config = bench_fleet.prometheus_config(REPO, port, NODES, ksm_port, "5s")
        prom = bench_fleet.Prometheus(tmp_path / "prometheus", config, prom_port)
        try:
            prom.wait_ready()
            samples: dict[str, list[float]] = {}
            deadline = time.monotonic() + 90
            while time.monotonic() < deadline:  # six evaluations of every group, each one's time kept
                time.sleep(5)
                for group, seconds in prom.rule_durations().items():
                    samples.setdefault(group, []).append(seconds)
                iterations = prom.rule_groups("prometheus_rule_group_iterations_total")
                if len(iterations) == len(groups) and min(iterations.values()) >= 6:
                    break
            durations = {group: statistics.median(values) for group, values in samples.items()}
            series = prom.scalar('count({__name__=~"gpuzombie_.*"})')
            queries, variables = bench_fleet.dashboard_queries(REPO)
            views = {"all 1h": (".*", 1.0), "node 1h": (bench_fleet.node_name(1), 1.0)}
            answers = bench_fleet.measure_queries(prom, queries, views, repeat=1)
            variable_answers = {
                label: prom.get(f"label/{label}/values", **{"match[]": m}) for label, m in variables.items()
            }
        finally:
            prom.stop()
    assert set(durations) == set(groups), durations  # every group of both rule files evaluated
    slow = {g: d for g, d in durations.items() if d > RULE_GROUP_SECONDS}
    assert not slow, slow
    assert series / NODES <= SERIES_PER_FINDINGS_NODE, series / NODES
    failed = [(q.view, q.panel, q.status) for q in answers if q.status != 200 or q.seconds > QUERY_SECONDS]
    assert not failed, failed
    assert all(status == 200 for status, _, _ in variable_answers.values()), variable_answers
    # The fleet's findings reach the panels: orphans, zombies and the stuck-terminating pods.
    found = {q.panel for q in answers if q.view == "all 1h" and q.series}
    assert {"Orphans by pod", "Zombies by pod", "GPU memory held by Terminating pods", "Ghost GPUs"} <= found


def test_history_is_back_filled_fifteen_seconds_apart(texts, tmp_path):
    """The benchmark's back-fill (bench_fleet.HistoryClock): scraped every second, a node's samples
    land 15 s apart on the simulated clock, from that long ago up to now, and the scrape at the wall
    clock that follows them is accepted (in order)."""
    if shutil.which("prometheus") is None:
        pytest.skip("prometheus is not installed (Debian package prometheus; make test installs it)")
    port, ksm_port, prom_port = free_port(), free_port(), free_port()
    minutes = 4
    with bench_fleet.Simulator({"after": (port, *texts)}, 3, ksm_port) as simulator:
        config = bench_fleet.prometheus_config(REPO, port, 3, ksm_port, "15s", scrape_seconds=1)
        prom = bench_fleet.Prometheus(tmp_path / "prometheus", config, prom_port, backfill=True)
        try:
            prom.wait_ready()
            simulator.clock = bench_fleet.HistoryClock(minutes / 60, speed=15)
            time.sleep(simulator.clock.seconds_left() + 3)
            simulator.clock = None
            prom.reload(bench_fleet.prometheus_config(REPO, port, 3, ksm_port, "1s"))
            time.sleep(5)
            node = bench_fleet.node_name(1)
            status, body, _ = prom.get("query", query=f'gpuzombie_scan_success{{node="{node}"}}[{minutes + 1}m]')
        finally:
            prom.stop()
    assert status == 200, body
    stamps = [float(t) for t, _ in json.loads(body)["data"]["result"][0]["values"]]
    gaps = [b - a for a, b in itertools.pairwise(stamps)]
    real_time = next(i for i, g in enumerate(gaps) if g < 5)  # then the wall clock's scrapes, 1 s apart
    # Prometheus starts scraping new targets within 5 s (its target sync): up to 75 s of simulated
    # time before the first scrape go unfilled (a minute of the benchmark's hour; it counts them).
    assert real_time >= minutes * 4 - 6, gaps
    assert all(13 <= g <= 17 for g in gaps[: real_time - 1]), gaps
    assert stamps[0] <= stamps[-1] - minutes * 60 + 90, stamps
