"""`gpuzombie fence` on the real single-node cluster (issue 38): the real API server, kube-scheduler
and kubelet; a real DRA driver without hardware (sigs.k8s.io/dra-example-driver v0.4.0's kubelet
plugin, built from its Go module, go/dra-example-driver: 4 mock GPUs in a ResourceSlice); the dirty
verdict from the real exporter (its NVML replay, the UUIDs the driver published) through Debian's
Prometheus; the fence itself as the real CLI with the chart's ServiceAccount token, so the chart's
RBAC is all it has. The steps of the issue, in order, one test:

1. while a device is fenced, claims get the other devices, and one more stays pending (the
   scheduler's event says why);
2. once the GPU reads clean the rule goes and the device is allocated again;
3. the rule appears within two scrape intervals of the verdict (measured at each new dirty GPU);
4. the limit holds (50 % of the node's 4 devices: 2 of 3 dirty GPUs), and its alert is pending;
   a dry run with the limit raised prints the third rule and creates nothing;
5. Prometheus down changes nothing (nothing lifted, nothing new fenced), one log line, the metric 0;
6. rules made by others (one even with the fence's label and taint key) survive every lift;
7. the fence SIGKILLed and started again leaves exactly the rules the verdicts call for.

STAND-IN: NVML (a replay file: a GPU's memory held with no process, which the exporter calls
ghost). The fence runs on the host, not as the chart's Deployment: pods here cannot reach the API
server (no kube-proxy, the `kubernetes` Service has no endpoints, docs/kubernetes.md)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from gpuzombie.cluster.build import DRA_EXAMPLE_DRIVER, ensure_tool
from gpuzombie.cluster.layout import NODE_NAME, Layout
from kube import chart, monitoring, pods
from kube.api import Api, metric, object_path, wait_for

DRIVER = "gpu.example.com"
DEVICES = 4
NAMESPACE = "fence-test"
SCRAPE_S = 5
INTERVAL_S = 2
CLEAN_EVALUATIONS = 3
MAX_NODE_PERCENT = 50
"""2 of the node's 4 devices."""
RULES = "/apis/resource.k8s.io/v1/devicetaintrules"
HELD = 2 << 30
REPEAT = 3
ALERTS = chart.CHART / "files" / "gpuzombie-fence-alerts.yaml"
DRIVER_BUILD_TIMEOUT_S = 1800
LIFT_TIMEOUT_S = 120
"""A lift needs CLEAN_EVALUATIONS clean points after the exporter's restart (its scrape gap reads as
missing data): 10-20 s here; bounded generously for a loaded machine."""

pytestmark = pytest.mark.timeout(1800 + DRIVER_BUILD_TIMEOUT_S)


def _get(url: str) -> str:
    with urllib.request.urlopen(url, timeout=10) as response:
        return str(response.read().decode())


@dataclass
class Exporter:
    """The real `gpuzombie exporter` on the host with an NVML replay; started again for each verdict."""

    env: dict[str, str]
    work: Path
    uuids: list[str]
    port: int
    process: monitoring.Detached | None = None

    def serve(self, dirty: set[int]) -> float:
        """Serve GPUs ``dirty`` as held by a ghost (2 GiB, no process), the others clean; the
        monotonic time the exporter first answered with the new verdicts."""
        devices = []
        for i, uuid in enumerate(self.uuids):
            used = (1 << 30) + (HELD if i in dirty else 0)
            devices.append(
                {
                    "index": i,
                    "uuid": uuid,
                    "name": "STAND-IN replayed GPU",
                    "memory_total": 80 << 30,
                    "memory_used": used,
                    "memory_free": (80 << 30) - used,
                    "memory_reserved": 1 << 30,
                    "processes": [],
                }
            )
        replay = self.work / "nvml.json"
        replay.write_text(json.dumps({"available": True, "driver_version": "stand-in", "devices": devices}))
        self.stop()
        argv = [sys.executable, "-m", "gpuzombie", "exporter", "--listen", f"127.0.0.1:{self.port}"]
        argv += ["--min-interval", "0", "--nvml-replay", str(replay), "--node-name", NODE_NAME]
        self.process = monitoring.Detached.start(argv, self.work / "exporter.log", env=self.env)
        want = {u: 0.0 if i in dirty else 1.0 for i, u in enumerate(self.uuids)}

        def serving() -> float | None:
            try:
                text = _get(f"http://127.0.0.1:{self.port}/metrics")
            except OSError:
                return None
            got = {u: metric(text, "gpuzombie_gpu_handover_clean", UUID=u) for u in self.uuids}
            return time.monotonic() if got == want else None

        return wait_for("the exporter serving the new verdicts", serving, timeout=120, interval=0.05)

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop()
            self.process = None


@dataclass
class Fleet:
    kube: Any
    api: Api
    work: Path
    uuids: list[str]
    devices: list[str]
    exporter: Exporter
    kubeconfig: Path
    prometheus_port: int
    fence_port: int
    fence: monitoring.Detached | None = None
    prometheus_cm: Any = None
    prometheus: monitoring.Prometheus | None = None

    # --- the parts, started and stopped ---

    def start_prometheus(self) -> None:
        jobs = [
            {"job_name": "gpuzombie", "static_configs": [{"targets": [f"127.0.0.1:{self.exporter.port}"]}]},
            {"job_name": "fence", "static_configs": [{"targets": [f"127.0.0.1:{self.fence_port}"]}]},
        ]
        groups = yaml.safe_load(ALERTS.read_text())["groups"]
        self.prometheus_cm = monitoring.prometheus(
            self.work / "prometheus", jobs, rule_groups=groups, interval=f"{SCRAPE_S}s", port=self.prometheus_port
        )
        self.prometheus = self.prometheus_cm.__enter__()

    def stop_prometheus(self) -> None:
        if self.prometheus_cm is not None:
            self.prometheus_cm.__exit__(None, None, None)
            self.prometheus_cm = self.prometheus = None

    def start_fence(self) -> None:
        argv = [sys.executable, "-m", "gpuzombie", "fence", "--kubeconfig", str(self.kubeconfig)]
        argv += ["--prometheus", f"http://127.0.0.1:{self.prometheus_port}", "--driver", DRIVER]
        argv += ["--interval", str(INTERVAL_S), "--clean-evaluations", str(CLEAN_EVALUATIONS)]
        argv += ["--max-node-percent", str(MAX_NODE_PERCENT), "--listen", f"127.0.0.1:{self.fence_port}"]
        self.fence = monitoring.Detached.start(argv, self.work / "fence.log", env=self.kube.env)
        wait_for("the fence serving", lambda: monitoring.http_ok(f"http://127.0.0.1:{self.fence_port}/healthz"))

    def kill_fence(self) -> None:
        assert self.fence is not None
        self.fence.process.send_signal(signal.SIGKILL)
        self.fence.process.wait(30)
        self.fence = None

    def stop_fence(self) -> None:
        if self.fence is not None:
            self.fence.stop()
            self.fence = None

    # --- what they show ---

    def rules(self) -> dict[str, dict[str, Any]]:
        """Every DeviceTaintRule, by name."""
        reply = self.api.call("GET", RULES)
        assert reply.ok, reply.body
        return {r["metadata"]["name"]: r for r in reply.body["items"]}

    def fenced(self) -> dict[str, str]:
        """The fence's rules: device -> rule name."""
        return {
            r["spec"]["deviceSelector"]["device"]: name
            for name, r in self.rules().items()
            if (r["metadata"].get("labels") or {}).get("app.kubernetes.io/managed-by") == "gpuzombie-fence"
            and name.startswith("gpuzombie-dirty-")
        }

    def fence_metric(self, name: str) -> float:
        return metric(_get(f"http://127.0.0.1:{self.fence_port}/metrics"), name)

    def log(self) -> str:
        return (self.work / "fence.log").read_text()

    def wait_fenced(self, devices: set[str], what: str, timeout: float = 60) -> float:
        """Poll (0.1 s) until the fence's rules are exactly on ``devices``; the monotonic time seen."""
        return wait_for(what, lambda: time.monotonic() if set(self.fenced()) == devices else None, timeout, 0.1)


def _apply(api: Api, obj: dict[str, Any]) -> dict[str, Any]:
    reply = api.apply(obj)
    assert reply.ok, reply.body
    return reply.body


def _claim(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": DRIVER}}]}},
    }


def _claim_pod(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {
            "terminationGracePeriodSeconds": 0,
            "resourceClaims": [{"name": "gpu", "resourceClaimName": name}],
            "containers": [
                {
                    "name": "train",
                    "image": pods.BUSYBOX,
                    "imagePullPolicy": "Never",
                    "command": ["sleep", "3600"],
                    "resources": {"claims": [{"name": "gpu"}]},
                }
            ],
        },
    }


def _allocated(api: Api, name: str) -> str | None:
    reply = api.call("GET", object_path(_claim(name)))
    results = ((reply.body.get("status") or {}).get("allocation") or {}).get("devices", {}).get("results") or []
    return results[0]["device"] if results else None


def _scheduling_event(api: Api, pod: str) -> str | None:
    reply = api.call("GET", f"/api/v1/namespaces/{NAMESPACE}/events?fieldSelector=involvedObject.name%3D{pod}")
    messages = [e["message"] for e in reply.body.get("items", []) if e.get("reason") == "FailedScheduling"]
    return messages[-1] if messages else None


def _token_kubeconfig(api: Api, kube: Any, service_account: str, path: Path) -> None:
    """A kubeconfig holding a token of the chart's ServiceAccount (TokenRequest, as the kubelet gets one)."""
    request = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": {"expirationSeconds": 7200}}
    reply = api.call("POST", f"/api/v1/namespaces/{chart.NAMESPACE}/serviceaccounts/{service_account}/token", request)
    assert reply.ok, reply.body
    admin = json.loads(kube.kubeconfig.read_text())
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": admin["clusters"],
        "users": [{"name": "fence", "user": {"token": reply.body["status"]["token"]}}],
        "contexts": [{"name": "fence", "context": {"cluster": admin["clusters"][0]["name"], "user": "fence"}}],
        "current-context": "fence",
    }
    path.write_text(json.dumps(config))


@pytest.fixture(scope="module")
def fleet(kube, api: Api, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    work = tmp_path_factory.mktemp("fence")
    layout = Layout(kube.root, int(os.environ.get("GPUZOMBIE_CLUSTER_INSTANCE", "0")))
    binary = ensure_tool(DRA_EXAMPLE_DRIVER, timeout=DRIVER_BUILD_TIMEOUT_S)
    (kube.root / "cdi").mkdir(exist_ok=True)
    driver = monitoring.Detached.start(
        [
            str(binary),
            f"--node-name={NODE_NAME}",
            f"--kubeconfig={kube.kubeconfig}",
            f"--num-devices={DEVICES}",
            f"--cdi-root={kube.root / 'cdi'}",
            f"--kubelet-registrar-directory-path={layout.kubelet_root / 'plugins_registry'}",
            f"--kubelet-plugins-directory-path={layout.kubelet_root / 'plugins'}",
        ],
        work / "dra-example-driver.log",
    )
    device_class = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": DRIVER},
        "spec": {"selectors": [{"cel": {"expression": f"device.driver == '{DRIVER}'"}}]},
    }
    rendered = chart.render(
        {"exporter": {"enabled": False}, "fence": {"enabled": True, "prometheusUrl": "http://p:9090"}}, "1.37.2"
    )
    rbac = [o for o in rendered if o["kind"] in ("ServiceAccount", "ClusterRole", "ClusterRoleBinding")]
    (service_account,) = [o["metadata"]["name"] for o in rbac if o["kind"] == "ServiceAccount"]
    exporter = Exporter(kube.node_env(), work, [], monitoring.free_port())
    fleet = None
    try:

        def published() -> dict[str, Any] | None:
            reply = api.call("GET", f"/apis/resource.k8s.io/v1/resourceslices?fieldSelector=spec.driver%3D{DRIVER}")
            items = reply.body.get("items") or []
            return items[0] if items and driver.alive() else (None if driver.alive() else {"dead": True})

        resource_slice = wait_for("the driver's ResourceSlice", published, timeout=120)
        assert "dead" not in resource_slice, driver.log.read_text()[-3000:]
        (work / "resourceslice.json").write_text(json.dumps(resource_slice, indent=2))
        devices = sorted(resource_slice["spec"]["devices"], key=lambda d: int(d["name"].split("-")[1]))
        exporter.uuids = [d["attributes"]["uuid"]["string"] for d in devices]
        for namespace in (chart.NAMESPACE, NAMESPACE):
            api.ensure_namespace(namespace)
        for obj in [device_class, *rbac]:
            _apply(api, obj)
        kubeconfig = work / "fence-kubeconfig.json"
        _token_kubeconfig(api, kube, service_account, kubeconfig)
        fleet = Fleet(
            kube,
            api,
            work,
            exporter.uuids,
            [d["name"] for d in devices],
            exporter,
            kubeconfig,
            monitoring.free_port(),
            monitoring.free_port(),
        )
        exporter.serve(set())
        fleet.start_prometheus()
        yield fleet
    finally:
        if fleet is not None:
            fleet.stop_fence()
            fleet.stop_prometheus()
            for name in fleet.rules():
                api.call("DELETE", f"{RULES}/{name}")
        exporter.stop()
        for name in (f"p{i}" for i in range(1, DEVICES + 1)):
            api.call("DELETE", f"/api/v1/namespaces/{NAMESPACE}/pods/{name}")
        api.call("DELETE", f"/api/v1/namespaces/{NAMESPACE}")
        for obj in [device_class, *rbac]:
            api.delete(obj)
        driver.stop()


def _other_rule(name: str, device: str, labels: dict[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceTaintRule",
        "metadata": {"name": name, "labels": labels},
        "spec": {
            "deviceSelector": {"driver": DRIVER, "pool": NODE_NAME, "device": device},
            "taint": {"key": "gpuzombie.dev/dirty", "value": "maintenance", "effect": "None"},
        },
    }


def test_the_fence_steps_of_issue_38(fleet: Fleet, api: Api) -> None:
    d = fleet.devices
    measured: dict[str, Any] = {"latency_s": [], "lift_s": []}
    # Served by the cluster's API server with no feature gate or --runtime-config (docs/kubernetes.md)
    served = {r["name"] for r in api.call("GET", "/apis/resource.k8s.io/v1").body["resources"]}
    assert {"devicetaintrules", "resourceslices", "resourceclaims", "deviceclasses"} <= served
    wait_for(
        "the clean verdicts in Prometheus",
        lambda: fleet.prometheus and len(fleet.prometheus.query("gpuzombie_gpu_handover_clean == 1")) == DEVICES,
        timeout=60,
    )
    fleet.start_fence()
    time.sleep(3 * INTERVAL_S)
    assert fleet.fenced() == {}

    # 3. the verdict -> the rule (and, three times, the rule lifted again: the spread of both)
    for _ in range(REPEAT):
        at = fleet.exporter.serve({0})
        measured["latency_s"].append(fleet.wait_fenced({d[0]}, "the rule on gpu-0") - at)
        at = fleet.exporter.serve(set())
        measured["lift_s"].append(fleet.wait_fenced(set(), "the rule lifted", LIFT_TIMEOUT_S) - at)
    at = fleet.exporter.serve({0})
    measured["latency_s"].append(fleet.wait_fenced({d[0]}, "the rule on gpu-0") - at)
    (rule,) = [r for r in fleet.rules().values() if r["spec"]["deviceSelector"]["device"] == d[0]]
    annotations = rule["metadata"]["annotations"]
    assert annotations["gpuzombie.dev/uuid"] == fleet.uuids[0] and annotations["gpuzombie.dev/node"] == NODE_NAME
    assert annotations["gpuzombie.dev/holder"] == "ghost" and annotations["gpuzombie.dev/held-mib"] == "2048"
    assert rule["spec"]["taint"] == {
        "key": "gpuzombie.dev/dirty",
        "value": "ghost",
        "effect": "NoSchedule",
        "timeAdded": rule["spec"]["taint"]["timeAdded"],
    }
    (fleet.work / "rule.json").write_text(json.dumps(rule, indent=2))

    # 1. claims get the other devices; one more stays pending
    for i in range(1, DEVICES):
        _apply(api, _claim(f"p{i}"))
        _apply(api, _claim_pod(f"p{i}"))
    allocated = {wait_for(f"claim p{i} allocated", lambda i=i: _allocated(api, f"p{i}")) for i in range(1, DEVICES)}
    assert allocated == set(d[1:]), allocated
    _apply(api, _claim(f"p{DEVICES}"))
    _apply(api, _claim_pod(f"p{DEVICES}"))
    event = wait_for("the scheduler's FailedScheduling event", lambda: _scheduling_event(api, f"p{DEVICES}"))
    measured["pending_event"] = event
    assert _allocated(api, f"p{DEVICES}") is None

    # 6. others' rules: one plain, one copying the fence's label and taint key (effect None: no effect)
    theirs = {
        "team-maintenance": _other_rule("team-maintenance", d[0], {}),
        "team-copy": _other_rule("team-copy", d[0], {"app.kubernetes.io/managed-by": "gpuzombie-fence"}),
    }
    uids = {name: _apply(api, obj)["metadata"]["uid"] for name, obj in theirs.items()}

    # 2. clean -> lifted -> the device allocated again
    at = fleet.exporter.serve(set())
    measured["lift_s"].append(fleet.wait_fenced(set(), "the rule lifted", LIFT_TIMEOUT_S) - at)
    assert wait_for(f"claim p{DEVICES} allocated", lambda: _allocated(api, f"p{DEVICES}"), timeout=120) == d[0]
    assert {n: fleet.rules()[n]["metadata"]["uid"] for n in theirs} == uids
    for i in range(1, DEVICES + 1):
        pods.delete_and_wait(api, _claim_pod(f"p{i}"))
        api.delete(_claim(f"p{i}"))

    # 4. the limit: 3 dirty, at most 50 % of 4 devices fenced; the alert pending
    at = fleet.exporter.serve({0, 1, 2})
    first = wait_for("a first rule", lambda: time.monotonic() if fleet.fenced() else None, timeout=60, interval=0.1)
    measured["latency_s"].append(first - at)
    order = sorted(range(3), key=lambda i: fleet.uuids[i])  # the fence takes them in the order of their UUIDs
    fleet.wait_fenced({d[order[0]], d[order[1]]}, "two rules")
    time.sleep(3 * INTERVAL_S)
    assert set(fleet.fenced()) == {d[order[0]], d[order[1]]}
    assert fleet.fence_metric("gpuzombie_fence_limited_gpus") == 1
    held_back = f"not fenced: node {NODE_NAME} {fleet.uuids[order[2]]}: at the limit of 50 % of node {NODE_NAME}'s 4"
    assert fleet.log().count(held_back) == 1  # said once, not at every evaluation
    # the dry run with the limit raised: what it would create, printed, nothing created
    dry = [sys.executable, "-m", "gpuzombie", "fence", "--once", "--dry-run", "--kubeconfig", str(fleet.kubeconfig)]
    dry += [
        "--prometheus",
        f"http://127.0.0.1:{fleet.prometheus_port}",
        "--driver",
        DRIVER,
        "--max-node-percent",
        "100",
    ]
    done = subprocess.run([*dry, "--json"], env=fleet.kube.env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert [r["spec"]["deviceSelector"]["device"] for r in report["rules"]] == [d[order[2]]]
    assert report["dry_run"] and not report["created"] and report["api_calls"] == 2  # the rules, the node's slices
    done = subprocess.run(dry, env=fleet.kube.env, capture_output=True, text=True, timeout=120)
    assert (
        done.returncode == 0
        and f"would create {report['create'][0]}: {DRIVER}/{NODE_NAME}/{d[order[2]]}" in done.stdout
    )
    assert set(fleet.fenced()) == {d[order[0]], d[order[1]]}
    assert fleet.prometheus is not None
    pending = wait_for(
        "GpuzombieFenceLimitReached pending",
        lambda: fleet.prometheus.alerts("GpuzombieFenceLimitReached") or None,
        timeout=60,
    )
    assert pending[0]["state"] == "pending"

    # 5. Prometheus down: nothing lifted, nothing new fenced, one log line, the metric 0
    before = {n: r["metadata"]["uid"] for n, r in fleet.rules().items()}
    fleet.stop_prometheus()
    fleet.exporter.serve({3})
    wait_for("the fence blind", lambda: fleet.fence_metric("gpuzombie_fence_verdicts_available") == 0, timeout=30)
    time.sleep((CLEAN_EVALUATIONS + 3) * INTERVAL_S + SCRAPE_S)
    assert {n: r["metadata"]["uid"] for n, r in fleet.rules().items()} == before
    assert fleet.log().count("verdicts unavailable") == 1
    fleet.start_prometheus()
    fleet.wait_fenced({d[3]}, "lifted and fenced on fresh verdicts", LIFT_TIMEOUT_S)
    assert "verdicts back after" in fleet.log()

    # 7. SIGKILLed mid-flight; the verdicts change; started again
    fleet.kill_fence()
    fleet.exporter.serve({1})
    time.sleep((CLEAN_EVALUATIONS + 1) * INTERVAL_S + 2 * SCRAPE_S)
    assert set(fleet.fenced()) == {d[3]}  # nobody changed anything while it was down
    fleet.start_fence()
    fleet.wait_fenced({d[1]}, "exactly the rule the verdicts call for", LIFT_TIMEOUT_S)
    time.sleep(3 * INTERVAL_S)
    assert set(fleet.fenced()) == {d[1]}
    assert {n: fleet.rules()[n]["metadata"]["uid"] for n in theirs} == uids  # 6. still there
    measured["latency_s"] = [round(x, 2) for x in measured["latency_s"]]
    measured["lift_s"] = [round(x, 2) for x in measured["lift_s"]]
    print("fence measured:", json.dumps(measured))
    (fleet.work / "measured.json").write_text(json.dumps(measured, indent=2))
    assert max(measured["latency_s"]) <= 2 * SCRAPE_S, measured
