"""The chart's MutatingAdmissionPolicy through the real helm binary: off by default; rendered with
the webhook's settings and validated strictly against the Kubernetes schemas that have it (1.36, where
it is GA, and the newest kubernetes-validate knows); refused beside the webhook; and
deploy/admission/mutating-admission-policy.yaml kept equal to it (scripts/render-policy.sh writes it). What its
CEL does, evaluated by the real API server, is tests/kube/test_admission_kubernetes.py's."""

from __future__ import annotations

import copy
from typing import Any

import pytest

kubernetes_validate = pytest.importorskip("kubernetes_validate", reason="kubernetes-validate is in the 'chart' extra")
yaml = pytest.importorskip("yaml", reason="PyYAML is in the 'chart' extra")

from cluster_support import CHART, REPO, helm, render  # noqa: E402

KINDS = {"MutatingAdmissionPolicy", "MutatingAdmissionPolicyBinding"}
VERSIONS = ("1.36.0", kubernetes_validate.latest_version())
NAMESPACE = "gpuzombie"
HELM_ONLY_LABELS = ("helm.sh/chart", "app.kubernetes.io/managed-by")


def policy_objects(helm_binary: str, values: dict[str, Any]) -> dict[str, dict[str, Any]]:
    found = {o["kind"]: o for o in render(helm_binary, values, namespace=NAMESPACE, kube_version="1.36.0")}
    return {kind: obj for kind, obj in found.items() if kind in KINDS}


def test_off_by_default(helm_binary):
    assert policy_objects(helm_binary, {}) == {}
    assert policy_objects(helm_binary, {"webhook": {"enabled": True}}) == {}


def test_renders_valid_objects(helm_binary):
    objects = policy_objects(helm_binary, {"policy": {"enabled": True}})
    assert set(objects) == KINDS
    for obj in objects.values():
        for version in VERSIONS:
            kubernetes_validate.validate(obj, version, strict=True)
    policy, binding = objects["MutatingAdmissionPolicy"], objects["MutatingAdmissionPolicyBinding"]
    assert binding["spec"]["policyName"] == policy["metadata"]["name"]
    assert policy["spec"]["failurePolicy"] == "Ignore"  # a CEL error admits the pod unchanged, as the webhook
    assert policy["spec"]["reinvocationPolicy"] == "IfNeeded"
    assert [m["patchType"] for m in policy["spec"]["mutations"]] == ["JSONPatch"]


def test_the_validation_is_strict(helm_binary):
    """A misspelt field fails: the schema validation above would catch one in the template."""
    policy = policy_objects(helm_binary, {"policy": {"enabled": True}})["MutatingAdmissionPolicy"]
    broken = copy.deepcopy(policy)
    broken["spec"]["mutations"][0]["jsonPatch"]["expresion"] = broken["spec"]["mutations"][0]["jsonPatch"].pop(
        "expression"
    )
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, VERSIONS[0], strict=True)


def test_takes_the_webhooks_settings(helm_binary):
    values = {
        "policy": {"enabled": True},
        "image": {"registry": "harbor.example.org"},
        "webhook": {
            "failurePolicy": "Fail",
            "skipNamespaces": ["batch-legacy"],
            "namespaceSelector": {"matchLabels": {"gpuzombie.dev/webhook": "enabled"}},
        },
    }
    objects = policy_objects(helm_binary, values)
    policy, binding = objects["MutatingAdmissionPolicy"], objects["MutatingAdmissionPolicyBinding"]
    assert policy["spec"]["failurePolicy"] == "Fail"
    assert (
        '"harbor.example.org/gpu-zombie/gpuzombie-node:0.1.0"'
        in policy["spec"]["mutations"][0]["jsonPatch"]["expression"]
    )
    selector = binding["spec"]["matchResources"]["namespaceSelector"]
    assert selector["matchLabels"] == {"gpuzombie.dev/webhook": "enabled"}
    assert selector["matchExpressions"][0]["values"] == ["kube-system", NAMESPACE, "batch-legacy"]
    assert binding["spec"]["matchResources"]["objectSelector"]["matchExpressions"][0]["key"] == "gpuzombie.dev/inject"
    injected = policy_objects(
        helm_binary, {"policy": {"enabled": True}, "webhook": {"injectImage": "mirror.example/tini:1"}}
    )
    assert (
        '"mirror.example/tini:1"'
        in injected["MutatingAdmissionPolicy"]["spec"]["mutations"][0]["jsonPatch"]["expression"]
    )


def test_refused_beside_the_webhook(helm_binary):
    """The policy runs before the webhook, which would then leave every pod it fixed alone."""
    got = helm(
        helm_binary,
        "template",
        "gpuzombie",
        str(CHART),
        values={"policy": {"enabled": True}, "webhook": {"enabled": True}},
    )
    assert got.returncode != 0
    assert "policy.enabled and webhook.enabled: choose one" in got.stderr


@pytest.mark.parametrize("kube_version", ["1.25.0", "1.30.0", "1.35.4", "1.35.9-gke.1000"])
def test_refused_before_kubernetes_1_36(helm_binary, kube_version):
    """Issue 35 (9): policy.enabled rendered for Kubernetes 1.30, whose API server has no
    admissionregistration.k8s.io/v1 MutatingAdmissionPolicy (GA in 1.36): the install failed on the
    kind, or a cluster that had the beta on ran another version of it. Providers' versions (GKE's
    1.35.9-gke.1000) are semver pre-releases: compared as their release."""
    got = helm(
        helm_binary,
        "template",
        "gpuzombie",
        str(CHART),
        "--kube-version",
        f"v{kube_version}",
        values={"policy": {"enabled": True}},
    )
    assert got.returncode != 0
    # helm 3 drops the pre-release part of --kube-version, helm 4 keeps it
    assert (
        "policy.enabled needs Kubernetes >= 1.36" in got.stderr and f"not v{kube_version.split('-')[0]}" in got.stderr
    )


@pytest.mark.parametrize("kube_version", ["1.36.0", "1.36.0-rc.1", "1.36.2-gke.1100", "1.37.2"])
def test_rendered_from_kubernetes_1_36(helm_binary, kube_version):
    objects = render(helm_binary, {"policy": {"enabled": True}}, namespace=NAMESPACE, kube_version=kube_version)
    assert {o["kind"] for o in objects} >= KINDS


def test_the_audit_alert_comes_with_the_policy(helm_binary):
    values = {"policy": {"enabled": True}, "prometheusRule": {"enabled": True}}
    rendered = render(helm_binary, values, namespace=NAMESPACE, kube_version="1.36.0")
    (rule,) = [o for o in rendered if o["kind"] == "PrometheusRule"]
    assert "gpuzombie-admission" in {g["name"] for g in rule["spec"]["groups"]}


def _without_helm_labels(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {k: _without_helm_labels(v) for k, v in obj.items() if k not in HELM_ONLY_LABELS}
    if isinstance(obj, list):
        return [_without_helm_labels(v) for v in obj]
    return obj


def test_the_plain_manifest_is_the_chart(helm_binary):
    values = {"policy": {"enabled": True}, "image": {"registry": "REGISTRY.example.com"}}
    rendered = [
        o for o in render(helm_binary, values, namespace=NAMESPACE, kube_version="1.36.0") if o["kind"] in KINDS
    ]
    shipped = [
        d
        for d in yaml.safe_load_all((REPO / "deploy" / "admission" / "mutating-admission-policy.yaml").read_text())
        if d
    ]
    assert shipped == _without_helm_labels(rendered), "run scripts/render-policy.sh"
