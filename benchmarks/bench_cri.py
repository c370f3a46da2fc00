"""Benchmark: names for a node of real containerd pods through the gRPC client, against the seed's way.

A private containerd (``gpuzombie.lab.runtime.containerd``) runs --pods kubelet-style pods of two busybox
containers each. Then, side by side in the same run, --repeat times in alternating order:

* gpuzombie: a fresh ``RuntimeNames`` (a new channel, ListPodSandbox + ListContainers, what one
  ``trace`` run does) naming every container id;
* the seed's way: one ``crictl inspect`` per container. No crictl here, so its equivalent over the
  same socket: for each container a fresh connection and one ContainerStatus call (crictl's own
  process start, ~30 ms a call, is left out: the seed's real cost is higher);
* gpuzombie's next exporter scan: the same lookup again on the warm object (names kept by id).

Prints the machine, the date and this command, each time (median, min-max) and the ratio.

Run (root): python3 benchmarks/bench_cri.py [--pods 50] [--repeat 5]
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "src"))

from gpuzombie.k8s.cri import ContainerSpec, RuntimeClient, SandboxSpec
from gpuzombie.k8s.names import RuntimeNames
from gpuzombie.lab.runtime.containerd import BUSYBOX_IMAGE, Containerd, private_containerd

CONTAINERS = ("main", "sidecar")


def start_pods(ctd: Containerd, pods: int) -> list[str]:
    """``pods`` pods of two sleeping containers; their container ids."""
    ids = []
    for i in range(pods):
        pod = ctd.start_pod(SandboxSpec(name=f"bench-{i}", namespace="bench"))
        for name in CONTAINERS:
            ids.append(pod.start(ContainerSpec(name=name, image=BUSYBOX_IMAGE, command=("sleep", "3600"))))
    return ids


def ours(socket: str, ids: list[str]) -> int:
    names = RuntimeNames(socket, timeout=30)
    got = names(ids)
    names.close()
    return sum(got.container(c) is not None and got.container(c).pod is not None for c in ids)  # type: ignore[union-attr]


def seeds_way(socket: str, ids: list[str]) -> int:
    named = 0
    for cid in ids:
        with RuntimeClient(socket, timeout=30) as client:
            named += bool(client.container_status(cid).status.labels.get("io.kubernetes.pod.name"))
    return named


def timed(fn: Callable[[], int]) -> tuple[float, int]:
    t0 = time.perf_counter()
    named = fn()
    return time.perf_counter() - t0, named


def spread(times: list[float]) -> str:
    ms = [t * 1000 for t in times]
    return f"{statistics.median(ms):8.2f} ms (min {min(ms):.2f}, max {max(ms):.2f})"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pods", type=int, default=50)
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args()
    version = subprocess.run(["containerd", "--version"], capture_output=True, text=True, check=False).stdout.strip()
    print(f"machine: {platform.node()} {platform.machine()}, {os.cpu_count()} CPUs, Linux {platform.release()}")
    print(f"runtime: {version}, private instance (gpuzombie.lab.runtime.containerd), runc, cgroupfs")
    print(f"date: {datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC")
    print(f"command: python3 benchmarks/bench_cri.py --pods {args.pods} --repeat {args.repeat}")
    print(f"load average before: {os.getloadavg()[0]:.1f}", flush=True)
    with private_containerd() as ctd:
        t0 = time.perf_counter()
        ids = start_pods(ctd, args.pods)
        print(f"{args.pods} pods, {len(ids)} containers started in {time.perf_counter() - t0:.1f} s", flush=True)
        warm = RuntimeNames(ctd.socket, timeout=30)
        warm(ids)
        grpc_times, seed_times, warm_times = [], [], []
        for i in range(args.repeat):
            order = [("grpc", grpc_times), ("seed", seed_times)]
            for kind, times in order if i % 2 == 0 else order[::-1]:
                fn = (lambda: ours(ctd.socket, ids)) if kind == "grpc" else (lambda: seeds_way(ctd.socket, ids))
                seconds, named = timed(fn)
                assert named == len(ids), f"{kind}: {named} of {len(ids)} named"
                times.append(seconds)
            warm_times.append(timed(lambda: len(warm(ids).containers))[0])
        warm.close()
    med_grpc, med_seed = statistics.median(grpc_times), statistics.median(seed_times)
    print(f"names for {len(ids)} containers, {args.repeat} runs each:")
    print(f"  gpuzombie, gRPC list calls (fresh client):          {spread(grpc_times)}")
    print(f"  seed's way, ContainerStatus per container (fresh):  {spread(seed_times)}")
    print(f"  gpuzombie, next exporter scan (names kept by id):   {spread(warm_times)}")
    print(f"ratio seed/gpuzombie (medians): {med_seed / med_grpc:.1f}x")
    print(f"load average after: {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
