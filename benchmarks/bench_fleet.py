"""Fleet scale: a real Prometheus scraping N simulated GPU nodes with the chart's rules, before and after.

    python benchmarks/bench_fleet.py --before /tmp/base-fleet [--nodes 50,200] [--minutes 5] [--json out.json]
        [--history-hours 1] [--fill-interval 1] [--one-side-at-a-time] [--sides before,after]

For each N, side by side in one run (the same machine load for both):

* each side's node text is one real exporter run of that side's code (``--before``: a worktree of
  the old commit; ``--after``: this one) on benchmarks/fleet_node.py's busy fake node: 8 H200s, 110
  pods, ~2,100 processes; 10% of the nodes are its ``--findings`` variant;
* N nodes per side are served on loopback addresses 127.1.x.y (one port a side) with per-node
  names, pod names and uids, and values that drift each scrape; a kube-state-metrics-shaped target
  serves ``kube_pod_info`` for every pod and ``kube_pod_deletion_timestamp`` for one GPU pod on 4% of
  the nodes (stuck terminating);
* one real Prometheus a side (15 s scrape and evaluation) loads that side's two rule files
  (charts/gpuzombie/files); first ``--history-hours`` (default 1) of history is back-filled by
  scraping: every ``--fill-interval`` s each node answers with its samples stamped 15 s of a
  simulated clock later than the last (HistoryClock), from that long ago up to now, so a 1 h range
  query reads 240 samples a series as over a real hour (the table's "history samples" column is
  that count, measured); kube-state-metrics, `up` and the recording rules are not back-filled (they
  start with the run); then the fleet is scraped in real time for ``--minutes``;
* then it measures head series, gpuzombie series per node, Prometheus RSS, each rule group's
  ``prometheus_rule_group_last_duration_seconds`` (sampled each evaluation over the run's second
  half: p50 and max; on a loaded machine that includes preemption, so also each group's expressions
  through the API, the fastest of 5 runs of each, summed), and each query of that side's dashboard (charts/gpuzombie/dashboards) through
  the HTTP API, all nodes over 1 h and 6 h (the step Grafana takes at 1,000 points) and one node over
  1 h, ``--repeat`` times (median), with its HTTP status and answer size; and the namespace variable
  through /api/v1/series (what older Grafana sends) and /api/v1/label/.../values.

The node text itself (``fleet_node.py``) and ``simulate`` are used by tests/cluster/test_cluster_fleet.py.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import re
import resource
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))
from fleet_node import NODE, POD_TOKEN, UID_PREFIX, pod_uid

RULE_FILES = ("charts/gpuzombie/files/gpuzombie-alerts.yaml", "charts/gpuzombie/files/gpuzombie-admission-alerts.yaml")
DASHBOARD = "charts/gpuzombie/dashboards/gpuzombie.json"
DRIFTING = ("gpuzombie_gpu_memory_used_bytes", "gpuzombie_scan_timestamp_seconds", "gpuzombie_scan_duration_seconds")
FINDINGS_EVERY = 10
TERMINATING_EVERY = 25
GATED_PODS = 8
"""GPU pods a node whose preflight gate kube-state-metrics reports (one a GPU)."""


def node_text(repo: Path, *, findings: bool) -> str:
    """One exporter run of ``repo``'s code on the fake node, as its /metrics text."""
    env = {**os.environ, "PYTHONPATH": f"{repo / 'src'}:{REPO / 'tests'}"}
    args = [sys.executable, str(REPO / "benchmarks" / "fleet_node.py"), *(["--findings"] if findings else [])]
    return subprocess.run(args, env=env, check=True, capture_output=True, text=True).stdout


def address(i: int) -> str:
    return f"127.1.{i // 250}.{i % 250 + 1}"


def node_name(i: int) -> str:
    return f"gpu-{i:05d}"


@dataclass
class NodeTemplate:
    """A node's text split into what stays and the lines whose values drift each scrape."""

    static: list[str]
    drifting: list[tuple[str, float]]

    @classmethod
    def of(cls, text: str, i: int) -> NodeTemplate:
        text = text.replace(NODE, node_name(i)).replace(POD_TOKEN, f"n{i:04d}").replace(UID_PREFIX, f"{i:08x}")
        static, drifting = [], []
        for line in text.splitlines():
            if line.startswith(DRIFTING):
                name, _, value = line.rpartition(" ")
                drifting.append((name, float(value)))
            else:
                static.append(line)
        return cls([line for line in static if line and not line.startswith("#")], drifting)

    def body(self, stamp_ms: int | None) -> bytes:
        """The text of one scrape; with ``stamp_ms``, every sample carries that timestamp (back-fill)."""
        jitter = random.random()
        samples = [*self.static, *(f"{n} {v * (1 + 1e-3 * jitter)}" for n, v in self.drifting)]
        end = "\n" if stamp_ms is None else f" {stamp_ms}\n"
        return (end.join(samples) + end).encode()


def ksm_lines(nodes: int) -> list[str]:
    """kube-state-metrics' shape: kube_pod_info for every pod; the gpuzombie-preflight init container
    of each node's GATED_PODS GPU pods (the webhook's --preflight for the whole cluster: passed, except
    one pod waiting on every node with findings); and a deletion timestamp for the stuck-terminating
    GPU pod of every TERMINATING_EVERY-th node."""
    lines = []
    now = time.time()
    for i in range(nodes):
        for p in range(110):
            uid = pod_uid(p).replace(UID_PREFIX, f"{i:08x}")
            pod = f"job-n{i:04d}-{p:03d}"
            labels = f'namespace="team-{p % 12}",pod="{pod}",uid="{uid}"'
            lines.append(f'kube_pod_info{{{labels},node="{node_name(i)}"}} 1')
            if p < GATED_PODS:
                waiting = p == 1 and i % FINDINGS_EVERY == 0
                gate = f'{labels},container="gpuzombie-preflight"'
                lines += [
                    f"kube_pod_init_container_status_restarts_total{{{gate}}} {3 if waiting else 0}",
                    f"kube_pod_init_container_status_ready{{{gate}}} {0 if waiting else 1}",
                    f'kube_pod_init_container_resource_requests{{{gate},node="{node_name(i)}",resource="cpu",unit="core"}} 0.01',
                    f'kube_pod_init_container_resource_requests{{{gate},node="{node_name(i)}",resource="memory",unit="byte"}} 67108864',
                ]
        if i % TERMINATING_EVERY == 1:
            uid = pod_uid(0).replace(UID_PREFIX, f"{i:08x}")
            lines.append(
                f'kube_pod_deletion_timestamp{{namespace="team-0",pod="job-n{i:04d}-000",uid="{uid}"}} {now - 600:.0f}'
            )
    return lines


class HistoryClock:
    """Back-fill: the simulated time of the samples, ``hours`` behind the wall clock at ``start`` and
    running ``speed`` times faster, so a scrape every ``15 / speed`` s lays down samples 15 s apart; it
    stops (None: no timestamp, Prometheus's own) once it is within a scrape of the wall clock."""

    def __init__(self, hours: float, speed: float) -> None:
        self.start = time.time()
        self.hours = hours
        self.speed = speed

    def stamp_ms(self) -> int | None:
        now = time.time()
        simulated = self.start - self.hours * 3600 + (now - self.start) * self.speed
        return None if simulated >= now - 15 else int(simulated * 1000)

    def seconds_left(self) -> float:
        return max(0.0, (self.hours * 3600 - 15) / (self.speed - 1) - (time.time() - self.start))


class Simulator:
    """The fleet's targets on loopback, served from a thread's event loop: per side a port, per node
    an address; the kube-state-metrics target on 127.0.0.1."""

    def __init__(self, sides: dict[str, tuple[int, str, str]], nodes: int, ksm_port: int) -> None:
        self.templates = {
            (port, address(i)): NodeTemplate.of(findings if i % FINDINGS_EVERY == 0 else clean, i)
            for port, clean, findings in sides.values()
            for i in range(nodes)
        }
        self.ksm = NodeTemplate(ksm_lines(nodes), [])
        self.ksm_port = ksm_port
        self.clock: HistoryClock | None = None
        self.loop = asyncio.new_event_loop()
        self.ready = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while await reader.readuntil(b"\r\n\r\n"):
                host, port = writer.get_extra_info("sockname")[:2]
                if port == self.ksm_port:  # scraped every evaluation interval, never back-filled
                    body = self.ksm.body(None)
                else:
                    body = self.templates[(port, host)].body(self.clock.stamp_ms() if self.clock else None)
                head = (
                    f"HTTP/1.1 200 OK\r\nContent-Type: text/plain; version=0.0.4\r\nContent-Length: {len(body)}\r\n\r\n"
                )
                writer.write(head.encode() + body)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    async def _serve(self) -> None:
        self.servers = [await asyncio.start_server(self._handle, host, port) for port, host in self.templates]
        self.servers.append(await asyncio.start_server(self._handle, "127.0.0.1", self.ksm_port))
        self.ready.set()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.run_until_complete(self._serve())
        self.loop.run_forever()

    def __enter__(self) -> Simulator:
        _, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        self.thread.start()
        self.ready.wait(60)
        return self

    def __exit__(self, *exc: object) -> None:
        for s in self.servers:
            self.loop.call_soon_threadsafe(s.close)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


def prometheus_config(
    repo: Path, port: int, nodes: int, ksm_port: int, interval: str, scrape_seconds: float | None = None
) -> str:
    """Scrape every ``scrape_seconds`` (default: ``interval``, the evaluation interval)."""
    targets = [{"targets": [f"{address(i)}:{port}"], "labels": {"node": node_name(i)}} for i in range(nodes)]
    rule_files = [str(repo / f) for f in RULE_FILES]
    interval_ms = int(float(interval.rstrip("s")) * 1000)
    scrape_ms = int(scrape_seconds * 1000) if scrape_seconds else interval_ms
    return json.dumps(
        {
            "global": {
                "scrape_interval": f"{scrape_ms}ms",
                "evaluation_interval": interval,
                "scrape_timeout": f"{min(10_000, scrape_ms)}ms",
            },
            "rule_files": rule_files,
            "scrape_configs": [
                {"job_name": "gpuzombie", "static_configs": targets},
                {
                    "job_name": "kube-state-metrics",
                    "scrape_interval": interval,
                    "scrape_timeout": f"{min(10_000, interval_ms)}ms",
                    "static_configs": [{"targets": [f"127.0.0.1:{ksm_port}"]}],
                },
            ],
        }
    )


class Prometheus:
    """A real Prometheus on 127.0.0.1:``port`` with its own TSDB in ``workdir``."""

    def __init__(self, workdir: Path, config: str, port: int, *, backfill: bool = False) -> None:
        workdir.mkdir(parents=True)
        self.config = workdir / "prometheus.yml"
        self.config.write_text(config)
        self.base = f"http://127.0.0.1:{port}"
        self.log = open(workdir / "prometheus.log", "w")  # noqa: SIM115  closed in stop()
        # Back-filled samples reach 1 h behind the synthetic `up` series (written at the wall clock):
        # the head takes samples back to half its block range, 1 h by default, so 2 h while filling.
        blocks = ["--storage.tsdb.min-block-duration=4h"] if backfill else []
        self.proc = subprocess.Popen(
            [
                shutil.which("prometheus") or "prometheus",
                f"--config.file={self.config}",
                f"--storage.tsdb.path={workdir / 'data'}",
                f"--web.listen-address=127.0.0.1:{port}",
                *blocks,
            ],
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )

    def get(self, path: str, timeout: float = 300, **params: str) -> tuple[int, bytes, float]:
        url = f"{self.base}/api/v1/{path}?{urllib.parse.urlencode(params)}"
        started = time.perf_counter()
        try:
            with urllib.request.urlopen(url, timeout=timeout) as r:
                return r.status, r.read(), time.perf_counter() - started
        except urllib.error.HTTPError as e:
            return e.code, e.read(), time.perf_counter() - started

    def scalar(self, query: str) -> float:
        status, body, _ = self.get("query", query=query)
        result = json.loads(body)["data"]["result"] if status == 200 else []
        return float(result[0]["value"][1]) if result else float("nan")

    def wait_ready(self, timeout: float = 120) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"Prometheus exited {self.proc.returncode}: see {self.log.name}")
            try:
                with urllib.request.urlopen(f"{self.base}/-/ready", timeout=5) as r:
                    if r.status == 200:
                        return
            except OSError:
                time.sleep(0.5)
        raise TimeoutError(f"Prometheus at {self.base} not ready")

    def own_metrics(self, name: str) -> dict[str, float]:
        """Prometheus's own /metrics (it does not scrape itself here): ``name``'s samples by labels."""
        with urllib.request.urlopen(f"{self.base}/metrics", timeout=60) as r:
            text = r.read().decode()
        return {
            m.group(1) or "": float(m.group(2))
            for m in re.finditer(rf"^{name}(?:{{(.*)}})? (\S+)$", text, re.MULTILINE)
        }

    def rule_groups(self, name: str) -> dict[str, float]:
        """A rule-group metric by group name."""
        return {
            re.search(r'rule_group="[^"]*;([^"]+)"', labels).group(1): v  # type: ignore[union-attr]
            for labels, v in self.own_metrics(name).items()
        }

    def rule_durations(self) -> dict[str, float]:
        return self.rule_groups("prometheus_rule_group_last_duration_seconds")

    def reload(self, config: str) -> None:
        self.config.write_text(config)
        self.proc.send_signal(signal.SIGHUP)

    def rss_bytes(self) -> int:
        with open(f"/proc/{self.proc.pid}/status") as f:
            return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS:"))

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.log.close()


@dataclass(frozen=True)
class Query:
    panel: str
    expr: str
    instant: bool


def dashboard_queries(repo: Path) -> tuple[list[Query], dict[str, str]]:
    """Every panel query of the side's dashboard, and each variable's label_values(metric, label)."""
    board = json.loads((repo / DASHBOARD).read_text())
    queries = [
        Query(p["title"], t["expr"], bool(t.get("instant")) or t.get("format") == "table")
        for p in board["panels"]
        for t in p.get("targets", [])
    ]
    variables = {}
    for v in board["templating"]["list"]:
        m = re.fullmatch(r"label_values\((\S+), *(\w+)\)", v.get("definition", ""))
        if m:
            variables[m.group(2)] = m.group(1)
    return queries, variables


def rule_exprs(repo: Path) -> dict[str, dict[str, str]]:
    """Each rule group's expressions by rule name (alert or record), from the side's rule files."""
    import yaml

    groups: dict[str, dict[str, str]] = {}
    for f in RULE_FILES:
        for group in yaml.safe_load((repo / f).read_text())["groups"]:
            groups[group["name"]] = {rule.get("alert") or rule["record"]: rule["expr"] for rule in group["rules"]}
    return groups


def rule_costs(prom: Prometheus, groups: dict[str, dict[str, str]], repeat: int) -> dict[str, dict[str, float]]:
    """Each rule's expression evaluated through the API, the fastest of ``repeat`` runs: what an
    evaluation costs when the machine's other load does not preempt it (the group's own last
    duration, sampled, includes that preemption)."""
    now = f"{time.time():.3f}"
    return {
        group: {rule: min(prom.get("query", query=e, time=now)[2] for _ in range(repeat)) for rule, e in rules.items()}
        for group, rules in groups.items()
    }


def fill(expr: str, node: str) -> str:
    return expr.replace('"$node"', f'"{node}"').replace('"$namespace"', '".*"')


@dataclass
class QueryResult:
    panel: str
    view: str
    status: int
    seconds: float
    bytes: int
    series: int
    samples: int
    """Samples the query loaded (Prometheus's stats: peakSamples, what --query.max-samples limits)."""


@dataclass
class SideResult:
    side: str
    nodes: int
    head_series: float = 0
    gpuzombie_series: float = 0
    rss_bytes: int = 0
    rule_groups: dict[str, list[float]] = field(default_factory=dict)
    rule_costs: dict[str, dict[str, float]] = field(default_factory=dict)
    history_samples: float = 0
    """Samples a node's series holds over the last hour (240 for a full hour at 15 s)."""
    load: tuple[float, float] = (0, 0)
    queries: list[QueryResult] = field(default_factory=list)
    variables: dict[str, dict[str, float]] = field(default_factory=dict)


def measure_queries(
    prom: Prometheus, queries: list[Query], views: dict[str, tuple[str, float]], repeat: int
) -> list[QueryResult]:
    out = []
    now = time.time()
    for view, (node, hours) in views.items():
        step = max(15.0, hours * 3600 / 1000)
        for q in queries:
            expr = fill(q.expr, node)
            runs = []
            for _ in range(repeat):
                if q.instant:
                    runs.append(prom.get("query", query=expr, time=f"{now:.3f}", stats="all"))
                else:
                    runs.append(
                        prom.get(
                            "query_range",
                            query=expr,
                            start=f"{now - hours * 3600:.3f}",
                            end=f"{now:.3f}",
                            step=f"{step}",
                            stats="all",
                        )
                    )
            status, body, _ = runs[-1]
            data = json.loads(body)["data"] if status == 200 else {}
            series = len(data.get("result", []))
            samples = data.get("stats", {}).get("samples", {}).get("peakSamples", 0)
            seconds = statistics.median(r[2] for r in runs)
            out.append(QueryResult(q.panel, view, status, seconds, len(body), series, samples))
    return out


def measure_variables(prom: Prometheus, variables: dict[str, str], hours: float = 1) -> dict[str, dict[str, float]]:
    now = time.time()
    out = {}
    for label, metric in variables.items():
        window = {"start": f"{now - hours * 3600:.3f}", "end": f"{now:.3f}"}
        _, _, series_s = prom.get("series", **{"match[]": metric}, **window)
        _, _, values_s = prom.get(f"label/{label}/values", **{"match[]": metric}, **window)
        out[label] = {"series_s": series_s, "label_values_s": values_s}
    return out


def run_size(
    sides: dict[str, Path],
    texts: dict[str, tuple[str, str]],
    nodes: int,
    minutes: float,
    repeat: int,
    workdir: Path,
    interval: str = "15s",
    history_hours: float = 0,
    fill_interval: float = 1,
) -> list[SideResult]:
    """One fleet of ``nodes`` per side, served and scraped at once; both measured in turn. With
    ``history_hours``, that much history is back-filled first (HistoryClock: a scrape every
    ``fill_interval`` s stamped 15 s apart), then scraped in real time for ``minutes``."""
    ports = {name: 19400 + k for k, name in enumerate(sides)}
    ksm_port = 19399
    results = {name: SideResult(name, nodes) for name in sides}
    load = os.getloadavg()[0]

    def config(name: str, scrape_seconds: float | None = None) -> str:
        return prometheus_config(sides[name], ports[name], nodes, ksm_port, interval, scrape_seconds)

    with Simulator({n: (ports[n], *texts[n]) for n in sides}, nodes, ksm_port) as simulator:
        if history_hours:
            simulator.clock = HistoryClock(history_hours, float(interval.rstrip("s")) / fill_interval)
        proms = {
            n: Prometheus(
                workdir / f"{n}-{nodes}",
                config(n, fill_interval if history_hours else None),
                19490 + k,
                backfill=bool(history_hours),
            )
            for k, n in enumerate(sides)
        }
        try:
            for p in proms.values():
                p.wait_ready()
            if simulator.clock:
                time.sleep(simulator.clock.seconds_left() + 1)
                simulator.clock = None
                for n, p in proms.items():
                    p.reload(config(n))
            started = time.monotonic()
            seconds = float(interval.rstrip("s"))
            while (elapsed := time.monotonic() - started) < minutes * 60:
                time.sleep(seconds)
                if elapsed >= minutes * 30:  # the second half: the head is full, history grows
                    for n, p in proms.items():
                        for group, d in p.rule_durations().items():
                            results[n].rule_groups.setdefault(group, []).append(d)
            for n, p in proms.items():
                r = results[n]
                r.head_series = p.own_metrics("prometheus_tsdb_head_series")[""]
                r.gpuzombie_series = p.scalar('count({__name__=~"gpuzombie_.*"})')
                r.history_samples = p.scalar('avg(count_over_time(gpuzombie_scan_success{job="gpuzombie"}[1h]))')
                r.rss_bytes = p.rss_bytes()
            for n, p in proms.items():
                queries, variables = dashboard_queries(sides[n])
                views = {"all 1h": (".*", 1.0), "all 6h": (".*", 6.0), "node 1h": (node_name(1), 1.0)}
                results[n].rule_costs = rule_costs(p, rule_exprs(sides[n]), max(repeat, 5))
                results[n].queries = measure_queries(p, queries, views, repeat)
                results[n].variables = measure_variables(p, variables)
        finally:
            for p in proms.values():
                p.stop()
    for r in results.values():
        r.load = (load, os.getloadavg()[0])
    return list(results.values())


def p50(values: list[float]) -> float:
    return statistics.median(values) if values else float("nan")


def table(results: list[SideResult]) -> str:
    out = [
        "| nodes | side | load avg start/end | head series | gpuzombie series / node | history samples / series, 1 h | Prometheus RSS MiB | rule group last duration p50 / max s (its expressions, fastest of 5) | all 1h: sum / worst panel s | all 6h: worst s, non-200, most samples | node 1h worst s | namespace variable series / label_values s |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        groups = ", ".join(
            f"{g} {p50(v):.3f}/{max(v):.3f} ({sum(r.rule_costs.get(g, {}).values()):.3f})"
            for g, v in sorted(r.rule_groups.items())
        )
        by_view: dict[str, list[QueryResult]] = {}
        for q in r.queries:
            by_view.setdefault(q.view, []).append(q)

        def worst(view: str, by_view: dict[str, list[QueryResult]] = by_view) -> QueryResult:
            return max(by_view[view], key=lambda result: result.seconds)

        all1 = by_view["all 1h"]
        bad = [f"{q.panel} {q.status}" for q in by_view["all 6h"] if q.status != 200]
        most = max(by_view["all 6h"], key=lambda q: q.samples)
        ns = r.variables.get("namespace", {})
        out.append(
            f"| {r.nodes} | {r.side} | {r.load[0]:.1f} / {r.load[1]:.1f} | {r.head_series:.0f} | {r.gpuzombie_series / r.nodes:.1f} "
            f"| {r.history_samples:.0f} | {r.rss_bytes / 2**20:.0f} | {groups} "
            f"| {sum(q.seconds for q in all1):.2f} / {worst('all 1h').seconds:.2f} ({worst('all 1h').panel}) "
            f"| {worst('all 6h').seconds:.2f} ({worst('all 6h').panel}), {', '.join(bad) or 'none'}, {most.samples} ({most.panel}) "
            f"| {worst('node 1h').seconds:.3f} | {ns.get('series_s', float('nan')):.3f} / {ns.get('label_values_s', float('nan')):.3f} |"
        )
    return "\n".join(out)


def details(r: SideResult) -> str:
    """Each rule's and each query's figures, as comment lines under the table."""
    rules = [
        f"#   {r.side} {r.nodes} rule  {seconds:7.3f} s  {group} / {rule}"
        for group, costs in sorted(r.rule_costs.items())
        for rule, seconds in costs.items()
    ]
    queries = [
        f"#   {r.side} {r.nodes} {q.view:7} {q.seconds:7.3f} s {q.status} {q.bytes:>10} B {q.series:>6} series {q.samples:>10} samples  {q.panel}"
        for q in r.queries
    ]
    return "\n".join(rules + queries)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--before", type=Path, required=True, help="worktree of the code before (e.g. /tmp/base-fleet)")
    parser.add_argument("--after", type=Path, default=REPO, help="worktree of the code after (default: this one)")
    parser.add_argument("--nodes", default="50,200", help="comma-separated fleet sizes (default 50,200)")
    parser.add_argument(
        "--minutes", type=float, default=5, help="minutes of real-time scraping before the queries (default 5)"
    )
    parser.add_argument("--repeat", type=int, default=3, help="runs of each dashboard query, median kept (default 3)")
    parser.add_argument(
        "--history-hours", type=float, default=1, help="hours of history back-filled first, 0 for none (default 1)"
    )
    parser.add_argument(
        "--fill-interval",
        type=float,
        default=1,
        help="seconds between back-fill scrapes, each 15 s of history (default 1)",
    )
    parser.add_argument(
        "--one-side-at-a-time",
        action="store_true",
        help="run the sides one after the other, not at once (when two fleets do not fit the machine)",
    )
    parser.add_argument("--sides", default="before,after", help="the sides to run (default before,after)")
    parser.add_argument("--json", type=Path, help="write every figure here")
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # stop both Prometheus servers on the way out
    worktrees = {"before": args.before.resolve(), "after": args.after.resolve()}
    sides = {n: worktrees[n] for n in args.sides.split(",")}
    texts = {n: (node_text(repo, findings=False), node_text(repo, findings=True)) for n, repo in sides.items()}
    version = subprocess.run(["prometheus", "--version"], capture_output=True, text=True).stdout.splitlines()[0]
    print(
        f"# {platform.node()} {platform.machine()} {os.cpu_count()} cores, {version}, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}"
    )
    print(f"# command: {' '.join(sys.argv)}")
    for n, (clean, findings) in texts.items():
        count = sum(1 for line in clean.splitlines() if line and not line.startswith("#"))
        count_f = sum(1 for line in findings.splitlines() if line and not line.startswith("#"))
        print(f"# {n}: series per clean node {count}, per node with findings {count_f}")
    runs = [{n: repo} for n, repo in sides.items()] if args.one_side_at_a_time else [sides]
    everything: list[SideResult] = []
    with tempfile.TemporaryDirectory(prefix="bench-fleet-") as tmp:
        for nodes in (int(n) for n in args.nodes.split(",")):
            results = []
            for run in runs:
                results += run_size(
                    run,
                    {n: texts[n] for n in run},
                    nodes,
                    args.minutes,
                    args.repeat,
                    Path(tmp),
                    history_hours=args.history_hours,
                    fill_interval=args.fill_interval,
                )
            everything.extend(results)
            print(table(results), flush=True)
            for r in results:
                print(details(r), flush=True)
    if args.json:
        args.json.write_text(
            json.dumps([r.__dict__ | {"queries": [q.__dict__ for q in r.queries]} for r in everything], indent=1)
        )


if __name__ == "__main__":
    main()
