"""Benchmark: one `gpuzombie top` refresh on a node of 110 pods × 20 processes + 2,000 host
processes, beside nvitop's own refresh work on the same node, in one run.

The node is a fake /proc tree in a temp dir (tests/topnode.py: every pod its own PID namespace and
cgroup, one GPU worker per pod listed by a fake NVML on 8 GPUs; a third with a ``sleep`` PID 1 and
every fifth with a zombie); 4,200 live processes are too heavy for the 2 shared cores here.

* gpuzombie top: ``NodeSource()`` = one ``trace.scan.scan_node`` (every process read, the trace,
  the per-namespace survey) + the view model; then the frame rendered as ``--once`` prints it. The
  first refresh (reading every process whole, filling the ``ProcessCache``) is the warm-up; the
  measured ones are the steady state, each with its sweep (one process in 8 read whole).
* nvitop (``pip install nvitop``): what its TUI does every refresh besides NVML: a host snapshot of
  every GPU process (``GpuProcess.host_snapshot``'s fields: status, username, name, cmdline,
  cpu_percent, memory_percent, memory, running time, through ``nvitop.HostProcess`` = psutil), and
  the host panel (cpu_percent, virtual and swap memory), with psutil pointed at the same fake /proc
  (``psutil.PROCFS_PATH``). Its NVML calls cannot run without a GPU and are not counted (on a GPU
  node they add one query per device per refresh); it reads the 110 processes NVML lists, where top
  reads all 4,200 (zombies, orphans and PID 1 are in the others).

With --real (a GPU node: scripts/device/top_gpu.sh runs it with the lab's pods up): both on this
machine's own /proc and real NVML, nvitop's TUI refresh whole: every device's snapshot, its
processes, ``GpuProcess.take_snapshots`` of them and the host panel.

gpuzombie top twice: on the node as built (no process ran between two refreshes: every stat the
same, what its cache keeps) and with every stat changed before each refresh (every process ran:
its worst case).

Each: --repeat refreshes, median and spread of wall time, and CPU seconds per refresh
(``time.process_time``) as a share of one core at the default 2 s refresh of both tools.

Run: python3 benchmarks/bench_top.py [--pods 110] [--per-pod 20] [--host 2000] [--repeat 20] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "tests"))
sys.path.insert(0, str(HERE.parent / "src"))

from fakeproc import BOOT_TIME
from gpuzombie.gpu.attribution import ReaderView
from gpuzombie.k8s.podresources import PodResources
from gpuzombie.proc.procfs import Procfs
from gpuzombie.top.model import arrange
from gpuzombie.top.render import render_text
from gpuzombie.top.source import NodeSource
from topnode import FakeNode, build_fake_node, worker_pid

INTERVAL_S = 2.0
"""Both tools' default refresh interval (gpuzombie top --interval, nvitop --interval)."""


def machine() -> str:
    """The machine, the CPUs this run may use (``taskset -c 0,1``: 2) and the load beside it."""
    usable = len(os.sched_getaffinity(0))
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    return f"{platform.node()} {platform.machine()} {os.cpu_count()} cpus, {usable} usable, load {load}"


def measure(fn: Callable[[], object], repeat: int, before: Callable[[], object] | None = None) -> dict[str, float]:
    """``before`` (not timed) runs before each refresh."""
    walls, cpus = [], []
    fn()  # warm: imports, caches both tools keep across refreshes (names, psutil process objects)
    for _ in range(repeat):
        if before is not None:
            before()
        w0, c0 = time.perf_counter(), time.process_time()
        fn()
        walls.append(time.perf_counter() - w0)
        cpus.append(time.process_time() - c0)
    cpu = statistics.median(cpus)
    return {
        "median_s": statistics.median(walls),
        "min_s": min(walls),
        "max_s": max(walls),
        "stdev_s": statistics.stdev(walls) if len(walls) > 1 else 0.0,
        "cpu_s_per_refresh": cpu,
        "cpu_share_of_one_core_at_2s": cpu / INTERVAL_S,
    }


def pad_stat(node: FakeNode) -> None:
    """Every stat file to the kernel's 52 fields (the fake tree writes the first 24: psutil reads up to
    39), and /proc/stat's cpu line whole (the host panel's cpu_percent)."""
    (node.proc / "stat").write_text(f"cpu 1 2 3 4 5 6 7 8 9 10\nbtime {BOOT_TIME}\n")
    for stat in node.proc.glob("[0-9]*/stat"):
        fields = stat.read_text().split(" ")
        stat.write_text(" ".join(fields + ["0"] * (52 - len(fields))))


def churn(node: FakeNode) -> Callable[[], object]:
    """Before each refresh, every process's stat made to differ from the last refresh's (its utime,
    field 14, between 0 and 1): a node where every process ran since (the worst case for top's
    cache, which keeps what an unchanged stat made)."""
    variants = []
    for stat in sorted(node.proc.glob("[0-9]*/stat")):
        fields = stat.read_text().split(" ")
        ran = [*fields[:13], "1", *fields[14:]]
        variants.append((stat, " ".join(fields), " ".join(ran)))
    turn = [0]

    def before() -> None:
        turn[0] ^= 1
        for stat, idle, ran in variants:
            stat.write_text(ran if turn[0] else idle)

    return before


def top_refresh(node: FakeNode) -> tuple[Callable[[], object], Callable[[], object]]:
    source = NodeSource(
        procfs=Procfs(str(node.proc)),
        nvml=node.nvml(),
        view=ReaderView(in_root_pidns=True),
        names=node.names,
        resources=lambda: PodResources(source=None),
        pods=None,
        node_name="bench",
    )
    last: list = []

    def refresh() -> object:
        last[:] = [source()]
        return last[0]

    def render() -> object:
        return render_text(arrange(last[0] if last else source()), width=200, expanded=frozenset())

    return refresh, render


def nvitop_refresh(node: FakeNode) -> Callable[[], object] | str:
    try:
        import nvitop
        import psutil
    except ImportError as exc:
        return f"nvitop not installed ({exc}): pip install nvitop"
    (node.proc / "meminfo").write_text(
        "MemTotal: 263824896 kB\nMemFree: 200000000 kB\nMemAvailable: 220000000 kB\n"
        "Buffers: 0 kB\nCached: 0 kB\nShmem: 0 kB\nActive: 0 kB\nInactive: 0 kB\nSwapTotal: 0 kB\nSwapFree: 0 kB\n"
    )
    (node.proc / "vmstat").write_text("pswpin 0\npswpout 0\n")
    psutil.PROCFS_PATH = str(node.proc)
    pids = [worker_pid(i) for i in range(node.pods)]

    def refresh() -> object:
        snaps = []
        for pid in pids:  # GpuProcess.host_snapshot, per GPU process NVML lists
            try:
                p = nvitop.HostProcess(pid)
                with p.oneshot():
                    snaps.append(
                        (
                            p.is_running(),
                            p.status(),
                            p.username(),
                            p.name(),
                            p.cmdline(),
                            p.command(),
                            p.cpu_percent(),
                            p.memory_percent(),
                            p.memory_info().rss,
                            p.running_time(),
                        )
                    )
            except (psutil.Error, OSError):
                snaps.append(None)
        host = (nvitop.host.cpu_percent(), nvitop.host.virtual_memory(), nvitop.host.swap_memory())
        return snaps, host

    return refresh


def real_refreshes(cri_socket: str | None) -> tuple[Callable[[], object], Callable[[], object] | str]:
    """Both tools on this machine's /proc and NVML."""
    from gpuzombie.gpu.attribution import current_view
    from gpuzombie.gpu.nvml import default_backend
    from gpuzombie.k8s.names import RuntimeNames

    source = NodeSource(
        procfs=Procfs("/proc"),
        nvml=default_backend(),
        view=current_view(),
        names=RuntimeNames(cri_socket),
        resources=lambda: PodResources(source=None),
        pods=None,
    )
    try:
        from nvitop import Device, GpuProcess, host
    except ImportError as exc:
        return source, f"nvitop not installed ({exc})"
    devices = Device.all()

    def nvitop_refresh() -> object:  # the TUI's device panel, process panel and host panel
        snapshots = [d.as_snapshot() for d in devices]
        processes = [p for d in devices for p in d.processes().values()]
        return snapshots, GpuProcess.take_snapshots(processes, failsafe=True), host.cpu_percent(), host.virtual_memory()

    return source, nvitop_refresh


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pods", type=int, default=110)
    parser.add_argument("--per-pod", type=int, default=20)
    parser.add_argument("--host", type=int, default=2000)
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--real", action="store_true", help="this machine's /proc and NVML, not a fake node")
    parser.add_argument("--cri-socket", default=None, help="with --real: the runtime that names the pods")
    args = parser.parse_args()
    if args.real:
        top, nvitop_real = real_refreshes(args.cri_socket)
        results: dict[str, object] = {
            "machine": machine(),
            "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "node": "this machine's /proc and NVML",
            "gpuzombie_top_refresh": measure(top, args.repeat),
            "nvitop_refresh": nvitop_real if isinstance(nvitop_real, str) else measure(nvitop_real, args.repeat),
        }
        results["machine_after"] = machine()
        return report(results, as_json=args.json)
    root = Path(tempfile.mkdtemp(prefix="bench-top-"))
    try:
        node = build_fake_node(root, pods=args.pods, per_pod=args.per_pod, host=args.host)
        pad_stat(node)
        refresh, render = top_refresh(node)
        view = refresh()
        results = {
            "machine": machine(),
            "python": sys.version.split()[0],
            "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "node": f"{args.pods} pods x {args.per_pod} processes + {args.host} host processes",
            "processes": view.processes,  # type: ignore[attr-defined]
            "gpuzombie_top_refresh": measure(refresh, args.repeat),
            "gpuzombie_top_refresh_every_stat_changed": measure(refresh, args.repeat, churn(node)),
            "gpuzombie_top_render": measure(render, args.repeat),
        }
        nvitop = nvitop_refresh(node)
        if isinstance(nvitop, str):
            results["nvitop_refresh"] = nvitop
        else:
            import nvitop as nv

            results["nvitop_version"] = nv.__version__
            results["nvitop_refresh"] = measure(nvitop, args.repeat)
    finally:
        shutil.rmtree(root)
    results["machine_after"] = machine()
    return report(results, as_json=args.json)


def report(results: dict[str, object], *, as_json: bool) -> int:
    if as_json:
        print(json.dumps(results, indent=2))
        return 0
    for key, value in results.items():
        if isinstance(value, dict):
            print(
                f"{key:42} median {value['median_s'] * 1000:7.1f} ms  min {value['min_s'] * 1000:7.1f}  max "
                f"{value['max_s'] * 1000:7.1f}  stdev {value['stdev_s'] * 1000:6.1f}  cpu {value['cpu_s_per_refresh'] * 1000:7.1f} ms"
                f" = {value['cpu_share_of_one_core_at_2s'] * 100:4.1f}% of a core at 2 s"
            )
        else:
            print(f"{key:42} {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
