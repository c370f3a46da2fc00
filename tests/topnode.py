"""A fake GPU node for ``gpuzombie top``: a fake /proc tree of many pods (each its own PID namespace
and cgroup, one GPU worker listed by a fake NVML, some with a non-reaping PID 1 and zombies) and
many host services, with the CRI names and NVML snapshot that go with it. Shared by the tests and
benchmarks/bench_top.py."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from fakeproc import TREE_PIDNS, make_fake_proc, make_fake_root
from gpuzombie.gpu.nvml import FakeNvml, GpuDevice, GpuProcess, GpuSnapshot
from gpuzombie.k8s.names import ContainerNames, CriNames
from gpuzombie.units import MIB

GIB = 1024 * MIB
WORKER_MIB = 2000
SIGTERM_MASK = "0000000000004000"


def pod_uid(i: int) -> str:
    return f"{i:08x}-0000-4000-8000-{i:012x}"


def container_id(i: int) -> str:
    return f"{i:08x}" * 8


def pod_name(i: int) -> str:
    return f"train-{i}"


def namespace(i: int) -> str:
    return ("team-a", "team-b", "infra")[i % 3]


def worker_pid(i: int) -> int:
    return 100_000 + i * 100 + 2


@dataclass(frozen=True)
class FakeNode:
    proc: Path
    pods: int
    per_pod: int
    gpus: int

    def nvml(self) -> FakeNvml:
        devices = []
        for g in range(self.gpus):
            procs = tuple(
                GpuProcess(worker_pid(i), (WORKER_MIB + i) * MIB, "compute", "python3")
                for i in range(self.pods)
                if i % self.gpus == g
            )
            used = 615 * MIB + sum(p.used_memory or 0 for p in procs)
            devices.append(
                GpuDevice(g, f"GPU-{g:04d}", "NVIDIA H200", 140 * GIB, used, 140 * GIB - used, 615 * MIB, procs)
            )
        return FakeNvml(GpuSnapshot(available=True, driver_version="580.159.04", devices=tuple(devices)))

    def names(self, ids) -> CriNames:
        wanted = set(ids)
        found = {
            container_id(i): ContainerNames(
                container_id(i), "worker", pod_name(i), namespace(i), pod_uid(i), "CONTAINER_RUNNING"
            )
            for i in range(self.pods)
            if container_id(i) in wanted
        }
        return CriNames(source="fake", containers=found)


def build_fake_node(root: Path, *, pods: int, per_pod: int, host: int, gpus: int = 8) -> FakeNode:
    """Pod i: PID 1 ``tini`` (``sleep`` for every third pod: it reaps nothing), a python3 GPU worker
    (local pid 2) on GPU i % gpus, helpers under the worker; every fifth pod has a zombie helper.
    Host: ``host`` services under systemd, none holding a GPU."""
    proc = root / "proc"
    proc.mkdir(parents=True)
    make_fake_root(proc)
    make_fake_proc(proc, 1, ppid=0, comm="systemd", cmdline=b"/sbin/init\0", pidns=TREE_PIDNS)
    for n in range(host):
        d = make_fake_proc(proc, 1000 + n, ppid=1, comm="svc", cmdline=b"/usr/bin/svc\0--serve\0", pidns=TREE_PIDNS)
        (d / "cgroup").write_text(f"0::/system.slice/svc-{n}.service\n")
    for i in range(pods):
        base, inode = 100_000 + i * 100, TREE_PIDNS + 1000 + i
        uid = pod_uid(i).replace("-", "_")
        line = (
            f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{uid}.slice/"
            f"cri-containerd-{container_id(i)}.scope\n"
        )
        sleeper = i % 3 == 0
        for local in range(1, per_pod + 1):
            if local == 1:
                comm, cmdline, ppid = (
                    ("sleep", b"sleep\0infinity\0", 50) if sleeper else ("tini", b"tini\0--\0python3\0", 50)
                )
            elif local == 2:
                comm, cmdline, ppid = "python3", b"python3\0train.py\0--gpu\0", base + 1
            else:
                comm, cmdline, ppid = "python3", f"python3\0-c\0helper {local}\0".encode(), base + 2
            zombie = i % 5 == 0 and local == per_pod
            d = make_fake_proc(
                proc,
                base + local,
                ppid=ppid,
                state="Z" if zombie else "S",
                comm=comm,
                cmdline=b"" if zombie else cmdline,
                nspid=(base + local, local),
                pidns=inode,
                fds=(f"/dev/nvidia{i % gpus}", "/dev/nvidiactl") if local == 2 else (),
                starttime=1000 + i,
            )
            (d / "cgroup").write_text(line)
            with open(d / "status", "a") as f:
                f.write(
                    f"SigBlk:\t0000000000000000\nSigIgn:\t0000000000000000\nSigCgt:\t{SIGTERM_MASK if local == 2 else '0000000000000000'}\n"
                )
    return FakeNode(proc, pods, per_pod, gpus)
