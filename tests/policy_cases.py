"""The pods the policy and the webhook are compared on, standard library and the project only (no
CEL, no cluster): pods as the API server sends them (the webhook tests' command/args cases, MIG, AMD,
gpu.shared, a KAI fraction, a DRA claim, sidecars, a GPU init container, every "left alone" case) and
the fleet corpus's pod templates as the Pods they make. tests/kube/test_admission_kubernetes.py sends
each to the real API server (the MutatingAdmissionPolicy, then the deployed webhook);
tests/test_admission_policy.py compares `webhook --patch` with the serving webhook on them."""

from __future__ import annotations

import copy
import pathlib
from typing import Any

from admission_requests import api_server_pod, container
from gpuzombie.k8s.podspec.loader import load_documents, objects
from gpuzombie.k8s.podspec.templates import pod_templates

REPO = pathlib.Path(__file__).resolve().parents[1]
FLEET = REPO / "tests" / "fixtures" / "fleet"
RELEASE_NAMESPACE = "gpuzombie"
S1 = ["sh", "-c", "python3 train.py & exec sleep infinity"]
SERVICE_ACCOUNT_VOLUME = api_server_pod()["spec"]["volumes"][0]
"""The token volume the ServiceAccount admission plugin added (its mount is in every container())."""


def _container(command: list[str] | None = None, args: list[str] | None = None, **fields: Any) -> dict[str, Any]:
    c = container(**fields)
    if command is not None:
        c["command"] = command
    if args is not None:
        c["args"] = args
    return c


def _annotated(pod: dict[str, Any], **annotations: str) -> dict[str, Any]:
    pod["metadata"].setdefault("annotations", {}).update(annotations)
    return pod


def _with(pod: dict[str, Any], **spec: Any) -> dict[str, Any]:
    pod["spec"].update(spec)
    return pod


def _os_affinity(values: list[str]) -> dict[str, Any]:
    term = {"matchExpressions": [{"key": "kubernetes.io/os", "operator": "In", "values": values}]}
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}}}


def admission_cases() -> dict[str, dict[str, Any]]:
    """Pods as the API server sends them: the cases of the webhook's own tests that CEL must decide."""
    init_gpu = _container(["python3", "warm.py"], name="warm")
    sidecar = container("log-shipper", gpu=False, command=["fluent-bit"], restartPolicy="Always")
    mounted = _container(S1)
    mounted["volumeMounts"].append({"name": "mine", "mountPath": "//.gpuzombie/."})
    bare = _container(S1)
    del bare["volumeMounts"]
    argv = {
        "sh -c '... & exec sleep infinity'": (S1, None),
        "bash & sleep": (["bash", "-c", "python3 t.py & sleep infinity"], None),
        "python as PID 1": (["python3", "train.py"], None),
        "script in args": (["sh", "-c"], ["exec python3 t.py"]),
        "tini in command": (["tini", "--"], ["python3", "t.py"]),
        "dumb-init by path": (["/usr/bin/dumb-init", "python3"], None),
        "s6-overlay /init": (["/init"], None),
        "catatonit": (["catatonit", "--", "sleep", "1"], None),
        "supervisord": (["/usr/bin/supervisord", "-n"], None),
        "sh -c 'exec tini ...'": (["sh", "-c", "exec tini -- python3 t.py"], None),
        "bash -c 'exec dumb-init ...'": (["bash", "-c", "exec dumb-init python3 t.py"], None),
        "args only": (None, S1),
        "image ENTRYPOINT and CMD": (None, None),
        "empty command is unset": ([], ["python3"]),
    }
    cases = {f"argv: {name}": api_server_pod(_container(c, a)) for name, (c, a) in argv.items()}
    resources = {
        # An extended resource needs its limit (the API server refuses requests alone: "Limit must be
        # set for non overcommitable resources"); requests alone are check's and podspec's cases.
        "MIG": {"requests": {"nvidia.com/mig-1g.10gb": "1"}, "limits": {"nvidia.com/mig-1g.10gb": "1"}},
        "AMD": {"limits": {"amd.com/gpu": "1"}},
        "shared GPU": {"limits": {"nvidia.com/gpu.shared": "1"}},
        "a number": {"limits": {"nvidia.com/gpu": 2}},
        "zero GPUs": {"limits": {"nvidia.com/gpu": "0"}},
        "CPU only": {"limits": {"cpu": "8", "memory": "64Gi"}},
    }
    cases |= {f"resources: {name}": api_server_pod(_container(S1, resources=r)) for name, r in resources.items()}
    cases |= {
        "mixed: share once, tini for the one with a command": api_server_pod(
            _container(None, S1), _container(name="eval"), _container(S1, name="aux")
        ),
        "sidecars and istio left alone": api_server_pod(
            _container(S1),
            container("istio-proxy", gpu=False, command=["pilot-agent", "proxy"]),
            initContainers=[sidecar],
        ),
        "a GPU init container moves down one": api_server_pod(
            _container(S1), initContainers=[container("fetch", gpu=False, command=["true"]), init_gpu]
        ),
        # Without a token (the ServiceAccount plugin, before every mutating admission step, would add
        # its volume and mount otherwise).
        "no volumes, mounts or annotations yet": api_server_pod(bare, volumes=[], automountServiceAccountToken=False),
        "annotations there already": _annotated(api_server_pod(_container(S1)), team="ml"),
        "KAI fraction, named container": _annotated(
            api_server_pod(_container(S1, gpu=False), _container(S1, name="second", gpu=False)),
            **{"gpu-fraction": "0.5", "gpu-fraction-container-name": "second"},
        ),
        "KAI fraction 0": _annotated(api_server_pod(_container(S1, gpu=False)), **{"gpu-fraction": "0"}),
        "DRA claim": api_server_pod(
            _container(S1, gpu=False, resources={"claims": [{"name": "gpu"}]}),
            resourceClaims=[{"name": "gpu", "resourceClaimTemplateName": "one-gpu"}],
        ),
        "mounted at /.gpuzombie already": api_server_pod(
            mounted, volumes=[copy.deepcopy(SERVICE_ACCOUNT_VOLUME), {"name": "mine", "emptyDir": {}}]
        ),
        "opted out": _annotated(api_server_pod(_container(S1)), **{"gpuzombie.dev/inject": "False"}),
        "mutated already": _annotated(api_server_pod(_container(S1)), **{"gpuzombie.dev/injected": "tini:train"}),
        "a container named gpuzombie-install": api_server_pod(_container(S1), _container(S1, name="gpuzombie-install")),
        "windows": _with(api_server_pod(_container(S1)), os={"name": "windows"}),
        "windows by nodeSelector": _with(api_server_pod(_container(S1)), nodeSelector={"kubernetes.io/os": "windows"}),
        "windows by node affinity": _with(api_server_pod(_container(S1)), affinity=_os_affinity(["windows"])),
        "windows or linux by node affinity": _with(
            api_server_pod(_container(S1)), affinity=_os_affinity(["linux", "windows"])
        ),
        "hostPID": _with(api_server_pod(_container(S1)), hostPID=True),
        "shares its process namespace already": _with(api_server_pod(_container(S1)), shareProcessNamespace=True),
        "kube-system": api_server_pod(_container(S1), namespace="kube-system"),
        "the release's namespace": api_server_pod(_container(S1), namespace=RELEASE_NAMESPACE),
        "opt-in: prestop": _annotated(api_server_pod(_container(S1)), **{"gpuzombie.dev/prestop": "true"}),
        "opt-in: grace-seconds": _annotated(api_server_pod(_container(S1)), **{"gpuzombie.dev/grace-seconds": "60"}),
    }
    return cases


def fleet_cases() -> tuple[dict[str, dict[str, Any]], list[dict[str, Any]]]:
    """Every pod template of the fleet corpus as the Pod it makes, and the corpus's DRA claims (so
    that --patch can resolve them). Argo's container templates are left out: --patch leaves them."""
    pods: dict[str, dict[str, Any]] = {}
    claims: list[dict[str, Any]] = []
    for path in sorted(FLEET.rglob("*.yaml")):
        documents = load_documents(path.read_text())
        for obj in objects(documents):
            if isinstance(obj.data, dict) and obj.data.get("kind") in ("ResourceClaim", "ResourceClaimTemplate"):
                claims.append(obj.data)
        for ref in pod_templates(documents):
            if ref.container is not None:
                continue
            metadata = {**(ref.pod.get("metadata") or {}), "namespace": ref.namespace or "default"}
            pod = {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": copy.deepcopy(ref.pod["spec"])}
            pods[f"fleet {path.parent.name}/{path.name}#{ref.document}:{ref.pointer}"] = pod
    return pods, claims
