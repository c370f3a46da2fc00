"""charts/gpuzombie and charts/gpu-zombie-test through a real helm binary: `helm lint --strict` and
`helm template` with every toggle, each rendered object validated strictly (the prometheus-operator
objects against the operator's CRD schemas), and what the node agent's pod must be."""

from __future__ import annotations

import dataclasses
import json
import re
import shlex
import subprocess
import sys
import tomllib
from typing import Any

import pytest

pytest.importorskip("kubernetes_validate", reason="kubernetes-validate is in the 'chart' extra")
pytest.importorskip("yaml", reason="PyYAML is in the 'chart' extra")

import yaml
from cluster_support import (
    ALERTS,
    CHART,
    DASHBOARD,
    EXPERIMENT_CHART,
    OLDEST_K8S,
    REPO,
    by_kind,
    helm,
    render,
    validate_strictly,
)

from markers import needs_root
from pidns import wait_until

TLS = {"enabled": True, "secretName": "gpuzombie-tls", "clientAuth": True}
SCRAPE_TLS = {"ca": {"secret": {"name": "gpuzombie-tls", "key": "ca.crt"}}, "serverName": "gpuzombie"}
TOGGLES: dict[str, dict[str, Any]] = {
    "defaults": {},
    "operator": {"serviceMonitor": {"enabled": True}, "prometheusRule": {"enabled": True}},
    "pod-monitor": {"podMonitor": {"enabled": True}, "prometheusRule": {"enabled": True}},
    "locked-down": {
        "networkPolicy": {"enabled": True},
        "serviceMonitor": {"enabled": True, "labels": {"release": "kube-prometheus-stack"}},
        "exporter": {"tls": {**TLS, "scrapeTlsConfig": SCRAPE_TLS}},
    },
    "locked-down-pods": {
        "networkPolicy": {"enabled": True},
        "podMonitor": {"enabled": True, "labels": {"release": "kube-prometheus-stack"}},
        "exporter": {"tls": {**TLS, "scrapeTlsConfig": SCRAPE_TLS}},
    },
    "bare": {
        "service": {"enabled": False},
        "dashboard": {"enabled": False},
        "scrapeAnnotations": False,
        "gpuNodesOnly": False,
        "priorityClassName": "",
        "tolerations": [],
        "exporter": {"cri": {"enabled": False}, "ipv6": True},
    },
    "placed": {
        "image": {"registry": "harbor.example.org", "repository": "aipf/gpuzombie-node", "tag": "0.1.0-abc1234"},
        "imagePullSecrets": [{"name": "registry-pull-secret"}],
        "runtimeClassName": "nvidia",
        "nodeSelector": {"node-role.kubernetes.io/gpu": ""},
        "affinity": {"podAntiAffinity": {}},
        "podAnnotations": {"example.org/team": "ml-platform"},
        "podLabels": {"team": "ml-platform"},
        "updateStrategy": {"maxUnavailable": "25%"},
        "dashboard": {"namespace": "grafana"},
        "exporter": {"extraArgs": ["--ghost-threshold-mib", "256"], "port": 19844},
        "fullnameOverride": "node-agent",
    },
}
ALL_ON = {**TOGGLES["operator"], "networkPolicy": {"enabled": True}}
MONITORS = {kind: {f"{kind[0].lower()}{kind[1:]}": {"enabled": True}} for kind in ("ServiceMonitor", "PodMonitor")}
"""One monitor at a time: both are refused (test_both_monitors_are_refused)."""

# The experiment chart's toggles: its defaults, nothing, the DaemonSet alone, each scenario alone.
EXPERIMENT_SCENARIOS = list(yaml.safe_load((EXPERIMENT_CHART / "values.yaml").read_text())["scenarios"])


def experiment_values(scenario: str | None, *, node: bool = False) -> dict[str, Any]:
    return {"scenarios": {key: {"enabled": key == scenario} for key in EXPERIMENT_SCENARIOS}, "node": {"enabled": node}}


EXPERIMENT_TOGGLES = {
    "defaults": None,
    "nothing": experiment_values(None),
    "node-only": experiment_values(None, node=True),
    **{key: experiment_values(key) for key in EXPERIMENT_SCENARIOS},
}


def lint(helm_binary: str, chart, values, kube_version: str) -> None:
    got = helm(helm_binary, "lint", "--strict", str(chart), "--kube-version", f"v{kube_version}", values=values)
    assert got.returncode == 0, got.stdout + got.stderr
    assert "[WARNING]" not in got.stdout and "[ERROR]" not in got.stdout, got.stdout


@pytest.mark.parametrize("toggle", list(TOGGLES))
def test_gpuzombie_chart_lints_strictly_and_every_object_validates(helm_binary, toggle):
    import kubernetes_validate

    for kube_version in (OLDEST_K8S, kubernetes_validate.latest_version()):
        lint(helm_binary, CHART, TOGGLES[toggle], kube_version)
    objects = render(helm_binary, TOGGLES[toggle])
    assert objects
    for obj in objects:
        validate_strictly(obj)


@pytest.mark.parametrize("toggle", list(EXPERIMENT_TOGGLES))
def test_experiment_chart_lints_strictly_and_validates(helm_binary, toggle):
    values = EXPERIMENT_TOGGLES[toggle]
    lint(helm_binary, EXPERIMENT_CHART, values, OLDEST_K8S)
    for obj in render(
        helm_binary, values, chart=EXPERIMENT_CHART, release="gpu-zombie-test", namespace="gpu-zombie-test"
    ):
        validate_strictly(obj)


def test_defaults_render_the_agent_service_and_dashboard(helm_binary):
    kinds = sorted(o["kind"] for o in render(helm_binary))
    assert kinds == ["ConfigMap", "DaemonSet", "Service"]
    assert sorted(o["kind"] for o in render(helm_binary, ALL_ON)) == sorted(
        ["ConfigMap", "DaemonSet", "Service", "ServiceMonitor", "PrometheusRule", "NetworkPolicy"]
    )
    assert "PodMonitor" in {o["kind"] for o in render(helm_binary, MONITORS["PodMonitor"])}


def test_both_monitors_are_refused(helm_binary):
    """Issue 35 (9): serviceMonitor and podMonitor together scraped every agent twice, silently (the
    same job, instance and node: Prometheus keeps one copy and counts the other as duplicates)."""
    values = {**MONITORS["ServiceMonitor"], **MONITORS["PodMonitor"]}
    got = helm(helm_binary, "template", "gpuzombie", str(CHART), values=values)
    assert got.returncode != 0
    assert "serviceMonitor.enabled and podMonitor.enabled: choose one" in got.stderr, got.stderr


def test_names_are_release_scoped(helm_binary):
    one = {(o["kind"], o["metadata"]["name"]) for o in render(helm_binary, ALL_ON, release="a")}
    two = {(o["kind"], o["metadata"]["name"]) for o in render(helm_binary, ALL_ON, release="b")}
    assert not one & two
    assert {name for _, name in one} == {"a-gpuzombie", "a-gpuzombie-dashboard"}
    assert {o["metadata"]["name"] for o in render(helm_binary, release="gpuzombie")} == {
        "gpuzombie",
        "gpuzombie-dashboard",
    }


def pod_spec(objects) -> dict[str, Any]:
    return by_kind(objects)["DaemonSet"]["spec"]["template"]["spec"]


def test_agent_pod_is_least_privilege_and_reads_the_host_read_only(helm_binary):
    spec = pod_spec(render(helm_binary))
    (c,) = spec["containers"]
    security = c["securityContext"]
    assert spec["hostPID"] is True and spec["automountServiceAccountToken"] is False
    assert "hostNetwork" not in spec  # it listens on its pod IP
    assert security["privileged"] is False and security["allowPrivilegeEscalation"] is False
    assert security["readOnlyRootFilesystem"] is True
    assert security["capabilities"] == {"drop": ["ALL"], "add": ["DAC_READ_SEARCH", "SYS_PTRACE"]}
    mounts = {m["name"]: m for m in c["volumeMounts"]}
    volumes = {v["name"]: v for v in spec["volumes"]}
    for name in ("host-proc", "pod-resources", "cri-socket", "cdi"):
        assert mounts[name]["readOnly"] is True, name
    assert volumes["cdi"]["hostPath"] == {"path": "/var/run/cdi", "type": "DirectoryOrCreate"}  # DRA's CDI specs
    assert volumes["host-proc"]["hostPath"]["path"] == "/proc"
    assert volumes["cri-socket"]["hostPath"] == {"path": "/run/containerd/containerd.sock", "type": "Socket"}
    args = c["args"]
    assert args[args.index("--cri-socket") + 1] == "/run/containerd/containerd.sock"
    assert [args[i + 1] for i, a in enumerate(args) if a == "--listen"] == ["$(POD_IP):9844", "127.0.0.1:9844"]
    env = {e["name"]: e for e in c["env"]}
    assert env["POD_IP"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"
    assert env["GPUZOMBIE_PROCFS"]["value"] == "/host/proc"
    # Hostname and node are the node's name, not the exporter pod's (the pod has its own network).
    assert env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    assert "nvidia.com/gpu" not in json.dumps(c["resources"])


def test_reap_stale_after_is_off_by_default_and_on_adds_the_flag_and_kill(helm_binary):
    (off,) = pod_spec(render(helm_binary))["containers"]
    assert "--reap-stale-after" not in off["args"] and "KILL" not in off["securityContext"]["capabilities"]["add"]
    (on,) = pod_spec(render(helm_binary, {"exporter": {"reapStaleAfter": "10m"}}))["containers"]
    assert on["args"][on["args"].index("--reap-stale-after") + 1] == "10m"
    assert on["securityContext"]["capabilities"]["add"] == ["DAC_READ_SEARCH", "SYS_PTRACE", "KILL"]
    refused = helm(helm_binary, "template", "x", str(CHART), values={"exporter": {"reapStaleAfter": "ten minutes"}})
    assert refused.returncode != 0 and "reapStaleAfter" in refused.stderr


def test_agent_pod_probes_placement_and_priority(helm_binary):
    objects = render(helm_binary)
    ds = by_kind(objects)["DaemonSet"]
    spec = pod_spec(objects)
    (c,) = spec["containers"]
    assert c["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "metrics", "scheme": "HTTP"}
    assert c["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "metrics", "scheme": "HTTP"}
    assert c["ports"] == [{"name": "metrics", "containerPort": 9844, "protocol": "TCP"}]
    assert spec["priorityClassName"] == "system-node-critical"
    (term,) = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert term["matchExpressions"] == [{"key": "nvidia.com/gpu.present", "operator": "In", "values": ["true"]}]
    assert {(t["key"], t["effect"]) for t in spec["tolerations"]} == {
        ("nvidia.com/gpu", "NoSchedule"),
        ("nvidia.com/gpu", "NoExecute"),
    }
    assert ds["spec"]["updateStrategy"]["rollingUpdate"]["maxUnavailable"] == 1
    annotations = ds["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/port"] == "9844" and annotations["prometheus.io/scrape"] == "true"
    assert "affinity" not in pod_spec(render(helm_binary, {"gpuNodesOnly": False}))


def test_tls_mounts_the_secret_and_probes_over_https(helm_binary):
    objects = render(helm_binary, {"exporter": {"tls": TLS}, "serviceMonitor": {"enabled": True}})
    (c,) = pod_spec(objects)["containers"]
    args = c["args"]
    assert args[args.index("--tls-cert") + 1] == "/etc/gpuzombie/tls/tls.crt"
    assert args[args.index("--tls-client-ca") + 1] == "/etc/gpuzombie/tls/ca.crt"
    assert c["livenessProbe"]["httpGet"]["scheme"] == "HTTPS"
    assert by_kind(objects)["ServiceMonitor"]["spec"]["endpoints"][0]["scheme"] == "https"
    missing = helm(helm_binary, "template", "x", str(CHART), values={"exporter": {"tls": {"enabled": True}}})
    assert missing.returncode != 0 and "exporter.tls.secretName" in missing.stderr


def test_monitors_relabel_node_and_keep_the_workload_labels(helm_binary):
    for kind, endpoints in (("ServiceMonitor", "endpoints"), ("PodMonitor", "podMetricsEndpoints")):
        spec = by_kind(render(helm_binary, MONITORS[kind]))[kind]["spec"]
        assert spec["jobLabel"] == "app.kubernetes.io/name"  # job="gpuzombie", what the alerts select
        (endpoint,) = spec[endpoints]
        relabel = endpoint["relabelings"]
        assert {
            "sourceLabels": ["__meta_kubernetes_pod_node_name"],
            "targetLabel": "node",
            "action": "replace",
        } in relabel
        assert {"regex": "(namespace|pod|container|service|endpoint)", "action": "labeldrop"} in relabel
        assert endpoint["honorLabels"] is True
        assert spec["selector"]["matchLabels"] == {
            "app.kubernetes.io/name": "gpuzombie",
            "app.kubernetes.io/instance": "gpuzombie",
        }


def test_prometheus_rule_is_the_promtool_tested_file(helm_binary):
    base = "https://git.example.org/ops/gpuzombie/docs/cluster.md"
    rule = by_kind(render(helm_binary, {"prometheusRule": {"enabled": True, "runbookBaseUrl": base}}))["PrometheusRule"]
    plain = yaml.safe_load(ALERTS.read_text())
    for group in plain["groups"]:
        for r in group["rules"]:
            if "annotations" in r:  # an alert (recording rules have none)
                r["annotations"]["runbook_url"] = re.sub(r"^.*docs/cluster\.md", base, r["annotations"]["runbook_url"])
    assert rule["spec"] == plain


def test_dashboard_configmap_embeds_the_import_file(helm_binary):
    cm = by_kind(render(helm_binary, {"dashboard": {"namespace": "grafana"}}))["ConfigMap"]
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert cm["metadata"]["namespace"] == "grafana"
    assert json.loads(cm["data"]["gpuzombie.json"]) == json.loads(DASHBOARD.read_text())


@pytest.mark.parametrize(
    ("kind", "path"), [("ServiceMonitor", ("spec", "endpoints", 0)), ("PodMonitor", ("spec", "podMetricsEndpoints", 0))]
)
def test_crd_validation_rejects_unknown_and_mistyped_fields(helm_binary, kind, path):
    """The operator schemas made strict: a typo in a monitor fails here, not silently in the cluster."""
    obj = by_kind(render(helm_binary, MONITORS[kind]))[kind]
    endpoint = obj
    for key in path:
        endpoint = endpoint[key]
    endpoint["relabelling"] = []  # British spelling: an unknown field
    with pytest.raises(AssertionError, match="relabelling"):
        validate_strictly(obj)
    del endpoint["relabelling"]
    endpoint["interval"] = "every 30 seconds"
    with pytest.raises(AssertionError, match="interval"):
        validate_strictly(obj)


def test_network_policy_admits_only_the_scraper(helm_binary):
    policy = by_kind(render(helm_binary, {"networkPolicy": {"enabled": True}}))["NetworkPolicy"]["spec"]
    assert policy["policyTypes"] == ["Ingress", "Egress"] and policy["egress"] == []
    (rule,) = policy["ingress"]
    assert rule["ports"] == [{"port": "metrics", "protocol": "TCP"}]
    assert rule["from"][0]["podSelector"]["matchLabels"] == {"app.kubernetes.io/name": "prometheus"}


def test_image_default_is_what_make_image_and_cd_produce(helm_binary):
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text())
    version = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["version"]
    assert chart["appVersion"] == version
    (c,) = pod_spec(render(helm_binary))["containers"]
    assert c["image"] == f"localhost/gpu-zombie/gpuzombie-node:{chart['appVersion']}"
    assert "scripts/build-image.sh" in (REPO / "Makefile").read_text()  # make image
    script = (REPO / "scripts" / "build-image.sh").read_text()
    assert "localhost/gpu-zombie/gpuzombie-node:$version" in script and "charts/gpuzombie/Chart.yaml" in script
    # CD pushes <registry>/<project>/gpuzombie-node:<version> (tests/k8s/test_k8s_workflows.py checks it).


def test_every_exporter_flag_the_chart_passes_exists(helm_binary):
    values = {"exporter": {"tls": TLS, "trustRuntimeWithoutKubelet": True}}
    (c,) = pod_spec(render(helm_binary, values))["containers"]
    assert "--trust-runtime-without-kubelet" in c["args"]
    (default,) = pod_spec(render(helm_binary, {}))["containers"]
    assert "--trust-runtime-without-kubelet" not in default["args"]  # no stale verdict on a guess
    assert c["args"][:2] == ["gpuzombie", "exporter"]
    help_text = subprocess.run(
        [sys.executable, "-m", "gpuzombie", "exporter", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout
    flags = [a for a in c["args"] if a.startswith("--")]
    assert [f for f in flags if f not in help_text] == []


@pytest.mark.parametrize(
    ("values", "complaint"),
    [
        ({"exporter": {"prot": 9844}}, "additional properties 'prot'"),
        ({"serviceMonitor": {"enable": True}}, "additional properties 'enable'"),
        ({"exporter": {"port": 0}}, "minimum"),
        ({"image": {"pullPolicy": "Sometimes"}}, "value must be one of"),
    ],
    ids=["typo-in-exporter", "typo-in-monitor", "port-0", "bad-pull-policy"],
)
def test_values_schema_rejects_mistakes(helm_binary, values, complaint):
    """values.schema.json: a typo fails the install instead of being silently ignored."""
    got = helm(helm_binary, "template", "x", str(CHART), values=values)
    assert got.returncode != 0 and complaint in got.stderr, got.stderr


def notes(binary: str, values: dict[str, Any] | None = None) -> str:
    """NOTES.txt as `helm install` prints it (a client-side dry run: no cluster)."""
    got = helm(binary, "install", "gz", str(CHART), "--namespace", "monitoring", "--dry-run=client", values=values)
    assert got.returncode == 0, got.stderr
    return got.stdout.split("NOTES:\n", 1)[1]


@needs_root
@pytest.mark.parametrize("values", [{}, {"exporter": {"port": 9911, "ipv6": True}}], ids=["defaults", "ipv6-port"])
def test_the_notes_port_forward_reaches_the_agent(helm_binary, tmp_path, values):
    """Issue 18 (6): the NOTES' port-forward could not work, the agent listened on its pod IP only,
    and the runtime's port-forward dials localhost inside the pod (containerd, CRI-O: tcp4). Here:
    the chart's own --listen arguments in a real network namespace whose only other address is the
    pod IP, dialled on 127.0.0.1 from inside it, as the runtime does."""
    test_exporter = pytest.importorskip("test_exporter")

    port = (values.get("exporter") or {}).get("port", 9844)
    text = notes(helm_binary, values)
    assert f"port-forward ds/gz-gpuzombie {port} &" in text and f"http://localhost:{port}/metrics" in text
    (c,) = pod_spec(render(helm_binary, values))["containers"]
    args = c["args"]
    pod_ip = "fd00::7" if "[$(POD_IP)]" in " ".join(args) else "10.244.0.7"
    listen = [args[i + 1].replace("$(POD_IP)", pod_ip) for i, a in enumerate(args) if a == "--listen"]
    root = tmp_path / "proc"
    test_exporter.build_node(root)
    replay = tmp_path / "nvml.json"
    replay.write_text(json.dumps(dataclasses.asdict(test_exporter.gpus())))
    exporter = [sys.executable, "-m", "gpuzombie", "exporter", "--procfs", str(root), "--nvml-replay", str(replay)]
    exporter += [x for address in listen for x in ("--listen", address)]
    family = "-6" if ":" in pod_ip else "-4"
    script = f"ip link set lo up && ip {family} addr add {pod_ip} dev lo && exec " + " ".join(
        map(shlex.quote, exporter)
    )
    log = tmp_path / "exporter.log"
    with open(log, "w") as err:
        pod = subprocess.Popen(["unshare", "--net", "sh", "-c", script], stderr=err)
    try:
        wait_until(lambda: "serving" in log.read_text() or pod.poll() is not None, timeout=60)
        assert pod.poll() is None, log.read_text()
        dial = f"import urllib.request; print(urllib.request.urlopen('http://127.0.0.1:{port}/healthz', timeout=10).status)"
        inside = subprocess.run(
            ["nsenter", f"--net=/proc/{pod.pid}/ns/net", sys.executable, "-c", dial],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert inside.stdout.strip() == "200", inside.stderr
        assert f"{pod_ip}" in log.read_text() and f"127.0.0.1:{port}" in log.read_text()
    finally:
        pod.terminate()
        pod.wait(timeout=30)
