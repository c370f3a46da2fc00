"""What the fence decides on, as data: each GPU's reading, the DRA devices of a node, the fence's
rules; and the two translations to and from the API's objects (a ResourceSlice's devices, a
DeviceTaintRule)."""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

API_VERSION = "resource.k8s.io/v1"
RULES_PATH = "/apis/resource.k8s.io/v1/devicetaintrules"
SLICES_PATH = "/apis/resource.k8s.io/v1/resourceslices"
TAINT_KEY = "gpuzombie.dev/dirty"
EFFECT = "NoSchedule"
"""New claims stay off the device; pods already on it keep running (NoExecute would evict them)."""
OWNER_LABEL = "app.kubernetes.io/managed-by"
OWNER = "gpuzombie-fence"
NAME_PREFIX = "gpuzombie-dirty-"
ANNOTATION = "gpuzombie.dev/"
UUID_ATTRIBUTES = ("uuid",)
"""The device attribute that holds the GPU's UUID: NVIDIA's DRA driver (gpu.nvidia.com) and the DRA
example driver (gpu.example.com) both name it ``uuid`` (unqualified: the driver's own domain)."""


GpuKey = tuple[str, str]
"""(node, GPU UUID)."""


@dataclass(frozen=True)
class Reading:
    """One GPU as the fleet's metrics see it now."""

    node: str
    uuid: str
    clean: bool
    held: tuple[tuple[str, int], ...] = ()
    """(holder, bytes) of the stale, foreign, D-state and ghost holders, largest first."""
    at: float = 0.0
    """When the verdict was sampled (Unix seconds)."""

    @property
    def key(self) -> GpuKey:
        return (self.node, self.uuid)

    @property
    def dirty(self) -> bool:
        """Not clean, and memory held by what should not hold it (a GPU busy with its own pod is neither)."""
        return not self.clean and any(n > 0 for _, n in self.held)

    @property
    def held_bytes(self) -> int:
        return sum(n for _, n in self.held)

    @property
    def holder(self) -> str:
        """The holder of the most memory (the taint's value)."""
        return self.held[0][0] if self.held else "unknown"


@dataclass(frozen=True)
class Device:
    """A DRA device that publishes a GPU (by its ``uuid`` attribute)."""

    driver: str
    pool: str
    name: str
    node: str
    uuid: str | None

    @property
    def ref(self) -> tuple[str, str, str]:
        return (self.driver, self.pool, self.name)


@dataclass(frozen=True)
class Rule:
    """A DeviceTaintRule as the API server lists it."""

    name: str
    uid: str
    driver: str | None
    pool: str | None
    device: str | None
    own: bool
    node: str = ""
    uuid: str = ""

    @property
    def key(self) -> GpuKey:
        return (self.node, self.uuid)


def _attribute(device: Mapping[str, Any], names: Iterable[str], driver: str) -> str | None:
    attributes = device.get("attributes") or {}
    for name in names:
        for key in (name, f"{driver}/{name}"):
            value = (attributes.get(key) or {}).get("string")
            if isinstance(value, str):
                return value
    return None


def slice_devices(resource_slice: Mapping[str, Any]) -> list[Device]:
    """The devices of one ResourceSlice (resource.k8s.io/v1), each with its UUID attribute if any."""
    spec = resource_slice.get("spec") or {}
    driver, pool = spec.get("driver", ""), (spec.get("pool") or {}).get("name", "")
    node = spec.get("nodeName") or ""
    return [
        Device(driver, pool, d["name"], node, _attribute(d, UUID_ATTRIBUTES, driver))
        for d in spec.get("devices") or []
        if isinstance(d, Mapping) and isinstance(d.get("name"), str)
    ]


def parse_rule(obj: Mapping[str, Any]) -> Rule:
    """A listed DeviceTaintRule; ``own`` only with the fence's label, its name prefix and its taint key."""
    meta = obj.get("metadata") or {}
    spec = obj.get("spec") or {}
    selector = spec.get("deviceSelector") or {}
    annotations = meta.get("annotations") or {}
    own = (
        (meta.get("labels") or {}).get(OWNER_LABEL) == OWNER
        and str(meta.get("name", "")).startswith(NAME_PREFIX)
        and (spec.get("taint") or {}).get("key") == TAINT_KEY
    )
    return Rule(
        name=meta.get("name", ""),
        uid=meta.get("uid", ""),
        driver=selector.get("driver"),
        pool=selector.get("pool"),
        device=selector.get("device"),
        own=own,
        node=annotations.get(ANNOTATION + "node", ""),
        uuid=annotations.get(ANNOTATION + "uuid", ""),
    )


def rule_name(device: Device) -> str:
    """One name per device, the same on every run and replica (a second create is refused, not doubled)."""
    digest = hashlib.sha256("\0".join(device.ref).encode()).hexdigest()[:20]
    return NAME_PREFIX + digest


def _rfc3339(seconds: float) -> str:
    import datetime

    return datetime.datetime.fromtimestamp(seconds, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def render_rule(device: Device, reading: Reading) -> dict[str, Any]:
    """The DeviceTaintRule that fences ``device``: the fence's label, the GPU and why as annotations."""
    return {
        "apiVersion": API_VERSION,
        "kind": "DeviceTaintRule",
        "metadata": {
            "name": rule_name(device),
            "labels": {OWNER_LABEL: OWNER},
            "annotations": {
                ANNOTATION + "node": reading.node,
                ANNOTATION + "uuid": reading.uuid,
                ANNOTATION + "holder": ",".join(h for h, _ in reading.held),
                ANNOTATION + "held-mib": str(reading.held_bytes // (1024 * 1024)),
                ANNOTATION + "dirty-since": _rfc3339(reading.at),
            },
        },
        "spec": {
            "deviceSelector": {"driver": device.driver, "pool": device.pool, "device": device.name},
            "taint": {"key": TAINT_KEY, "value": reading.holder, "effect": EFFECT},
        },
    }
