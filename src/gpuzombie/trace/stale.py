"""Dirty GPUs: GPU holders that should not be there, judged over a trace's rows.

* **stale**: a process holding GPU memory or ``/dev/nvidia*`` sits in the cgroup of a pod the
  runtime no longer lists, or lists only as not ready: the pod was deleted and the process outlived
  it (NVIDIA/k8s-device-plugin#12 and #519: the next pod gets a GPU a dead pod still holds). The
  runtime is read *after* the processes, and each candidate is checked to be the same process
  (pid and start time) after that read: a process that was merely exiting with its pod is never
  called stale. Without an answer from the runtime, or with one the kubelet's pod list contradicts
  (``k8s.liveness``), the verdict is ``unknown``, never stale.
* **foreign**: a process NVML lists on a GPU holds memory in a pod other than the one(s) the
  kubelet's PodResources assigned that GPU (or MIG instance) to, in any of the device plugin's id
  forms (``gpu.deviceids``: UUID, index, MIG UUID, with a replica's suffix or not): a pod that went
  around the device plugin, e.g. ``NVIDIA_VISIBLE_DEVICES=all``. A DRA claim's device counts as
  the kubelet's assignment of the GPU node its CDI spec injects (``k8s.podresources``); a pod with a
  DRA device no CDI spec resolved is not judged. Only NVML's entries count: a bare
  ``/dev/nvidia*`` fd is what every monitoring agent (dcgm-exporter, the device plugin) holds on
  every GPU.

Host processes (no pod in their cgroup) are neither.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from enum import Enum

from gpuzombie.gpu.deviceids import without_replica
from gpuzombie.k8s.liveness import PodState, RuntimePods
from gpuzombie.k8s.podresources import PodResources


class Dirty(str, Enum):
    STALE = "stale"
    FOREIGN = "foreign"
    UNKNOWN = "unknown"
    """A pod's GPU holder whose pod the runtime could not be asked about."""


@dataclass(frozen=True)
class DirtyChecks:
    """Which checks a trace could make (a check it could not make hides its findings)."""

    stale: bool = False
    foreign: bool = False
    stale_problem: str | None = None
    """Why stale holders could not be judged; None when they were (or nobody asked)."""


@dataclass(frozen=True)
class Holder:
    """What the judgment needs of one trace row."""

    pid: int | None
    start_ticks: int | None
    pod_uid: str | None
    namespace: str | None
    pod: str | None
    runtime: str | None
    """The runtime its cgroup names (containerd, cri-o, ...); None for a pod-level process."""
    gpu_uuid: str | None
    live: bool
    """NVML lists it on a GPU and it is alive (the only kind foreign applies to)."""
    holds_gpu: bool
    """Listed by NVML, or holds a /dev/nvidia* fd (and is no zombie: a zombie holds nothing)."""
    gpu_instance: int | None = None
    """The MIG GPU instance of ``gpu_uuid`` NVML lists it on; None for a whole GPU."""
    device_ids: frozenset[str] = frozenset()
    """Every id by which a device plugin can give the kubelet what NVML lists it on
    (``gpu.deviceids.kubelet_ids``): a PodResources id among them names its GPU."""


def _stale(holder: Holder, pods: RuntimePods, still_there: Callable[[int, int], bool]) -> tuple[Dirty, str] | None:
    if holder.pod_uid is None or not holder.holds_gpu or holder.pid is None:
        return None
    state = pods.state(holder.pod_uid)
    if state is PodState.UNKNOWN:
        return Dirty.UNKNOWN, f"pod {holder.pod_uid}: not judged ({pods.problem})"
    if state is PodState.RUNNING:
        return None
    if holder.runtime and pods.runtime and holder.runtime not in ("unknown", pods.runtime):
        return Dirty.UNKNOWN, (
            f"its container runs under {holder.runtime}, the runtime asked is {pods.describe()}: not the kubelet's?"
        )
    if holder.start_ticks is None or not still_there(holder.pid, holder.start_ticks):
        return None  # exited while its pod was torn down: what a deletion does
    if state is PodState.NOT_READY:
        return Dirty.STALE, f"pod {holder.pod_uid}'s sandbox is stopped ({pods.describe()}): it outlived its pod"
    return Dirty.STALE, f"pod {holder.pod_uid} is gone from {pods.describe()}: it outlived its pod"


def _foreign(holder: Holder, resources: PodResources) -> tuple[Dirty, str] | None:
    if not holder.live or holder.gpu_uuid is None or holder.pod_uid is None or not holder.pod:
        return None
    if (holder.namespace, holder.pod) in resources.unresolved_dra:
        return None  # its DRA GPU is unknown: k8s.podresources warned
    owners = sorted(
        {(a.namespace, a.pod) for a in resources.gpu_assignments if without_replica(a.device_id) in holder.device_ids}
    )
    if (holder.namespace, holder.pod) in owners:
        return None
    gpu = holder.gpu_uuid if holder.gpu_instance is None else f"{holder.gpu_uuid} GPU instance {holder.gpu_instance}"
    if not owners:
        return Dirty.FOREIGN, f"the kubelet assigned {gpu} to no pod"
    return Dirty.FOREIGN, f"the kubelet assigned {gpu} to " + ", ".join(f"{n}/{p}" for n, p in owners)


def judge(
    holders: Iterable[Holder],
    *,
    pods: RuntimePods | None,
    resources: PodResources,
    still_there: Callable[[int, int], bool],
) -> tuple[list[tuple[Dirty, str] | None], DirtyChecks]:
    """One verdict (kind, reason) or None per holder, in order, and which checks were made.

    ``pods`` None: nobody asked for the stale check (a library caller without a runtime).
    ``still_there(pid, start_ticks)``: is that very process still alive now, after the runtime read?"""
    foreign_ok = resources.read
    verdicts: list[tuple[Dirty, str] | None] = []
    for h in holders:
        verdict = _stale(h, pods, still_there) if pods is not None else None
        if (verdict is None or verdict[0] is Dirty.UNKNOWN) and foreign_ok:
            verdict = _foreign(h, resources) or verdict
        verdicts.append(verdict)
    problem = pods.problem if pods is not None else None
    return verdicts, DirtyChecks(stale=pods is not None and problem is None, foreign=foreign_ok, stale_problem=problem)
