"""Shared pieces of the cluster-install tests: the real helm binary (scripts/get-helm.sh), rendering
and linting through it, and strict validation of what it renders: core objects against the
Kubernetes OpenAPI schemas (kubernetes-validate, unknown fields rejected) and the
prometheus-operator objects against the operator's own CRD schemas (crds/, source named inside),
made strict the same way."""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import subprocess
import tempfile
from functools import cache
from typing import Any

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "gpuzombie"
EXPERIMENT_CHART = REPO / "charts" / "gpu-zombie-test"
ALERTS = CHART / "files" / "gpuzombie-alerts.yaml"
DASHBOARD = CHART / "dashboards" / "gpuzombie.json"
DOCS = REPO / "docs" / "cluster.md"
CRDS = pathlib.Path(__file__).resolve().parent / "crds"
OLDEST_K8S = "1.25.0"  # both charts' kubeVersion floor


def promtool(*args: str) -> subprocess.CompletedProcess[str]:
    """Debian's promtool (a skip where it is not installed)."""
    if shutil.which("promtool") is None:
        pytest.skip("promtool is not installed (Debian package prometheus; make test installs it)")
    return subprocess.run(["promtool", *args], capture_output=True, text=True, timeout=120)


def find_helm() -> str:
    """The pinned helm from scripts/get-helm.sh (built from Helm's Go module: minutes cold, then
    cached); a skip without Go, but a failure in CI."""
    got = subprocess.run([str(REPO / "scripts" / "get-helm.sh")], capture_output=True, text=True, timeout=1800)
    if got.returncode != 0:
        message = f"scripts/get-helm.sh failed: {got.stderr.strip()}"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return got.stdout.strip()


def helm(binary: str, *args: str, values: dict[str, Any] | None = None) -> subprocess.CompletedProcess[str]:
    """Run helm with ``values`` given as a values file (JSON is YAML)."""
    with tempfile.NamedTemporaryFile("w", suffix=".yaml") as values_file:
        json.dump(values or {}, values_file)
        values_file.flush()
        return subprocess.run(
            [binary, *args, "--values", values_file.name], capture_output=True, text=True, timeout=120
        )


def render(
    binary: str,
    values: dict[str, Any] | None = None,
    *,
    chart: pathlib.Path = CHART,
    release: str = "gpuzombie",
    namespace: str = "monitoring",
    kube_version: str | None = None,
) -> list[dict[str, Any]]:
    import yaml

    args = ["template", release, str(chart), "--namespace", namespace]
    if kube_version:
        args += ["--kube-version", f"v{kube_version}"]
    got = helm(binary, *args, values=values)
    assert got.returncode == 0, f"helm template: exit {got.returncode}\n{got.stderr}"
    return [doc for doc in yaml.safe_load_all(got.stdout) if doc]


def by_kind(objects: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    found: dict[str, dict[str, Any]] = {}
    for obj in objects:
        assert obj["kind"] not in found, f"two {obj['kind']} objects"
        found[obj["kind"]] = obj
    return found


def _strict(schema: Any) -> Any:
    """The schema with unknown fields rejected wherever it lists the known ones."""
    if isinstance(schema, dict):
        out = {k: _strict(v) for k, v in schema.items()}
        if (
            "properties" in out
            and "additionalProperties" not in out
            and not out.get("x-kubernetes-preserve-unknown-fields")
        ):
            out["additionalProperties"] = False
        return out
    if isinstance(schema, list):
        return [_strict(v) for v in schema]
    return schema


@cache
def _crd_validator(kind: str) -> Any:
    import jsonschema

    spec = json.loads((CRDS / f"{kind.lower()}.json").read_text())
    schema = _strict(spec["openAPIV3Schema"])
    schema["properties"]["metadata"] = {"type": "object"}
    return jsonschema.Draft7Validator(schema)


def validate_strictly(obj: dict[str, Any]) -> None:
    """Fail on any schema violation or unknown field (prometheus-operator's and cert-manager's objects
    against their CRD schemas)."""
    import kubernetes_validate

    if obj["apiVersion"] in ("monitoring.coreos.com/v1", "cert-manager.io/v1"):
        errors = sorted(_crd_validator(obj["kind"]).iter_errors(obj), key=str)
        assert not errors, f"{obj['kind']}: " + "; ".join(f"{list(e.absolute_path)}: {e.message}" for e in errors)
        return
    for version in (OLDEST_K8S, kubernetes_validate.latest_version()):
        kubernetes_validate.validate(obj, version, strict=True)
