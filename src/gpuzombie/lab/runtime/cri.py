"""The lab's CRI runtime: a private containerd (or one on ``--cri-socket``) and what every lab
container gets there (``manifestpod.ManifestPod`` makes the pods, through the kubelet's CRI calls).

The image is a busybox rootfs; the host's
``/usr``, ``/lib``, ``/lib64`` (and ``/opt``), the lab's Python and the project are mounted read-only,
so nothing is pulled from a registry. On a GPU the ``/dev/nvidia*`` devices are CRI devices and the
driver's libraries and ``nvidia-smi`` are mounted, as the NVIDIA container toolkit does.
"""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import stat
import subprocess
import tempfile
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from gpuzombie.k8s.cri import BindMount, CriError, RunningPod, RuntimeClient, SandboxSpec
from gpuzombie.lab.runtime.containerd import (
    BUSYBOX_IMAGE,
    Containerd,
    busybox_image,
    pause_image,
    private_containerd,
    write_image_archive,
)
from gpuzombie.lab.runtime.interpreter import PythonLayout, interpreter_paths
from gpuzombie.lab.runtime.rundirs import remove_cgroup

LAB_NAMESPACE = "gpuzombie-lab"
KUBELET_MIN_GRACE_S = 2
"""The kubelet's ``minimumGracePeriodInSeconds``: StopContainer never gets less after a preStop."""
KUBELET_RUNTIME_TIMEOUT_S = 120
"""The kubelet's ``--runtime-request-timeout`` (2 min): its only limit on the hook's ExecSync, and its
margin beyond the grace for StopContainer (a loaded node's runtime can take seconds to answer)."""
HOST_DIRS = ("/usr", "/lib", "/lib64", "/opt")
HOST_FILES = ("/etc/ld.so.cache",)
NVIDIA_LIB_DIRS = ("/usr/local/nvidia/lib64", "/usr/lib/x86_64-linux-gnu", "/usr/lib64")
NVIDIA_LIBS = ("libnvidia-ml.so.1", "libcuda.so.1")
IMAGE_ARCHIVES = (("pause.tar", pause_image), ("busybox.tar", busybox_image))
"""The two images a lab run needs, as archive file names and how they are built from host files."""
PASSED_ENV = ("CUDA_VISIBLE_DEVICES", "NCCL_", "TORCH_", "NVSHMEM_")
"""Variables (or prefixes) of the lab's environment the workload container gets too."""


def write_image_archives(directory: Path) -> list[Path]:
    """The pause and busybox images as docker archives, to carry to a machine that cannot build them."""
    directory.mkdir(parents=True, exist_ok=True)
    written = []
    for name, build in IMAGE_ARCHIVES:
        write_image_archive(build(), directory / name)
        written.append(directory / name)
    return written


@dataclass(frozen=True)
class GpuParts:
    """What the NVIDIA container toolkit gives a GPU container, found on this host."""

    devices: tuple[str, ...]
    mounts: tuple[str, ...]
    library_dirs: tuple[str, ...]


def find_gpu_parts(dev: str = "/dev") -> GpuParts:
    """The ``/dev/nvidia*`` character devices, the driver's library directories and nvidia-smi."""
    candidates = sorted(glob.glob(f"{dev}/nvidia*") + glob.glob(f"{dev}/nvidia-caps/*"))
    devices = tuple(p for p in candidates if stat.S_ISCHR(os.stat(p).st_mode))
    lib_dirs = tuple(d for d in NVIDIA_LIB_DIRS if any(os.path.exists(os.path.join(d, lib)) for lib in NVIDIA_LIBS))
    smi = shutil.which("nvidia-smi") or next(
        (p for p in ("/usr/local/nvidia/bin/nvidia-smi", "/usr/bin/nvidia-smi") if os.path.exists(p)), None
    )
    return GpuParts(devices=devices, mounts=lib_dirs + ((smi,) if smi else ()), library_dirs=lib_dirs)


def _under(path: str, dirs: Sequence[str]) -> bool:
    real = os.path.realpath(path)
    return any(real == d or real.startswith(d.rstrip("/") + "/") for d in map(os.path.realpath, dirs))


def workload_mounts(extra: Sequence[str], gpu: GpuParts | None) -> tuple[BindMount, ...]:
    """Read-only binds at the same paths: the host's system dirs, then whatever else the workload
    needs (the lab's Python, the project, an init binary) and is not under them already."""
    paths = [p for p in (*HOST_DIRS, *HOST_FILES) if os.path.exists(p)]
    base = list(paths)
    for p in (*extra, *(gpu.mounts if gpu else ())):
        inside = any(p == m or p.startswith(m.rstrip("/") + "/") for m in paths)  # in a mount already
        if os.path.exists(p) and not inside and not _under(p, base):
            paths.append(p)
    return tuple(BindMount(host_path=p, container_path=p, readonly=True) for p in paths)


def lab_environment(environ: Mapping[str, str], gpu: GpuParts | None) -> dict[str, str]:
    """The container's environment: absolute PYTHONPATH, a PATH with busybox first, the GPU's."""
    env = {"PATH": "/bin:/usr/local/bin:/usr/bin:/sbin:/usr/sbin", "HOME": "/tmp"}
    if environ.get("PYTHONPATH"):
        env["PYTHONPATH"] = os.pathsep.join(os.path.abspath(p) for p in environ["PYTHONPATH"].split(os.pathsep) if p)
    env.update({k: v for k, v in environ.items() if k.startswith(PASSED_ENV)})
    if gpu and gpu.library_dirs:
        env["LD_LIBRARY_PATH"] = os.pathsep.join(gpu.library_dirs)
    return env


def python_paths(environ: Mapping[str, str], layout: PythonLayout | None = None) -> list[str]:
    """What the lab's own Python (or ``layout``'s) needs inside a container: the venv and the
    installation it links to (a pyenv, uv or conda Python outside /usr), and the PYTHONPATH entries
    (the project's ``src`` in a checkout)."""
    paths = interpreter_paths(layout or PythonLayout.current())
    paths += [os.path.abspath(p) for p in environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    import gpuzombie  # the package itself, wherever it is installed

    paths.append(str(Path(gpuzombie.__file__).resolve().parents[1]))
    return list(dict.fromkeys(paths))


class SocketPods:
    """Pod sandboxes on a runtime the lab did not start (``--cri-socket``): the same two calls as
    ``Containerd.start_pod`` and ``stop_pod``."""

    def __init__(self, client: RuntimeClient) -> None:
        self.client = client
        self.uids: set[str] = set()
        """Every pod asked for, also one whose RunPodSandbox an interruption cut short."""

    def start_pod(self, spec: SandboxSpec) -> RunningPod:
        self.uids.add(spec.uid)
        return RunningPod(self.client, spec, self.client.run_pod_sandbox(spec))

    def stop_pod(self, pod: RunningPod) -> None:
        """RemovePodSandbox, then the pod's cgroup: a kubelet removes it, and there is none for these."""
        self.client.stop_pod_sandbox(pod.sandbox_id)
        self.client.remove_pod_sandbox(pod.sandbox_id)
        self.uids.discard(pod.spec.uid)
        remove_cgroup(pod.spec.cgroup_parent)

    def remove_left(self) -> None:
        """Stop and remove the sandboxes of this run that are still there (after an interruption)."""
        if not self.uids:
            return
        for sandbox in self.client.list_pod_sandboxes():
            if sandbox.metadata.uid in self.uids:
                self.client.stop_pod_sandbox(sandbox.id)
                self.client.remove_pod_sandbox(sandbox.id)
        for uid in self.uids:
            remove_cgroup(SandboxSpec(name="left", uid=uid).cgroup_parent)


class PodMaker(Protocol):
    def start_pod(self, spec: SandboxSpec) -> RunningPod: ...
    def stop_pod(self, pod: RunningPod) -> None: ...


@dataclass(frozen=True)
class CriRuntime:
    """Where the lab's CRI pods run: a client on the runtime's socket and what every container gets."""

    client: RuntimeClient
    pods: PodMaker
    """Makes and removes the sandboxes (a private containerd also removes their cgroups at its end)."""
    socket: str
    image: str
    mounts: tuple[BindMount, ...]
    env: Mapping[str, str]
    devices: tuple[str, ...]
    private: bool
    """A containerd of the lab's own (stopped at the end), or a runtime given by ``--cri-socket``."""
    state_dir: Path | None = None
    """The private containerd's run directory, where a pod's volumes go too (``lab clean`` finds
    them there after a crash); None on a runtime the lab did not start."""


def _import_archives(ctd: Containerd, archives: Path) -> None:
    for name, _build in IMAGE_ARCHIVES:
        path = archives / name
        if not path.is_file():
            raise CriError(f"image archive {path} missing (build it with: gpuzombie lab images {archives})")
        ctd.ctr("images", "import", "--no-unpack=false", str(path))


def _runtime(client: RuntimeClient, pods: PodMaker, socket: str, *, gpu: bool, state_dir: Path | None) -> CriRuntime:
    parts = find_gpu_parts() if gpu else None
    if gpu and not (parts and parts.devices):
        raise CriError("CreateContainer: --device cuda, but no /dev/nvidia* device on this host")
    mounts = workload_mounts(python_paths(os.environ), parts)
    env = lab_environment(os.environ, parts)
    devices = parts.devices if parts else ()
    return CriRuntime(client, pods, socket, BUSYBOX_IMAGE, mounts, env, devices, state_dir is not None, state_dir)


def cri_runtime_on(ctd: Containerd, *, gpu: bool = False) -> CriRuntime:
    """The lab's runtime on a private containerd that already runs (with the busybox image)."""
    return _runtime(ctd.client, ctd, ctd.socket, gpu=gpu, state_dir=ctd.workdir)


@contextlib.contextmanager
def cri_runtime(*, socket: str | None, gpu: bool, archives: Path | None = None) -> Iterator[CriRuntime]:
    """A CRI runtime for the lab: a private containerd (images built here or imported from
    ``archives``), or the runtime on ``socket`` with the lab's busybox image imported through ``ctr``."""
    if socket is None:
        images = () if archives is not None else (pause_image(), busybox_image())
        with private_containerd(images=images) as ctd:
            if archives is not None:
                _import_archives(ctd, archives)
            yield cri_runtime_on(ctd, gpu=gpu)
        return
    _import_into(socket)
    with RuntimeClient(socket) as client:
        client.version(timeout=5)
        pods = SocketPods(client)
        try:
            yield _runtime(client, pods, socket, gpu=gpu, state_dir=None)
        finally:
            pods.remove_left()


def _import_into(socket: str) -> None:
    """The lab's busybox image into the containerd on ``socket`` (its own sandbox image is used)."""
    with tempfile.TemporaryDirectory(prefix="gpuzombie-image-") as tmp:
        archive = Path(tmp) / "busybox.tar"
        write_image_archive(busybox_image(), archive)
        argv = ["ctr", "--address", socket, "--namespace", "k8s.io", "images", "import", str(archive)]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)
    if done.returncode != 0:
        raise CriError(f"ctr images import (into {socket}): {' '.join(done.stderr.split())[-200:]}")


def parse_cri_log(text: str) -> str:
    """The container's output from the CRI log format (``<time> <stream> <P|F> <text>``): partial
    lines (P) joined with what follows, as ``kubectl logs`` shows them."""
    out: list[str] = []
    for line in text.splitlines():
        parts = line.split(" ", 3)
        if len(parts) < 3:
            continue
        out.append(parts[3] if len(parts) == 4 else "")
        if parts[2] == "F":
            out.append("\n")
    return "".join(out)
