"""What watches the chart on the real cluster, from the host: kube-state-metrics (built from its Go
module, go/kube-state-metrics), Debian's Prometheus with the scrape jobs the chart's annotations,
ServiceMonitor and PodMonitor describe, and the prometheus-operator CRDs the monitoring objects need.

Processes started here outlive the test that started them (a module's fixtures share them), so they
are started detached (their own session, reparented away from pytest: the suite's autouse reaper
kills a test's children) and stopped by their pid and start time (``Detached.stop``)."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import re
import signal
import socket
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psutil
import yaml

from gpuzombie.cluster.build import GoTool, ensure_tool
from pidns import wait_until

REPO = Path(__file__).resolve().parents[2]
KSM_PACKAGE = "k8s.io/kube-state-metrics/v2"
KSM_BUILD_TIMEOUT_S = 1800
"""A cold build took 7 min here (2 shared cores, load 3); with Go's build cache warm, seconds."""
CRDS = REPO / "tests" / "cluster" / "crds"
OPERATOR_CRDS = {"ServiceMonitor": "servicemonitors", "PodMonitor": "podmonitors", "PrometheusRule": "prometheusrules"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# --- kube-state-metrics from its Go module ---------------------------------------------------------


def kube_state_metrics_binary() -> Path:
    """kube-state-metrics ``main`` of the release go.mod pins (a ``tool`` of the module), built
    stripped with the version stamps its Makefile sets; cached as the cluster's own binary is."""
    plain = GoTool("kube-state-metrics", KSM_PACKAGE, "kube-state-metrics")
    stamps = [
        f"-X github.com/prometheus/common/version.Version={plain.required(KSM_PACKAGE)}",
        f"-X {KSM_PACKAGE}/pkg/app.ClientGoVersion={plain.required('k8s.io/client-go')}",
    ]
    return ensure_tool(dataclasses.replace(plain, ldflags=" ".join(["-s", "-w", *stamps])), timeout=KSM_BUILD_TIMEOUT_S)


# --- processes that outlive a test -----------------------------------------------------------------


@dataclass(frozen=True)
class Detached:
    """A process started in its own session and handed to init (not pytest's child)."""

    process: psutil.Process
    log: Path

    @classmethod
    def start(cls, argv: Sequence[str], log: Path, env: Mapping[str, str] | None = None) -> Detached:
        with log.open("ab") as out:
            launcher = subprocess.Popen(
                ["sh", "-c", '"$@" </dev/null >&2 & echo $!', "sh", *argv],
                stdout=subprocess.PIPE,
                stderr=out,
                start_new_session=True,
                env=None if env is None else dict(env),
            )
            pid_line, _ = launcher.communicate(timeout=30)
        return cls(psutil.Process(int(pid_line)), log)

    def alive(self) -> bool:
        try:
            return self.process.is_running() and self.process.status() != psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return False

    def stop(self, timeout: float = 20) -> None:
        """SIGTERM, then SIGKILL, to this very process (psutil refuses a reused pid)."""
        with contextlib.suppress(psutil.NoSuchProcess):
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout)
            except psutil.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)


def http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return bool(response.status == 200)
    except OSError:
        return False


@dataclass(frozen=True)
class KubeStateMetrics:
    address: str
    """Its metrics (127.0.0.1:port)."""
    telemetry: str
    """Its own metrics (kube_state_metrics_build_info)."""


@contextlib.contextmanager
def kube_state_metrics(binary: Path, kubeconfig: Path, work: Path) -> Iterator[KubeStateMetrics]:
    """kube-state-metrics on the host, reading the cluster as its admin (pods, daemonsets, nodes)."""
    port, telemetry = free_port(), free_port()
    argv = [
        str(binary),
        f"--kubeconfig={kubeconfig}",
        "--host=127.0.0.1",
        f"--port={port}",
        "--telemetry-host=127.0.0.1",
        f"--telemetry-port={telemetry}",
        "--resources=pods,daemonsets,nodes",
    ]
    ksm = Detached.start(argv, work / "kube-state-metrics.log")
    try:
        wait_until(lambda: http_ok(f"http://127.0.0.1:{port}/livez") or not ksm.alive(), timeout=120, interval=0.5)
        assert ksm.alive(), ksm.log.read_text()[-2000:]
        yield KubeStateMetrics(f"127.0.0.1:{port}", f"127.0.0.1:{telemetry}")
    finally:
        ksm.stop()


# --- the prometheus-operator CRDs ------------------------------------------------------------------


def operator_crds() -> list[dict[str, Any]]:
    """CustomResourceDefinitions of ServiceMonitor, PodMonitor and PrometheusRule made from the
    operator's own v1 schemas (tests/cluster/crds, their source named in each): the API server then
    validates the chart's monitoring objects as a cluster with the operator does."""
    crds = []
    for kind, plural in OPERATOR_CRDS.items():
        schema = json.loads((CRDS / f"{kind.lower()}.json").read_text())
        group = schema["apiVersion"].split("/")[0]
        crds.append(
            {
                "apiVersion": "apiextensions.k8s.io/v1",
                "kind": "CustomResourceDefinition",
                "metadata": {"name": f"{plural}.{group}", "annotations": {"gpuzombie.dev/schema": schema["source"]}},
                "spec": {
                    "group": group,
                    "scope": "Namespaced",
                    "names": {"kind": kind, "listKind": f"{kind}List", "plural": plural, "singular": kind.lower()},
                    "versions": [
                        {
                            "name": "v1",
                            "served": True,
                            "storage": True,
                            "schema": {"openAPIV3Schema": schema["openAPIV3Schema"]},
                        }
                    ],
                },
            }
        )
    return crds


# --- scrape jobs as the chart describes them -------------------------------------------------------


def _sd(role: str, kubeconfig: Path, namespaces: Sequence[str] = ()) -> list[dict[str, Any]]:
    sd: dict[str, Any] = {"role": role, "kubeconfig_file": str(kubeconfig)}
    if namespaces:
        sd["namespaces"] = {"names": list(namespaces)}
    return [sd]


def _label(name: str) -> str:
    return re.sub(r"[^a-zA-Z0-9_]", "_", name)


def _relabelings(endpoint: Mapping[str, Any]) -> list[dict[str, Any]]:
    """A monitor's ``relabelings`` in Prometheus's own spelling (sourceLabels -> source_labels)."""
    rename = {"sourceLabels": "source_labels", "targetLabel": "target_label"}
    return [{rename.get(k, k): v for k, v in r.items()} for r in endpoint.get("relabelings", [])]


def _common(monitor: Mapping[str, Any], endpoint: Mapping[str, Any], kind: str) -> dict[str, Any]:
    meta = monitor["metadata"]
    job: dict[str, Any] = {
        "job_name": f"{kind}/{meta['namespace']}/{meta['name']}/0",
        "honor_labels": bool(endpoint.get("honorLabels", False)),
    }
    for field, key in (("interval", "scrape_interval"), ("scrapeTimeout", "scrape_timeout"), ("path", "metrics_path")):
        if endpoint.get(field):
            job[key] = endpoint[field]
    if endpoint.get("scheme"):
        job["scheme"] = endpoint["scheme"]
    return job


def service_monitor_job(monitor: Mapping[str, Any], kubeconfig: Path) -> dict[str, Any]:
    """The scrape job prometheus-operator generates for the first endpoint of a ServiceMonitor
    (pkg/prometheus/promcfg.go, generateServiceMonitorConfig, role endpointslice), for the fields the
    chart uses: the Service kept by its selector, the endpoint port by name, the operator's target
    labels (node, pod, namespace, service, container), the running-pod filter, job from the Service
    (then ``jobLabel``), ``endpoint``, then the monitor's own relabelings."""
    spec = monitor["spec"]
    (endpoint,) = spec["endpoints"]
    job = _common(monitor, endpoint, "serviceMonitor")
    job["kubernetes_sd_configs"] = _sd("endpointslice", kubeconfig, spec["namespaceSelector"]["matchNames"])
    target = [
        "__meta_kubernetes_endpointslice_address_target_kind",
        "__meta_kubernetes_endpointslice_address_target_name",
    ]
    relabel: list[dict[str, Any]] = [{"source_labels": ["job"], "target_label": "__tmp_prometheus_job_name"}]
    for key, value in sorted(spec["selector"]["matchLabels"].items()):
        sources = [
            f"__meta_kubernetes_service_label_{_label(key)}",
            f"__meta_kubernetes_service_labelpresent_{_label(key)}",
        ]
        relabel.append({"action": "keep", "source_labels": sources, "regex": f"({value});true"})
    relabel += [
        {"action": "keep", "source_labels": ["__meta_kubernetes_endpointslice_port_name"], "regex": endpoint["port"]},
        {
            "source_labels": target,
            "separator": ";",
            "regex": "Node;(.*)",
            "replacement": "${1}",
            "target_label": "node",
        },
        {"source_labels": target, "separator": ";", "regex": "Pod;(.*)", "replacement": "${1}", "target_label": "pod"},
        {"source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace"},
        {"source_labels": ["__meta_kubernetes_service_name"], "target_label": "service"},
        {"source_labels": ["__meta_kubernetes_pod_name"], "target_label": "pod"},
        {"source_labels": ["__meta_kubernetes_pod_container_name"], "target_label": "container"},
        {"action": "drop", "source_labels": ["__meta_kubernetes_pod_phase"], "regex": "(Failed|Succeeded)"},
        {"source_labels": ["__meta_kubernetes_service_name"], "target_label": "job", "replacement": "${1}"},
    ]
    if spec.get("jobLabel"):
        source = f"__meta_kubernetes_service_label_{_label(spec['jobLabel'])}"
        relabel.append({"source_labels": [source], "target_label": "job", "regex": "(.+)", "replacement": "${1}"})
    relabel.append({"target_label": "endpoint", "replacement": endpoint["port"]})
    job["relabel_configs"] = relabel + _relabelings(endpoint)
    return job


def pod_monitor_job(monitor: Mapping[str, Any], kubeconfig: Path) -> dict[str, Any]:
    """The job prometheus-operator generates for a PodMonitor's first endpoint (generatePodMonitorConfig,
    role pod), for the fields the chart uses: pods kept by the selector and the container port by name,
    namespace/container/pod target labels, job from ``jobLabel`` (else namespace/name), ``endpoint``,
    then the monitor's relabelings."""
    spec = monitor["spec"]
    (endpoint,) = spec["podMetricsEndpoints"]
    meta = monitor["metadata"]
    job = _common(monitor, endpoint, "podMonitor")
    job["kubernetes_sd_configs"] = _sd("pod", kubeconfig, spec["namespaceSelector"]["matchNames"])
    relabel: list[dict[str, Any]] = [{"source_labels": ["job"], "target_label": "__tmp_prometheus_job_name"}]
    for key, value in sorted(spec["selector"]["matchLabels"].items()):
        sources = [f"__meta_kubernetes_pod_label_{_label(key)}", f"__meta_kubernetes_pod_labelpresent_{_label(key)}"]
        relabel.append({"action": "keep", "source_labels": sources, "regex": f"({value});true"})
    relabel += [
        {"action": "keep", "source_labels": ["__meta_kubernetes_pod_container_port_name"], "regex": endpoint["port"]},
        {"source_labels": ["__meta_kubernetes_namespace"], "target_label": "namespace"},
        {"source_labels": ["__meta_kubernetes_pod_container_name"], "target_label": "container"},
        {"source_labels": ["__meta_kubernetes_pod_name"], "target_label": "pod"},
        {"action": "drop", "source_labels": ["__meta_kubernetes_pod_phase"], "regex": "(Failed|Succeeded)"},
        {"target_label": "job", "replacement": f"{meta['namespace']}/{meta['name']}"},
    ]
    if spec.get("jobLabel"):
        source = f"__meta_kubernetes_pod_label_{_label(spec['jobLabel'])}"
        relabel.append({"source_labels": [source], "target_label": "job", "regex": "(.+)", "replacement": "${1}"})
    relabel.append({"target_label": "endpoint", "replacement": endpoint["port"]})
    job["relabel_configs"] = relabel + _relabelings(endpoint)
    return job


ANNOTATION_JOB = "kubernetes-pods"


def annotation_job(kubeconfig: Path) -> dict[str, Any]:
    """The Prometheus community chart's pod job (``kubernetes-pods``: prometheus.io/scrape, /path,
    /port, /scheme, honor_labels, the pod's namespace and name as target labels) with the one rule
    docs/cluster.md says to add: ``node`` from the pod's node."""
    return {
        "job_name": ANNOTATION_JOB,
        "honor_labels": True,
        "kubernetes_sd_configs": _sd("pod", kubeconfig),
        "relabel_configs": [
            {
                "source_labels": ["__meta_kubernetes_pod_annotation_prometheus_io_scrape"],
                "action": "keep",
                "regex": "true",
            },
            {
                "source_labels": ["__meta_kubernetes_pod_annotation_prometheus_io_scheme"],
                "action": "replace",
                "regex": "(https?)",
                "target_label": "__scheme__",
            },
            {
                "source_labels": ["__meta_kubernetes_pod_annotation_prometheus_io_path"],
                "action": "replace",
                "target_label": "__metrics_path__",
                "regex": "(.+)",
            },
            {
                "source_labels": ["__meta_kubernetes_pod_annotation_prometheus_io_port", "__meta_kubernetes_pod_ip"],
                "action": "replace",
                "regex": r"(\d+);((([0-9]+?)(\.|$)){4})",
                "replacement": "$2:$1",
                "target_label": "__address__",
            },
            {"action": "labelmap", "regex": "__meta_kubernetes_pod_label_(.+)"},
            {"source_labels": ["__meta_kubernetes_namespace"], "action": "replace", "target_label": "namespace"},
            {"source_labels": ["__meta_kubernetes_pod_name"], "action": "replace", "target_label": "pod"},
            {
                "source_labels": ["__meta_kubernetes_pod_phase"],
                "regex": "Pending|Succeeded|Failed|Completed",
                "action": "drop",
            },
            # docs/cluster.md "Scraping and the node label": the one rule to add to a shared pod job.
            {"source_labels": ["__meta_kubernetes_pod_node_name"], "target_label": "node"},
        ],
    }


def kube_state_metrics_job(address: str) -> dict[str, Any]:
    """kube-state-metrics with ``honor_labels`` (as kube-prometheus-stack scrapes it): its namespace,
    pod and node labels are the pods'."""
    return {"job_name": "kube-state-metrics", "honor_labels": True, "static_configs": [{"targets": [address]}]}


# --- Kubernetes service discovery: a STAND-IN --------------------------------------------------------
#
# Debian's Prometheus 2.42 is built without the Kubernetes service discovery (``kubernetes_sd_configs``
# is no field of its ScrapeConfig: its package leaves client-go out; no Debian package of Prometheus
# has it). The jobs above are written as a Prometheus with it runs them; ``through_standin`` swaps
# only their discovery for an HTTP SD served here, which reads the real API server and gives each
# target the ``__meta_kubernetes_*`` labels Prometheus's own discovery documents for that role
# (prometheus.io/docs, kubernetes_sd_config: roles pod and endpointslice). Relabeling, scraping and
# the rules are Prometheus's own.


def _meta_map(prefix: str, values: Mapping[str, str] | None) -> dict[str, str]:
    out = {}
    for key, value in (values or {}).items():
        out[f"{prefix}_{_label(key)}"] = value
        out[f"{prefix}present_{_label(key)}"] = "true"
    return out


def _object_meta(prefix: str, obj: Mapping[str, Any]) -> dict[str, str]:
    meta = obj["metadata"]
    return {
        **_meta_map(f"{prefix}_label", meta.get("labels")),
        **_meta_map(f"{prefix}_annotation", meta.get("annotations")),
    }


def _pod_meta(pod: Mapping[str, Any]) -> dict[str, str]:
    meta, status = pod["metadata"], pod.get("status", {})
    ready = {c["type"]: c["status"] for c in status.get("conditions", [])}.get("Ready", "unknown")
    labels = {
        "__meta_kubernetes_namespace": meta["namespace"],
        "__meta_kubernetes_pod_name": meta["name"],
        "__meta_kubernetes_pod_ip": status.get("podIP", ""),
        "__meta_kubernetes_pod_ready": ready.lower(),
        "__meta_kubernetes_pod_phase": status.get("phase", ""),
        "__meta_kubernetes_pod_node_name": pod["spec"].get("nodeName", ""),
        "__meta_kubernetes_pod_host_ip": status.get("hostIP", ""),
        "__meta_kubernetes_pod_uid": meta["uid"],
        **_object_meta("__meta_kubernetes_pod", pod),
    }
    owners = [o for o in meta.get("ownerReferences", []) if o.get("controller")]
    if owners:
        labels["__meta_kubernetes_pod_controller_kind"] = owners[0]["kind"]
        labels["__meta_kubernetes_pod_controller_name"] = owners[0]["name"]
    return labels


def _container_meta(container: Mapping[str, Any], init: bool) -> dict[str, str]:
    return {
        "__meta_kubernetes_pod_container_name": container["name"],
        "__meta_kubernetes_pod_container_image": container.get("image", ""),
        "__meta_kubernetes_pod_container_init": str(init).lower(),
    }


def _port_meta(port: Mapping[str, Any]) -> dict[str, str]:
    return {
        "__meta_kubernetes_pod_container_port_name": port.get("name", ""),
        "__meta_kubernetes_pod_container_port_number": str(port["containerPort"]),
        "__meta_kubernetes_pod_container_port_protocol": port.get("protocol", "TCP"),
    }


def pod_targets(pods: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Role pod: a target for each container port (podIP:port), one for each container without any
    (podIP), every pod's meta labels on each; pods without an IP yet have none."""
    groups = []
    for pod in pods:
        ip = pod.get("status", {}).get("podIP")
        if not ip:
            continue
        targets = []
        spec = pod["spec"]
        for init, containers in ((False, spec.get("containers", [])), (True, spec.get("initContainers", []))):
            for container in containers:
                ports = container.get("ports") or []
                for port in ports:
                    address = f"{ip}:{port['containerPort']}"
                    targets.append((address, {**_container_meta(container, init), **_port_meta(port)}))
                if not ports:
                    targets.append((ip, _container_meta(container, init)))
        for address, labels in targets:
            groups.append({"targets": [address], "labels": {**_pod_meta(pod), **labels}})
    return groups


def endpointslice_targets(
    slices: Sequence[Mapping[str, Any]], services: Sequence[Mapping[str, Any]], pods: Sequence[Mapping[str, Any]]
) -> list[dict[str, Any]]:
    """Role endpointslice: a target for each address and port of each slice, with the slice's, its
    Service's and (for a Pod target) the pod's and its matching container port's meta labels."""
    by_service = {(s["metadata"]["namespace"], s["metadata"]["name"]): s for s in services}
    by_pod = {(p["metadata"]["namespace"], p["metadata"]["name"]): p for p in pods}
    groups = []
    for eps in slices:
        meta = eps["metadata"]
        namespace = meta["namespace"]
        base = {
            "__meta_kubernetes_namespace": namespace,
            "__meta_kubernetes_endpointslice_name": meta["name"],
            "__meta_kubernetes_endpointslice_address_type": eps.get("addressType", ""),
            **_object_meta("__meta_kubernetes_endpointslice", eps),
        }
        service = by_service.get((namespace, (meta.get("labels") or {}).get("kubernetes.io/service-name", "")))
        if service:
            base["__meta_kubernetes_service_name"] = service["metadata"]["name"]
            base.update(_object_meta("__meta_kubernetes_service", service))
        for endpoint in eps.get("endpoints") or []:
            conditions = endpoint.get("conditions", {})
            ref = endpoint.get("targetRef") or {}
            per_endpoint = {
                **base,
                "__meta_kubernetes_endpointslice_endpoint_conditions_ready": str(
                    conditions.get("ready", False)
                ).lower(),
                "__meta_kubernetes_endpointslice_endpoint_conditions_serving": str(
                    conditions.get("serving", False)
                ).lower(),
                "__meta_kubernetes_endpointslice_endpoint_conditions_terminating": str(
                    conditions.get("terminating", False)
                ).lower(),
                "__meta_kubernetes_endpointslice_endpoint_node_name": endpoint.get("nodeName", ""),
            }
            if ref:
                per_endpoint["__meta_kubernetes_endpointslice_address_target_kind"] = ref.get("kind", "")
                per_endpoint["__meta_kubernetes_endpointslice_address_target_name"] = ref.get("name", "")
            pod = by_pod.get((namespace, ref.get("name", ""))) if ref.get("kind") == "Pod" else None
            for address in endpoint.get("addresses", []):
                for port in eps.get("ports") or []:
                    labels = {
                        **per_endpoint,
                        "__meta_kubernetes_endpointslice_port": str(port["port"]),
                        "__meta_kubernetes_endpointslice_port_name": port.get("name", ""),
                        "__meta_kubernetes_endpointslice_port_protocol": port.get("protocol", "TCP"),
                    }
                    if pod:
                        labels.update(_pod_meta(pod))
                        for container in pod["spec"].get("containers", []):
                            for cport in container.get("ports") or []:
                                if cport["containerPort"] == port["port"]:
                                    labels.update({**_container_meta(container, False), **_port_meta(cport)})
                    groups.append({"targets": [f"{address}:{port['port']}"], "labels": labels})
    return groups


class KubernetesDiscovery:
    """STAND-IN for Prometheus's Kubernetes SD (see above): an HTTP SD on 127.0.0.1 reading the API
    server with the admin kubeconfig through the cluster's kubectl at every refresh."""

    def __init__(self, kubectl: Path, kubeconfig: Path) -> None:
        import http.server
        import threading

        self.kubectl, self.kubeconfig = kubectl, kubeconfig
        discovery = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                url = urllib.parse.urlsplit(self.path)
                query = urllib.parse.parse_qs(url.query)
                namespaces = [n for n in query.get("namespaces", [""])[0].split(",") if n]
                try:
                    body, status = json.dumps(discovery.targets(url.path.strip("/"), namespaces)).encode(), 200
                except (AssertionError, KeyError, ValueError) as exc:
                    body, status = str(exc).encode(), 500
                with contextlib.suppress(BrokenPipeError, ConnectionResetError):  # a Prometheus stopping
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)

            def log_message(self, *args: object) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, name="kubernetes-sd-standin", daemon=True)
        self.thread.start()
        self.base = f"http://127.0.0.1:{self.server.server_address[1]}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join()

    def _list(self, resource: str, namespaces: Sequence[str]) -> list[dict[str, Any]]:
        scopes = [["-n", n] for n in namespaces] or [["--all-namespaces"]]
        items = []
        for scope in scopes:
            done = subprocess.run(
                [str(self.kubectl), f"--kubeconfig={self.kubeconfig}", "get", resource, *scope, "-o", "json"],
                capture_output=True,
                text=True,
                timeout=60,
                check=False,
            )
            assert done.returncode == 0, done.stderr
            items += json.loads(done.stdout)["items"]
        return items

    def targets(self, role: str, namespaces: Sequence[str]) -> list[dict[str, Any]]:
        pods = self._list("pods", namespaces)
        if role == "pod":
            return pod_targets(pods)
        if role == "endpointslice":
            slices = self._list("endpointslices.discovery.k8s.io", namespaces)
            return endpointslice_targets(slices, self._list("services", namespaces), pods)
        raise ValueError(f"no role {role!r} in the stand-in")

    def through_standin(self, job: Mapping[str, Any]) -> dict[str, Any]:
        """``job`` with its kubernetes_sd_configs served by this stand-in (http_sd_configs)."""
        out = dict(job)
        sds = out.pop("kubernetes_sd_configs", [])
        if not sds:
            return out
        out["http_sd_configs"] = [
            {
                "url": f"{self.base}/{sd['role']}?"
                + urllib.parse.urlencode({"namespaces": ",".join(sd.get("namespaces", {}).get("names", []))}),
                "refresh_interval": "5s",
            }
            for sd in sds
        ]
        return out


# --- Prometheus --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Prometheus:
    base: str
    process: Detached

    def api(self, path: str, **params: str) -> Any:
        url = f"{self.base}/api/v1/{path}?" + urllib.parse.urlencode(params)
        with urllib.request.urlopen(url, timeout=20) as response:
            body = json.load(response)
        assert body["status"] == "success", body
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        return list(self.api("query", query=expr)["result"])

    def targets(self, job: str) -> list[dict[str, Any]]:
        return [t for t in self.api("targets", state="active")["activeTargets"] if t["labels"].get("job") == job]

    def alerts(self, name: str) -> list[dict[str, Any]]:
        return [a for a in self.api("alerts")["alerts"] if a["labels"]["alertname"] == name]

    def rule_health(self) -> dict[str, str]:
        """Every rule's health after its last evaluation (``ok``; ``err`` with lastError)."""
        found = {}
        for group in self.api("rules")["groups"]:
            for rule in group["rules"]:
                found[rule["name"]] = (
                    rule["health"] if rule["health"] == "ok" else f"{rule['health']}: {rule.get('lastError')}"
                )
        return found


@contextlib.contextmanager
def prometheus(
    work: Path,
    scrape_configs: Sequence[Mapping[str, Any]],
    *,
    discovery: KubernetesDiscovery | None = None,
    rule_groups: Sequence[Mapping[str, Any]] = (),
    interval: str = "5s",
    port: int | None = None,
) -> Iterator[Prometheus]:
    """Debian's Prometheus on 127.0.0.1 (on ``port``, or a free one) with these jobs, their Kubernetes
    discovery through the stand-in (and these rule groups, as one rule file). The same ``work`` and
    ``port`` start it again on its stored history."""
    work.mkdir(parents=True, exist_ok=True)
    config: dict[str, Any] = {
        "global": {"scrape_interval": interval, "evaluation_interval": interval},
        "scrape_configs": [discovery.through_standin(job) if discovery else job for job in scrape_configs],
    }
    if rule_groups:
        rules = work / "rules.yaml"
        rules.write_text(yaml.safe_dump({"groups": list(rule_groups)}, sort_keys=False))
        config["rule_files"] = [str(rules)]
    (work / "prometheus.yml").write_text(yaml.safe_dump(config, sort_keys=False))
    checked = subprocess.run(
        ["promtool", "check", "config", str(work / "prometheus.yml")], capture_output=True, text=True, timeout=120
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    web = f"127.0.0.1:{port or free_port()}"
    argv = [
        "prometheus",
        f"--config.file={work / 'prometheus.yml'}",
        f"--storage.tsdb.path={work / 'tsdb'}",
        f"--web.listen-address={web}",
        "--log.level=warn",
    ]
    process = Detached.start(argv, work / "prometheus.log")
    try:
        wait_until(lambda: http_ok(f"http://{web}/-/ready") or not process.alive(), timeout=120, interval=0.5)
        assert process.alive(), process.log.read_text()[-2000:]
        yield Prometheus(f"http://{web}", process)
    finally:
        process.stop()


def wait_for(what: str, probe: Any, *, timeout: float, interval: float = 1.0) -> Any:
    """``wait_until`` with a message that says what did not happen."""
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout:.0f} s: {what}")
        time.sleep(interval)
