"""The handover experiment (issue 25): pod A leaves a stale GPU holder on the lab's containerd; pod B
asks for the same GPU, as written (no gate) or as the webhook patches it with ``--preflight``.

Pod A is a sandbox whose cgroup a host worker joins (a leaf below the pod's, as a process stuck
outside its container sits); the sandbox is then stopped and removed through the CRI, so the worker
outlives its pod: a stale holder, as ``scripts/device/stale_gpu.py`` makes one. Pod B is run as
``lab pod`` runs a manifest (``ManifestPod``: init containers to completion, then the containers).
With the gate: B's workload must not start while the holder lives; ``gpuzombie reap --yes`` (the
real command, pidfd-only) ends the holder, and the time from the GPU being free to B's workload
container running is measured. Without it: B starts beside the holder, both measured.

On the CPU the GPU is a stand-in, named so: the holder holds host memory and an open stand-in
``/dev/nvidia0`` on a private /dev (what makes ``reap`` count it a GPU holder), and NVML is a JSON
snapshot the gate reads through ``--nvml-standin``, written here every 20 ms from the holder's
liveness (``StandinNvml``). The CRI, the processes, the gate's polling and reap are real.

``gpuzombie lab handover`` runs it (``run_handover``: B without the gate, then with it, N times) and
writes handover.json; scripts/device/handover_gpu.sh runs that command on a GPU machine.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from gpuzombie.admission.mutate import Policy, mutate, patched
from gpuzombie.admission.preflight import CONTAINER as GATE
from gpuzombie.gpu.nvml import GpuDevice, GpuSnapshot, NvmlBackend, default_backend, read_gpus
from gpuzombie.k8s.cri import SandboxSpec
from gpuzombie.lab.errors import PodError
from gpuzombie.lab.events import EventLog
from gpuzombie.lab.manifest import parse_pod
from gpuzombie.lab.runner import check_can_make_pods
from gpuzombie.lab.runtime.cri import CriRuntime, PodMaker, cri_runtime
from gpuzombie.lab.runtime.manifestpod import HostPathGrant, ManifestPod, PodRunConfig
from gpuzombie.lab.runtime.rundirs import cgroup_roots
from gpuzombie.units import MIB

STANDIN_IN_POD = "/run/gpuzombie-nvml-standin"
STANDIN_FILE = "nvml.json"
STANDIN_UUID = "GPU-00000000-0000-0000-0000-standin00000"
STANDIN_RESERVED = 615 * MIB
"""The driver's reservation the stand-in GPU shows (an idle H200's, DEVICE-FACTS.md)."""
STANDIN_TOTAL = 143771 * MIB
POLL_S = 0.01
Say = Callable[[str], None]


def pod_b(name: str, *, size_mib: int, device: str, namespace: str = "gpu-test") -> dict[str, Any]:
    """Pod B as a team writes it: one GPU container whose worker holds ``size_mib`` (and frees it on
    SIGTERM); shareProcessNamespace, so the webhook's only change is the gate (no tini to copy in)."""
    backend = ["--backend", "torch"] if device == "cuda" else []
    worker = ["python3", "-m", "gpuzombie.workloads.worker_fixed", "--size-mib", str(size_mib), "--device", device]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "terminationGracePeriodSeconds": 10,
            "shareProcessNamespace": True,
            "containers": [
                {
                    "name": "train",
                    "image": "registry.example.com/ml/train:1",
                    "command": [*worker, *backend],
                    "resources": {"limits": {"nvidia.com/gpu": 1}},
                }
            ],
        },
    }


def gated(doc: Mapping[str, Any], image: str = "localhost/gpu-zombie/gpuzombie-node:0.1.0") -> dict[str, Any]:
    """``doc`` as the webhook patches it with ``--preflight`` (its real mutation, nothing else)."""
    namespace = doc.get("metadata", {}).get("namespace")
    mutation = mutate(doc, namespace, Policy(image=image, preflight=True))
    if "preflight" not in mutation.actions:
        raise PodError(f"the webhook added no gate: {mutation.skipped or mutation.warnings}")
    return patched(doc, mutation.ops)


def with_standin(doc: Mapping[str, Any], host_dir: str) -> dict[str, Any]:
    """The CPU stand-in's one change to the webhook's output: the gate reads the stand-in NVML file
    (``--nvml-standin``) from ``host_dir``, bound read-only."""
    out = copy.deepcopy(dict(doc))
    spec = out["spec"]
    gate = next(c for c in spec["initContainers"] if c["name"] == GATE)
    gate["command"] = [*gate["command"], "--nvml-standin", f"{STANDIN_IN_POD}/{STANDIN_FILE}"]
    gate.setdefault("volumeMounts", []).append({"name": "nvml-standin", "mountPath": STANDIN_IN_POD, "readOnly": True})
    spec.setdefault("volumes", []).append({"name": "nvml-standin", "hostPath": {"path": host_dir}})
    return out


class StandinNvml:
    """STAND-IN for the driver on a CPU host: a GPU whose used memory is the reservation plus what the
    stale holder holds while it lives (listing no process: the holder is in no PID namespace of B's),
    written to ``dir/nvml.json`` every 20 ms, atomically."""

    def __init__(self, directory: Path, holder: subprocess.Popen[bytes], held_bytes: int) -> None:
        self.path = directory / STANDIN_FILE
        self.holder, self.held_bytes = holder, held_bytes
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="nvml-standin", daemon=True)

    def snapshot(self) -> GpuSnapshot:
        held = self.held_bytes if self.holder.poll() is None else 0
        used = STANDIN_RESERVED + held
        device = GpuDevice(
            index=0,
            uuid=STANDIN_UUID,
            name="stand-in GPU",
            memory_total=STANDIN_TOTAL,
            memory_used=used,
            memory_free=STANDIN_TOTAL - used,
            memory_reserved=STANDIN_RESERVED,
        )
        return GpuSnapshot(available=True, driver_version="stand-in", devices=(device,))

    def _write(self) -> None:
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(dataclasses.asdict(self.snapshot())))
        os.chmod(tmp, 0o644)
        os.replace(tmp, self.path)

    def _run(self) -> None:
        while not self._stop.wait(0.02):
            self._write()

    def __enter__(self) -> StandinNvml:
        self._write()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


@dataclasses.dataclass(frozen=True)
class StaleHolder:
    pod_uid: str
    process: subprocess.Popen[bytes]
    size_mib: int


@contextlib.contextmanager
def stale_holder(ctd: PodMaker, *, size_mib: int, device: str, log: Path) -> Iterator[StaleHolder]:
    """Pod A's worker, left holding ``size_mib`` after its pod is removed; killed at the end."""
    doomed = ctd.start_pod(SandboxSpec(name="handover-a", namespace="gpu-test"))
    roots = [r for r in cgroup_roots() if os.path.isdir(r + doomed.spec.cgroup_parent)]
    groups = [Path(r + doomed.spec.cgroup_parent) for r in roots]
    leaves: list[Path] = []
    if roots == ["/sys/fs/cgroup"]:  # cgroup v2: a leaf, as no process may sit beside child cgroups
        leaves = groups = [groups[0] / "leftover"]
        groups[0].mkdir(exist_ok=True)
    join = " && ".join(f"echo $$ > {g}/cgroup.procs" for g in groups)  # v1: the pod's own, each hierarchy
    backend = "torch" if device == "cuda" else "auto"
    run = (
        f"exec {sys.executable} -m gpuzombie.workloads.worker --size-mib {size_mib} --device {device} "
        f"--backend {backend} > {log} 2>&1"
    )
    if device == "cuda":
        argv = ["sh", "-c", f"{join} && {run}"]
    else:  # a stand-in /dev/nvidia0 on a private /dev, held open: what makes reap count it a GPU holder
        private = "mount -t tmpfs -o mode=755 stale-dev /dev && touch /dev/nvidia0 && exec 3</dev/nvidia0"
        argv = ["unshare", "--mount", "sh", "-c", f"{private} && {join} && {run}"]
    process = subprocess.Popen(argv, start_new_session=True, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        deadline = time.monotonic() + 120
        while "ready" not in (log.read_text() if log.exists() else ""):
            if process.poll() is not None or time.monotonic() > deadline:
                raise PodError(f"pod A's worker did not get ready: {log.read_text()[-300:] if log.exists() else ''}")
            time.sleep(0.05)
        ctd.stop_pod(doomed)  # the pod is gone; its worker is not
        yield StaleHolder(doomed.spec.uid, process, size_mib)
    finally:
        if process.poll() is None:
            process.kill()
        process.wait()
        for leaf in leaves:
            with contextlib.suppress(OSError):
                leaf.rmdir()


def reap_command(socket: str, uid: str) -> list[str]:
    """``gpuzombie reap --yes`` on pod A's holders: no kubelet here, so the runtime alone judges."""
    alone = ["--pod-resources-socket", "/nonexistent", "--trust-runtime-without-kubelet"]
    return [sys.executable, "-m", "gpuzombie", "reap", "--yes", "--json", "--cri-socket", socket, *alone,
            "--pod-uid", uid, "--timeout", "5", "--kill-wait", "2"]  # fmt: skip


def listed_pids(nvml: NvmlBackend | None) -> dict[int, int]:
    """pid -> bytes NVML lists over every GPU (empty without NVML: the stand-in lists none)."""
    if nvml is None:
        return {}
    return {p.pid: p.used_memory or 0 for d in read_gpus(nvml).devices for p in d.processes}


@dataclasses.dataclass
class HandoverRun:
    """What one pod B run showed; filled in as the run goes (returned once it is over)."""

    gated: bool
    stale_mib: int
    workload_started_while_dirty: bool
    """B's workload container ran while the holder lived."""
    both_holders: dict[str, int] = dataclasses.field(default_factory=dict)
    """Without the gate: what NVML listed for the stale holder and B's worker (pid -> MiB)."""
    gate_polls: int = 0
    gate_dirty_polls: int = 0
    gate_log: str = ""
    reap_exit: int | None = None
    reap_output: str = ""
    reap_to_free_s: float | None = None
    """reap's start → the holder gone (and on a GPU, no longer listed by NVML)."""
    free_to_running_s: float | None = None
    """The holder gone → B's workload container running (its process started)."""
    free_to_holding_s: float | None = None
    """On a GPU: the holder gone → NVML lists B's worker."""
    events: list[str] = dataclasses.field(default_factory=list)


def run_b(
    cri: CriRuntime, doc: Mapping[str, Any], holder: StaleHolder, *, device: str, reap_after_s: float,
    nvml: NvmlBackend | None, say: Say, host_paths: tuple[HostPathGrant, ...] = (),
) -> HandoverRun:  # fmt: skip
    """Pod B (``doc``) beside the stale holder; with a gate in ``doc``, reap after ``reap_after_s``."""
    manifest = parse_pod(doc)
    has_gate = any(c.name == GATE for c in manifest.init_containers)
    events = EventLog()
    pod = ManifestPod(cri, manifest, PodRunConfig(device=device, host_paths=host_paths), events)
    failure: list[BaseException] = []

    def start() -> None:
        try:
            pod.start()
        except BaseException as exc:  # noqa: BLE001 - reported by the caller, in its thread
            failure.append(exc)

    starter = threading.Thread(target=start, name="pod-b", daemon=True)
    result = HandoverRun(has_gate, holder.size_mib, False)
    t0 = time.monotonic()
    starter.start()
    try:
        if has_gate:
            _gated_run(pod, starter, holder, result, cri.socket, reap_after_s, nvml, say, t0)
        else:
            _plain_run(pod, starter, holder, result, nvml, say)
        starter.join(timeout=180)
        if failure:
            raise PodError(f"pod B: {failure[0]}")
        result.gate_log = pod.log_text() if has_gate else ""
        polls = [line for line in result.gate_log.splitlines() if line.startswith("preflight: ") and " s: " in line]
        result.gate_polls = len(polls)
        result.gate_dirty_polls = sum(": dirty," in line for line in polls)
        result.events = [f"{e.t:8.3f} {e.name} {e.detail}" for e in events.events]
    finally:
        starter.join(timeout=180)
        pod.kill()
    return result


def _gated_run(
    pod: ManifestPod, starter: threading.Thread, holder: StaleHolder, result: HandoverRun, socket: str,
    reap_after_s: float, nvml: NvmlBackend | None, say: Say, t0: float,
) -> None:  # fmt: skip
    while time.monotonic() - t0 < reap_after_s:
        result.workload_started_while_dirty |= bool(pod.pids_by_name)
        time.sleep(POLL_S)
    say(f"B waited {reap_after_s:g} s with its workload {'RUNNING' if pod.pids_by_name else 'not started'}; reap --yes")
    result.workload_started_while_dirty |= bool(pod.pids_by_name)
    reaping = time.monotonic()
    reap = subprocess.Popen(reap_command(socket, holder.pod_uid), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    pid = holder.process.pid
    free = running = holding = None
    deadline = reaping + 120
    while time.monotonic() < deadline and (free is None or running is None or (nvml and holding is None)):
        now = time.monotonic()
        listed = listed_pids(nvml)
        if free is None and holder.process.poll() is not None and pid not in listed:
            free = now
        if running is None and pod.pids_by_name:
            running = now
            result.workload_started_while_dirty |= free is None
        if nvml and holding is None and running is not None and any(p != pid for p in listed):
            holding = now
        if not starter.is_alive() and running is None:
            break
        time.sleep(POLL_S)
    out, err = reap.communicate(timeout=120)
    result.reap_exit, result.reap_output = reap.returncode, (out + err).decode(errors="replace")
    if free is not None:
        result.reap_to_free_s = round(free - reaping, 3)
        result.free_to_running_s = None if running is None else round(running - free, 3)
        result.free_to_holding_s = None if holding is None else round(holding - free, 3)
    say(
        f"reap exit {reap.returncode}; free {result.reap_to_free_s} s after reap; B running {result.free_to_running_s} s after free"
    )


def _plain_run(
    pod: ManifestPod, starter: threading.Thread, holder: StaleHolder, result: HandoverRun,
    nvml: NvmlBackend | None, say: Say,
) -> None:  # fmt: skip
    deadline = time.monotonic() + 120
    pid = holder.process.pid
    while time.monotonic() < deadline and starter.is_alive():
        time.sleep(POLL_S)
    result.workload_started_while_dirty = bool(pod.pids_by_name) and holder.process.poll() is None
    while nvml and time.monotonic() < deadline:  # B's worker allocates after its start: wait for all of it
        listed = listed_pids(nvml)
        others = {p: b for p, b in listed.items() if p != pid}
        if pid in listed and sum(others.values()) >= holder.size_mib * MIB:  # B asks A's size
            result.both_holders = {
                f"stale {pid}": listed[pid] // MIB,
                **{f"B {p}": b // MIB for p, b in others.items()},
            }
            break
        time.sleep(0.05)
    say(f"B started beside the stale holder: {result.workload_started_while_dirty}; NVML: {result.both_holders}")


def _spread(values: list[float]) -> dict[str, float] | None:
    if not values:
        return None
    return {"n": len(values), "median": statistics.median(values), "min": min(values), "max": max(values)}


def _one_run(
    cri: CriRuntime, n: int, out: Path, *, device: str, size_mib: int, reap_after_s: float,
    nvml: NvmlBackend | None, standin_dir: Path, say: Say,
) -> dict[str, Any]:  # fmt: skip
    """Pod B without the gate, then with it, beside one stale holder; the run's entry of handover.json."""
    plain_doc = pod_b("handover-b", size_mib=size_mib, device=device)
    gated_doc = gated(plain_doc)
    grants: tuple[HostPathGrant, ...] = ()
    with stale_holder(cri.pods, size_mib=size_mib, device=device, log=out / f"a-{n}.log") as holder:
        stand_in = (
            StandinNvml(standin_dir, holder.process, size_mib * MIB) if device != "cuda" else contextlib.nullcontext()
        )
        with stand_in:
            if device != "cuda":
                gated_doc = with_standin(gated_doc, str(standin_dir))
                grants = (HostPathGrant(str(standin_dir)),)
            plain = run_b(cri, plain_doc, holder, device=device, reap_after_s=0, nvml=nvml, say=say)
            result = run_b(
                cri, gated_doc, holder, device=device, reap_after_s=reap_after_s, nvml=nvml, say=say,
                host_paths=grants,
            )  # fmt: skip
    (out / f"gate-{n}.log").write_text(result.gate_log + "\n== events\n" + "\n".join(result.events) + "\n")
    left_out = ("gate_log", "events", "both_holders", "reap_output")
    return {
        "without_gate": {
            "started_beside_the_holder": plain.workload_started_while_dirty,
            "nvml_mib": plain.both_holders,
        },
        "with_gate": {k: v for k, v in dataclasses.asdict(result).items() if k not in left_out},
    }


def _as_expected(runs: list[dict[str, Any]]) -> bool:
    """Every gated B waited for the reap (its gate saw the holder twice or more) and then ran; every
    ungated B started beside the holder."""
    gates = [r["with_gate"] for r in runs]
    return bool(gates) and all(
        not g["workload_started_while_dirty"] and g["gate_dirty_polls"] >= 2 and g["reap_exit"] == 0
        and g["free_to_running_s"] is not None
        for g in gates
    ) and all(r["without_gate"]["started_beside_the_holder"] for r in runs)  # fmt: skip


def run_handover(
    out: Path, *, device: str, size_mib: int, repeat: int, reap_after_s: float, budget_s: float | None,
    archives: Path | None, say: Say,
) -> dict[str, Any]:  # fmt: skip
    """The experiment ``repeat`` times on a private containerd (runs that would start after
    ``budget_s`` are skipped); writes OUT/handover.json (returned: ``ok`` says whether every run went
    as the gate promises), OUT/gate-<n>.log (the gate's polls and the run's events) and OUT/a-<n>.log."""
    check_can_make_pods()
    out.mkdir(parents=True, exist_ok=True)
    nvml = default_backend() if device == "cuda" else None
    summary: dict[str, Any] = {"device": device, "size_mib": size_mib, "reap_after_s": reap_after_s, "runs": []}
    if nvml is not None:
        gpu = read_gpus(nvml)
        summary["gpu"] = {
            "driver": gpu.driver_version,
            "devices": [(d.name, d.memory_total // MIB) for d in gpu.devices],
        }
    started = time.monotonic()
    standin_dir = Path("/tmp/gpuzombie-handover-standin")
    standin_dir.mkdir(mode=0o755, exist_ok=True)
    with cri_runtime(socket=None, gpu=device == "cuda", archives=archives) as cri:
        for n in range(1, repeat + 1):
            if budget_s is not None and time.monotonic() - started > budget_s:
                say(f"run {n}: skipped (budget {budget_s:g} s)")
                break
            say(f"run {n}/{repeat}: pod A leaves a stale holder of {size_mib} MiB")
            run = _one_run(
                cri, n, out, device=device, size_mib=size_mib, reap_after_s=reap_after_s, nvml=nvml,
                standin_dir=standin_dir, say=say,
            )  # fmt: skip
            summary["runs"].append(run)
            say(f"run {n}: {json.dumps(run)}")
    gates = [r["with_gate"] for r in summary["runs"]]
    summary["spread"] = {
        key: _spread([g[key] for g in gates if g[key] is not None])
        for key in ("reap_to_free_s", "free_to_running_s", "free_to_holding_s")
    }
    summary["ok"] = _as_expected(summary["runs"])
    (out / "handover.json").write_text(json.dumps(summary, indent=1))
    return summary
