"""CDI spec files: which GPU device node (``/dev/nvidiaN``) each CDI device injects.

The Container Device Interface (github.com/cncf-tags/container-device-interface, SPEC.md) is how
containerd and CRI-O add devices to a container: a spec file (``.json`` or ``.yaml`` in
``/etc/cdi`` or ``/var/run/cdi``) has a ``kind`` (``vendor/class``) and ``devices``, each a ``name``
and ``containerEdits`` whose ``deviceNodes`` list ``path`` (in the container), and optionally
``hostPath``, ``major`` and ``minor``; the spec's own ``containerEdits`` go with every device of it.
A device's fully qualified name is ``kind=name``: what the kubelet's PodResources reports as a DRA
device's ``cdi_devices``.

NVIDIA's DRA driver (NVIDIA/k8s-dra-driver-gpu, cmd/gpu-kubelet-plugin/cdi.go) writes one transient
spec per prepared claim, ``/var/run/cdi/k8s.gpu.nvidia.com-claim_<claim UID>.yaml``, kind
``k8s.gpu.nvidia.com/claim``, one device per allocated device named ``<claim UID>-<device>``
(``gpu-0``; a MIG device ``gpu-0-mig-1g24gb-14-0``). Its device edits come from the container
toolkit's nvcdi, which names a GPU ``/dev/nvidia<NVML minor number>`` (internal/platform-support/
dgpu/nvml.go); a MIG device gets its parent's node plus two ``/dev/nvidia-caps/nvidia-cap*`` nodes.
The minor number is NVML's ``nvmlDeviceGetMinorNumber``, so it names the GPU on this node whatever
NVML's index order.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

DEFAULT_CDI_DIRS = ("/etc/cdi", "/var/run/cdi")
"""The CDI spec directories of containerd and CRI-O (later directories take precedence)."""
MAX_SPEC_BYTES = 4 << 20
"""A spec larger than this is skipped with a warning (a full-node NVIDIA spec is tens of KiB)."""
NVIDIA_MAJOR = 195
"""The character major of /dev/nvidia* (the driver's registered major: /proc/devices' ``nvidia-frontend``)."""
_GPU_NODE = re.compile(r"/dev/nvidia(\d+)")


@dataclass(frozen=True)
class CdiDevices:
    """Every CDI device the specs define, by fully qualified name, with the GPU minors it injects."""

    gpu_minors: Mapping[str, tuple[int, ...]] = field(default_factory=dict)
    warnings: tuple[str, ...] = ()


def _mapping(value: object, where: str) -> Mapping[str, object]:
    if not isinstance(value, Mapping):
        raise ValueError(f"{where} is not a mapping")
    return value


def _list(value: object, where: str) -> list[object]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise ValueError(f"{where} is not a list")
    return value


def _gpu_minor(node: Mapping[str, object]) -> int | None:
    """The GPU minor a device node is: a ``/dev/nvidiaN`` path; its ``minor`` field, where the
    writer stat'ed the node (major 195), is the number itself."""
    path = node.get("path")
    if not isinstance(path, str) or not (m := _GPU_NODE.fullmatch(path)):
        return None
    minor, major = node.get("minor"), node.get("major")
    if major == NVIDIA_MAJOR and isinstance(minor, int) and not isinstance(minor, bool) and minor >= 0:
        return minor
    return int(m.group(1))


def _edits_minors(edits: object, where: str) -> list[int]:
    if edits is None:
        return []
    nodes = _list(_mapping(edits, where).get("deviceNodes"), f"{where}.deviceNodes")
    minors = (_gpu_minor(_mapping(n, f"{where}.deviceNodes[{i}]")) for i, n in enumerate(nodes))
    return [m for m in minors if m is not None]


def parse_spec(doc: object) -> dict[str, tuple[int, ...]]:
    """A parsed CDI spec's devices, by qualified name (``kind=name``), with the GPU minors each
    injects (its own edits and the spec's); ValueError when the shape is not a CDI spec's."""
    spec = _mapping(doc, "spec")
    kind = spec.get("kind")
    if not isinstance(kind, str) or kind.count("/") != 1:
        raise ValueError("kind is not vendor/class")
    common = _edits_minors(spec.get("containerEdits"), "containerEdits")
    devices: dict[str, tuple[int, ...]] = {}
    for i, raw in enumerate(_list(spec.get("devices"), "devices")):
        device = _mapping(raw, f"devices[{i}]")
        name = device.get("name")
        if not isinstance(name, str) or not name:
            raise ValueError(f"devices[{i}].name is not a string")
        own = _edits_minors(device.get("containerEdits"), f"devices[{i}].containerEdits")
        devices[f"{kind}={name}"] = tuple(sorted(set(own + common)))
    return devices


def _load(path: str) -> object:
    with open(path, "rb") as f:
        data = f.read(MAX_SPEC_BYTES + 1)
    if len(data) > MAX_SPEC_BYTES:
        raise ValueError(f"larger than {MAX_SPEC_BYTES} bytes")
    if path.endswith(".json"):
        return json.loads(data)
    import yaml  # read_cdi_devices skips YAML specs without it

    try:
        return yaml.safe_load(data)
    except yaml.YAMLError as exc:
        raise ValueError(f"not YAML: {exc}") from exc


def _have_yaml() -> bool:
    try:
        import yaml  # noqa: F401 -- only whether it is there
    except ImportError:
        return False
    return True


def read_cdi_devices(dirs: Iterable[str] = DEFAULT_CDI_DIRS) -> CdiDevices:
    """The devices of every ``.json``/``.yaml`` spec in ``dirs`` (a later directory's device
    replaces an earlier one's, as in the CDI registry); each unreadable spec is one warning, and
    without PyYAML one warning says how many YAML specs were not read."""
    found: dict[str, tuple[int, ...]] = {}
    warnings: list[str] = []
    have_yaml = _have_yaml()
    suffixes = (".json", ".yaml") if have_yaml else (".json",)
    skipped = 0
    for directory in dirs:
        try:
            names = sorted(os.listdir(directory))
        except FileNotFoundError:
            continue
        except OSError as exc:
            warnings.append(f"CDI specs: {directory}: {exc.strerror or exc}")
            continue
        skipped += 0 if have_yaml else sum(n.endswith(".yaml") for n in names)
        for name in names:
            if not name.endswith(suffixes):
                continue
            path = os.path.join(directory, name)
            try:
                found.update(parse_spec(_load(path)))
            except (OSError, ValueError, RecursionError) as exc:  # UnicodeDecodeError is a ValueError
                warnings.append(f"CDI spec {path}: {_one_line(exc)}")
    if skipped:
        warnings.append(f"CDI specs: {skipped} YAML spec(s) not read: PyYAML is not installed")
    return CdiDevices(found, tuple(warnings))


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())[:200]
