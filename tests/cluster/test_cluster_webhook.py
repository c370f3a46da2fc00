"""The chart's admission webhook through the real helm binary: off by default; its objects with every
toggle validated strictly (Kubernetes schemas at the rendered version and the newest, cert-manager's
Certificate and Issuer against cert-manager's own CRD schemas); the Deployment's command accepted by
the real CLI (the matchConditions, evaluated by the real API server: tests/kube/test_admission_kubernetes.py); the
audit alert through promtool; and `helm template` output checked by `gpuzombie check`."""

from __future__ import annotations

import base64
import json
import pathlib
import subprocess
import sys
from typing import Any

import pytest

kubernetes_validate = pytest.importorskip("kubernetes_validate", reason="kubernetes-validate is in the 'chart' extra")
yaml = pytest.importorskip("yaml", reason="PyYAML is in the 'chart' extra")

from cluster_support import CHART, EXPERIMENT_CHART, REPO, _crd_validator, promtool, render  # noqa: E402

ADMISSION_ALERTS = CHART / "files" / "gpuzombie-admission-alerts.yaml"
ADMISSION_TESTS = pathlib.Path(__file__).resolve().parent / "promtool" / "gpuzombie-admission-alerts.test.yaml"
NAMESPACE = "gpuzombie"
WEBHOOK_KINDS = {"Deployment", "ServiceAccount", "Service", "PodDisruptionBudget", "MutatingWebhookConfiguration"}
TOGGLES: dict[str, dict[str, Any]] = {
    "cert-manager": {"webhook": {"enabled": True}},
    "cert-manager-issuer": {
        "webhook": {"enabled": True, "certManager": {"issuerRef": {"name": "cluster-ca", "kind": "ClusterIssuer"}}}
    },
    "own-secret": {
        "webhook": {
            "enabled": True,
            "certManager": {"enabled": False},
            "secretName": "gpuzombie-webhook-tls",
            "caBundle": base64.b64encode(b"-----BEGIN CERTIFICATE-----\n").decode(),
        }
    },
    "warn-opt-ins": {
        "webhook": {
            "enabled": True,
            "mode": "warn",
            "skipNamespaces": ["batch-legacy"],
            "optIns": ["ml-train:prestop=true", "ml-train:grace-seconds=60"],
            "namespaceSelector": {"matchLabels": {"gpuzombie.dev/webhook": "enabled"}},
            "injectImage": "harbor.example.org/aipf/gpuzombie-node:0.1.0",
            "ipv6": True,
        },
        "prometheusRule": {"enabled": True},
    },
}


def validate(obj: dict[str, Any], kube_version: str) -> None:
    if obj["apiVersion"] == "cert-manager.io/v1":
        errors = sorted(_crd_validator(obj["kind"]).iter_errors(obj), key=str)
        assert not errors, f"{obj['kind']}: " + "; ".join(f"{list(e.absolute_path)}: {e.message}" for e in errors)
        return
    if obj["apiVersion"] == "monitoring.coreos.com/v1":
        return  # test_cluster_chart validates those
    for version in {kube_version, kubernetes_validate.latest_version()}:
        kubernetes_validate.validate(obj, version, strict=True)


def webhook_objects(helm_binary: str, values: dict[str, Any], kube_version: str = "1.30.0") -> dict[str, Any]:
    objects = render(helm_binary, values, namespace=NAMESPACE, kube_version=kube_version)
    for obj in objects:
        validate(obj, kube_version)
    return {
        o["kind"]: o
        for o in objects
        if o["metadata"].get("labels", {}).get("app.kubernetes.io/component") != "node-agent"
    }


def test_off_by_default(helm_binary):
    kinds = {o["kind"] for o in render(helm_binary, {}, namespace=NAMESPACE)}
    assert not kinds & (WEBHOOK_KINDS | {"Certificate", "Issuer"}) - {"Service"}
    assert yaml.safe_load((CHART / "values.yaml").read_text())["webhook"]["enabled"] is False


@pytest.mark.parametrize("kube_version", ["1.25.0", "1.29.0", "1.37.0"])
@pytest.mark.parametrize("toggle", list(TOGGLES))
def test_webhook_objects_validate_strictly(helm_binary, toggle, kube_version):
    objects = webhook_objects(helm_binary, TOGGLES[toggle], kube_version)
    assert set(objects) >= WEBHOOK_KINDS
    config = objects["MutatingWebhookConfiguration"]["webhooks"][0]
    assert ("matchConditions" in config) is (kube_version != "1.25.0")  # GA in 1.30, beta on in 1.28
    expected = {"cert-manager-issuer": {"Certificate"}, "own-secret": set()}.get(toggle, {"Certificate", "Issuer"})
    assert set(objects) & {"Certificate", "Issuer"} == expected


def test_the_configuration_never_blocks_pods_and_is_reinvoked(helm_binary):
    objects = webhook_objects(helm_binary, TOGGLES["cert-manager"])
    mwc = objects["MutatingWebhookConfiguration"]
    (hook,) = mwc["webhooks"]
    assert hook["failurePolicy"] == "Ignore" and hook["sideEffects"] == "None"
    assert hook["reinvocationPolicy"] == "IfNeeded" and hook["timeoutSeconds"] <= 5
    assert hook["admissionReviewVersions"] == ["v1"]
    assert hook["rules"] == [
        {
            "operations": ["CREATE"],
            "apiGroups": [""],
            "apiVersions": ["v1"],
            "resources": ["pods"],
            "scope": "Namespaced",
        }
    ]
    (skip,) = hook["namespaceSelector"]["matchExpressions"]
    assert skip["operator"] == "NotIn" and set(skip["values"]) == {"kube-system", NAMESPACE}
    assert hook["clientConfig"]["service"]["name"] == objects["Service"]["metadata"]["name"]
    assert hook["clientConfig"]["service"]["path"] == "/mutate"
    certificate = objects["Certificate"]
    assert (
        mwc["metadata"]["annotations"]["cert-manager.io/inject-ca-from"]
        == f"{NAMESPACE}/{certificate['metadata']['name']}"
    )
    assert f"{objects['Service']['metadata']['name']}.{NAMESPACE}.svc" in certificate["spec"]["dnsNames"]
    secret = objects["Deployment"]["spec"]["template"]["spec"]["volumes"][0]["secret"]["secretName"]
    assert secret == certificate["spec"]["secretName"]


def test_own_secret_and_ca_bundle(helm_binary):
    objects = webhook_objects(helm_binary, TOGGLES["own-secret"])
    (hook,) = objects["MutatingWebhookConfiguration"]["webhooks"]
    assert hook["clientConfig"]["caBundle"] == TOGGLES["own-secret"]["webhook"]["caBundle"]
    assert "annotations" not in objects["MutatingWebhookConfiguration"]["metadata"]
    volumes = objects["Deployment"]["spec"]["template"]["spec"]["volumes"]
    assert volumes[0]["secret"]["secretName"] == "gpuzombie-webhook-tls"
    missing = {"webhook": {"enabled": True, "certManager": {"enabled": False}}}
    from cluster_support import helm

    got = helm(helm_binary, "template", "gz", str(CHART), values=missing)
    assert got.returncode != 0 and "webhook.secretName" in got.stderr


def test_the_deployment_is_least_privileged_and_highly_available(helm_binary):
    objects = webhook_objects(helm_binary, TOGGLES["cert-manager"])
    deployment = objects["Deployment"]
    pod = deployment["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    assert deployment["spec"]["replicas"] == 2
    assert objects["PodDisruptionBudget"]["spec"]["minAvailable"] == 1
    assert pod["automountServiceAccountToken"] is False and pod["securityContext"]["runAsNonRoot"] is True
    assert objects["ServiceAccount"]["automountServiceAccountToken"] is False
    assert c["securityContext"] == {
        "privileged": False,
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "capabilities": {"drop": ["ALL"]},
    }
    assert {c["readinessProbe"]["httpGet"]["path"], c["livenessProbe"]["httpGet"]["path"]} == {"/readyz", "/healthz"}
    assert c["readinessProbe"]["httpGet"]["scheme"] == "HTTPS"
    assert c["resources"]["limits"]["memory"]


@pytest.mark.parametrize("toggle", list(TOGGLES))
def test_the_real_cli_accepts_the_deployments_command(helm_binary, toggle):
    from gpuzombie.cli.webhook import command

    objects = webhook_objects(helm_binary, TOGGLES[toggle])
    (c,) = objects["Deployment"]["spec"]["template"]["spec"]["containers"]
    assert c["command"][:2] == ["gpuzombie", "webhook"]
    argv = [a.replace("$(POD_IP)", "10.0.0.7" if "[" not in a else "fd00::7") for a in c["command"][2:]]
    ctx = command.make_context("webhook", argv)
    assert ctx.params["tls_cert"] == "/etc/gpuzombie/webhook-tls/tls.crt"
    assert ctx.params["mode"] == TOGGLES[toggle]["webhook"].get("mode", "mutate")
    if toggle == "warn-opt-ins":
        assert ctx.params["opt_in"] == {"ml-train": {"prestop": "true", "grace-seconds": "60"}}
        assert ctx.params["skip_namespace"] == ("batch-legacy",)
        assert ctx.params["image"] == "harbor.example.org/aipf/gpuzombie-node:0.1.0"
        assert (
            "batch-legacy"
            in objects["MutatingWebhookConfiguration"]["webhooks"][0]["namespaceSelector"]["matchExpressions"][0][
                "values"
            ]
        )


def test_promtool_checks_and_tests_the_audit_alert():
    for args in (("check", "rules", str(ADMISSION_ALERTS)), ("test", "rules", str(ADMISSION_TESTS))):
        got = promtool(*args)
        assert got.returncode == 0, got.stdout + got.stderr


def test_the_prometheus_rule_audits_the_namespaces_the_webhook_covers(helm_binary):
    objects = render(helm_binary, TOGGLES["warn-opt-ins"], namespace=NAMESPACE)
    (rule,) = [o for o in objects if o["kind"] == "PrometheusRule"]
    groups = {g["name"]: g for g in rule["spec"]["groups"]}
    (alert,) = groups["gpuzombie-admission"]["rules"]
    assert f'namespace!~"kube-system|{NAMESPACE}|batch-legacy"' in alert["expr"]
    assert alert["annotations"]["runbook_url"] == "docs/admission.md#gpuzombiewebhookmissedgpupod"
    off = render(helm_binary, {"prometheusRule": {"enabled": True}}, namespace=NAMESPACE)
    (rule,) = [o for o in off if o["kind"] == "PrometheusRule"]
    assert "gpuzombie-admission" not in {g["name"] for g in rule["spec"]["groups"]}


def test_check_reads_helm_template_output(helm_binary):
    """The experiment chart's scenario pods, as `helm template` prints them, through `gpuzombie check -`."""
    from cluster_support import helm

    got = helm(helm_binary, "template", "gpu-zombie-test", str(EXPERIMENT_CHART))
    assert got.returncode == 0, got.stderr
    done = subprocess.run(
        [sys.executable, "-m", "gpuzombie", "check", "--json", "--fail-on", "warning", "-"],
        input=got.stdout,
        capture_output=True,
        text=True,
        timeout=60,
        cwd=REPO,
    )
    assert done.returncode == 1, done.stderr
    report = json.loads(done.stdout)
    by_name = {p["name"]: [f["rule"] for f in p["findings"]] for p in report["pods"]}
    assert by_name["gpu-zombie-nofix"] == ["GZ001"]  # S1's `& exec sleep infinity`, PID 1 not claimed
    assert report["summary"]["gpu_pods"] >= 4
