"""The stale-holder path on a real GPU (run by scripts/device/stale_gpu.sh, as root, PYTHONPATH=src).

On a private containerd (the lab's): a running pod ``keeper-0`` and a pod ``trainer-0`` whose cgroup
two host torch workers join (a leaf cgroup below the pod's, as a process stuck outside its container
would sit), each holding SIZE_MIB of GPU memory: ``worker`` ignores SIGTERM, ``worker_fixed`` frees
its memory and exits on it. Then the pod is stopped and removed through the CRI. Recorded under
OUT: trace (before: not stale; after: STALE), exporter --once's dirty series, reap's dry run, and
``reap --yes``: each worker's outcome and how long after reap's start NVML stopped listing it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

from gpuzombie.gpu.nvml import default_backend, read_gpus
from gpuzombie.k8s.cri import SandboxSpec
from gpuzombie.lab.runtime.containerd import pause_image, private_containerd
from gpuzombie.lab.runtime.rundirs import cgroup_roots
from gpuzombie.units import MIB

OUT = Path(sys.argv[1])
SIZE_MIB = int(os.environ.get("SIZE_MIB", "2048"))
REAP_TIMEOUT = os.environ.get("REAP_TIMEOUT", "5")
DEVICE = os.environ.get("DEVICE", "cuda")
"""``DEVICE=cpu``: a dry run of this script without a GPU (the workers' liveness stands in for NVML)."""
NVML = default_backend()
WORKERS: dict[str, subprocess.Popen[bytes]] = {}


def gpuzombie(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gpuzombie", *args], capture_output=True, text=True, timeout=120)


def save(name: str, text: str) -> None:
    (OUT / name).write_text(text)


def read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


def listed() -> dict[int, int]:
    """pid -> bytes NVML lists, over every GPU."""
    if DEVICE == "cpu":
        return {p.pid: 0 for p in WORKERS.values() if p.poll() is None}
    snapshot = read_gpus(NVML)
    return {p.pid: p.used_memory or 0 for d in snapshot.devices for p in d.processes}


def wait_for(probe, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = probe()
        if value:
            return value
        time.sleep(0.05)
    raise SystemExit(f"timed out after {timeout:g} s: {what}")


def rows_of(doc: dict, pids: set[int]) -> list[dict]:
    return [r for r in doc["rows"] if r["pid"] in pids]


def main() -> int:
    summary: dict = {"size_mib": SIZE_MIB, "reap_timeout_s": float(REAP_TIMEOUT)}
    workers = WORKERS
    with private_containerd(images=(pause_image(),)) as ctd:
        # the runtime runs a pod: it is asked for real
        ctd.start_pod(SandboxSpec(name="keeper-0", namespace="gpu-test"))
        doomed = ctd.start_pod(SandboxSpec(name="trainer-0", namespace="gpu-test"))
        uid = doomed.spec.uid
        roots = [r for r in cgroup_roots() if os.path.isdir(r + doomed.spec.cgroup_parent)]
        groups = [Path(r + doomed.spec.cgroup_parent) for r in roots]
        leaves: list[Path] = []
        if roots == ["/sys/fs/cgroup"]:  # cgroup v2 (the device): a leaf, as no process may sit beside children
            leaves = groups = [groups[0] / "leftover"]
            groups[0].mkdir()
        join = " && ".join(f"echo $$ > {g}/cgroup.procs" for g in groups)  # v1: the pod's own, each hierarchy
        try:
            for name, module in (("ignores_sigterm", "worker"), ("handles_sigterm", "worker_fixed")):
                log = OUT / f"{name}.log"
                command = (
                    f"{join} && exec {sys.executable} -m gpuzombie.workloads.{module} "
                    f"--size-mib {SIZE_MIB} --device {DEVICE} --backend {'torch' if DEVICE == 'cuda' else 'auto'} "
                    f"> {log} 2>&1"
                )
                if DEVICE == "cpu":  # no GPU: a stand-in /dev/nvidia0 on a private /dev, held open, makes it a holder
                    command = f"mount -t tmpfs dry-dev /dev && touch /dev/nvidia0 && exec 3</dev/nvidia0 && {command}"
                    argv = ["unshare", "--mount", "sh", "-c", command]
                else:
                    argv = ["sh", "-c", command]
                workers[name] = subprocess.Popen(argv, start_new_session=True)
            for name in workers:
                wait_for(lambda n=name: "ready" in read(OUT / f"{n}.log"), 120, f"{name} ready")
            pids = {p.pid for p in workers.values()}
            held = wait_for(lambda: (m := listed()) and pids <= m.keys() and m, 30, "NVML lists both workers")
            summary["held_mib"] = {n: round(held[p.pid] / MIB) for n, p in workers.items()}
            print(f"workers {sorted(pids)} hold {summary['held_mib']} MiB in pod {uid}'s cgroup", flush=True)

            # No kubelet here: the runtime alone judges (tests/test_stale.py checks the cross-check with one).
            alone = ("--pod-resources-socket", "/nonexistent", "--trust-runtime-without-kubelet")
            args = ("--cri-socket", ctd.socket, *alone)
            before = json.loads(gpuzombie("trace", "--json", *args).stdout)
            save("trace-running.json", json.dumps(before, indent=1))
            summary["before"] = [r["dirty"] for r in rows_of(before, pids)]

            ctd.client.stop_pod_sandbox(doomed.sandbox_id)
            ctd.client.remove_pod_sandbox(doomed.sandbox_id)
            after = json.loads(gpuzombie("trace", "--json", *args).stdout)
            save("trace-stale.json", json.dumps(after, indent=1))
            table = gpuzombie("trace", *args)
            save("trace-stale.txt", table.stdout + table.stderr)
            print(table.stdout, flush=True)
            summary["after"] = [(r["dirty"], r["dirty_reason"]) for r in rows_of(after, pids)]
            once = gpuzombie("exporter", "--once", *args)
            save("exporter.prom", once.stdout)
            dirty = [line for line in once.stdout.splitlines() if line.startswith("gpuzombie_dirty_gpu")]
            summary["exporter"] = dirty
            print("\n".join(dirty), flush=True)

            dry = gpuzombie("reap", "--json", *args, "--pod-uid", uid)
            save("reap-dry.json", dry.stdout + dry.stderr)
            summary["dry_run_exit"] = dry.returncode

            gone: dict[int, float] = {}
            started = time.monotonic()
            argv = ["reap", "--yes", "--json", *args, "--pod-uid", uid]
            reap = subprocess.Popen(
                [sys.executable, "-m", "gpuzombie", *argv, "--timeout", REAP_TIMEOUT, "--kill-wait", "2"],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            out: list[str] = []
            reader = threading.Thread(target=lambda: out.extend(reap.communicate(timeout=120)))
            reader.start()
            while len(gone) < len(pids) and time.monotonic() - started < 60:
                now = listed()
                for pid in pids - gone.keys():
                    if pid not in now:
                        gone[pid] = round(time.monotonic() - started, 3)
                time.sleep(0.02)
            reader.join()
            save("reap.json", out[0] + out[1])
            report = json.loads(out[0])
            summary["reap_exit"] = reap.returncode
            summary["reap_duration_s"] = report["duration_s"]
            summary["results"] = {
                n: {
                    "outcome": next(r["outcome"] for r in report["results"] if r["target"]["pid"] == p.pid),
                    "signals": next(r["signals"] for r in report["results"] if r["target"]["pid"] == p.pid),
                    "nvml_unlisted_after_reap_start_s": gone.get(p.pid),
                }
                for n, p in workers.items()
            }
        finally:
            for p in workers.values():
                if p.poll() is None:
                    p.kill()
                p.wait()
            for leaf in leaves:
                if leaf.exists():
                    leaf.rmdir()
    summary["gpu_after"] = [
        {"index": d.index, "used_mib": round(d.memory_used / MIB), "processes": len(d.processes)}
        for d in read_gpus(NVML).devices
    ]
    save("summary.json", json.dumps(summary, indent=1))
    print(json.dumps(summary, indent=1))
    ok = (
        summary["before"] == [None, None]
        and [d for d, _ in summary["after"]] == ["stale", "stale"]
        and summary["reap_exit"] == 0
        and all(r["nvml_unlisted_after_reap_start_s"] is not None for r in summary["results"].values())
    )
    print("stale path on a real GPU:", "OK" if ok else "NOT AS EXPECTED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
