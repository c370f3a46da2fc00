"""``gpuzombie lab pod``: a Pod manifest run on the lab's CRI runtime as the kubelet runs it
(``lab.runtime.manifestpod``), deleted as the kubelet deletes it, and measured like the scenarios.

Memory held is sampled every 10 ms from before the start (NVML above the pre-pod baseline on a GPU,
the pod's RSS on the CPU stand-in); once the pod's processes and memory have been steady for a
second it is observed, deleted, and observed again. The run is a ``LabRun`` whose subject is the
manifest's pod, so results.json, comparison.md, notes.md and the plots are written as ``lab run``
writes them.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gpuzombie.gpu.nvml import NvmlBackend, default_backend
from gpuzombie.lab.errors import PodError
from gpuzombie.lab.events import EventLog
from gpuzombie.lab.labrun import LabConfig, LabRun, PodSubject
from gpuzombie.lab.manifest import PodManifest
from gpuzombie.lab.measure import Measurement, Progress
from gpuzombie.lab.runtime.containerd import BUSYBOX_IMAGE, cni_bin_dir
from gpuzombie.lab.runtime.cri import CriRuntime
from gpuzombie.lab.runtime.manifestpod import (
    HOOK_PATH,
    LAB_PYTHON_BIN,
    PREFLIGHT_PATH,
    TINI_STATIC,
    ManifestPod,
    PodRunConfig,
    host_path_grant,
)
from gpuzombie.lab.runtime.pod import HOST_PROCFS, Deletion, LabPod
from gpuzombie.units import MIB
from gpuzombie.workloads.memory import CPU_STANDIN

if TYPE_CHECKING:
    from gpuzombie.lab.runtime.kube import KubePod, KubeRuntime

SETTLE_S = 1.0
"""The pod is measured once its processes and memory held have not changed for this long, none running."""
STEADY_BYTES = 8 * MIB
IMAGE_NOTE = (
    f"every image runs as the lab's ({BUSYBOX_IMAGE}: busybox with the host's /usr, /lib, /lib64 and "
    "/opt mounted read-only; nothing is pulled)"
)
NETWORK_NOTE = (
    "each pod has its own network and UTS namespaces with only lo up (no pod network, Services, DNS or "
    "ports: a lab node has no CNI network); its hostname is the pod's name"
)
DEFAULTS_NOTE = (
    "containers get seccomp RuntimeDefault unless the manifest says Unconfined, and the runtime's default "
    "capabilities less NET_RAW (the Pod Security Standards' baseline set)"
)
ENTRYPOINT_NOTE = "an image's ENTRYPOINT is taken as empty (the lab's image has none): a container runs command + args"
LAB_POD_RUNTIMES = ("containerd", "kubernetes")


class PodRssProbe:
    """CPU stand-in: the RSS of every process of the pod (host memory, not GPU memory)."""

    source = "RSS of the pod's processes (CPU stand-in)"

    def __init__(self, pod: LabPod) -> None:
        self.pod = pod

    def read(self) -> tuple[int, int]:
        total = sum(HOST_PROCFS.rss_bytes(pid) or 0 for pid in self.pod.tree())
        return total, total


def lab_notes(manifest: PodManifest, config: PodRunConfig) -> list[str]:
    """What the lab does differently from a node, for the output (nothing silently)."""
    device = config.device
    notes = [IMAGE_NOTE, ENTRYPOINT_NOTE, NETWORK_NOTE, DEFAULTS_NOTE]
    python3 = shutil.which("python3", path=LAB_PYTHON_BIN) or shutil.which("python3", path="/usr/local/bin:/usr/bin")
    notes.append(f"python3 in a container is the lab's ({python3}, as the scenarios run it), the project on PYTHONPATH")
    notes.append(
        f"the fast preStop hook and the preflight gate are built fresh, read-only at {HOOK_PATH}, {PREFLIGHT_PATH}"
    )
    gpus = sum(c.resources.gpus for c in manifest.containers)
    if gpus:
        notes.append(
            "GPU resources: the GPU's /dev/nvidia* devices and driver libraries"
            if device == "cuda"
            else "GPU resources: no GPU device (CPU stand-in: the workload holds host memory)"
        )
    for v in manifest.volumes:
        grant = host_path_grant(v.host_path, config.host_paths) if v.host_path else None
        if grant is not None and not grant.writable:
            notes.append(
                f"hostPath {v.host_path} (volume {v.name}) is bound read-only (--allow-host-path PATH:rw writes)"
            )
    if manifest.no_effect:
        notes.append("accepted without effect on a lab node: " + ", ".join(manifest.no_effect))
    return notes


def kube_notes(pod: KubePod) -> list[str]:
    """What the lab changed in the manifest for the cluster's node (``kubespec.node_document``),
    and how the node differs from a GPU node, for the output."""
    from gpuzombie.lab.runtime.kube import NETWORK_NOTE

    changes = [f"kubectl apply gets the lab's change for this node: {c}" for c in pod.changes]
    return [
        *changes,
        f"python3 in a container is the lab's ({LAB_PYTHON_BIN}/python3, as the scenarios run it), the project on PYTHONPATH",
        NETWORK_NOTE,
        "the pod is deleted with kubectl delete --grace-period: the kubelet runs the preStop hook, StopContainer "
        "and the SIGKILL at the grace's end",
    ]


def check_runnable(manifest: PodManifest, config: PodRunConfig, runtime: str = "containerd") -> None:
    """What the kubelet (or this host, or ``--allow-host-path``) refuses before the first container,
    in one line."""
    if runtime == "containerd" and cni_bin_dir() is None:
        raise PodError(
            "each pod gets its own network namespace, which needs the CNI plugins loopback and static "
            "(Debian: apt-get install containernetworking-plugins; make debian installs it)"
        )
    for c in (*manifest.init_containers, *manifest.containers):
        sec = c.security
        if sec.run_as_non_root and not sec.run_as_user:
            raise PodError(
                f"container {c.name}: runAsNonRoot, but it would run as root (no runAsUser, and the lab's "
                "image runs as root): the kubelet refuses it (CreateContainerConfigError)"
            )
        uses_tini = any(TINI_STATIC in arg for arg in c.argv)
        if uses_tini and not os.path.isfile(TINI_STATIC):
            raise PodError(f"container {c.name} copies {TINI_STATIC}: install Debian's tini package on this host")
    for v in manifest.volumes:
        if v.host_path and host_path_grant(v.host_path, config.host_paths) is None:
            raise PodError(
                f"volume {v.name}: hostPath {v.host_path} is not allowed: lab pod binds a host path only "
                "where --allow-host-path names it or a directory above it"
            )
        if v.kind == "hostPath" and v.host_type in ("Directory", "File") and v.host_path:
            exists = os.path.isdir(v.host_path) if v.host_type == "Directory" else os.path.isfile(v.host_path)
            if not exists:
                raise PodError(f"volume {v.name}: hostPath {v.host_path} is not a {v.host_type.lower()}")


def run_key_for(manifest: PodManifest) -> str:
    """``pod-<name>``, and what the webhook did to it (its annotation), so before and after differ."""
    done = manifest.annotations.get("gpuzombie.dev/injected", "")
    suffix = "".join(ch if ch.isalnum() else "-" for ch in done.lower()).strip("-")
    return f"pod-{manifest.name}" + (f"-{suffix}" if suffix else "")


class _PodMeasurement(Measurement):
    """One ``lab pod`` run: the manifest's pod, measured once it is steady."""

    keep_prestop_log = True

    def __init__(
        self,
        runtime: CriRuntime | KubeRuntime,
        manifest: PodManifest,
        config: PodRunConfig,
        nvml: NvmlBackend,
        progress: Progress,
        document: Mapping[str, Any] | None = None,
    ) -> None:
        from gpuzombie.lab.runtime.kube import KubePod, KubeRuntime

        self.manifest, self.config = manifest, config
        events = EventLog()
        pod: ManifestPod | KubePod
        applied: Mapping[str, Any] | None = None
        if isinstance(runtime, KubeRuntime):
            assert document is not None
            pod = KubePod(runtime, manifest, config, events, document=document)
            self.runtime_name, self.notes, applied = "kubernetes", kube_notes(pod), pod.document
        else:
            pod = ManifestPod(runtime, manifest, config, events)
            self.runtime_name, self.notes = "containerd", lab_notes(manifest, config)
        self.grace = pod.grace
        self.at_delete = 0
        try:
            super().__init__(
                pod,
                events,
                nvml=nvml,
                gpu_index=config.gpu_index,
                standin=PodRssProbe(pod) if config.device != "cuda" else None,
                sample_interval=config.sample_interval,
                progress=progress,
                cri_socket=runtime.socket,
            )
        except BaseException:
            pod.kill()
            raise
        self.manifest_pod = pod
        if applied is not None:  # what the API server was given, beside the logs; the changes said first
            self.logs["pod.json"] = json.dumps(applied, indent=2) + "\n"
            for note in self.notes:
                progress(f"lab pod: {note}")

    def busy(self, pids: frozenset[int]) -> bool:
        """A process of the pod is running (state R): still setting up, e.g. importing torch before
        its CUDA allocation (a few MiB of context, steady for seconds, is not the workload's memory)."""
        return any((st := HOST_PROCFS.stat(pid)) is not None and st.state == "R" for pid in pids)

    def settle(self) -> None:
        """Until the pod's processes and memory held have not changed for SETTLE_S while none of
        them ran (the workload is set up and waiting), or the ready timeout; then PID 1 is named."""
        deadline = time.monotonic() + self.config.ready_timeout
        last: tuple[frozenset[int], int] | None = None
        since = time.monotonic()
        while time.monotonic() < deadline:
            now = (frozenset(self.pod.processes()), self.held_now())
            if last is None or now[0] != last[0] or abs(now[1] - last[1]) > STEADY_BYTES or self.busy(now[0]):
                last, since = now, time.monotonic()
            elif time.monotonic() - since >= SETTLE_S and now[1] > 0:
                self.events.add("steady", f"{len(now[0])} process(es), {now[1] // MIB} MiB held")
                break
            time.sleep(0.05)
        else:
            self.events.add("not-steady", f"still changing after {self.config.ready_timeout:.0f} s")
        pid1 = HOST_PROCFS.stat(self.pod.pid1)
        self.manifest_pod.init = pid1.comm if pid1 else "?"

    def deleting(self) -> str:
        if self.runtime_name == "kubernetes":
            return (
                f"deleting the pod (kubectl delete --grace-period={self.grace}: the kubelet's preStop, StopContainer)"
            )
        return f"deleting the pod (grace {self.grace} s, as the kubelet: preStop, StopContainer)"

    def worker_bytes(self, deletion: Deletion) -> int:
        """What the pod held when it was deleted (it has no worker size of its own)."""
        held = self.sampler.samples
        self.at_delete = max((s.held_bytes for s in held if s.t <= deletion.requested_at), default=0)
        return max(self.at_delete, 1)

    def run(self) -> LabRun:
        where = "the cluster (kubectl apply)" if self.runtime_name == "kubernetes" else "the lab's containerd"
        self.say(f"starting {self.manifest.namespace}/{self.manifest.name} on {where}")
        deletion, metrics = self.measure()
        pod = self.manifest_pod
        hooks = [c.name for c in self.manifest.containers if c.prestop is not None]
        config = LabConfig(
            grace=float(pod.grace),
            device=self.config.device,
            backend=CPU_STANDIN if self.standin else "the pod's workload",
            size_mib=self.at_delete // MIB,
            runtime=self.runtime_name,
            gpu_index=self.config.gpu_index,
        )
        pod_info = {
            "name": self.manifest.name,
            "namespace": self.manifest.namespace,
            "annotations": dict(self.manifest.annotations),
            "grace_s": pod.grace,
            "manifest_grace_s": self.manifest.grace_s,
            "share_process_namespace": self.manifest.share_process_namespace,
            "qos": self.manifest.qos,
            "init_containers": [c.name for c in self.manifest.init_containers],
            "containers": [c.name for c in self.manifest.containers],
            "prestop_containers": hooks,
            "pid1_comm": pod.init,
            "notes": self.notes,
        }
        subject = PodSubject(run_key_for(self.manifest), pod_info)
        return self.lab_run(deletion, metrics, subject=subject, config=config, init=pod.init)


def run_lab_pod(
    manifest: PodManifest,
    config: PodRunConfig,
    *,
    out: Path,
    command: Sequence[str],
    archives: Path | None = None,
    nvml: NvmlBackend | None = None,
    progress: Progress = lambda _: None,
    repeat: int = 1,
    runtime: str = "containerd",
    document: Mapping[str, Any] | None = None,
) -> tuple[list[LabRun], Path]:
    """``lab pod`` as a library call: a private containerd (or, ``runtime="kubernetes"``, the
    cluster: the manifest ``document`` applied through its API server), the pod run and measured
    ``repeat`` times (``-runN`` folders after the first), OUT/results.json (merged with earlier runs
    of the same kind) and the report. Ctrl-C or SIGTERM removes the pod and the containerd (or a
    cluster the run started) before KeyboardInterrupt propagates."""
    from gpuzombie.lab import report
    from gpuzombie.lab.results import write_results
    from gpuzombie.lab.runner import check_can_make_pods, interrupts_as_keyboard_interrupt
    from gpuzombie.lab.runtime.cri import cri_runtime
    from gpuzombie.lab.runtime.kube import kube_runtime
    from gpuzombie.lab.runtime.rundirs import clean_dead_runs

    if runtime == "kubernetes" and document is None:
        raise PodError("--runtime kubernetes applies the manifest itself: pass its document")
    check_can_make_pods()
    for left in clean_dead_runs():  # a SIGKILLed run's containerd, shims, pods, mounts
        progress(f"removed what a dead run left in {left.path}: {len(left.processes)} process(es)")
        for problem in left.problems:
            progress(f"  {problem}")
    nvml = nvml or default_backend()
    gpus = nvml.read()
    check_runnable(manifest, config, runtime)
    gpu = config.device == "cuda"
    with (
        interrupts_as_keyboard_interrupt(),
        kube_runtime(progress=progress, gpu=gpu)
        if runtime == "kubernetes"
        else cri_runtime(socket=None, gpu=gpu, archives=archives) as pods,
    ):
        runs = []
        for attempt in range(1, repeat + 1):
            say = progress if repeat == 1 else (lambda line, n=attempt: progress(f"[{n}/{repeat}] {line}"))
            run = _PodMeasurement(pods, manifest, config, nvml, say, document).run()
            runs.append(replace(run, attempt=attempt))
    path = write_results(runs, out, command=command, gpus=gpus)
    report.build(out)
    return runs, path
