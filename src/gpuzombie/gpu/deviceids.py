"""The ids a GPU device plugin gives the kubelet, and so PodResources, matched to what NVML reports.

NVIDIA's k8s-device-plugin (``internal/rm``) names a device to the kubelet in one of these forms:

* ``GPU-<uuid>``: a whole GPU, NVML's UUID (``--device-id-strategy=uuid``, and what the plugin
  advertises for ``index`` too: that strategy changes only NVIDIA_VISIBLE_DEVICES).
* ``MIG-<uuid>``: one MIG device (a compute instance of a GPU instance), NVML's UUID for it since R470.
* ``MIG-GPU-<uuid>/<gi>/<ci>``: the same before R470: the parent GPU, GPU instance and compute instance.
* ``<i>`` and ``<i>:<j>``: the index forms (``newNvmlGPUDevice``, ``newMigDevice``): NVML's index of the
  GPU and the index of the MIG device among the GPU's MIG device handles.
* any of these followed by ``::<n>``: replica n of a shared device (time-slicing, MPS); the device itself.

A DRA device has no such id: ``k8s.podresources`` names it by the GPU node its CDI spec injects,
``/dev/nvidia<minor>``, NVML's minor number of the GPU (a MIG device: its parent GPU's node, so it
names every GPU instance of that GPU).

A GPU in MIG mode is one NVML entry per GPU instance (``gpu.nvml``): the GPU's own ids (``GPU-…``, ``<i>``,
what a plugin with ``--mig-strategy=none`` hands out) name every instance of it.
"""

from __future__ import annotations

from gpuzombie.gpu.nvml import MigInstance

REPLICA_SEPARATOR = "::"


def without_replica(device_id: str) -> str:
    """A device plugin's id without its replica suffix: ``GPU-…::3`` is ``GPU-…``."""
    return device_id.split(REPLICA_SEPARATOR, 1)[0]


def kubelet_ids(uuid: str, index: int, mig: MigInstance | None, minor: int | None = None) -> frozenset[str]:
    """Every id (replica suffix removed) by which a device plugin can give the kubelet the NVML entry
    of GPU ``uuid`` at ``index``: the whole GPU, or with ``mig`` that GPU instance of it; with the
    GPU's ``minor`` number, also its node ``/dev/nvidia<minor>``, a DRA device's id."""
    ids = {uuid, str(index)}
    if minor is not None:
        ids.add(f"/dev/nvidia{minor}")
    if mig is not None:
        ids.update(mig.uuids)
        ids.update(f"MIG-{uuid}/{mig.gpu_instance_id}/{ci}" for ci in mig.compute_instance_ids)
        ids.update(f"{index}:{slot}" for slot in mig.slots)
    return frozenset(ids)
