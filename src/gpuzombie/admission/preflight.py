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
pod's memory on it is expected, and the gate would block the pod until that pod ended.

Only for GPUs the gate can read: it reads NVML, so it is given NVIDIA's GPUs and MIG instances
alone. An AMD GPU, a VFIO passthrough or a DRA claim whose class is not known here (the serving
webhook sees a pod alone; a NIC's claim looks the same) would make it fail at every try, the pod in
Init:CrashLoopBackOff for ever: such a GPU is left out of the gate, said in a warning. Pure.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpuzombie.admission.security import restricted_security_context
from gpuzombie.k8s.podspec.gpus import GPU_DEVICE_CLASSES, GpuForm, GpuResource
from gpuzombie.k8s.podspec.model import Container, ContainerKind, PodSpec

CONTAINER = "gpuzombie-preflight"
OPT_IN = "gpuzombie.dev/preflight"
IMAGE_PREFLIGHT = "/opt/gpuzombie/preflight.pyz"
WAIT_SECONDS = 60
"""--wait of the injected gate: then exit 1, and the kubelet's restart back-off (10 s doubling to
5 min) runs it again, the pod waiting with the message shown."""
SHARED_FORMS = frozenset({GpuForm.SHARED, GpuForm.FRACTION})
DRA_FORMS = frozenset({GpuForm.DRA, GpuForm.DRA_ASSUMED})
NVML_DEVICE_CLASSES = frozenset({"gpu.nvidia.com", "mig.nvidia.com"})
"""The DRA device classes whose devices NVML shows in the container: NVIDIA's DRA driver's GPUs and
MIG devices. Its ``vfio.gpu.nvidia.com`` hands the GPU to a VM, bound to vfio-pci (no NVIDIA driver,
no NVML); AMD's ``gpu.amd.com`` has no NVML at all."""
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


def nvml_reads(resource: GpuResource) -> bool | None:
    """Whether NVML shows the gate this GPU: True for NVIDIA's device plugin's GPUs and MIG
    instances and its DRA driver's ``gpu.nvidia.com`` and ``mig.nvidia.com``; False for those it
    never does (AMD's GPUs, a VFIO passthrough); None where it cannot be told here (a DRA claim whose
    device class is not known, or a class ``--gpu-device-class`` added)."""
    if resource.form in (GpuForm.WHOLE, GpuForm.MIG):
        return resource.vendor == "nvidia"
    if resource.form is GpuForm.DRA and resource.name in NVML_DEVICE_CLASSES:
        return True
    if resource.form is GpuForm.DRA and resource.name in GPU_DEVICE_CLASSES:
        return False  # the default classes NVML does not read: gpu.amd.com, vfio.gpu.nvidia.com
    return None


def gate_gpus(pod: PodSpec, *, vouched: bool = False) -> tuple[GateGpus | None, list[str]]:
    """The GPUs the gate asks for (None: it is not added) and the warnings for kubectl: why it is
    not added, or which GPUs it does not check. Only GPUs NVML shows it are given to it: a gate
    given none NVML shows fails every time (Init:CrashLoopBackOff for ever). A DRA claim of a class
    not known here is given only when ``vouched`` (the pod's own ``gpuzombie.dev/preflight: "true"``:
    its owner knows the claim)."""
    counts: dict[str, dict[str, int]] = {"app": {}, "init": {}}
    claims: list[str] = []
    ungated: list[str] = []
    unknown = False
    named = _named_claims(pod.raw)
    for c in pod.gpu_containers:
        for request in c.gpus:
            resource = request.resource
            if resource.form in SHARED_FORMS or resource.name.endswith(".shared"):
                return None, [
                    f"the preflight gate is not added: container {c.name}'s GPU ({resource.name}) is shared by "
                    "design, another pod's memory on it is expected"
                ]
            claim = _claim_name(request.quantity, resource.name) if resource.form in DRA_FORMS else None
            if claim in named:
                return None, [
                    f"the preflight gate is not added: container {c.name}'s DRA claim {claim} is a "
                    "ResourceClaim other pods may share"
                ]
            reads = nvml_reads(resource)
            if reads is False or (reads is None and not vouched):
                unknown |= reads is None
                what = f"claim {claim}" if claim is not None else resource.name
                what += " (device class not known here)" if reads is None else ""
                what += f" ({resource.name})" if reads is False and resource.form is GpuForm.DRA else ""
                if f"container {c.name}'s {what}" not in ungated:
                    ungated.append(f"container {c.name}'s {what}")
                continue
            if resource.form in DRA_FORMS:
                if claim is not None and claim not in claims:
                    claims.append(claim)
                continue
            if not _WHOLE_NUMBER.match(request.quantity.strip()):
                return None, [f"the preflight gate is not added: {resource.name}: {request.quantity!r} is no count"]
            side = "init" if c.kind is ContainerKind.INIT else "app"
            _add(counts[side], resource.name, int(request.quantity.strip()), c)
    limits = {
        name: str(max(counts["app"].get(name, 0), counts["init"].get(name, 0)))
        for name in sorted(counts["app"].keys() | counts["init"].keys())
    }
    said = []
    if ungated:
        listed = ", ".join(ungated)
        line = "the preflight gate " + (
            f"does not check {listed}: it reads NVIDIA GPUs through NVML"
            if limits or claims
            else f"is not added: it reads NVIDIA GPUs through NVML and would never pass on {listed}"
        )
        said.append(line + (f'; {OPT_IN}: "true" on the pod itself gates such a claim' if unknown else ""))
    if not limits and not claims:
        return None, said
    return GateGpus(limits, tuple(claims)), said


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


def gate_container(image: str, gpus: GateGpus, spec: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The injected init container: an explicit command, least privilege (the pod ``spec``'s own
    seccomp profile kept), the node's name for the fix."""
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
        "securityContext": restricted_security_context(spec),
    }
