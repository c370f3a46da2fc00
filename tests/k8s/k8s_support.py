"""Shared pieces of the Kubernetes delivery tests: the chart renderer and the strict validator.

Test modules import this after `pytest.importorskip` of the 'chart' extra's modules.

Everything runs offline: Helm's own Go engine (helm-python-sdk) renders and lints the chart, and
kubernetes-validate checks each object against the OpenAPI schemas of a Kubernetes release with
unknown fields rejected.
"""

from __future__ import annotations

import pathlib
from typing import Any

import helm_python as helm
import kubernetes_validate
import yaml

REPO = pathlib.Path(__file__).resolve().parents[2]
CHART_DIR = REPO / "charts" / "gpu-zombie-test"
DEPLOY_DIR = REPO / "deploy"
RELEASE = "gpu-zombie-test"
NAMESPACE = "gpu-zombie-test"

# The oldest Kubernetes the chart supports (Chart.yaml kubeVersion) and the newest schema shipped.
OLDEST_K8S = "1.25.0"
K8S_VERSIONS = (OLDEST_K8S, kubernetes_validate.latest_version())

# values key -> (pod name, `gpuzombie lab run --scenario`): the seed's scenario table.
SCENARIOS = {
    "nofix": ("gpu-zombie-nofix", "s1-nofix"),
    "tini": ("gpu-zombie-tini", "s2-tini"),
    "tiniPrestop": ("gpu-zombie-tini-prestop", "s3-tini-prestop"),
    "fullfix": ("gpu-zombie-fullfix", "s4-fullfix"),
    "nofixUid1000": ("gpu-zombie-nofix-uid1000", "s1-nofix"),
    "sharePid": ("gpu-zombie-sharepid", "s5-sharepid"),
}
DEFAULT_SCENARIOS = ("nofix", "tini", "tiniPrestop", "fullfix")


def only(scenario: str | None, *, node: bool = False) -> dict[str, Any]:
    """Values that enable just one scenario (None: none) and the DaemonSet when asked."""
    return {
        "scenarios": {key: {"enabled": key == scenario} for key in SCENARIOS},
        "node": {"enabled": node},
    }


def render(values: dict[str, Any] | None = None) -> dict[str, dict[str, Any]]:
    """Render the chart like `helm template`; returns {template path: object}, NOTES.txt dropped."""
    with helm.Chart.load(CHART_DIR) as chart:
        rendered = chart.render(values, name=RELEASE, namespace=NAMESPACE, is_install=True)
    objects = {}
    for path, text in rendered.items():
        if path.endswith("NOTES.txt"):
            continue
        docs = [doc for doc in yaml.safe_load_all(text) if doc]
        assert len(docs) <= 1, f"{path}: one object per template"
        if docs:
            objects[path] = docs[0]
    return objects


def notes(values: dict[str, Any] | None = None) -> str:
    with helm.Chart.load(CHART_DIR) as chart:
        rendered = chart.render(values, name=RELEASE, namespace=NAMESPACE, is_install=True)
    return next(text for path, text in rendered.items() if path.endswith("NOTES.txt"))


def validate_strictly(obj: dict[str, Any]) -> None:
    """Fail on any schema violation or unknown field, in the oldest and the newest version."""
    for version in K8S_VERSIONS:
        kubernetes_validate.validate(obj, version, strict=True)


def pods_by_name(objects: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {o["metadata"]["name"]: o for o in objects.values() if o["kind"] == "Pod"}


def container(obj: dict[str, Any]) -> dict[str, Any]:
    """The one container of a scenario pod or of the DaemonSet's pod template."""
    spec = obj["spec"]["template"]["spec"] if obj["kind"] == "DaemonSet" else obj["spec"]
    (only_container,) = spec["containers"]
    return only_container
