"""A busy fake GPU node for the fleet benchmark: 8 H200s, 110 pods, ~2,100 processes in a fake procfs
(tests/fakeproc.py), scanned once by the real exporter code (scan_node with a fake NVML and runtime)
and printed as its /metrics text.

    PYTHONPATH=<src>:<repo>/tests python benchmarks/fleet_node.py [--findings]

Run with the ``src`` of the code to measure (the bench runs it once for the code before and once
for the code after). Every node of the fleet is this text with its names, uids and values changed:
the node is ``FLEETNODE``, each pod name holds ``n0000`` and each pod uid starts ``c0ffee00``.

Clean node: 8 GPU pods under tini (as the admission webhook leaves them), 102 CPU pods whose PID 1
is a python program, a shell or tini, each with ~18 workers; the runtime lists every pod (the stale
check can judge). With ``--findings``: a zombie and an orphan under a ``sleep`` PID 1, a GPU worker
that ignores SIGTERM under a python PID 1 that drops it (grace risk, and the webhook's miss), and
1,000 MiB of ghost memory on GPU 7.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

GIB = 1 << 30
MIB = 1 << 20
GPUS = 8
PODS = 110
WORKERS = 18
SIGTERM = "0000000000004000"
NONE = "0000000000000000"
NODE = "FLEETNODE"
UID_PREFIX = "c0ffee00"
POD_TOKEN = "n0000"


def pod_uid(i: int) -> str:
    return f"{UID_PREFIX}-0000-4000-8000-{i:012x}"


def container_id(i: int) -> str:
    return f"{i:04x}" * 16


def _cgroup(i: int) -> str:
    uid = pod_uid(i).replace("-", "_")
    return f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{uid}.slice/cri-containerd-{container_id(i)}.scope\n"


def _proc(root: Path, i: int, host: int, local: int, ppid_host: int, comm: str, **kw) -> None:
    from fakeproc import make_fake_proc

    sig = kw.pop("sig", {})
    d = make_fake_proc(
        root,
        host,
        ppid=ppid_host,
        comm=comm,
        cmdline=kw.pop("cmdline", comm.encode() + b"\0"),
        nspid=(host, local),
        pidns=4026540000 + i,
        starttime=1000 + local,
        **kw,
    )
    (d / "cgroup").write_text(_cgroup(i))
    with open(d / "status", "a") as f:
        f.write(f"SigBlk:\t{sig.get('blk', NONE)}\nSigIgn:\t{sig.get('ign', NONE)}\nSigCgt:\t{sig.get('cgt', NONE)}\n")


def build(root: Path, *, findings: bool) -> list[tuple[int, int]]:
    """The fake /proc; returns (host pid, GPU index) of each process NVML lists."""
    from fakeproc import TREE_PIDNS, make_fake_proc, make_fake_root

    root.mkdir()
    make_fake_root(root)
    make_fake_proc(root, 1, ppid=0, comm="systemd", cmdline=b"/sbin/init\0", pidns=TREE_PIDNS)
    make_fake_proc(root, 50, ppid=1, comm="containerd-shim", pidns=TREE_PIDNS)
    listed = []
    for i in range(PODS):
        base = 1000 + i * 100
        if i < GPUS:
            dev = (f"/dev/nvidia{i}", "/dev/nvidiactl", "/dev/nvidia-uvm")
            if findings and i == 1:  # python PID 1 without a handler: drops SIGTERM; its worker ignores it
                _proc(root, i, base, 1, 50, "python3", cmdline=b"python3\0train.py\0")
                main_sig = {"ign": SIGTERM}
            else:  # what the admission webhook makes of a GPU pod: tini as PID 1
                _proc(root, i, base, 1, 50, "tini", cmdline=b"tini\0--\0python3\0train.py\0", sig={"blk": SIGTERM})
                main_sig = {"cgt": SIGTERM}
            _proc(root, i, base + 1, 2, base, "python3", cmdline=b"python3\0train.py\0", fds=dev, sig=main_sig)
            listed.append((base + 1, i))
            for w in range(WORKERS - 2):  # dataloader workers: children of the trainer, not of PID 1
                _proc(root, i, base + 2 + w, 3 + w, base + 1, "pt_data_worker")
        elif findings and i == GPUS:  # sleep as PID 1: an orphaned worker and a zombie
            _proc(root, i, base, 1, 50, "sleep", cmdline=b"sleep\0infinity\0")
            _proc(root, i, base + 1, 7, base, "python3")
            _proc(root, i, base + 2, 8, base, "python3", state="Z", cmdline=b"")
        else:
            kind = i % 3
            if kind == 0:
                _proc(root, i, base, 1, 50, "python3", cmdline=b"python3\0-m\0service\0", sig={"cgt": SIGTERM})
            elif kind == 1:
                _proc(root, i, base, 1, 50, "sh", cmdline=b"/bin/sh\0-c\0run.sh\0")
            else:
                _proc(root, i, base, 1, 50, "tini", cmdline=b"tini\0--\0java\0", sig={"blk": SIGTERM})
            for w in range(WORKERS - 1):  # the ordinary workers of a multi-process pod
                direct = 1 if kind == 2 else 4  # tini starts one child; python and sh several
                parent = base if w < direct else base + 1
                _proc(root, i, base + 1 + w, 2 + w, parent, "worker", sig={"cgt": SIGTERM})
    return listed


def render(*, findings: bool) -> str:
    from prometheus_client import CollectorRegistry, generate_latest

    from gpuzombie.exporter import NodeCollector, scan_node
    from gpuzombie.gpu.attribution import ReaderView
    from gpuzombie.gpu.nvml import FakeNvml, GpuDevice, GpuProcess, GpuSnapshot
    from gpuzombie.k8s.liveness import RuntimePods
    from gpuzombie.k8s.names import ContainerNames, CriNames
    from gpuzombie.k8s.podresources import PodResources
    from gpuzombie.proc.procfs import Procfs

    shm = "/dev/shm" if Path("/dev/shm").is_dir() else None  # a tmpfs: 2,100 process dirs made in ~1 s
    with tempfile.TemporaryDirectory(prefix="fleet-node-", dir=shm) as tmp:
        root = Path(tmp) / "proc"
        listed = build(root, findings=findings)
        devices = []
        for gpu in range(GPUS):
            procs = tuple(GpuProcess(pid, 60 * GIB + pid * MIB, "compute", "python3") for pid, g in listed if g == gpu)
            ghost = 1000 * MIB if findings and gpu == GPUS - 1 else 0
            used = 615 * MIB + sum(p.used_memory for p in procs) + ghost
            devices.append(GpuDevice(gpu, f"GPU-{gpu:04d}-{NODE}", "NVIDIA H200", 141 * GIB, used, 0, 615 * MIB, procs))
        snapshot = GpuSnapshot(available=True, driver_version="580.159.04", devices=tuple(devices))
        containers = {
            container_id(i): ContainerNames(
                container_id(i), "main", f"job-{POD_TOKEN}-{i:03d}", f"team-{i % 12}", pod_uid(i), "CONTAINER_RUNNING"
            )
            for i in range(PODS)
        }

        def scan():
            return scan_node(
                procfs=Procfs(str(root)),
                nvml=FakeNvml(snapshot),
                view=ReaderView(in_root_pidns=True),
                names=lambda ids: CriNames(source="fake", containers=containers),
                resources=lambda: PodResources(source=None),
                node_name=NODE,
                pods=lambda: RuntimePods(source="fake", ready=frozenset(pod_uid(i) for i in range(PODS))),
            )

        registry = CollectorRegistry()
        registry.register(NodeCollector(scan, min_interval=0))
        return generate_latest(registry).decode()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--findings", action="store_true", help="the node with findings")
    args = parser.parse_args()
    sys.stdout.write(render(findings=args.findings))


if __name__ == "__main__":
    main()
