"""The handover gate's init container, as the webhook injects it: ``gpuzombie preflight`` (the
zipapp in the webhook's image) first among the init containers of a GPU pod, given the GPUs the
pod's containers ask for, so that NVML in it shows the very devices the workload will get.

Why the same GPUs: a container sees only the GPUs it was given (the device plugin's or DRA driver's
devices, the NVIDIA runtime's libraries). The kubelet's device manager gives the devices of an
init container to the pod's later containers first (its "devices to reuse"), so an init container
asking for as many as the pod's containers together takes no GPU more and checks the ones the
workload will run on. A DRA claim is shared by the containers that name it: the gate names it too.

Never for a GPU shared by design (time-slicing or MPS replicas ``nvidia.com/gpu.shared``,
``*.shared`` MIG resources, KAI/run.ai fractions, a ResourceClaim several pods may name): another
pod's memory on it is expected, and the gate would block the pod until that pod ended. Pure.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpuzombie.admission.security import restricted_security_context
from gpuzombie.k8s.podspec import Container, ContainerKind, GpuForm, PodSpec

CONTAINER = "gpuzombie-preflight"
IMAGE_PREFLIGHT = "/opt/gpuzombie/preflight.pyz"
WAIT_SECONDS = 60
"""--wait of the injected gate: then exit 1, and the kubelet's restart back-off (10 s doubling to
5 min) runs it again, the pod waiting with the message shown."""
SHARED_FORMS = frozenset({GpuForm.SHARED, GpuForm.FRACTION})
DRA_FORMS = frozenset({GpuForm.DRA, GpuForm.DRA_ASSUMED})
_WHOLE_NUMBER = re.compile(r"^[0-9]+$")
_GATE_ARGV = ("python3", "-S", "-I", IMAGE_PREFLIGHT)


@dataclass(frozen=True)
class GateGpus:
    """What the gate asks for: device-plugin resources (name -> count) and the pod's DRA claims."""

    limits: Mapping[str, str]
    claims: tuple[str, ...]


def _claim_name(request_quantity: str, resource_name: str) -> str | None:
    """The pod claim a DRA GPU request came from (podspec writes ``claim NAME`` in one of the two)."""
    for text in (request_quantity, resource_name):
        if text.startswith("claim "):
            return text.removeprefix("claim ")
    return None


def _named_claims(spec: Mapping[str, Any]) -> set[str]:
    """Pod claims made from a ResourceClaim by name: one any pod may name, so possibly shared."""
    listed = spec.get("resourceClaims")
    return {
        c["name"]
        for c in (listed if isinstance(listed, list) else [])
        if isinstance(c, Mapping) and isinstance(c.get("name"), str) and isinstance(c.get("resourceClaimName"), str)
    }


def gate_gpus(pod: PodSpec) -> tuple[GateGpus | None, str | None]:
    """The GPUs the gate asks for, or None and why it is not added (one line for kubectl)."""
    counts: dict[str, dict[str, int]] = {"app": {}, "init": {}}
    claims: list[str] = []
    named = _named_claims(pod.raw)
    for c in pod.gpu_containers:
        for request in c.gpus:
            resource = request.resource
            if resource.form in SHARED_FORMS or resource.name.endswith(".shared"):
                return None, (
                    f"the preflight gate is not added: container {c.name}'s GPU ({resource.name}) is shared by "
                    "design, another pod's memory on it is expected"
                )
            if resource.form in DRA_FORMS:
                claim = _claim_name(request.quantity, resource.name)
                if claim in named:
                    return None, (
                        f"the preflight gate is not added: container {c.name}'s DRA claim {claim} is a "
                        "ResourceClaim other pods may share"
                    )
                if claim is not None and claim not in claims:
                    claims.append(claim)
                continue
            if not _WHOLE_NUMBER.match(request.quantity.strip()):
                return None, f"the preflight gate is not added: {resource.name}: {request.quantity!r} is no count"
            side = "init" if c.kind is ContainerKind.INIT else "app"
            _add(counts[side], resource.name, int(request.quantity.strip()), c)
    limits = {
        name: str(max(counts["app"].get(name, 0), counts["init"].get(name, 0)))
        for name in sorted(counts["app"].keys() | counts["init"].keys())
    }
    return GateGpus(limits, tuple(claims)), None


def _add(counts: dict[str, int], name: str, quantity: int, c: Container) -> None:
    """Containers that run together (regular ones, sidecars) add up; init containers run one by one."""
    if c.kind is ContainerKind.INIT:
        counts[name] = max(counts.get(name, 0), quantity)
    else:
        counts[name] = counts.get(name, 0) + quantity


def is_gate(c: Container) -> bool:
    """The injected gate, as injected: one python process that forks nothing and exits by itself, so
    PID 1's rules (reaping, SIGTERM) have nothing to say about it."""
    return c.kind is ContainerKind.INIT and c.name == CONTAINER and c.words[:4] == _GATE_ARGV


def gate_container(image: str, gpus: GateGpus) -> dict[str, Any]:
    """The injected init container: an explicit command, least privilege, the node's name for the fix."""
    resources: dict[str, Any] = {
        "requests": {"cpu": "10m", "memory": "64Mi"},
        "limits": {"cpu": "500m", "memory": "128Mi", **gpus.limits},
    }
    if gpus.claims:
        resources["claims"] = [{"name": claim} for claim in gpus.claims]
    return {
        "name": CONTAINER,
        "image": image,
        "imagePullPolicy": "IfNotPresent",
        "command": [*_GATE_ARGV, "--wait", str(WAIT_SECONDS)],
        "env": [{"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}],
        "resources": resources,
        "terminationMessagePolicy": "File",
        "securityContext": restricted_security_context(),
    }
