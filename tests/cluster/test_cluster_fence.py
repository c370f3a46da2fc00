"""The chart's fence through the real helm binary: off by default; its Deployment, ServiceAccount,
ClusterRole and binding validated strictly (Kubernetes schemas at 1.37, the first with
resource.k8s.io/v1 DeviceTaintRules, and the newest); the RBAC exactly what the fence calls; the
Deployment's command accepted by the real CLI; a release of the fence alone; its alerts through
promtool and in the PrometheusRule. The same RBAC on the real API server:
tests/kube/test_fence_kubernetes.py."""

from __future__ import annotations

from typing import Any

import pytest

kubernetes_validate = pytest.importorskip("kubernetes_validate", reason="kubernetes-validate is in the 'chart' extra")
yaml = pytest.importorskip("yaml", reason="PyYAML is in the 'chart' extra")

from cluster_support import CHART, helm, promtool, render  # noqa: E402

FENCE_ALERTS = CHART / "files" / "gpuzombie-fence-alerts.yaml"
NAMESPACE = "gpuzombie"
KINDS = {"Deployment", "ServiceAccount", "ClusterRole", "ClusterRoleBinding"}
ON = {"fence": {"enabled": True, "prometheusUrl": "http://prometheus-operated.monitoring.svc:9090"}}


def fence_objects(helm_binary: str, values: dict[str, Any]) -> dict[str, Any]:
    objects = render(helm_binary, values, namespace=NAMESPACE, kube_version="1.37.0")
    fence = [o for o in objects if o["metadata"].get("labels", {}).get("app.kubernetes.io/component") == "fence"]
    for obj in fence:
        for version in {"1.37.0", kubernetes_validate.latest_version()}:
            kubernetes_validate.validate(obj, version, strict=True)
    return {o["kind"]: o for o in fence}


def test_off_by_default(helm_binary):
    labels = [o["metadata"].get("labels", {}) for o in render(helm_binary, {}, namespace=NAMESPACE)]
    assert not [x for x in labels if x.get("app.kubernetes.io/component") == "fence"]


def test_objects_validate_strictly(helm_binary):
    assert set(fence_objects(helm_binary, ON)) == KINDS


def test_rbac_is_what_the_fence_calls_and_nothing_else(helm_binary):
    objects = fence_objects(helm_binary, ON)
    assert objects["ClusterRole"]["rules"] == [
        {"apiGroups": ["resource.k8s.io"], "resources": ["devicetaintrules"], "verbs": ["list", "create", "delete"]},
        {"apiGroups": ["resource.k8s.io"], "resources": ["resourceslices"], "verbs": ["list"]},
    ]
    binding = objects["ClusterRoleBinding"]
    assert binding["roleRef"]["name"] == objects["ClusterRole"]["metadata"]["name"]
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": objects["ServiceAccount"]["metadata"]["name"], "namespace": NAMESPACE}
    ]


def test_the_deployment_is_least_privileged(helm_binary):
    deployment = fence_objects(helm_binary, ON)["Deployment"]
    pod = deployment["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    assert deployment["spec"]["replicas"] == 1
    assert pod["automountServiceAccountToken"] is True  # its token is how it reaches the API server
    assert pod["securityContext"]["runAsNonRoot"] is True and "hostPID" not in pod
    assert c["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
    }
    assert c["livenessProbe"]["httpGet"]["path"] == "/healthz" and c["resources"]["limits"]["memory"]
    assert deployment["spec"]["template"]["metadata"]["annotations"]["prometheus.io/port"] == "9845"


def test_the_real_cli_accepts_the_deployments_command(helm_binary):
    from gpuzombie.cli.fence import command

    values = {
        "fence": {
            **ON["fence"],
            "drivers": ["gpu.nvidia.com", "gpu.example.com"],
            "maxDevices": 4,
            "maxNodePercent": 25,
            "cleanEvaluations": 5,
            "dryRun": True,
        }
    }
    (c,) = fence_objects(helm_binary, values)["Deployment"]["spec"]["template"]["spec"]["containers"]
    assert c["command"][:2] == ["gpuzombie", "fence"]
    ctx = command.make_context("fence", [a.replace("$(POD_IP)", "10.0.0.7") for a in c["command"][2:]])
    assert ctx.params["prometheus"] == ON["fence"]["prometheusUrl"]
    assert ctx.params["drivers"] == ("gpu.nvidia.com", "gpu.example.com")
    assert (ctx.params["max_devices"], ctx.params["max_node_percent"], ctx.params["clean_evaluations"]) == (4, 25, 5)
    assert ctx.params["dry_run"] is True and ctx.params["listen"] == "10.0.0.7:9845"
    assert ctx.params["kubeconfig"] is None  # the pod's service account


def test_prometheus_url_is_required(helm_binary):
    got = helm(helm_binary, "template", "gpuzombie", str(CHART), values={"fence": {"enabled": True}})
    assert got.returncode != 0 and "fence.prometheusUrl" in got.stderr


def test_a_release_of_the_fence_alone(helm_binary):
    values = {**ON, "exporter": {"enabled": False}, "prometheusRule": {"enabled": True}}
    objects = render(helm_binary, values, namespace=NAMESPACE, kube_version="1.37.0")
    assert "DaemonSet" not in {o["kind"] for o in objects}
    (rule,) = [o for o in objects if o["kind"] == "PrometheusRule"]
    assert rule["spec"]["groups"] == yaml.safe_load(FENCE_ALERTS.read_text())["groups"]


def test_runbooks_name_the_handover_page_and_follow_the_base_url(helm_binary):
    for group in yaml.safe_load(FENCE_ALERTS.read_text())["groups"]:
        for r in group["rules"]:
            assert r["annotations"]["runbook_url"] == f"docs/handover.md#{r['alert'].lower()}"
            assert f"## {r['alert']}" in (CHART.parents[1] / "docs" / "handover.md").read_text()
    page = "https://git.example.org/ops/gpuzombie/src/branch/main/docs/cluster.md"
    values = {**ON, "prometheusRule": {"enabled": True, "runbookBaseUrl": page}}
    (rule,) = [o for o in render(helm_binary, values, namespace=NAMESPACE) if o["kind"] == "PrometheusRule"]
    fence = [r for g in rule["spec"]["groups"] if g["name"] == "gpuzombie-fence" for r in g["rules"]]
    assert {r["annotations"]["runbook_url"] for r in fence} == {
        page.replace("cluster.md", "handover.md") + "#gpuzombiefencelimitreached",
        page.replace("cluster.md", "handover.md") + "#gpuzombiefenceverdictsunavailable",
    }


def test_promtool_checks_the_alerts():
    """Their unit tests (promtool/gpuzombie-fence-alerts.test.yaml) run with the others in test_cluster_alerts."""
    got = promtool("check", "rules", str(FENCE_ALERTS))
    assert got.returncode == 0 and "SUCCESS: 2 rules found" in got.stdout, got.stdout + got.stderr
