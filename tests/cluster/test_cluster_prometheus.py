"""A real Prometheus (Debian package) on 127.0.0.1 scrapes a real `gpuzombie exporter` serving a fake
GPU node (tests/test_exporter.py's fake /proc with container namespaces and its NVML snapshot, plus a
host process stuck in D holding /dev/nvidia0), with the alert rules loaded, under the annotation scrape
job's name of the Prometheus community chart ("kubernetes-pods", not "gpuzombie"). Every dashboard
query and every alert expression must parse, and return data wherever the fake node has the
condition (it has zombies under a non-reaping PID 1, orphans, a ghost GPU, grace risk and a D-state
GPU holder; its exporter is up, sees NVML and scans fine). Stand-ins, named as such since no cluster
runs here: a CRI runtime (tests/cri_standin.py, a real gRPC server) that runs two of its pods, so the
third pod's GPU holder is stale; a kube-state-metrics on 127.0.0.1 serving
``kube_pod_deletion_timestamp`` for the nofix pod, deleted 10 minutes ago and still holding its
memory, and a pod waiting in its gpuzombie-preflight init container on the node; a dcgm-exporter
serving utilisation and memory of the node's two GPUs (its metric and label names); and, while the
exporter does not serve them yet (issue 25's node side), the handover series it will serve for that
node: GPU 0's ghost and GPU 1's stale holder keep them from being clean."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import pathlib
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from typing import Any

import pytest

import gpuzombie

pytest.importorskip("yaml", reason="PyYAML is in the 'chart' extra")

import yaml
from cluster_support import ALERTS, DASHBOARD

from fakeproc import TREE_PIDNS, make_fake_proc
from pidns import wait_until

pytestmark = pytest.mark.slow  # a real Prometheus server scrapes the exporter

NODE = "fake-gpu-node"
JOB = "kubernetes-pods"  # the community chart's annotation job: the rules must not need job="gpuzombie"
D_STATE_PID = 95
AGENT_POD = {"namespace": "gpuzombie", "pod": "gpuzombie-7xk2p"}
"""The target labels an annotation job gives the exporter: never a finding's (its own labels, even empty, win)."""
# The dashboard's template variables, set to "All" as Grafana sends them (allValue .*).
VARIABLES = {"$node": ".*", "$namespace": ".*"}
# Alerts whose condition the fake node does not have: their expressions must parse and be empty.
HEALTHY_HERE = {
    "GpuzombieExporterDown": "the exporter is up",
    "GpuzombieExporterAbsent": "the exporter is scraped",
    "GpuzombieNvmlUnavailable": "the NVML snapshot answers",
    "GpuzombieScansFailing": "every scan reads the fake /proc",
    "GpuzombieUnreadableProcesses": "every fake process is readable",
    "GpuzombieDStateGpuHolder": "its D-state holder is younger than the 5 minutes it takes",
    "GpuzombieForeignGpuHolder": "no kubelet PodResources socket",
    "GpuzombieStaleCheckUnavailable": "the stand-in runtime answers",
}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def api(base: str, path: str, **params: str) -> Any:
    url = f"{base}/api/v1/{path}?" + urllib.parse.urlencode(params)
    with urllib.request.urlopen(url, timeout=10) as response:
        body = json.load(response)
    assert body["status"] == "success", body
    return body["data"]


def stop(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@contextlib.contextmanager
def exposition(series: str):
    """A stand-in exporter (kube-state-metrics, dcgm-exporter): ``series`` in the exposition format
    on 127.0.0.1."""
    import http.server
    import threading

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            body = series.encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def runtime_pods(test_exporter) -> dict:
    """The stand-in runtime's pods: nofix and tini run (named), the third pod (UID_C) is gone; the
    shared-namespace pod's sandbox is left unnamed, as before (its container label: the short id)."""
    ns = "gpu-zombie-test"
    return {
        "sandboxes": [
            ["1" * 64, "gpu-zombie-nofix", ns, test_exporter.UID_A],
            ["2" * 64, "gpu-zombie-tini", ns, test_exporter.UID_B],
        ],
        "listed": {
            test_exporter.CID_A: ["worker", "gpu-zombie-nofix", ns, test_exporter.UID_A],
            test_exporter.CID_B: ["worker", "gpu-zombie-tini", ns, test_exporter.UID_B],
        },
    }


def kube_state_series(test_exporter, deleted: float) -> str:
    """The nofix pod deleted at ``deleted``; pod b-0 on the node refused by its preflight twice."""
    waiting = 'namespace="ml",pod="b-0",uid="u-b0"'
    return (
        "# TYPE kube_pod_deletion_timestamp gauge\n"
        f'kube_pod_deletion_timestamp{{namespace="gpu-zombie-test",pod="gpu-zombie-nofix",'
        f'uid="{test_exporter.UID_A}"}} {deleted:.0f}\n'
        f'kube_pod_info{{{waiting},node="{NODE}"}} 1\n'
        f'kube_pod_init_container_status_restarts_total{{{waiting},container="gpuzombie-preflight"}} 2\n'
        f'kube_pod_init_container_status_ready{{{waiting},container="gpuzombie-preflight"}} 0\n'
        f'kube_pod_init_container_resource_requests{{{waiting},container="gpuzombie-preflight",node="{NODE}",'
        'resource="cpu",unit="core"} 0.01\n'
    )


def dcgm_series() -> str:
    """dcgm-exporter's default GPU_UTIL (%) and FB_USED (MiB) for the fake node's GPUs, with its labels,
    and a GPU no offender holds (OTHER_GPU)."""
    lines = []
    for gpu, uuid, util, used in (("0", "GPU-0000", 0, 4273), ("1", "GPU-1111", 35, 3615), ("2", OTHER_GPU, 90, 70000)):
        labels = f'gpu="{gpu}",UUID="{uuid}",device="nvidia{gpu}",modelName="NVIDIA H200",Hostname="{NODE}"'
        lines += [f"DCGM_FI_DEV_GPU_UTIL{{{labels}}} {util}", f"DCGM_FI_DEV_FB_USED{{{labels}}} {used}"]
    return "\n".join(lines) + "\n"


OTHER_GPU = "GPU-2222"
HANDOVER = {
    "gpuzombie_gpu_handover_clean": [('gpu="0",UUID="GPU-0000"', 0), ('gpu="1",UUID="GPU-1111"', 0)],
    "gpuzombie_gpu_held_memory_bytes": [
        ('gpu="0",UUID="GPU-0000",holder="ghost"', 1000 * 1024 * 1024),
        ('gpu="1",UUID="GPU-1111",holder="stale"', 1000 * 1024 * 1024),
    ],
}


def handover_standin(served: set[str]) -> str:
    """Issue 25's per-GPU series for the fake node, those the exporter does not serve itself."""
    return "".join(
        f'{name}{{{labels},Hostname="{NODE}"}} {value}\n'
        for name, samples in HANDOVER.items()
        if name not in served
        for labels, value in samples
    )


@pytest.fixture
def prometheus(tmp_path_factory):
    """(Prometheus base URL, metric names the exporter and its stand-in serve), every process stopped
    afterwards (per test: tests/conftest.py kills every child a test leaves)."""
    with prometheus_scraping(tmp_path_factory) as (base, served, _):
        yield base, served


@contextlib.contextmanager
def prometheus_scraping(tmp_path_factory):
    """A Prometheus scraping the exporter and the stand-ins: (base URL, names served, the exporter)."""
    if shutil.which("prometheus") is None:
        pytest.skip("prometheus is not installed (Debian package prometheus; make test installs it)")
    test_exporter = pytest.importorskip("test_exporter")
    d = tmp_path_factory.mktemp("prometheus")
    test_exporter.build_node(d / "proc")
    # A host process stuck in D holding /dev/nvidia0 (outside any pod).
    make_fake_proc(d / "proc", D_STATE_PID, ppid=1, state="D", comm="python3", fds=("/dev/nvidia0",), pidns=TREE_PIDNS)
    (d / "nvml.json").write_text(json.dumps(dataclasses.asdict(test_exporter.gpus())))
    (d / "runtime.json").write_text(json.dumps(runtime_pods(test_exporter)))
    standin = str(pathlib.Path(__file__).resolve().parents[1] / "cri_standin.py")
    runtime = subprocess.Popen([sys.executable, standin, str(d / "cri.sock"), str(d / "runtime.json")])
    wait_until(lambda: (d / "cri.sock").exists())
    stack = contextlib.ExitStack()
    deleted = time.time() - 600
    ksm = stack.enter_context(exposition(kube_state_series(test_exporter, deleted)))
    dcgm = stack.enter_context(exposition(dcgm_series()))
    exporter = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gpuzombie",
            "exporter",
            "--listen",
            "127.0.0.1:0",
            "--min-interval",
            "1",
            "--procfs",
            str(d / "proc"),
            "--nvml-replay",
            str(d / "nvml.json"),
            "--cri-socket",
            str(d / "cri.sock"),
            # No kubelet here: the rules and the dashboard need the stale holder the runtime alone
            # shows (the kubelet cross-check itself is tests/test_stale.py's).
            "--trust-runtime-without-kubelet",
            "--node-name",
            NODE,
        ],
        stderr=subprocess.PIPE,
        text=True,
    )
    server = None
    try:
        port = int(re.search(r"http://127\.0\.0\.1:(\d+)/metrics", exporter.stderr.readline()).group(1))
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
            served = set(re.findall(r"^# TYPE (\w+) ", response.read().decode(), re.MULTILINE))
        handover = stack.enter_context(exposition(handover_standin(served)))
        served |= set(HANDOVER)
        config = {
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": [str(ALERTS)],
            "scrape_configs": [
                {
                    # As the community chart's pod job: honor_labels, and the agent's own pod as target labels.
                    "job_name": JOB,
                    "honor_labels": True,
                    "static_configs": [{"targets": [f"127.0.0.1:{port}"], "labels": {"node": NODE, **AGENT_POD}}],
                },
                {"job_name": "kube-state-metrics", "honor_labels": True, "static_configs": [{"targets": [ksm]}]},
                {"job_name": "dcgm-exporter", "static_configs": [{"targets": [dcgm]}]},
                {
                    "job_name": "issue-25-standin",
                    "static_configs": [{"targets": [handover], "labels": {"node": NODE}}],
                },
            ],
        }
        (d / "prometheus.yml").write_text(yaml.safe_dump(config))
        web = f"127.0.0.1:{free_port()}"
        server = subprocess.Popen(
            [
                "prometheus",
                f"--config.file={d / 'prometheus.yml'}",
                f"--storage.tsdb.path={d / 'tsdb'}",
                f"--web.listen-address={web}",
                "--log.level=warn",
            ],
            stdout=subprocess.DEVNULL,
            stderr=stack.enter_context((d / "prometheus.log").open("w")),
        )
        base = f"http://{web}"

        def scraped_three_times():
            try:
                got = api(base, "query", query=f'count_over_time(up{{job="{JOB}"}}[1m]) >= 3')
            except OSError:
                return None
            return got["result"] or None

        wait_until(scraped_three_times, timeout=60)
        yield base, served, exporter
    finally:
        if server is not None:
            stop(server)
        stop(exporter)
        stop(runtime)
        exporter.stderr.close()
        stack.close()


def dashboard_queries() -> list[tuple[str, str]]:
    found = []
    for panel in json.loads(DASHBOARD.read_text())["panels"]:
        for target in panel.get("targets", []):
            expr = target["expr"]
            for name, value in VARIABLES.items():
                expr = expr.replace(name, value)
            found.append((f"{panel['title']} {target['refId']}", expr))
    return found


def alert_rules() -> dict[str, str]:
    return {
        r["alert"]: r["expr"] for g in yaml.safe_load(ALERTS.read_text())["groups"] for r in g["rules"] if "alert" in r
    }


def recording_rules() -> set[str]:
    return {r["record"] for g in yaml.safe_load(ALERTS.read_text())["groups"] for r in g["rules"] if "record" in r}


def test_every_dashboard_query_and_variable_parses_and_returns_data(prometheus):
    base, served = prometheus
    # The GiB·s rule integrates over a subquery whose 30 s steps are aligned to the clock: its first
    # sample comes at the first step after the terminating pod's memory was first recorded.
    wait_until(
        lambda: api(base, "query", query="gpuzombie:terminating_pod_gpu_memory_gib_seconds")["result"], timeout=60
    )
    empty = []
    for title, expr in dashboard_queries():
        result = api(base, "query", query=expr)["result"]  # a query that does not parse fails here
        unknown = set(re.findall(r"gpuzombie_\w+", expr)) - served - {n + "_total" for n in served}
        assert not unknown, (title, unknown)  # a metric name the exporter does not serve
        if not result:
            empty.append(title)
    assert not empty, f"no data for: {empty}"
    # The dcgm-exporter panels show the GPUs offenders hold, not the others.
    for title, expr in dashboard_queries():
        if "DCGM_" in expr:
            uuids = {series["metric"]["UUID"] for series in api(base, "query", query=expr)["result"]}
            assert uuids == {"GPU-0000", "GPU-1111"}, (title, uuids)
    # The on-call row (issue 35, 5) on this node: GPU 0's ghost and GPU 1's stale holder make two dirty
    # GPUs, 1000 MiB each; the D-state holder holds only /dev/nvidia0 (no memory); the nofix pod,
    # deleted 10 minutes ago, still holds its GPU memory; the exporter is up.
    on_call = {
        title.removesuffix(" A"): api(base, "query", query=expr)["result"] for title, expr in dashboard_queries()
    }
    values = {
        title: [float(s["value"][1]) for s in on_call[title]]
        for title in (
            "Dirty GPUs now",
            "Held by stale holders",
            "Held by ghosts",
            "Held by D-state holders",
            "Pods in grace waste",
            "Exporters down",
        )
    }
    assert values == {
        "Dirty GPUs now": [2.0],
        "Held by stale holders": [1000 * 1024 * 1024],
        "Held by ghosts": [1000 * 1024 * 1024],
        "Held by D-state holders": [0.0],
        "Pods in grace waste": [1.0],
        "Exporters down": [0.0],
    }
    # A GPU is its node and index: each line of "GPU memory accounted" names both.
    for title, expr in dashboard_queries():
        if title.startswith("GPU memory accounted"):
            assert {(s["metric"]["node"], s["metric"]["gpu"]) for s in api(base, "query", query=expr)["result"]} <= {
                (NODE, "0"),
                (NODE, "1"),
            }
    (version,) = on_call["Versions running"]
    assert version["metric"] == {"version": gpuzombie.__version__} and version["value"][1] == "1"
    # The host process in D: outside any pod, not in the agent's (the scrape's target labels).
    (host,) = api(base, "query", query='gpuzombie_dstate_seconds{pod_uid=""}')["result"]
    assert "namespace" not in host["metric"] and "pod" not in host["metric"], host
    # Each variable's label_values query answers and the node is listed. (Namespaces and pod names
    # are empty on this node: without a container runtime to ask, the exporter knows pods by uid.)
    for variable in json.loads(DASHBOARD.read_text())["templating"]["list"]:
        if variable["type"] != "query":
            continue
        label, metric = re.fullmatch(r"label_values\((\w+), (\w+)\)", variable["query"]["query"]).group(2, 1)
        api(base, f"label/{label}/values", **{"match[]": metric})
    assert api(base, "label/node/values", **{"match[]": "gpuzombie_scan_success"}) == [NODE]
    pods = api(base, "label/pod_uid/values", **{"match[]": "gpuzombie_pid1_info"})
    assert "11111111-2222-3333-4444-555555555555" in pods


def test_every_alert_expression_parses_and_finds_the_fake_nodes_conditions_and_the_rules_load(prometheus):
    base, _ = prometheus
    for alert, expr in alert_rules().items():
        result = api(base, "query", query=expr)["result"]
        if alert in HEALTHY_HERE:
            assert result == [], (alert, HEALTHY_HERE[alert], result)
            continue
        assert result, f"{alert}: no data on a node that has the condition"
        for series in result:
            assert series["metric"]["node"] == NODE, alert
            if "gpu" not in series["metric"]:
                # namespace and pod are "" (so absent) here: no container runtime names the pods
                assert {"pod_uid", "container"} <= set(series["metric"]), (alert, series["metric"])
    (ghost,) = api(base, "query", query=alert_rules()["GpuzombieGhostGpuMemory"])["result"]
    assert ghost["metric"]["gpu"] == "0" and float(ghost["value"][1]) == 1000 * 1024 * 1024
    rules = [r for g in api(base, "rules")["groups"] for r in g["rules"]]
    assert {r["name"] for r in rules} == set(alert_rules()) | recording_rules()

    def evaluated():
        health = {r["health"] for g in api(base, "rules")["groups"] for r in g["rules"]}
        return health == {"ok"} or None

    wait_until(evaluated, timeout=30)


def test_an_exporter_that_stops_answering_under_an_annotation_job_is_down_not_absent(tmp_path_factory):
    """Under "kubernetes-pods" (no job="gpuzombie"), the exporter known by what it served: once it
    stops answering, GpuzombieExporterDown's expression finds its target, Absent's does not, and the
    "Exporters up" panel shows it at 0. (a884539's rules, up{job="gpuzombie"}, saw nothing here.)"""
    with prometheus_scraping(tmp_path_factory) as (base, _, exporter):
        wait_until(lambda: api(base, "query", query="gpuzombie:exporter_target")["result"], timeout=30)
        stop(exporter)
        down = alert_rules()["GpuzombieExporterDown"]
        (series,) = wait_until(lambda: api(base, "query", query=down)["result"], timeout=60)
        assert (series["metric"]["job"], series["metric"]["node"]) == (JOB, NODE)
        assert api(base, "query", query=alert_rules()["GpuzombieExporterAbsent"])["result"] == []
        (panel,) = [expr for title, expr in dashboard_queries() if title == "Exporters up (the 10 lowest) A"]
        (shown,) = api(base, "query", query=panel)["result"]
        assert shown["value"][1] == "0"


def test_the_dashboard_preview_renders_every_panel_from_prometheus(prometheus, tmp_path):
    """A look at it (tests/cluster/dashboard_preview.py: Grafana's grid and panel kinds drawn from the
    real Prometheus, not Grafana), as a PNG: in $GPUZOMBIE_DASHBOARD_PNG when set, for a person."""
    import os

    import dashboard_preview

    base, _ = prometheus
    board = json.loads(DASHBOARD.read_text())
    text = dashboard_preview.page(base, board)
    assert "query failed" not in text
    assert text.count('class="stat"') == 6 and ">2<" in text  # the on-call row; two dirty GPUs
    assert text.count('<a title="${runbook}#gpuzombiedirtygpublockspreflight">') >= 1
    if dashboard_preview.chromium() is None:
        pytest.skip("chromium is not installed (Debian package chromium): the HTML rendered, no PNG")
    out = pathlib.Path(os.environ.get("GPUZOMBIE_DASHBOARD_PNG") or tmp_path / "dashboard.png")
    if "GPUZOMBIE_DASHBOARD_PNG" in os.environ:
        time.sleep(60)  # for a person: a minute of lines, not a point each
    dashboard_preview.screenshot(base, out, board)
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and out.stat().st_size > 50_000
