"""deploy/ (the seed's per-scenario pod.yaml, for `kubectl apply` without Helm) and argocd-app.yaml.

deploy/ must not drift from the chart: every manifest there equals the chart's rendering (default
values plus the non-root variant) minus the labels only Helm sets. After a chart change, regenerate:
    GPUZOMBIE_UPDATE_DEPLOY=1 python3 -m pytest tests/k8s/test_k8s_manifests.py
"""

from __future__ import annotations

import os
import pathlib
import re
from typing import Any

import pytest

pytest.importorskip("helm_python", reason="helm-python-sdk is in the 'chart' extra")
pytest.importorskip("kubernetes_validate", reason="kubernetes-validate is in the 'chart' extra")

from k8s_support import (
    CHART_DIR,
    DEPLOY_DIR,
    NAMESPACE,
    RELEASE,
    REPO,
    SCENARIOS,
    helm,
    render,
    validate_strictly,
    yaml,
)

HELM_ONLY_LABELS = ("helm.sh/chart", "app.kubernetes.io/managed-by")
HEADER = """\
# Generated from charts/gpu-zombie-test/{template} (default values, every scenario on);
# tests/k8s/test_k8s_manifests.py keeps the two equal.
# Apply without Helm: kubectl apply -f deploy/namespace.yaml -f deploy/{name}
# PLACEHOLDER: REGISTRY.example.com/gpu-zombie (image) and the pull secret registry-pull-secret.
"""


def _without_helm_labels(obj: Any) -> Any:
    """The object with Helm's bookkeeping labels removed at every level (pod templates too)."""
    if isinstance(obj, dict):
        return {key: _without_helm_labels(value) for key, value in obj.items() if key not in HELM_ONLY_LABELS}
    if isinstance(obj, list):
        return [_without_helm_labels(value) for value in obj]
    return obj


def expected_deploy() -> dict[str, dict[str, Any]]:
    """deploy/<file name> -> object, from the chart with every scenario on."""
    values = {"scenarios": {key: {"enabled": True} for key in SCENARIOS}}
    return {pathlib.PurePath(template).name: _without_helm_labels(obj) for template, obj in render(values).items()}


def _deploy_files() -> list[pathlib.Path]:
    return sorted(DEPLOY_DIR.glob("*.yaml"))


if os.environ.get("GPUZOMBIE_UPDATE_DEPLOY") == "1":  # regenerate before the tests read deploy/
    DEPLOY_DIR.mkdir(exist_ok=True)
    for _name, _obj in expected_deploy().items():
        _template = f"templates/{_name}"
        (DEPLOY_DIR / _name).write_text(
            HEADER.format(template=_template, name=_name) + yaml.safe_dump(_obj, sort_keys=False, width=110)
        )


def test_deploy_matches_the_chart():
    expected = expected_deploy()
    on_disk = {path.name: yaml.safe_load(path.read_text()) for path in _deploy_files()}
    on_disk.pop("namespace.yaml")
    assert sorted(on_disk) == sorted(expected), "run GPUZOMBIE_UPDATE_DEPLOY=1 (module docstring)"
    for name, obj in expected.items():
        assert on_disk[name] == obj, f"deploy/{name} drifted from {CHART_DIR.name}: regenerate"


def test_deploy_has_one_pod_per_scenario_in_the_namespace():
    pods = {}
    for path in _deploy_files():
        obj = yaml.safe_load(path.read_text())
        if obj["kind"] == "Namespace":
            assert obj["metadata"]["name"] == NAMESPACE
            continue
        assert obj["metadata"]["namespace"] == NAMESPACE
        if obj["kind"] == "Pod":
            pods[obj["metadata"]["name"]] = path.name
    assert sorted(pods) == sorted(name for name, _ in SCENARIOS.values())
    assert pods["gpu-zombie-tini-prestop"] == "pod-tini-prestop.yaml"


@pytest.mark.parametrize("path", _deploy_files(), ids=lambda p: p.name)
def test_deploy_manifest_is_valid_in_oldest_and_newest_kubernetes(path):
    validate_strictly(yaml.safe_load(path.read_text()))


def test_argocd_application_syncs_the_chart_from_oci():
    app = yaml.safe_load((REPO / "argocd-app.yaml").read_text())
    chart = yaml.safe_load((CHART_DIR / "Chart.yaml").read_text())
    assert (app["apiVersion"], app["kind"]) == ("argoproj.io/v1alpha1", "Application")
    source, sync = app["spec"]["source"], app["spec"]["syncPolicy"]
    assert source["chart"] == chart["name"] == RELEASE
    assert source["targetRevision"] == chart["version"]
    # Helm OCI in ArgoCD: a registry path without a scheme; the placeholder is unmistakable.
    assert "://" not in source["repoURL"] and source["repoURL"].startswith("REGISTRY.example.com/")
    assert sync["automated"] == {"prune": True, "selfHeal": True}
    assert "CreateNamespace=true" in sync["syncOptions"]
    assert app["spec"]["destination"]["namespace"] == NAMESPACE
    # The namespace ArgoCD creates carries the labels deploy/namespace.yaml has.
    namespace = yaml.safe_load((DEPLOY_DIR / "namespace.yaml").read_text())
    assert sync["managedNamespaceMetadata"]["labels"] == namespace["metadata"]["labels"]
    # Its values override must be values the chart knows (a typo would be silently ignored).
    chart_values = yaml.safe_load((CHART_DIR / "values.yaml").read_text())
    for key, value in source["helm"]["valuesObject"].items():
        assert key in chart_values
        if isinstance(value, dict):
            assert set(value) <= set(chart_values[key])


def _readme_section() -> str:
    text = (REPO / "README.md").read_text()
    start = text.index("## The experiment on a cluster")
    end = text.find("\n## ", start + 1)
    return text[start : end if end != -1 else None]


def test_readme_helm_flags_render_and_files_exist():
    """The README's --set flags are values the chart knows, and what it applies exists."""
    import shlex

    section = _readme_section()
    shell = "\n".join(re.findall(r"```sh\n(.*?)```", section, re.S)).replace("\\\n", " ")
    words = shlex.split(shell, comments=True)
    sets = [words[i + 1] for i, word in enumerate(words) if word == "--set"]
    assert sets
    defaults = yaml.safe_load((CHART_DIR / "values.yaml").read_text())
    values: dict = {}
    with helm.Chart.load(CHART_DIR) as chart:
        for expression in sets:  # as `helm install --set` composes them
            parsed = helm.parse_set_string(expression)
            assert set(parsed) <= set(defaults), expression
            values = chart.merge_values({**values, **parsed})
    pods = [o for o in render(values).values() if o["kind"] == "Pod"]
    assert pods and all(p["spec"]["nodeSelector"] == {"kubernetes.io/hostname": "gpu-4"} for p in pods)
    for path in re.findall(r"(?:kubectl apply -f |-f )((?:deploy/)?[\w./-]+\.yaml)", section):
        assert (REPO / path).is_file(), path
    for tag in re.findall(r"`:([\w-]+)`", section):
        assert tag in {"nofix", "tini", "fullfix", "nofix-uid1000", "node"}, tag
