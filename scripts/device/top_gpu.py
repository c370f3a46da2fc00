"""`gpuzombie top --once` with the lab's GPU pods running (run by scripts/device/top_gpu.sh, as root,
PYTHONPATH=src:tests).

On a private containerd (the lab's): ``keeper-0`` (a pod the runtime runs, nothing on the GPU);
``trainer-0`` whose cgroup a torch worker joins holding SIZE_MIB (it ignores SIGTERM);
``orphans-0``, a PID namespace in its own pod's cgroup whose PID 1 is ``sleep`` and whose parent
starts two workers holding SIZE_MIB each and exits without wait() (the seed's scenario 1: orphans
on the GPU under a PID 1 that reaps nothing). Captured under OUT: top's frame and JSON with all of
it running (top-running.txt/.json), both tools' refresh on this node beside each other
(bench-top-real.log: benchmarks/bench_top.py --real pinned to BENCH_CPUS, default 0,1: two cores;
BENCH=0 skips it), then after ``trainer-0`` is
removed through the CRI (its worker STALE: top-stale.txt/.json), and the time of each --once.
"""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from gpuzombie.k8s.cri import SandboxSpec
from gpuzombie.lab.runtime.containerd import pause_image, private_containerd
from gpuzombie.lab.runtime.rundirs import cgroup_roots
from pidns import PidNamespace, wait_until

OUT = Path(sys.argv[1])
SIZE_MIB = int(os.environ.get("SIZE_MIB", "2048"))
DEVICE = os.environ.get("DEVICE", "cuda")
"""``DEVICE=cpu``: a dry run without a GPU (stand-in /dev/nvidia0 fds make the holders)."""
BACKEND = "torch" if DEVICE == "cuda" else "auto"
STAND_IN_DEV = "mount -t tmpfs dry-dev /dev && touch /dev/nvidia0 && exec 3</dev/nvidia0 && "


def removed(cgroup: Path) -> bool:
    """Remove an empty cgroup directory; False while the kernel still calls it busy."""
    try:
        cgroup.rmdir()
    except FileNotFoundError:
        return True
    except OSError as exc:
        if exc.errno == errno.EBUSY:
            return False
        raise
    return True


def workload(module: str, *options: str) -> str:
    return f"{sys.executable} -m gpuzombie.workloads.{module} --size-mib {SIZE_MIB} --device {DEVICE} --backend {BACKEND} {' '.join(options)}"


def cgroups_of(spec: SandboxSpec, leaf: str) -> list[Path]:
    """Where a process of ``spec`` joins: the pod's cgroup in each v1 hierarchy, a leaf below it on v2."""
    roots = [r for r in cgroup_roots() if os.path.isdir(r + spec.cgroup_parent)]
    groups = [Path(r + spec.cgroup_parent) for r in roots]
    if roots == ["/sys/fs/cgroup"]:
        groups = [groups[0] / leaf]
        groups[0].mkdir(exist_ok=True)
    return groups


def top(name: str, *args: str) -> float:
    started = time.monotonic()
    for suffix, extra in ((".txt", ("--tree", "--width", "200")), (".json", ("--json",))):
        done = subprocess.run(
            [sys.executable, "-m", "gpuzombie", "top", "--once", *extra, *args],
            capture_output=True,
            text=True,
            timeout=120,
        )
        (OUT / f"{name}{suffix}").write_text(
            done.stdout + (f"\n# stderr:\n{done.stderr}" if done.stderr and suffix == ".txt" else "")
        )
        if suffix == ".txt":
            print(done.stdout, done.stderr, flush=True)
            took = time.monotonic() - started
    return took


def main() -> int:
    summary: dict = {"size_mib": SIZE_MIB, "device": DEVICE}
    procs: list[subprocess.Popen[bytes]] = []
    leaves: list[Path] = []
    with private_containerd(images=(pause_image(),)) as ctd:
        ctd.start_pod(SandboxSpec(name="keeper-0", namespace="gpu-test"))
        trainer = ctd.start_pod(SandboxSpec(name="trainer-0", namespace="gpu-test"))
        orphans = ctd.start_pod(SandboxSpec(name="orphans-0", namespace="gpu-test"))
        try:
            groups = cgroups_of(trainer.spec, "leftover")
            leaves += [g for g in groups if g.name == "leftover"]
            join = " && ".join(f"echo $$ > {g}/cgroup.procs" for g in groups)
            log = OUT / "trainer-worker.log"
            command = f"{join} && exec {workload('worker')} > {log} 2>&1"
            if DEVICE == "cpu":
                command = STAND_IN_DEV + command
            procs.append(
                subprocess.Popen(
                    ["unshare", "--mount", "sh", "-c", command] if DEVICE == "cpu" else ["sh", "-c", command],
                    start_new_session=True,
                )
            )
            (ns_group,) = cgroups_of(orphans.spec, "ns")[:1]
            leaves += [ns_group] if ns_group.name == "ns" else []
            parent_log = OUT / "orphans-parent.log"
            inner = f"{workload('parent', '--workers', '2')} > {parent_log} 2>&1 & exec sleep infinity"
            argv = ("sh", "-c", (STAND_IN_DEV if DEVICE == "cpu" else "") + inner)
            with PidNamespace(*argv, cgroup=ns_group):  # --mount-proc: its own mount namespace for the stand-in
                wait_until(lambda: "ready" in log.read_text() if log.exists() else False, timeout=180)
                wait_until(lambda: parent_log.exists() and parent_log.read_text().count("ready pid=") >= 2, timeout=180)
                wait_until(lambda: "parent exiting" in parent_log.read_text(), timeout=60)
                args = (
                    "--cri-socket",
                    ctd.socket,
                    "--pod-resources-socket",
                    "/nonexistent",
                    "--trust-runtime-without-kubelet",
                )
                summary["once_running_s"] = top("top-running", *args)
                if os.environ.get("BENCH", "1") == "1":  # both tools' refresh on this node, the pods up
                    cpus = os.environ.get("BENCH_CPUS", "0,1")  # the goal is for 2 cores
                    bench = [
                        *(["taskset", "-c", cpus] if cpus else []),
                        sys.executable,
                        "benchmarks/bench_top.py",
                        "--real",
                        "--repeat",
                        "20",
                        "--cri-socket",
                        ctd.socket,
                    ]
                    done = subprocess.run(bench, capture_output=True, text=True, timeout=300)
                    (OUT / "bench-top-real.log").write_text(f"$ {' '.join(bench)}\n{done.stdout}{done.stderr}")
                    print(done.stdout, flush=True)
                ctd.client.stop_pod_sandbox(trainer.sandbox_id)
                ctd.client.remove_pod_sandbox(trainer.sandbox_id)
                summary["once_stale_s"] = top("top-stale", *args)
                stale = json.loads((OUT / "top-stale.json").read_text())
                marks = {
                    p["pod"]: (p["dirty"], p["reaps"], p["zombies"], p["orphans"])
                    for g in stale["groups"]
                    for p in g["pods"]
                }
                summary["pods"] = marks
        finally:
            for p in procs:
                os.killpg(p.pid, 9)
                p.wait()
            for leaf in leaves:
                wait_until(
                    lambda leaf=leaf: not leaf.exists() or not (leaf / "cgroup.procs").read_text().strip(), timeout=30
                )
                # An emptied cgroup can answer EBUSY while its last tasks finish exiting: retry, bounded.
                wait_until(lambda leaf=leaf: removed(leaf), timeout=30)
    (OUT / "summary.json").write_text(json.dumps(summary, indent=1))
    print(json.dumps(summary, indent=1))
    marks = summary.get("pods", {})
    ok = any(v[0] == "stale" for v in marks.values()) and marks.get("orphans-0", (None, None))[1] is False
    print("top on a GPU node:", "OK" if ok else "NOT AS EXPECTED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
