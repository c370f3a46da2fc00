"""The gpuzombie chart on the real cluster (issue 33 item 4): ``helm install`` with the real helm, every
object accepted by the real API server (the prometheus-operator objects against the operator's CRD
schemas, strictly); the DaemonSet's pod running on the node; its exporter naming real pods through
the kubelet's PodResources socket and the containerd CRI; Debian's Prometheus scraping it as the
chart's annotations, ServiceMonitor and PodMonitor say; kube-state-metrics built from its Go module
beside it; the Terminating-waste recording rules and the handover alert evaluated on real objects.

STAND-INS, named where they are made: the node has no GPU, so its status is given an extended
resource ``gpuzombie.dev/standin-gpu`` (the Kubernetes docs' "Advertise Extended Resources for a
Node"), the exporter reads NVML from a JSON snapshot (``--nvml-replay``) that lists the real host pid
of a real pod's process as the GPU's holder, and the preflight gate reads another
(``--nvml-standin``). Everything else is real: the API server, the kubelet, containerd, the pods and
their processes, kube-state-metrics, Prometheus, the chart's rules."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import os
import re
import subprocess
import time
import urllib.request
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("yaml", reason="PyYAML is in the 'chart' extra")

import yaml

from gpuzombie.gpu.nvml import GpuDevice, GpuProcess, GpuSnapshot
from gpuzombie.lab.handover import STANDIN_RESERVED, STANDIN_TOTAL, STANDIN_UUID, gated, with_standin
from gpuzombie.units import MIB
from kube import monitoring
from kube.conftest import Kube
from kube.monitoring import wait_for

pytestmark = pytest.mark.timeout(1800)  # a cold kube-state-metrics build takes minutes

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "gpuzombie"
ALERTS = CHART / "files" / "gpuzombie-alerts.yaml"
RELEASE = "gpuzombie"
NAMESPACE = "gpuzombie-agent"
"""Not tests/kube/chart.py's "gpuzombie", where the session's webhook fixture may be running."""
WORKLOADS = "ml-chart"
NODE = "gpuzombie-node"
BUSYBOX = "localhost/gpuzombie/busybox:static"
STANDIN_GPU = "gpuzombie.dev/standin-gpu"
"""STAND-IN for nvidia.com/gpu: an extended resource patched into the node's status (2 of them). A
name of its own: conftest's ``gpus`` stand-in is nvidia.com/gpu, which the session's webhook and
policy would patch (tini as PID 1) and whose teardown removes it."""
GIB = 1024 * MIB
HELD = 2 * GIB
"""What the stand-in NVML says the holder pod's process holds."""
HOLDER_GRACE_S = 20
SCRAPE_S = 5
INSTALL_TIMEOUT_S = 300
"""helm install --wait: 7.5-8.5 s here (the node image imported, no pull)."""
SCAN_WAIT_S = 120
"""The exporter rescans at most every 15 s (the chart's minIntervalSeconds) and scrapes come every 5 s."""


# --- the cluster, through the built kubectl and the real helm -------------------------------------


@dataclasses.dataclass(frozen=True)
class Cluster:
    kube: Kube
    helm: str

    def kubectl(self, *args: str, stdin: str | None = None, check: bool = True) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(
            [str(self.kube.root / "bin" / "kubectl"), *args],
            input=stdin,
            env=self.kube.env,
            capture_output=True,
            text=True,
            timeout=180,
            check=False,
        )
        if check:
            assert done.returncode == 0, f"kubectl {' '.join(args)}: {done.stderr[-2000:]}"
        return done

    def get(self, *args: str) -> Any:
        return json.loads(self.kubectl("get", *args, "-o", "json").stdout)

    def apply(self, *objects: Mapping[str, Any]) -> None:
        body = json.dumps({"apiVersion": "v1", "kind": "List", "items": list(objects)})
        self.kubectl("apply", "--server-side", "--field-manager=gpuzombie-tests", "-f", "-", stdin=body)

    def helm_run(
        self, *args: str, values: Mapping[str, Any] | None = None, check: bool = True
    ) -> subprocess.CompletedProcess[str]:
        with contextlib.ExitStack() as stack:
            argv = [self.helm, *args]
            if values is not None:
                path = stack.enter_context(_values_file(values))
                argv += ["--values", path]
            done = subprocess.run(
                argv, env=self.kube.env, capture_output=True, text=True, timeout=INSTALL_TIMEOUT_S + 60
            )
        if check:
            assert done.returncode == 0, f"helm {' '.join(args)}: {done.stderr[-2000:]}"
        return done


@contextlib.contextmanager
def _values_file(values: Mapping[str, Any]) -> Iterator[str]:
    import tempfile

    with tempfile.NamedTemporaryFile("w", suffix=".yaml") as f:
        json.dump(values, f)
        f.flush()
        yield f.name


def chart_values(kube: Kube) -> dict[str, Any]:
    """The chart's defaults but for what this node puts elsewhere (the CRI and PodResources sockets
    under the cluster's directory), with the operator objects and the NetworkPolicy on (every object
    the exporter side can render; a ServiceMonitor, the PodMonitor is checked on its own: one or the
    other), and a 5 s scrape interval."""
    return {
        "exporter": {
            "cri": {"socket": str(kube.root / "containerd" / "containerd.sock")},
            "podResourcesDir": str(kube.root / "kubelet" / "pod-resources"),
        },
        "serviceMonitor": {"enabled": True, "interval": f"{SCRAPE_S}s", "scrapeTimeout": f"{SCRAPE_S}s"},
        "prometheusRule": {"enabled": True},
        "networkPolicy": {"enabled": True},
    }


@dataclasses.dataclass(frozen=True)
class Release:
    cluster: Cluster
    values: dict[str, Any]
    install_s: float
    manifest: list[dict[str, Any]]

    def pod(self) -> dict[str, Any]:
        """The DaemonSet's one pod (the newest, during an update's overlap)."""
        pods = self.cluster.get("pods", "-n", NAMESPACE, "-l", f"app.kubernetes.io/name={RELEASE}")["items"]
        live = [p for p in pods if not p["metadata"].get("deletionTimestamp")]
        assert live, "no node agent pod"
        return max(live, key=lambda p: p["metadata"]["creationTimestamp"])

    def metrics(self) -> str:
        ip = self.pod()["status"]["podIP"]
        with urllib.request.urlopen(f"http://{ip}:9844/metrics", timeout=20) as response:
            return str(response.read().decode())


def helm_binary() -> str:
    got = subprocess.run([str(REPO / "scripts" / "get-helm.sh")], capture_output=True, text=True, timeout=600)
    if got.returncode != 0:
        if os.environ.get("CI"):
            pytest.fail(f"scripts/get-helm.sh: {got.stderr.strip()}")
        pytest.skip(f"scripts/get-helm.sh: {got.stderr.strip()}")
    return got.stdout.strip()


def _patch_standin_gpus(cluster: Cluster, count: str | None) -> None:
    body = json.dumps({"status": {"capacity": {STANDIN_GPU: count}}})
    cluster.kubectl("patch", "node", NODE, "--subresource=status", "--type=merge", "-p", body)


@pytest.fixture(scope="module")
def release(kube: Kube, node_image: str) -> Iterator[Release]:
    cluster = Cluster(kube, helm_binary())
    cluster.apply(*monitoring.operator_crds())
    cluster.kubectl(
        "wait",
        "--for=condition=Established",
        "--timeout=120s",
        *[f"crd/{plural}.monitoring.coreos.com" for plural in monitoring.OPERATOR_CRDS.values()],
    )
    for namespace in (NAMESPACE, WORKLOADS):
        cluster.kubectl("create", "namespace", namespace)
    # docs/cluster.md: the agent's namespace must allow Pod Security level privileged.
    cluster.kubectl("label", "namespace", NAMESPACE, "pod-security.kubernetes.io/enforce=privileged")
    cluster.kubectl("label", "node", NODE, "nvidia.com/gpu.present=true")  # what GPU feature discovery sets
    _patch_standin_gpus(cluster, "2")
    values = chart_values(kube)
    try:
        began = time.monotonic()
        cluster.helm_run(
            "install", RELEASE, str(CHART), "-n", NAMESPACE, "--wait", f"--timeout={INSTALL_TIMEOUT_S}s", values=values
        )
        install_s = time.monotonic() - began
        manifest = cluster.helm_run("get", "manifest", RELEASE, "-n", NAMESPACE).stdout
        yield Release(cluster, values, install_s, [d for d in yaml.safe_load_all(manifest) if d])
    finally:
        cluster.helm_run("uninstall", RELEASE, "-n", NAMESPACE, "--wait", "--timeout=120s", check=False)
        for namespace in (WORKLOADS, NAMESPACE):
            cluster.kubectl("delete", "namespace", namespace, "--wait=true", "--timeout=180s", check=False)
        cluster.kubectl("label", "node", NODE, "nvidia.com/gpu.present-", check=False)
        _patch_standin_gpus(cluster, None)
        for plural in monitoring.OPERATOR_CRDS.values():
            cluster.kubectl("delete", "crd", f"{plural}.monitoring.coreos.com", check=False)


def _pod(name: str, command: str, *, grace: int = 2, resources: Mapping[str, Any] | None = None) -> dict[str, Any]:
    container: dict[str, Any] = {"name": "c", "image": BUSYBOX, "command": ["/bin/sh", "-c", command]}
    if resources:
        container["resources"] = dict(resources)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": WORKLOADS},
        "spec": {"terminationGracePeriodSeconds": grace, "containers": [container]},
    }


@pytest.fixture(scope="module")
def zombie_pod(release: Release) -> dict[str, Any]:
    """A workload pod whose PID 1 (sleep) never reaps: its first child is a zombie from the start."""
    release.cluster.apply(_pod("zombie-maker", "sleep 1 & exec sleep 3600"))
    release.cluster.kubectl("wait", "-n", WORKLOADS, "--for=condition=Ready", "pod/zombie-maker", "--timeout=180s")
    return release.cluster.get("pod", "-n", WORKLOADS, "zombie-maker")


@pytest.fixture(scope="module")
def discovery(release: Release) -> Iterator[monitoring.KubernetesDiscovery]:
    """STAND-IN for Prometheus's Kubernetes SD, which Debian's Prometheus lacks (tests/kube/monitoring.py)."""
    sd = monitoring.KubernetesDiscovery(release.cluster.kube.root / "bin" / "kubectl", release.cluster.kube.kubeconfig)
    try:
        yield sd
    finally:
        sd.close()


def samples(exposition: str, name: str) -> list[tuple[dict[str, str], float]]:
    found = []
    for line in exposition.splitlines():
        match = re.fullmatch(rf"{name}(?:\{{(.*)\}})? (\S+)", line)
        if match:
            labels = dict(re.findall(r'(\w+)="((?:[^"\\]|\\.)*)"', match.group(1) or ""))
            found.append((labels, float(match.group(2))))
    return found


# --- install ----------------------------------------------------------------------------------------


def test_helm_install_every_object_accepted_by_the_api_server(release: Release) -> None:
    cluster = release.cluster
    print(f"helm install --wait: {release.install_s:.1f} s")
    kinds = sorted(o["kind"] for o in release.manifest)
    assert kinds == [
        "ConfigMap",
        "DaemonSet",
        "NetworkPolicy",
        "PrometheusRule",
        "Service",
        "ServiceMonitor",
    ], kinds
    for obj in release.manifest:
        stored = cluster.get(obj["kind"].lower(), "-n", NAMESPACE, obj["metadata"]["name"])
        assert stored["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "Helm"
    # Strictly: every field known to the API server's schemas (the operator's CRDs included).
    body = yaml.safe_dump_all(release.manifest)
    done = cluster.kubectl(
        "apply",
        "--server-side",
        "--force-conflicts",
        "--dry-run=server",
        "--validate=strict",
        "--field-manager=strict-check",
        "-f",
        "-",
        stdin=body,
    )
    assert "Warning" not in done.stderr, done.stderr
    # Nothing pruned: the PrometheusRule as stored is the rule file (the CRD's schema kept every field).
    stored = cluster.get("prometheusrule", "-n", NAMESPACE, RELEASE)
    assert stored["spec"]["groups"] == yaml.safe_load(ALERTS.read_text())["groups"]
    # The PodMonitor (the other choice to the ServiceMonitor) is accepted as strictly.
    pod_monitor = _rendered(release, pod_monitor_values(release))
    stored_pm = _server_dry_run(cluster, pod_monitor["PodMonitor"])
    assert stored_pm["spec"] == pod_monitor["PodMonitor"]["spec"]


def pod_monitor_values(release: Release) -> dict[str, Any]:
    """The release's values with the PodMonitor instead of the ServiceMonitor (one or the other)."""
    scrape = {"interval": f"{SCRAPE_S}s", "scrapeTimeout": f"{SCRAPE_S}s"}
    return {**release.values, "serviceMonitor": {"enabled": False}, "podMonitor": {"enabled": True, **scrape}}


def _rendered(release: Release, values: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    out = release.cluster.helm_run("template", RELEASE, str(CHART), "-n", NAMESPACE, values=values).stdout
    return {d["kind"]: d for d in yaml.safe_load_all(out) if d}


def _server_dry_run(cluster: Cluster, obj: Mapping[str, Any]) -> dict[str, Any]:
    """The object as the API server would store it (server-side apply, strict, not persisted)."""
    done = cluster.kubectl(
        "apply",
        "--server-side",
        "--dry-run=server",
        "--validate=strict",
        "--field-manager=strict-check",
        "-o",
        "json",
        "-f",
        "-",
        stdin=json.dumps(obj),
    )
    return dict(json.loads(done.stdout))


def test_the_daemonsets_pod_runs_on_the_node(release: Release) -> None:
    cluster = release.cluster
    ds = cluster.get("daemonset", "-n", NAMESPACE, RELEASE)
    status = ds["status"]
    assert status["desiredNumberScheduled"] == status["numberReady"] == status["numberAvailable"] == 1
    pod = release.pod()
    assert pod["spec"]["nodeName"] == NODE and pod["spec"]["hostPID"] is True
    conditions = {c["type"]: c["status"] for c in pod["status"]["conditions"]}
    assert conditions["Ready"] == "True"  # its startup and readiness probes passed: a scan read the node
    (container,) = pod["status"]["containerStatuses"]
    assert container["restartCount"] == 0 and container["image"].endswith("gpu-zombie/gpuzombie-node:0.1.0")
    logs = cluster.kubectl("logs", "-n", NAMESPACE, pod["metadata"]["name"]).stdout
    ip = pod["status"]["podIP"]
    assert f"serving http://{ip}:9844/metrics and http://127.0.0.1:9844/metrics" in logs, logs
    # The NOTES' check: port-forward reaches the pod's loopback listener through the kubelet and containerd.
    port = monitoring.free_port()
    forward = subprocess.Popen(
        [str(cluster.kube.root / "bin" / "kubectl"), "port-forward", "-n", NAMESPACE, f"ds/{RELEASE}", f"{port}:9844"],
        env=cluster.kube.env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert forward.stdout is not None
        assert "Forwarding from 127.0.0.1" in forward.stdout.readline()
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=20) as response:
            body = response.read().decode()
        assert samples(body, "gpuzombie_scan_success") == [({}, 1.0)]
    finally:
        forward.terminate()
        forward.wait(10)


def test_the_exporter_names_real_pods_through_the_cri_and_podresources(
    release: Release, zombie_pod: dict[str, Any]
) -> None:
    uid = zombie_pod["metadata"]["uid"]

    def zombie_series() -> list[tuple[dict[str, str], float]]:
        return [s for s in samples(release.metrics(), "gpuzombie_zombies_by_parent") if s[0].get("pod_uid") == uid]

    ((labels, value),) = wait_for("the exporter to name zombie-maker's zombie", zombie_series, timeout=SCAN_WAIT_S)
    # Names from containerd's CRI (pod, namespace, container), the UID from the pod's cgroup.
    assert labels == {
        "namespace": WORKLOADS,
        "pod": "zombie-maker",
        "pod_uid": uid,
        "container": "c",
        "parent": "sleep",
        "parent_is_pid1": "true",
    }
    assert value == 1

    # Both dirty-GPU checks could be made: the runtime listed its pods and the kubelet's PodResources
    # answered (a stale verdict needs both to agree; a foreign one needs PodResources). A scan while
    # the kubelet runs a pod the runtime has no sandbox of yet (one starting) cannot judge stale.
    def checks() -> dict[str, float]:
        return {labels["kind"]: v for labels, v in samples(release.metrics(), "gpuzombie_dirty_gpu_check")}

    wait_for("both dirty-GPU checks made", lambda: checks() == {"stale": 1.0, "foreign": 1.0}, timeout=SCAN_WAIT_S)
    body = release.metrics()
    assert samples(body, "gpuzombie_scan_success") == [({}, 1.0)]
    pid1 = [labels for labels, _ in samples(body, "gpuzombie_pid1_info") if labels["pod_uid"] == uid]
    assert pid1 and pid1[0]["program"] == "sleep" and pid1[0]["kind"] == "non_forking"


# --- Prometheus, as the chart says to scrape it --------------------------------------------------------


def test_prometheus_scrapes_it_as_the_annotations_servicemonitor_and_podmonitor_say(
    release: Release, zombie_pod: dict[str, Any], discovery: monitoring.KubernetesDiscovery, tmp_path: Path
) -> None:
    cluster = release.cluster
    kubeconfig = cluster.kube.kubeconfig
    service_monitor = cluster.get("servicemonitor", "-n", NAMESPACE, RELEASE)
    pod_monitor = _server_dry_run(
        cluster,
        _rendered(release, pod_monitor_values(release))["PodMonitor"],
    )
    jobs = [
        monitoring.annotation_job(kubeconfig),
        monitoring.service_monitor_job(service_monitor, kubeconfig),
        monitoring.pod_monitor_job(pod_monitor, kubeconfig),
    ]
    uid = zombie_pod["metadata"]["uid"]
    ip = release.pod()["status"]["podIP"]
    for number, job in enumerate(jobs):  # one Prometheus each: two jobs named gpuzombie would collide
        name = job["job_name"]
        job_label = "gpuzombie" if name.startswith(("serviceMonitor/", "podMonitor/")) else name
        with monitoring.prometheus(tmp_path / f"prometheus-{number}", [job], discovery=discovery) as prom:
            (series,) = wait_for(
                f"{name} to scrape zombie-maker's zombie",
                functools.partial(prom.query, f'gpuzombie_zombies_by_parent{{job="{job_label}",pod_uid="{uid}"}}'),
                timeout=SCAN_WAIT_S,
            )
            (target,) = prom.api("targets", state="active")["activeTargets"]
            assert (target["health"], target["scrapeUrl"]) == ("up", f"http://{ip}:9844/metrics"), target
            # honor_labels: the exporter's namespace/pod (the workload's) win over the agent's own.
            labels = series["metric"]
            assert (labels["namespace"], labels["pod"], labels["container"]) == (WORKLOADS, "zombie-maker", "c")
            assert labels["node"] == NODE, labels  # the relabeling every pod alert joins on
            (up,) = prom.query(f'up{{job="{job_label}"}}')
            if job_label == "gpuzombie":
                # The operator's jobs: job from the jobLabel, its own target labels dropped.
                assert set(up["metric"]) == {"__name__", "instance", "job", "node"}, up["metric"]
            else:
                # The annotation job's target labels name the agent's pod (the exporter's labels win).
                assert (up["metric"]["namespace"], up["metric"]["node"]) == (NAMESPACE, NODE), up["metric"]
            served = prom.query(f'{{job="{job_label}"}}')
            print(f"{name}: up, {len(served)} series")


# --- kube-state-metrics ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def ksm(release: Release, tmp_path_factory: pytest.TempPathFactory) -> Iterator[monitoring.KubeStateMetrics]:
    binary = monitoring.kube_state_metrics_binary()
    work = tmp_path_factory.mktemp("ksm")
    with monitoring.kube_state_metrics(binary, release.cluster.kube.kubeconfig, work) as running:
        yield running


def test_kube_state_metrics_built_from_its_module_runs_beside_the_exporter(
    release: Release,
    zombie_pod: dict[str, Any],
    ksm: monitoring.KubeStateMetrics,
    discovery: monitoring.KubernetesDiscovery,
    tmp_path: Path,
) -> None:
    service_monitor = release.cluster.get("servicemonitor", "-n", NAMESPACE, RELEASE)
    jobs = [
        monitoring.kube_state_metrics_job(ksm.address),
        monitoring.service_monitor_job(service_monitor, release.cluster.kube.kubeconfig),
    ]
    with monitoring.prometheus(tmp_path / "prometheus", jobs, discovery=discovery) as prom:
        ready = wait_for(
            "kube-state-metrics' DaemonSet series",
            lambda: prom.query(f'kube_daemonset_status_number_ready{{namespace="{NAMESPACE}",daemonset="{RELEASE}"}}'),
            timeout=SCAN_WAIT_S,
        )
        assert ready[0]["value"][1] == "1"
        # Its pod series carry the pods' own labels (honor_labels) and join the exporter's on uid.
        uid = zombie_pod["metadata"]["uid"]
        joined = wait_for(
            "kube_pod_info joined with the exporter's series on uid = pod_uid",
            lambda: prom.query(
                "gpuzombie_zombies_by_parent * on (pod_uid) group_left (node) "
                f'label_replace(kube_pod_info{{uid="{uid}",node="{NODE}"}}, "pod_uid", "$1", "uid", "(.+)")'
            ),
            timeout=SCAN_WAIT_S,
        )
        assert [(s["metric"]["namespace"], s["metric"]["pod"]) for s in joined] == [(WORKLOADS, "zombie-maker")]
    with urllib.request.urlopen(f"http://{ksm.telemetry}/metrics", timeout=20) as response:
        ((build, _),) = samples(response.read().decode(), "kube_state_metrics_build_info")
    assert build["version"] == "v2.20.0" and build["client_go_version"] == "v0.36.3", build


# --- the stand-in GPU: a Terminating pod that holds it, a pod waiting in its gate -----------------------


def standin_snapshot(processes: tuple[GpuProcess, ...]) -> dict[str, Any]:
    """STAND-IN NVML: one GPU (an H200's size and reservation) with HELD in use beyond the driver's
    reservation, listed against ``processes``."""
    used = STANDIN_RESERVED + HELD
    device = GpuDevice(
        index=0,
        uuid=STANDIN_UUID,
        name="stand-in GPU",
        memory_total=STANDIN_TOTAL,
        memory_used=used,
        memory_free=STANDIN_TOTAL - used,
        memory_reserved=STANDIN_RESERVED,
        processes=processes,
    )
    return dataclasses.asdict(GpuSnapshot(available=True, driver_version="stand-in", devices=(device,)))


def _renamed_resource(value: Any, old: str, new: str) -> Any:
    if isinstance(value, dict):
        return {(new if k == old else k): _renamed_resource(v, old, new) for k, v in value.items()}
    if isinstance(value, list):
        return [_renamed_resource(v, old, new) for v in value]
    return value


def gated_pod(gate_dir: Path) -> dict[str, Any]:
    """A GPU pod as a team writes it, patched by the webhook's own mutation with --preflight (the gate
    first among its init containers); then the stand-in's changes: the gate reads the stand-in NVML
    in ``gate_dir``, and nvidia.com/gpu is the node's stand-in resource."""
    team = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "gated", "namespace": WORKLOADS},
        "spec": {
            "terminationGracePeriodSeconds": 2,
            "containers": [
                {
                    "name": "train",
                    "image": BUSYBOX,
                    "command": ["sleep", "3600"],
                    "resources": {"limits": {"nvidia.com/gpu": 1}},
                }
            ],
        },
    }
    return dict(_renamed_resource(with_standin(gated(team), str(gate_dir)), "nvidia.com/gpu", STANDIN_GPU))


def pod_processes(uid: str) -> list[int]:
    """Host pids of the processes in the pod's cgroup (the kubelet's cgroupfs names it pod<uid>)."""
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        with contextlib.suppress(OSError):
            if f"/pod{uid}/" in Path(f"/proc/{pid}/cgroup").read_text():
                found.append(int(pid))
    return found


@dataclasses.dataclass(frozen=True)
class Stuck:
    """A process moved into a frozen cgroup of its own below its container's: in state D, a SIGKILL
    pending until it is thawed, as a GPU holder stuck in the driver is, as far as the kubelet and the
    exporter can tell. (Freezing the container's own cgroup would not do: runc freezes, signals and
    thaws it to deliver the kubelet's SIGKILL; a child cgroup frozen by itself stays frozen.)"""

    pid: int
    cgroup: Path
    frozen: str
    thawed: str

    @classmethod
    def freeze(cls, pid: int) -> Stuck:
        lines = Path(f"/proc/{pid}/cgroup").read_text().splitlines()
        v1 = [line.split(":", 2)[2] for line in lines if line.split(":", 2)[1] == "freezer"]
        if v1:  # these machines: cgroup v1 controllers
            stuck = cls(pid, Path("/sys/fs/cgroup/freezer" + v1[0]) / "stuck", "FROZEN", "THAWED")
        else:
            v2 = next(line.split(":", 2)[2] for line in lines if line.startswith("0::"))
            stuck = cls(pid, Path("/sys/fs/cgroup" + v2) / "stuck", "1", "0")
        stuck.cgroup.mkdir()
        (stuck.cgroup / "cgroup.procs").write_text(str(pid))
        stuck.state.write_text(stuck.frozen)
        return stuck

    @property
    def state(self) -> Path:
        return self.cgroup / ("freezer.state" if self.frozen == "FROZEN" else "cgroup.freeze")

    def thaw(self) -> None:
        """Thawed, its pending SIGKILL ends it; then the cgroup is removed (its parent's removal by
        the runtime needs that)."""
        with contextlib.suppress(OSError):
            self.state.write_text(self.thawed)
        with contextlib.suppress(AssertionError):
            wait_for(
                "the stuck process to end", lambda: not Path(f"/proc/{self.pid}").exists(), timeout=30, interval=0.2
            )
        with contextlib.suppress(OSError):
            self.cgroup.rmdir()


@dataclasses.dataclass(frozen=True)
class Standin:
    cluster: Cluster
    prom: monitoring.Prometheus
    holder: dict[str, Any]
    holder_pid: int
    stuck: list[Stuck]
    gated: dict[str, Any]
    upgrade_s: float


@pytest.fixture(scope="module")
def standin(
    release: Release,
    ksm: monitoring.KubeStateMetrics,
    discovery: monitoring.KubernetesDiscovery,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Standin]:
    """The holder pod (PID 1 ``sleep``, which drops SIGTERM, on one stand-in GPU) and the gated pod,
    the exporter upgraded to read the stand-in NVML listing the holder's process, and a Prometheus
    with the rules of the PrometheusRule as the API server stores it, scraping the exporter as the
    ServiceMonitor says and kube-state-metrics."""
    cluster = release.cluster
    work = tmp_path_factory.mktemp("standin")
    gate_dir = work / "gate"
    gate_dir.mkdir(mode=0o755)
    gate_file = gate_dir / "nvml.json"
    gate_file.write_text(json.dumps(standin_snapshot(())))  # the gate sees the memory, not the holder
    gate_file.chmod(0o644)
    holder = _pod("gpu-holder", "exec sleep 3600", grace=HOLDER_GRACE_S, resources={"limits": {STANDIN_GPU: "1"}})
    cluster.apply(holder)
    cluster.kubectl("wait", "-n", WORKLOADS, "--for=condition=Ready", "pod/gpu-holder", "--timeout=180s")
    holder = cluster.get("pod", "-n", WORKLOADS, "gpu-holder")
    (pid,) = [p for p in pod_processes(holder["metadata"]["uid"]) if Path(f"/proc/{p}/comm").read_text() == "sleep\n"]
    stuck: list[Stuck] = []  # the test freezes the holder; thawed here whatever happens
    replay = Path(release.values["exporter"]["podResourcesDir"]) / "gpuzombie-nvml-standin.json"
    replay.write_text(
        json.dumps(standin_snapshot((GpuProcess(pid=pid, used_memory=HELD, kind="compute", name="sleep"),)))
    )
    gated_doc = gated_pod(gate_dir)
    cluster.apply(gated_doc)
    rules = cluster.get("prometheusrule", "-n", NAMESPACE, RELEASE)["spec"]["groups"]
    jobs = [
        monitoring.service_monitor_job(
            cluster.get("servicemonitor", "-n", NAMESPACE, RELEASE), cluster.kube.kubeconfig
        ),
        monitoring.kube_state_metrics_job(ksm.address),
    ]
    try:
        with monitoring.prometheus(work / "prometheus", jobs, discovery=discovery, rule_groups=rules) as prom:
            began = time.monotonic()
            # The exporter reads the stand-in from the kubelet's pod-resources directory, which the chart mounts.
            cluster.helm_run(
                "upgrade",
                RELEASE,
                str(CHART),
                "-n",
                NAMESPACE,
                "--reuse-values",
                "--wait",
                f"--timeout={INSTALL_TIMEOUT_S}s",
                values={"exporter": {"extraArgs": ["--nvml-replay", str(replay)]}},
            )
            upgrade_s = time.monotonic() - began
            wait_for(
                "the holder's GPU memory in Prometheus",
                lambda: prom.query(f'gpuzombie_gpu_process_memory_bytes{{pod="gpu-holder",namespace="{WORKLOADS}"}}'),
                timeout=SCAN_WAIT_S,
            )
            yield Standin(cluster, prom, holder, pid, stuck, cluster.get("pod", "-n", WORKLOADS, "gated"), upgrade_s)
    finally:
        for process in stuck:
            process.thaw()
        for name in ("gpu-holder", "gated"):
            cluster.kubectl("delete", "pod", "-n", WORKLOADS, name, "--grace-period=0", "--force", check=False)
        replay.unlink(missing_ok=True)


def _value(series: Mapping[str, Any]) -> float:
    return float(series["value"][1])


def test_the_handover_alert_on_real_objects(standin: Standin) -> None:
    prom = standin.prom
    print(f"helm upgrade --reuse-values (the stand-in NVML) --wait: {standin.upgrade_s:.1f} s")
    # kube-state-metrics: the gate has not passed, and its requests name the node.
    (ready,) = wait_for(
        "the gate's readiness series",
        lambda: prom.query('kube_pod_init_container_status_ready{pod="gated",container="gpuzombie-preflight"}'),
        timeout=SCAN_WAIT_S,
    )
    assert _value(ready) == 0
    (waiting,) = wait_for(
        "gpuzombie:preflight_waiting_pods", lambda: prom.query("gpuzombie:preflight_waiting_pods"), timeout=SCAN_WAIT_S
    )
    assert waiting["metric"]["node"] == NODE and _value(waiting) >= 1  # gated (another module's may wait too)
    # The exporter: the stand-in GPU is not clean, and memory is held on it.
    (clean,) = prom.query(f'gpuzombie_gpu_handover_clean{{UUID="{STANDIN_UUID}"}}')
    assert _value(clean) == 0
    held = {
        s["metric"]["holder"]: _value(s)
        for s in prom.query(f'gpuzombie_gpu_held_memory_bytes{{UUID="{STANDIN_UUID}"}}')
    }
    print(f"held memory by holder: {held}")
    assert sum(held.values()) >= HELD
    (alert,) = wait_for(
        "GpuzombieDirtyGpuBlocksPreflight to be active",
        lambda: standin.prom.alerts("GpuzombieDirtyGpuBlocksPreflight"),
        timeout=SCAN_WAIT_S,
    )
    assert alert["state"] == "pending"  # for: 10m; pending is the expression true on these objects
    assert {k: alert["labels"][k] for k in ("node", "gpu", "UUID")} == {"node": NODE, "gpu": "0", "UUID": STANDIN_UUID}
    assert float(alert["value"]) == _value(waiting)
    assert f"{_value(waiting):.0f} pod(s) on that node wait" in alert["annotations"]["description"], alert
    # The pod itself waits in its gate, its workload not started.
    pod = standin.cluster.get("pod", "-n", WORKLOADS, "gated")
    (gate,) = [s for s in pod["status"]["initContainerStatuses"] if s["name"] == "gpuzombie-preflight"]
    assert gate["ready"] is False
    assert all("running" not in s["state"] for s in pod["status"].get("containerStatuses", []))
    assert all(h == "ok" for h in prom.rule_health().values()), prom.rule_health()


def _time(stamp: str) -> float:
    import datetime

    return datetime.datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()


def test_the_terminating_waste_rules_on_real_objects(standin: Standin) -> None:
    """The holder's process frozen (state D: the kubelet's SIGKILL cannot end it), the pod deleted:
    kube-state-metrics' deletion timestamp joins the exporter's GPU series of that very pod."""
    cluster, prom = standin.cluster, standin.prom
    uid = standin.holder["metadata"]["uid"]
    standin.stuck.append(Stuck.freeze(standin.holder_pid))
    requested = time.time()
    cluster.kubectl("delete", "pod", "-n", WORKLOADS, "gpu-holder", "--wait=false")
    meta = cluster.get("pod", "-n", WORKLOADS, "gpu-holder")["metadata"]
    # The API server's deletionTimestamp is the deadline, the request plus the grace: what
    # kube_pod_deletion_timestamp carries (not the time of the request).
    deadline = _time(meta["deletionTimestamp"])
    assert meta["deletionGracePeriodSeconds"] == HOLDER_GRACE_S
    assert abs(deadline - (requested + HOLDER_GRACE_S)) <= 3, (deadline, requested)
    selector = f'{{pod="gpu-holder",namespace="{WORKLOADS}"}}'
    (memory,) = wait_for(
        "gpuzombie:terminating_pod_gpu_memory_bytes",
        lambda: prom.query(f"gpuzombie:terminating_pod_gpu_memory_bytes{selector}"),
        timeout=SCAN_WAIT_S,
    )
    assert _value(memory) == HELD
    assert {k: memory["metric"][k] for k in ("node", "pod_uid", "container")} == {
        "node": NODE,
        "pod_uid": uid,
        "container": "c",
    }
    (past,) = wait_for(
        "gpuzombie:terminating_pod_seconds_past_grace",
        lambda: prom.query(f"gpuzombie:terminating_pod_seconds_past_grace{selector}"),
        timeout=SCAN_WAIT_S,
    )
    at, value = past["value"][0], _value(past)
    assert abs(value - (at - deadline)) <= 2 * SCRAPE_S + 2, (value, at - deadline)  # one evaluation's lag
    # After the grace the kubelet has sent SIGKILL; the frozen holder is still there, in state D.
    wait_for("the grace to run out", lambda: time.time() > deadline + 2 * SCRAPE_S, timeout=HOLDER_GRACE_S + 60)
    assert cluster.get("pod", "-n", WORKLOADS, "gpu-holder")["metadata"]["deletionTimestamp"]
    assert Path(f"/proc/{standin.holder_pid}").exists()
    wait_for(
        "the exporter to see the holder in state D",
        lambda: prom.query(f'gpuzombie_dstate_gpu_holders{{pod_uid="{uid}"}}'),
        timeout=SCAN_WAIT_S,
    )
    gib_s = wait_for(
        "gpuzombie:terminating_pod_gpu_memory_gib_seconds",
        lambda: prom.query(f"gpuzombie:terminating_pod_gpu_memory_gib_seconds{selector} > 0"),
        timeout=SCAN_WAIT_S,
    )
    held_s = time.time() - requested
    # 30 s steps of 2 GiB each since the deletion was seen: at most one step more than the time held.
    assert 0 < _value(gib_s[0]) <= HELD / GIB * (held_s + 30), (_value(gib_s[0]), held_s)
    # The alert: memory held 60 s past the grace; pending from then (for: 2m).
    (alert,) = wait_for(
        "GpuzombieTerminatingPodHoldsGpuMemory to be active",
        lambda: prom.alerts("GpuzombieTerminatingPodHoldsGpuMemory"),
        timeout=60 + HOLDER_GRACE_S + SCAN_WAIT_S,
    )
    active = _time(alert["activeAt"])
    assert active >= deadline + 60, (active, deadline)
    assert {k: alert["labels"][k] for k in ("namespace", "pod", "container", "node")} == {
        "namespace": WORKLOADS,
        "pod": "gpu-holder",
        "container": "c",
        "node": NODE,
    }
    assert "2GiB" in alert["annotations"]["description"], alert["annotations"]
    print(
        f"deleted at +0 s (deadline +{deadline - requested:.1f} s); alert active at +{active - requested:.1f} s; "
        f"{_value(gib_s[0]):.0f} GiB·s recorded at +{held_s:.0f} s"
    )
    assert all(h == "ok" for h in prom.rule_health().values()), prom.rule_health()
