"""The chart's admission objects on the real cluster: rendered by the real helm (scripts/get-helm.sh),
applied to the API server as they are, and switched on and off with a probe pod that shows when the
API server's admission chain has caught up (its policy and webhook informers are asynchronous)."""

from __future__ import annotations

import base64
import json
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from kube.api import Api, metric, wait_for

REPO = Path(__file__).resolve().parents[2]
CHART = REPO / "charts" / "gpuzombie"
RELEASE = "gpuzombie"
NAMESPACE = "gpuzombie"
"""The release's namespace: left alone by the webhook and the policy."""
PROBE_NAMESPACE = "ml-train"
WEBHOOK_NAME = "gpu-pods.gpuzombie.dev"
POLICY_NAME = "gpuzombie-policy"
INJECTED = "gpuzombie.dev/injected"
BUSYBOX = "localhost/gpuzombie/busybox:static"
GPU = "nvidia.com/gpu"


def helm_binary() -> str:
    got = subprocess.run([str(REPO / "scripts" / "get-helm.sh")], capture_output=True, text=True, timeout=600)
    assert got.returncode == 0, f"scripts/get-helm.sh: {got.stderr.strip()}"
    return got.stdout.strip()


def render(values: Mapping[str, Any], kube_version: str) -> list[dict[str, Any]]:
    """``helm template`` of the chart as release gpuzombie in namespace gpuzombie."""
    with tempfile.NamedTemporaryFile("w", suffix=".yaml") as values_file:
        json.dump(values, values_file)
        values_file.flush()
        argv = [helm_binary(), "template", RELEASE, str(CHART), "--namespace", NAMESPACE]
        argv += ["--kube-version", kube_version, "--values", values_file.name]
        got = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert got.returncode == 0, got.stderr
    return [d for d in yaml.safe_load_all(got.stdout) if d]


def webhook_values(ca_pem: bytes, secret: str) -> dict[str, Any]:
    """The chart's own path for a cluster without cert-manager: a TLS Secret you made and its CA."""
    return {
        "webhook": {
            "enabled": True,
            "certManager": {"enabled": False},
            "secretName": secret,
            "caBundle": base64.b64encode(ca_pem).decode(),
        }
    }


def admission_objects(objects: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The webhook's objects (its Deployment, Service, ServiceAccount, PDB, configuration) or the
    policy's: what the chart labels as the admission component (the node agent's are another test's)."""
    return [
        o
        for o in objects
        if (o["metadata"].get("labels") or {}).get("app.kubernetes.io/component") == "admission-webhook"
    ]


def tls_secret(name: str, cert: Path, key: Path) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "kubernetes.io/tls",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "data": {
            "tls.crt": base64.b64encode(cert.read_bytes()).decode(),
            "tls.key": base64.b64encode(key.read_bytes()).decode(),
        },
    }


def probe_pod(name: str = "probe", namespace: str = PROBE_NAMESPACE) -> dict[str, Any]:
    """A GPU pod both the webhook and the policy fix (tini for its command)."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "containers": [
                {
                    "name": "train",
                    "image": BUSYBOX,
                    "command": ["python3", "train.py"],
                    "resources": {"limits": {GPU: "1"}},
                }
            ]
        },
    }


@dataclass(frozen=True)
class Admission:
    """What fixes a GPU pod now: one dry run of the probe, and whether the webhook was called for it."""

    fixed: bool
    webhook_called: bool


def probe(api: Api) -> Admission:
    before = webhook_calls(api)
    reply = api.dry_run_pod(probe_pod())
    assert reply.ok, reply.body
    fixed = INJECTED in (reply.body["metadata"].get("annotations") or {})
    return Admission(fixed, webhook_calls(api) > before)


def webhook_calls(api: Api) -> float:
    return metric(api.metrics(), "apiserver_admission_webhook_request_total", name=WEBHOOK_NAME)


def wait_until_admission(api: Api, *, fixed: bool, webhook_called: bool, timeout: float = 120) -> None:
    """Until the probe pod comes out fixed or not, through the webhook or not (the API server's
    admission informers take a moment to see a new or deleted configuration)."""
    wanted = Admission(fixed, webhook_called)
    wait_for(f"the API server's admission to be {wanted}", lambda: probe(api) == wanted, timeout=timeout)


def apply_all(api: Api, objects: Sequence[Mapping[str, Any]]) -> None:
    for obj in objects:
        reply = api.apply(obj)
        assert reply.ok, (obj["kind"], obj["metadata"]["name"], reply.body.get("message"))


def delete_all(api: Api, objects: Sequence[Mapping[str, Any]]) -> None:
    for obj in objects:
        reply = api.delete(obj)
        assert reply.ok or reply.status == 404, (obj["kind"], reply.body.get("message"))
