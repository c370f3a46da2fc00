"""One release of charts/gpuzombie runs the node agent, the admission webhook, or both (issue 26: turning
the webhook on as the README said made a second release with a second DaemonSet). Each combination,
with and without the prometheus-operator objects, through the real helm: `helm lint --strict`, every
rendered object validated strictly, what it holds, the NOTES it prints, and the webhook's command as
the real CLI parses it."""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("kubernetes_validate", reason="kubernetes-validate is in the 'chart' extra")
pytest.importorskip("yaml", reason="PyYAML is in the 'chart' extra")

from cluster_support import CHART, OLDEST_K8S, helm, render, validate_strictly

AGENT_KINDS = {"DaemonSet", "Service", "ConfigMap"}
WEBHOOK_KINDS = {"Deployment", "ServiceAccount", "Service", "PodDisruptionBudget", "MutatingWebhookConfiguration"}
RUNS = {
    "exporter": {},
    "webhook": {"exporter": {"enabled": False}, "webhook": {"enabled": True}},
    "both": {"webhook": {"enabled": True}},
}
OPERATOR = {"serviceMonitor": {"enabled": True}, "prometheusRule": {"enabled": True}}


def _values(run: str, operator: bool) -> dict[str, Any]:
    return {**RUNS[run], **(OPERATOR if operator else {}), "networkPolicy": {"enabled": operator}}


def _components(objects: list[dict[str, Any]]) -> dict[str, set[str]]:
    found: dict[str, set[str]] = {}
    for obj in objects:
        component = obj["metadata"].get("labels", {}).get("app.kubernetes.io/component", "")
        found.setdefault(component, set()).add(obj["kind"])
    return found


@pytest.mark.parametrize("operator", [False, True], ids=["plain", "operator"])
@pytest.mark.parametrize("run", list(RUNS))
def test_one_release_runs_the_exporter_the_webhook_or_both(helm_binary, run, operator):
    import kubernetes_validate

    values = _values(run, operator)
    for kube_version in (OLDEST_K8S, kubernetes_validate.latest_version()):
        got = helm(helm_binary, "lint", "--strict", str(CHART), "--kube-version", f"v{kube_version}", values=values)
        assert got.returncode == 0 and "[WARNING]" not in got.stdout, got.stdout + got.stderr
    # At the oldest Kubernetes (no matchConditions): valid there and at the newest; test_cluster_webhook
    # validates the newer renderings.
    objects = render(helm_binary, values, namespace="gpuzombie", kube_version=OLDEST_K8S)
    for obj in objects:
        validate_strictly(obj)
    components = _components(objects)
    agent = AGENT_KINDS | ({"ServiceMonitor", "NetworkPolicy"} if operator else set())
    assert components.get("node-agent", set()) - {"PrometheusRule"} == (agent if run != "webhook" else set())
    assert components.get("admission-webhook", set()) >= (WEBHOOK_KINDS if run != "exporter" else set())
    assert run != "exporter" or "admission-webhook" not in components
    assert sum(o["kind"] == "DaemonSet" for o in objects) == (run != "webhook")
    rules = [o for o in objects if o["kind"] == "PrometheusRule"]
    assert len(rules) == operator
    if operator:
        groups = {g["name"] for g in rules[0]["spec"]["groups"]}
        assert ("gpuzombie-admission" in groups) is (run != "exporter")
        assert ("gpuzombie" in groups) is (run != "webhook"), groups


def test_a_release_of_the_policy_alone_has_no_agent(helm_binary):
    """policy.enabled (the MutatingAdmissionPolicy) with the exporter off: the policy, its binding and
    the admission audit alert; no DaemonSet."""
    values = {"exporter": {"enabled": False}, "policy": {"enabled": True}, "prometheusRule": {"enabled": True}}
    objects = render(helm_binary, values, namespace="gpuzombie", kube_version="1.36.0")
    kinds = {o["kind"] for o in objects}
    assert "DaemonSet" not in kinds and "MutatingAdmissionPolicy" in kinds, kinds
    (rule,) = [o for o in objects if o["kind"] == "PrometheusRule"]
    assert [g["name"] for g in rule["spec"]["groups"]] == ["gpuzombie-admission"]


def test_a_release_of_nothing_fails_with_one_line(helm_binary):
    got = helm(helm_binary, "template", "gpuzombie", str(CHART), values={"exporter": {"enabled": False}})
    assert got.returncode != 0
    assert (
        "nothing to install: exporter.enabled, webhook.enabled, policy.enabled, nri.enabled and fence.enabled are all false"
        in got.stderr
    )


@pytest.mark.parametrize("run", list(RUNS))
def test_the_notes_name_what_the_release_runs(helm_binary, run):
    got = helm(helm_binary, "install", "gz", str(CHART), "-n", "gpuzombie", "--dry-run=client", values=RUNS[run])
    assert got.returncode == 0, got.stderr
    notes = got.stdout.split("NOTES:\n", 1)[1]
    assert ("port-forward ds/gz-gpuzombie" in notes) is (run != "webhook")
    assert ("Pod Security level" in notes) is (run != "webhook")  # the webhook is non-root, no hostPID
    assert ("Deployment gz-gpuzombie-webhook" in notes) is (run != "exporter")


def test_the_injected_image_follows_the_image_values(helm_binary):
    """The init container's image is the chart's own image, registry included (not localhost/...)."""
    values = {"webhook": {"enabled": True}, "image": {"registry": "harbor.example.org", "tag": "0.1.0-abc"}}
    (deployment,) = [o for o in render(helm_binary, values) if o["kind"] == "Deployment"]
    (c,) = deployment["spec"]["template"]["spec"]["containers"]
    command = c["command"]
    assert (
        command[command.index("--image") + 1] == c["image"] == "harbor.example.org/gpu-zombie/gpuzombie-node:0.1.0-abc"
    )


def test_the_review_bounds_reach_the_cli(helm_binary):
    """webhook.reviewSeconds, maxReviews, maxBodyBytes, maxBodyBytesHeld: rendered as the CLI's flags
    (integers as integers, not helm's float notation) and parsed by the real CLI."""
    from gpuzombie.cli.webhook import command

    bounds = {"reviewSeconds": 0.8, "maxReviews": 4, "maxBodyBytes": 8388608, "maxBodyBytesHeld": 33554432}
    (deployment,) = [
        o for o in render(helm_binary, {"webhook": {"enabled": True, **bounds}}) if o["kind"] == "Deployment"
    ]
    (c,) = deployment["spec"]["template"]["spec"]["containers"]
    argv = [a.replace("$(POD_IP)", "10.0.0.7") for a in c["command"][2:]]
    params = command.make_context("webhook", argv).params
    assert (params["review_seconds"], params["max_reviews"]) == (0.8, 4)
    assert (params["max_body_bytes"], params["max_body_bytes_held"]) == (8388608, 33554432)


def test_the_library_default_image_is_the_charts_default(helm_binary):
    """mutate.Policy() (a library caller's) injects what the chart's image values render by default
    (what `make image` tags), so the two never name different images."""
    from gpuzombie.admission.mutate import Policy

    (deployment,) = [o for o in render(helm_binary, {"webhook": {"enabled": True}}) if o["kind"] == "Deployment"]
    command = deployment["spec"]["template"]["spec"]["containers"][0]["command"]
    assert Policy().image == command[command.index("--image") + 1] == "localhost/gpu-zombie/gpuzombie-node:0.1.0"
