"""GPU recognition: which extended resources, DRA claims and fractional-GPU annotations ask for
a GPU. Every reader (admission, the lab, the kubelet's device assignments) asks ``gpu_resource``."""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpuzombie.k8s.podspec.fields import mapping, sequence
from gpuzombie.k8s.podspec.loader import Document, objects


class GpuForm(enum.Enum):
    WHOLE = "whole"
    MIG = "mig"
    """A MIG instance (the device plugin's mixed strategy): a slice with its own memory."""
    SHARED = "shared"
    """A time-sliced or MPS replica (the device plugin's ``renameByDefault``): one GPU, many pods."""
    FRACTION = "fraction"
    """A fraction the scheduler gives (KAI's and run.ai's ``gpu-fraction`` annotation)."""
    DRA = "dra"
    """A DRA claim whose device class is a GPU class (``gpu.nvidia.com``, ``mig.nvidia.com``)."""
    DRA_ASSUMED = "dra-assumed"
    """A DRA claim whose device class is not in the input: assumed a GPU, said so."""


@dataclass(frozen=True)
class GpuResource:
    name: str
    vendor: str
    """``nvidia`` or ``amd``: whose ids the kubelet's device assignments carry."""
    form: GpuForm


_GPU_NAMES = {
    "nvidia.com/gpu": ("nvidia", GpuForm.WHOLE),
    "nvidia.com/gpu.shared": ("nvidia", GpuForm.SHARED),
    "amd.com/gpu": ("amd", GpuForm.WHOLE),
}
_GPU_PREFIXES = {"nvidia.com/mig-": ("nvidia", GpuForm.MIG)}
"""The device plugins' extended resources that are GPUs (``nvidia.com/mig-1g.10gb``,
``nvidia.com/mig-1g.10gb.shared``: MIG, shared or not)."""


def gpu_resource(name: str) -> GpuResource | None:
    """The GPU an extended resource name stands for, or None (cpu, memory, a NIC, ...)."""
    if name in _GPU_NAMES:
        return GpuResource(name, *_GPU_NAMES[name])
    for prefix, (vendor, form) in _GPU_PREFIXES.items():
        if name.startswith(prefix):
            return GpuResource(name, vendor, form)
    return None


@dataclass(frozen=True)
class GpuRequest:
    """A GPU a container asks for: a device plugin's resource with a non-zero quantity, a
    fractional-GPU annotation, or a DRA claim (its name is the resource's name then)."""

    resource: GpuResource
    quantity: str


GPU_DEVICE_CLASSES = frozenset({"gpu.nvidia.com", "mig.nvidia.com", "vfio.gpu.nvidia.com", "gpu.amd.com"})
"""DRA device classes that are GPUs by default (NVIDIA's DRA driver's GPU, MIG and VFIO classes,
AMD's); ``--gpu-device-class`` adds more. NVIDIA's ``compute-domain-*`` classes (IMEX channels)
are not GPUs."""
FRACTION_ANNOTATIONS = ("gpu-fraction", "gpu-memory")
"""KAI-Scheduler's (and run.ai's) fractional-GPU annotations on the pod; the GPU goes to the
container ``gpu-fraction-container-name`` names, the first regular container by default."""
FRACTION_CONTAINER_ANNOTATION = "gpu-fraction-container-name"


@dataclass(frozen=True)
class GpuContext:
    """What decides a container's GPUs beyond its own resources: the pod's annotations, the DRA
    claims and claim templates of the input (name -> device classes) and the GPU device classes."""

    annotations: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    claim_classes: Mapping[str, tuple[str, ...]] = dataclasses.field(default_factory=dict)
    """``ResourceClaim/NAME`` and ``ResourceClaimTemplate/NAME`` -> their requests' device classes."""
    gpu_device_classes: frozenset[str] = GPU_DEVICE_CLASSES


def _device_classes(claim_spec: Any) -> tuple[str, ...]:
    """The device classes a claim's spec requests (resource.k8s.io v1 ``exactly`` and
    ``firstAvailable``, v1beta1's flat ``deviceClassName``)."""
    devices = claim_spec.get("devices") if isinstance(claim_spec, Mapping) else None
    requests = devices.get("requests") if isinstance(devices, Mapping) else None
    found: list[str] = []
    for request in requests if isinstance(requests, list) else []:
        if not isinstance(request, Mapping):
            continue
        options = [request, request.get("exactly")]
        options += request["firstAvailable"] if isinstance(request.get("firstAvailable"), list) else []
        found += [
            o["deviceClassName"]
            for o in options
            if isinstance(o, Mapping) and isinstance(o.get("deviceClassName"), str)
        ]
    return tuple(found)


def claim_classes(documents: Sequence[Document]) -> dict[str, tuple[str, ...]]:
    """Every ResourceClaim and ResourceClaimTemplate of ``documents`` -> its device classes."""
    out: dict[str, tuple[str, ...]] = {}
    for obj in objects(documents):
        data = obj.data
        if not isinstance(data, Mapping) or data.get("kind") not in ("ResourceClaim", "ResourceClaimTemplate"):
            continue
        meta, spec = data.get("metadata"), data.get("spec")
        if not isinstance(meta, Mapping) or not isinstance(spec, Mapping):
            continue  # not a claim the API server takes: nothing to resolve against
        out[f"{data['kind']}/{meta.get('name')}"] = _device_classes(
            spec.get("spec") if data["kind"] == "ResourceClaimTemplate" else spec
        )
    return out


def _dra_requests(
    resources: Mapping[str, Any], where: str, pod_claims: Mapping[str, str | None], context: GpuContext
) -> Iterator[GpuRequest]:
    """The GPUs a container's ``resources.claims`` ask for through the pod's ``resourceClaims``."""
    for i, claim in enumerate(sequence(resources.get("claims"), f"{where}.resources.claims")):
        name = mapping(claim, f"{where}.resources.claims[{i}]").get("name")
        if not isinstance(name, str) or name not in pod_claims:
            continue
        source = pod_claims[name]
        classes = context.claim_classes.get(source) if source is not None else None
        if classes is None:
            yield GpuRequest(GpuResource(f"claim {name}", "unknown", GpuForm.DRA_ASSUMED), "DRA claim, assumed GPU")
            continue
        for device_class in classes:
            if device_class in context.gpu_device_classes:
                vendor = "amd" if device_class.endswith("amd.com") else "nvidia"
                yield GpuRequest(GpuResource(device_class, vendor, GpuForm.DRA), f"claim {name}")
                break


def container_gpus(
    container: Mapping[str, Any],
    where: str,
    pod_claims: Mapping[str, str | None] | None = None,
    context: GpuContext | None = None,
) -> tuple[GpuRequest, ...]:
    """The GPUs a container asks for: its DRA claims first (with ``pod_claims`` and ``context``),
    then the device plugins' resources its limits or requests name, one request per resource."""
    resources = mapping(container.get("resources"), f"{where}.resources")
    found: dict[str, GpuRequest] = {}
    if pod_claims and context is not None:
        found.update((r.resource.name, r) for r in _dra_requests(resources, where, pod_claims, context))
    for part in ("limits", "requests"):
        for name, quantity in mapping(resources.get(part), f"{where}.resources.{part}").items():
            gpu = gpu_resource(str(name))
            if gpu is not None and str(quantity).strip() not in ("0", "") and gpu.name not in found:
                found[gpu.name] = GpuRequest(gpu, str(quantity))
    return tuple(found.values())


def read_pod_claims(spec: Mapping[str, Any]) -> dict[str, str | None]:
    """The pod's ``resourceClaims``: name -> ``ResourceClaim/NAME`` or ``ResourceClaimTemplate/NAME``
    (None when it names neither)."""
    out: dict[str, str | None] = {}
    for i, claim in enumerate(sequence(spec.get("resourceClaims"), "spec.resourceClaims")):
        claim = mapping(claim, f"spec.resourceClaims[{i}]")
        if not isinstance(claim.get("name"), str):
            continue
        source = None
        for field, kind in (
            ("resourceClaimName", "ResourceClaim"),
            ("resourceClaimTemplateName", "ResourceClaimTemplate"),
        ):
            if isinstance(claim.get(field), str):
                source = f"{kind}/{claim[field]}"
        out[claim["name"]] = source
    return out
