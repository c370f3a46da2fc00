"""The chart's webhook on the real node (the session's deployment: helm's objects applied as they
are, its TLS from a Secret and webhook.caBundle, the chart's path without cert-manager): a GPU pod
applied with kubectl comes out patched and runs under tini; with the webhook down,
`failurePolicy: Ignore` admits the pod unpatched, the API server counts the fail-open, and the chart's
alert expression, evaluated by a real Prometheus on the real exporter's series, names the pod; and
the handover gate, injected as the first init container, holds the pod while the (stand-in) GPU is
dirty and lets it start once it is clean, as the kubelet runs it.

Stand-ins, named: the node's ``nvidia.com/gpu`` is an extended resource patched into its status
(conftest's ``gpus``); a GPU holder holds a regular file at /dev/nvidia0; NVML is a recorded snapshot
(the exporter's ``--nvml-replay``, the gate's ``--nvml-standin``: the lab's StandinNvml, which shows
the GPU dirty while a host process lives)."""

from __future__ import annotations

import json
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuzombie.admission.preflight import CONTAINER as GATE
from gpuzombie.lab.handover import StandinNvml, with_standin
from kube import chart, pods
from kube.api import Api, metric, wait_for
from kube.conftest import Webhook

HELD = 2 << 30
"""What the stand-in holder holds (GiB 2), well over the gate's tolerance."""
ALERT = "GpuzombieWebhookMissedGpuPod"
EXPORTER = [sys.executable, "-m", "gpuzombie", "exporter"]


def _webhook_log(kube) -> str:
    done = kube.kubectl(
        "-n", chart.NAMESPACE, "logs", "-l", "app.kubernetes.io/name=gpuzombie-webhook", "--prefix", "--tail=-1"
    )
    return done.stdout


def test_a_gpu_pod_applied_with_kubectl_comes_out_patched_and_runs_under_tini(
    kube, api: Api, webhook: Webhook, gpus: int, tmp_path: Path
):
    evidence = pods.evidence_dir(tmp_path / "evidence")
    pod = pods.gpu_pod("patched", chart.PROBE_NAMESPACE, evidence)
    warnings = pods.kubectl_apply(kube, pod)
    assert "Warning: gpuzombie: run container train's command under tini" in warnings
    live = pods.wait_ready(api, pod)
    assert live["metadata"]["annotations"][chart.INJECTED] == "tini:train"
    (install,) = live["status"]["initContainerStatuses"]
    assert install["name"] == "gpuzombie-install" and install["state"]["terminated"]["exitCode"] == 0
    running = pods.host_pids(live["metadata"]["uid"])
    assert any(cmd.startswith("/.gpuzombie/tini-static -s -g -- sh -c") for cmd in running.values()), running
    # One line per pod changed, from whichever replica the API server dialled (the review's uid).
    assert re.search(
        rf"webhook\] gpuzombie webhook: {chart.PROBE_NAMESPACE}/patched \(uid [0-9a-f-]+\): tini:train",
        _webhook_log(kube),
    )
    took = pods.delete_and_wait(api, pod)
    assert took < 25  # tini passes the kubelet's SIGTERM to the worker: not the 30 s grace


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _scale(kube, replicas: int) -> None:
    kube.kubectl("-n", chart.NAMESPACE, "scale", "deployment/gpuzombie-webhook", f"--replicas={replicas}")


@pytest.fixture
def webhook_down(kube, api: Api, webhook: Webhook) -> Iterator[None]:
    """The webhook's Deployment scaled to 0: no endpoints, every call fails."""
    _scale(kube, 0)
    try:
        chart.wait_until_admission(api, fixed=False, webhook_called=True)
        yield
    finally:
        _scale(kube, 2)
        chart.wait_until_admission(api, fixed=True, webhook_called=True, timeout=300)


def _prometheus_query(base: str, query: str) -> list[dict[str, Any]]:
    url = f"{base}/api/v1/query?" + urllib.parse.urlencode({"query": query})
    with urllib.request.urlopen(url, timeout=10) as response:
        return json.load(response)["data"]["result"]


def _alerts(base: str) -> list[dict[str, Any]]:
    with urllib.request.urlopen(f"{base}/api/v1/alerts", timeout=10) as response:
        return json.load(response)["data"]["alerts"]


def _stop(proc: subprocess.Popen) -> None:
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def test_with_the_webhook_down_the_pod_is_admitted_unpatched_and_the_alert_sees_it(
    kube, api: Api, webhook: Webhook, gpus: int, webhook_down: None, tmp_path: Path
):
    evidence = pods.evidence_dir(tmp_path / "evidence")
    pod = pods.gpu_pod("missed", chart.PROBE_NAMESPACE, evidence, grace=2)
    opened = metric(api.metrics(), "apiserver_admission_webhook_fail_open_count", name=chart.WEBHOOK_NAME)
    pods.kubectl_apply(kube, pod)
    assert metric(api.metrics(), "apiserver_admission_webhook_fail_open_count", name=chart.WEBHOOK_NAME) > opened
    live = pods.wait_ready(api, pod)
    assert chart.INJECTED not in (live["metadata"].get("annotations") or {})
    assert live["spec"]["containers"][0]["command"] == pods.S1_WORKER  # no tini: `sleep` is PID 1
    uid = live["metadata"]["uid"]
    worker = wait_for(
        "the worker's host pid",
        lambda: next((p for p, cmd in pods.host_pids(uid).items() if cmd.startswith("python3 -c")), None),
    )
    # STAND-IN for NVML: the driver would list the worker with its memory.
    replay = tmp_path / "nvml.json"
    device = {
        "index": 0,
        "uuid": "GPU-standin-0",
        "name": "stand-in GPU",
        "memory_total": 150 << 30,
        "memory_used": (1 << 30) + HELD,
        "memory_free": (150 << 30) - (1 << 30) - HELD,
        "memory_reserved": 1 << 30,
        "processes": [{"pid": worker, "used_memory": HELD, "kind": "compute"}],
    }
    replay.write_text(json.dumps({"available": True, "driver_version": "stand-in", "devices": [device]}))
    objects = chart.render(
        {**chart.webhook_values(webhook.ca.read_bytes(), "webhook-tls"), "prometheusRule": {"enabled": True}},
        webhook.version,
    )
    (rule,) = [o for o in objects if o["kind"] == "PrometheusRule"]
    (group,) = [g for g in rule["spec"]["groups"] if g["name"] == "gpuzombie-admission"]
    (alert,) = group["rules"]
    assert alert["alert"] == ALERT
    rules = tmp_path / "rules.yaml"
    rules.write_text(yaml.safe_dump({"groups": [{**group, "interval": "1s"}]}))
    exporter_port, prometheus_port = _free_port(), _free_port()
    config = tmp_path / "prometheus.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
                "rule_files": [str(rules)],
                "scrape_configs": [
                    {"job_name": "gpuzombie", "static_configs": [{"targets": [f"127.0.0.1:{exporter_port}"]}]}
                ],
            }
        )
    )
    exporter = subprocess.Popen(
        [*EXPORTER, "--listen", f"127.0.0.1:{exporter_port}", "--min-interval", "1", "--nvml-replay", str(replay)],
        env=kube.node_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    prometheus = subprocess.Popen(
        [
            "prometheus",
            f"--config.file={config}",
            f"--storage.tsdb.path={tmp_path / 'tsdb'}",
            f"--web.listen-address=127.0.0.1:{prometheus_port}",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    base = f"http://127.0.0.1:{prometheus_port}"
    try:

        def seen() -> list[dict[str, Any]] | None:
            try:
                return _prometheus_query(base, alert["expr"]) or None
            except OSError:
                return None

        (series,) = wait_for("the alert's expression to name the pod", seen, timeout=120)
        assert series["metric"]["pod"] == "missed" and series["metric"]["pod_uid"] == uid
        assert series["metric"]["container"] == "train"
        pending = wait_for(
            "the alert pending",
            lambda: [a for a in _alerts(base) if a["labels"].get("alertname") == ALERT] or None,
            timeout=60,
        )
        assert pending[0]["state"] == "pending" and pending[0]["labels"]["pod"] == "missed"  # for: 10m
    finally:
        _stop(prometheus)
        _stop(exporter)
        pods.delete_and_wait(api, pod)


def test_the_gate_holds_the_pod_while_the_gpu_is_dirty_and_releases_it(
    kube, api: Api, webhook: Webhook, gpus: int, tmp_path: Path
):
    standin = pods.evidence_dir(tmp_path / "nvml")
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "gated",
            "namespace": chart.PROBE_NAMESPACE,
            "annotations": {"gpuzombie.dev/preflight": "true"},
        },
        "spec": {
            "terminationGracePeriodSeconds": 2,
            "containers": [
                {
                    "name": "train",
                    "image": pods.BUSYBOX,
                    "command": ["sleep", "3600"],
                    "resources": {"limits": {pods.GPU: "1"}},
                }
            ],
        },
    }
    reply = api.dry_run_pod(pod)  # the deployed webhook's patch, as the API server applies it
    assert reply.ok, reply.body
    patched = reply.body
    assert [c["name"] for c in patched["spec"]["initContainers"]] == [GATE, "gpuzombie-install"]
    holder = subprocess.Popen(["sleep", "600"])
    path = f"/api/v1/namespaces/{chart.PROBE_NAMESPACE}/pods/gated"
    try:
        with StandinNvml(standin, holder, HELD):
            created = api.create(
                f"/api/v1/namespaces/{chart.PROBE_NAMESPACE}/pods",
                with_standin(pods.resubmitted(patched), str(standin)),
            )
            assert created.ok, created.body

            def gate_running() -> dict[str, Any] | None:
                status = api.call("GET", path).body.get("status", {})
                inits = status.get("initContainerStatuses") or []
                return status if inits and "running" in inits[0]["state"] else None

            wait_for("the gate running", gate_running, timeout=180)
            time.sleep(8)  # four of its 2 s polls
            status = api.call("GET", path).body["status"]
            assert "running" in status["initContainerStatuses"][0]["state"]
            assert "waiting" in status["containerStatuses"][0]["state"]  # the workload never started
            log = kube.kubectl("-n", chart.PROBE_NAMESPACE, "logs", "gated", "-c", GATE).stdout
            assert log.count(": dirty,") >= 3, log
            holder.kill()
            holder.wait()
            freed = time.monotonic()
            pods.wait_ready(api, {"metadata": {"name": "gated", "namespace": chart.PROBE_NAMESPACE}})
            assert time.monotonic() - freed < 30  # the gate's next poll (2 s), then install and start
        log = kube.kubectl("-n", chart.PROBE_NAMESPACE, "logs", "gated", "-c", GATE).stdout
        assert "preflight: clean after" in log, log
        gate = api.call("GET", path).body["status"]["initContainerStatuses"][0]
        assert gate["state"]["terminated"]["exitCode"] == 0 and gate["restartCount"] == 0
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait()
        pods.delete_and_wait(api, {"metadata": {"name": "gated", "namespace": chart.PROBE_NAMESPACE}})
