"""AdmissionReviews as kube-apiserver (v1.30) sends them for a GPU pod, standard library only (the
tests and benchmarks/bench_webhook.py build their requests here; the device has no pytest).

The request is what the API server writes after its defaulting (field by field from the Pod
defaults of k8s.io/kubernetes/pkg/apis/core/v1/defaults.go and the ServiceAccount admission plugin's
token volume): a Deployment's pod carries generateName and no name, its ReplicaSet as owner, and the
replicaset-controller as the user. No kube-apiserver runs here (ADMISSION-NOTES.md): this is the
stand-in, named as such.
"""

from __future__ import annotations

import copy
import sys
import uuid
from os import PathLike
from typing import Any

GPU = {"limits": {"nvidia.com/gpu": "1"}, "requests": {"nvidia.com/gpu": "1"}}
INJECT_IMAGE = "registry.example.com/gpu-zombie/gpuzombie-node:0.1.0"
"""The init container's image the tests and the benchmarks serve the webhook with."""


def webhook_argv(cert: str | PathLike[str], key: str | PathLike[str], *flags: str) -> list[str]:
    """The real `gpuzombie webhook` serving HTTPS on 127.0.0.1 (a free port: its first line names it),
    as the tests and benchmarks/bench_webhook*.py start it."""
    served = ["--listen", "127.0.0.1:0", "--image", INJECT_IMAGE, "--tls-cert", str(cert), "--tls-key", str(key)]
    return [sys.executable, "-m", "gpuzombie", "webhook", *served, *flags]


def container(name: str = "train", *, gpu: bool = True, **fields: Any) -> dict[str, Any]:
    """A container as the API server defaults it."""
    out: dict[str, Any] = {
        "name": name,
        "image": "registry.example.com/ml/train:2.1",
        "resources": copy.deepcopy(GPU) if gpu else {},
        "terminationMessagePath": "/dev/termination-log",
        "terminationMessagePolicy": "File",
        "imagePullPolicy": "IfNotPresent",
        "volumeMounts": [
            {
                "name": "kube-api-access-x7k2p",
                "readOnly": True,
                "mountPath": "/var/run/secrets/kubernetes.io/serviceaccount",
            }
        ],
    }
    out.update(fields)
    return out


def api_server_pod(*containers: dict[str, Any], namespace: str = "ml-train", **spec: Any) -> dict[str, Any]:
    """A Deployment's pod after the API server's defaulting and the ServiceAccount plugin."""
    pod: dict[str, Any] = {
        "kind": "Pod",
        "apiVersion": "v1",
        "metadata": {
            "generateName": "train-7c9d5b8f6d-",
            "namespace": namespace,
            "creationTimestamp": None,
            "labels": {"app": "train", "pod-template-hash": "7c9d5b8f6d"},
            "ownerReferences": [
                {
                    "apiVersion": "apps/v1",
                    "kind": "ReplicaSet",
                    "name": "train-7c9d5b8f6d",
                    "uid": str(uuid.uuid4()),
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
            "managedFields": [
                {
                    "manager": "kube-controller-manager",
                    "operation": "Update",
                    "apiVersion": "v1",
                    "time": "2026-12-01T12:00:00Z",
                    "fieldsType": "FieldsV1",
                    "fieldsV1": {"f:metadata": {"f:generateName": {}}},
                }
            ],
        },
        "spec": {
            "volumes": [
                {
                    "name": "kube-api-access-x7k2p",
                    "projected": {
                        "sources": [
                            {"serviceAccountToken": {"expirationSeconds": 3607, "path": "token"}},
                            {"configMap": {"name": "kube-root-ca.crt", "items": [{"key": "ca.crt", "path": "ca.crt"}]}},
                            {
                                "downwardAPI": {
                                    "items": [
                                        {
                                            "path": "namespace",
                                            "fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"},
                                        }
                                    ]
                                }
                            },
                        ],
                        "defaultMode": 420,
                    },
                }
            ],
            "containers": list(containers) or [container()],
            "restartPolicy": "Always",
            "terminationGracePeriodSeconds": 30,
            "dnsPolicy": "ClusterFirst",
            "serviceAccountName": "default",
            "serviceAccount": "default",
            "securityContext": {},
            "schedulerName": "default-scheduler",
            "tolerations": [
                {
                    "key": "node.kubernetes.io/not-ready",
                    "operator": "Exists",
                    "effect": "NoExecute",
                    "tolerationSeconds": 300,
                },
                {
                    "key": "node.kubernetes.io/unreachable",
                    "operator": "Exists",
                    "effect": "NoExecute",
                    "tolerationSeconds": 300,
                },
            ],
            "priority": 0,
            "enableServiceLinks": True,
            "preemptionPolicy": "PreemptLowerPriority",
        },
        "status": {},
    }
    pod["spec"].update(spec)
    return pod


def admission_review(pod: dict[str, Any], *, operation: str = "CREATE") -> dict[str, Any]:
    """The AdmissionReview of ``pod``'s creation, with a random uid."""
    namespace = pod["metadata"].get("namespace")
    return {
        "kind": "AdmissionReview",
        "apiVersion": "admission.k8s.io/v1",
        "request": {
            "uid": str(uuid.uuid4()),
            "kind": {"group": "", "version": "v1", "kind": "Pod"},
            "resource": {"group": "", "version": "v1", "resource": "pods"},
            "requestKind": {"group": "", "version": "v1", "kind": "Pod"},
            "requestResource": {"group": "", "version": "v1", "resource": "pods"},
            "namespace": namespace,
            "operation": operation,
            "userInfo": {
                "username": "system:serviceaccount:kube-system:replicaset-controller",
                "uid": str(uuid.uuid4()),
                "groups": ["system:serviceaccounts", "system:serviceaccounts:kube-system", "system:authenticated"],
            },
            "object": pod,
            "oldObject": None,
            "dryRun": False,
            "options": {"kind": "CreateOptions", "apiVersion": "meta.k8s.io/v1"},
        },
    }


def many_containers_review(target_bytes: int = int(3.94 * 1024 * 1024)) -> tuple[bytes, int]:
    """The AdmissionReview (compact JSON, ~``target_bytes``) of a pod with as many tiny GPU containers
    as fit, and their count: the costliest body under the webhook's 4 MiB bound (issue 29, item 8)."""
    import json

    one = {"name": "c0", "command": ["sh", "-c", "x & exec sleep 1"], "resources": {"limits": {"nvidia.com/gpu": "1"}}}
    per = len(json.dumps(one, separators=(",", ":"))) + 4
    pod = api_server_pod()
    count = (target_bytes - len(json.dumps(admission_review(pod), separators=(",", ":")))) // per
    pod["spec"]["containers"] = [{**one, "name": f"c{i}"} for i in range(count)]
    return json.dumps(admission_review(pod), separators=(",", ":")).encode(), count
