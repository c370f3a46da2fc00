"""The real API server over its REST API (standard library only): one TLS connection per call with
the admin's client certificate from the cluster's kubeconfig. The tests that send many pods (server-side
dry runs of every admission fixture) use it rather than a kubectl process per pod."""

from __future__ import annotations

import http.client
import json
import ssl
import time
import urllib.parse
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")
TIMEOUT_S = 60.0
"""Per request; beside `stress-ng --cpu 2` a dry-run create took 10-150 ms here."""


@dataclass(frozen=True)
class Reply:
    status: int
    raw: bytes
    warnings: tuple[str, ...] = ()

    @property
    def body(self) -> dict[str, Any]:
        return json.loads(self.raw) if self.raw else {}

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300


class Api:
    """The cluster's API server as the admin (system:masters)."""

    def __init__(self, kubeconfig: Path) -> None:
        config = json.loads(kubeconfig.read_text())
        cluster = config["clusters"][0]["cluster"]
        user = config["users"][0]["user"]
        url = urllib.parse.urlsplit(cluster["server"])
        self.host, self.port = url.hostname or "127.0.0.1", url.port or 443
        self.context = ssl.create_default_context(cafile=cluster["certificate-authority"])
        self.context.load_cert_chain(user["client-certificate"], user["client-key"])

    def call(
        self, method: str, path: str, body: Mapping[str, Any] | None = None, *, content_type: str = "application/json"
    ) -> Reply:
        """One request; the reply whatever its status (an error is the API's Status object)."""
        connection = http.client.HTTPSConnection(self.host, self.port, context=self.context, timeout=TIMEOUT_S)
        try:
            data = json.dumps(body).encode() if body is not None else None
            headers = {"Accept": "application/json"} | ({"Content-Type": content_type} if data is not None else {})
            connection.request(method, path, body=data, headers=headers)
            response = connection.getresponse()
            raw = response.read()
            warnings = tuple(v for k, v in response.getheaders() if k.lower() == "warning")
            return Reply(response.status, raw, warnings)
        finally:
            connection.close()

    def create(self, path: str, body: Mapping[str, Any], *, dry_run: bool = False) -> Reply:
        return self.call("POST", path + ("?dryRun=All" if dry_run else ""), body)

    def dry_run_pod(self, pod: Mapping[str, Any]) -> Reply:
        """``kubectl create --dry-run=server``: defaulting, every admission plugin (mutating
        policies and webhooks included) and validation, nothing stored."""
        namespace = pod["metadata"]["namespace"]
        return self.create(f"/api/v1/namespaces/{namespace}/pods", pod, dry_run=True)

    def apply(self, obj: Mapping[str, Any]) -> Reply:
        """Server-side apply of one object (created or replaced), as `kubectl apply --server-side --force-conflicts`."""
        path = object_path(obj) + "?fieldManager=gpuzombie-tests&force=true"
        return self.call("PATCH", path, obj, content_type="application/apply-patch+yaml")

    def delete(self, obj: Mapping[str, Any]) -> Reply:
        return self.call("DELETE", object_path(obj))

    def metrics(self) -> str:
        reply = self.call("GET", "/metrics")
        assert reply.ok, reply
        return reply.raw.decode()

    def ensure_namespace(self, name: str) -> None:
        reply = self.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
        assert reply.ok, reply


_RESOURCES = {
    "Namespace": "namespaces",
    "Pod": "pods",
    "Service": "services",
    "Secret": "secrets",
    "ServiceAccount": "serviceaccounts",
    "Endpoints": "endpoints",
    "MutatingAdmissionPolicy": "mutatingadmissionpolicies",
    "MutatingAdmissionPolicyBinding": "mutatingadmissionpolicybindings",
    "MutatingWebhookConfiguration": "mutatingwebhookconfigurations",
    "Deployment": "deployments",
    "DaemonSet": "daemonsets",
    "PodDisruptionBudget": "poddisruptionbudgets",
    "ClusterRole": "clusterroles",
    "ClusterRoleBinding": "clusterrolebindings",
    "DeviceClass": "deviceclasses",
    "DeviceTaintRule": "devicetaintrules",
    "ResourceClaim": "resourceclaims",
}


def object_path(obj: Mapping[str, Any]) -> str:
    """The REST path of ``obj`` (the kinds these tests create)."""
    api_version, kind, meta = obj["apiVersion"], obj["kind"], obj["metadata"]
    prefix = "/api/v1" if api_version == "v1" else f"/apis/{api_version}"
    namespace = meta.get("namespace")
    where = f"/namespaces/{namespace}" if namespace and kind != "Namespace" else ""
    return f"{prefix}{where}/{_RESOURCES[kind]}/{meta['name']}"


def metric(text: str, series_name: str, /, **labels: str) -> float:
    """The sum of the samples of ``series_name`` whose labels include ``labels`` (Prometheus text format)."""
    total = 0.0
    for line in text.splitlines():
        if not line.startswith((series_name + "{", series_name + " ")):
            continue
        series, _, value = line.rpartition(" ")
        if all(f'{k}="{v}"' in series for k, v in labels.items()):
            total += float(value)
    return total


def wait_for(what: str, check: Callable[[], T | None], timeout: float = 120.0, interval: float = 0.5) -> T:
    """Poll ``check`` until it returns something (bounded polling, psutil's call_until)."""
    deadline = time.monotonic() + timeout
    while True:
        got = check()
        if got is not None and got is not False:
            return got
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(interval)
