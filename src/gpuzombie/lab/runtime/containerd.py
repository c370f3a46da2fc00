"""A private containerd with its CRI plugin, for labs and tests: own root, state and socket in a
run directory (``rundirs``: under /run/gpuzombie-lab, named after its owner, so ``gpuzombie lab
clean`` finds it if the owner is SIGKILLed), images built here (no registry), everything stopped
and removed at the end.

``with private_containerd() as ctd:`` starts ``containerd --config`` in its own session, imports a
pause image (``catatonit -P``, a real reaping pause) and a busybox-static image, and yields a
``Containerd`` whose ``pod()`` makes sandboxes as the kubelet does. On leaving the block, even after
an error: every sandbox is stopped and removed through the CRI, containerd is stopped by its pid,
any shim or container process still tied to this instance is killed, its mounts are unmounted, the
pod cgroups it made are removed, and the run directory is deleted.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import shutil
import signal
import subprocess
import tarfile
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from gpuzombie.k8s.cri import CriError, RunningPod, RuntimeClient, SandboxSpec
from gpuzombie.lab.errors import LabError
from gpuzombie.lab.runtime.rundirs import (
    LAB_STATE_ROOT,
    cgroup_roots,
    new_run_dir,
    record_cgroup,
    recorded_cgroups,
    remove_run,
)

PAUSE_IMAGE = "localhost/gpuzombie/pause:catatonit"
BUSYBOX_IMAGE = "localhost/gpuzombie/busybox:static"
CRI_NAMESPACE = "k8s.io"
START_TIMEOUT = 30.0
STOP_TIMEOUT = 10.0
_BASE_DIRS = ("bin", "dev", "etc", "proc", "sys", "tmp", "run")


class ContainerdError(LabError):
    """containerd could not be started, fed an image, or cleaned up; the message is one line."""


@dataclass(frozen=True)
class ImageSpec:
    """A one-layer image built from host files: no registry, no builder."""

    name: str
    files: Mapping[str, str]
    """Path in the image → host file copied there (mode kept)."""
    symlinks: Mapping[str, str] = field(default_factory=dict)
    """Path in the image → link target."""
    entrypoint: tuple[str, ...] = ()
    cmd: tuple[str, ...] = ()
    env: tuple[str, ...] = ()
    """``NAME=value`` lines beside the image's PATH."""


def _host_binary(name: str, *candidates: str) -> str:
    for path in (shutil.which(name), *candidates):
        if path and os.path.isfile(path):
            return path
    raise ContainerdError(f"{name} not found (Debian: apt-get install {name}; make debian installs it)")


def pause_image(name: str = PAUSE_IMAGE) -> ImageSpec:
    """The pod's pause container: Debian's static ``catatonit -P``, which waits for signals and reaps."""
    catatonit = _host_binary("catatonit", "/usr/bin/catatonit", "/usr/libexec/podman/catatonit")
    return ImageSpec(name=name, files={"catatonit": catatonit}, entrypoint=("/catatonit", "-P"))


def busybox_image(name: str = BUSYBOX_IMAGE) -> ImageSpec:
    """Debian's busybox-static with a link for each of its applets in /bin."""
    busybox = _host_binary("busybox", "/bin/busybox")
    listed = subprocess.run([busybox, "--list"], capture_output=True, text=True, timeout=10, check=False)
    applets = sorted({a for a in listed.stdout.split() if a and "/" not in a and a != "busybox"})
    return ImageSpec(
        name=name,
        files={"bin/busybox": busybox},
        symlinks={f"bin/{a}": "busybox" for a in applets},
        cmd=("/bin/sh",),
    )


def _layer_tar(spec: ImageSpec) -> bytes:
    """The image's one layer, reproducibly (fixed owner and mtime)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:

        def add(info: tarfile.TarInfo, data: bytes | None = None) -> None:
            info.uid = info.gid = 0
            info.uname = info.gname = "root"
            info.mtime = 0
            tar.addfile(info, io.BytesIO(data) if data is not None else None)

        for d in _BASE_DIRS:
            info = tarfile.TarInfo(d)
            info.type, info.mode = tarfile.DIRTYPE, 0o1777 if d == "tmp" else 0o755
            add(info)
        for path, source in sorted(spec.files.items()):
            data = Path(source).read_bytes()
            info = tarfile.TarInfo(path)
            info.size, info.mode = len(data), os.stat(source).st_mode & 0o7777
            add(info, data)
        for path, target in sorted(spec.symlinks.items()):
            info = tarfile.TarInfo(path)
            info.type, info.linkname, info.mode = tarfile.SYMTYPE, target, 0o777
            add(info)
    return buf.getvalue()


def write_image_archive(spec: ImageSpec, path: str | os.PathLike[str]) -> None:
    """A docker-archive tar (what ``podman save --format docker-archive`` writes) that ``ctr images
    import`` reads: manifest.json, the image config, one uncompressed layer."""
    layer = _layer_tar(spec)
    layer_id = hashlib.sha256(layer).hexdigest()
    config = {
        "architecture": "amd64",
        "os": "linux",
        "config": {
            "Env": ["PATH=/usr/local/bin:/bin:/usr/bin:/sbin:/usr/sbin", *spec.env],
            "Entrypoint": list(spec.entrypoint) or None,
            "Cmd": list(spec.cmd) or None,
        },
        "rootfs": {"type": "layers", "diff_ids": [f"sha256:{layer_id}"]},
        "history": [{"created_by": "gpuzombie.lab.runtime.containerd.write_image_archive"}],
    }
    config_bytes = json.dumps(config, sort_keys=True).encode()
    config_name = f"{hashlib.sha256(config_bytes).hexdigest()}.json"
    manifest = [{"Config": config_name, "RepoTags": [spec.name], "Layers": [f"{layer_id}/layer.tar"]}]
    with tarfile.open(path, mode="w") as tar:
        for name, data in (
            (f"{layer_id}/layer.tar", layer),
            (config_name, config_bytes),
            ("manifest.json", json.dumps(manifest).encode()),
        ):
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o644
            tar.addfile(info, io.BytesIO(data))


CNI_PLUGIN_DIRS = ("/usr/lib/cni", "/opt/cni/bin")
"""Where Debian's containernetworking-plugins (and the upstream tarball) put ``loopback`` and ``static``."""
LOOPBACK_ONLY_CNI = {
    "cniVersion": "1.0.0",
    "name": "gpuzombie-lab-loopback-only",
    "plugins": [
        {"type": "static", "ipam": {"type": "static", "addresses": [{"address": "127.0.0.1/8"}]}},
        {"type": "loopback"},
    ],
}
"""A pod's own network namespace with nothing in it but ``lo``: ``static`` (an IPAM plugin run as
the chain's first plugin) creates no device and only reports 127.0.0.1, which containerd needs as
the pod IP of ``eth0``; ``loopback`` brings ``lo`` up and passes that result on. No bridge, no veth,
no state outside the work dir: the pod reaches nothing but itself."""


def cni_bin_dir() -> str | None:
    """The directory with the ``loopback`` and ``static`` CNI plugins: beside the containerd in use
    (``<prefix>/lib/cni``, also a Debian package unpacked elsewhere), or a usual place."""
    containerd = shutil.which("containerd")
    beside = [os.path.join(os.path.dirname(os.path.dirname(containerd)), "lib", "cni")] if containerd else []
    for d in (*beside, *CNI_PLUGIN_DIRS):
        if all(os.path.isfile(os.path.join(d, p)) for p in ("loopback", "static")):
            return d
    return None


def config_toml(workdir: Path, *, sandbox_image: str = PAUSE_IMAGE, cni_bin: str = CNI_PLUGIN_DIRS[0]) -> str:
    """containerd's config: everything under ``workdir`` (also the pods' network namespaces);
    ``restrict_oom_score_adj`` because a container without CAP_SYS_RESOURCE (CI, this lab) cannot
    give the pause container -998."""
    return f"""version = 2
root = "{workdir}/root"
state = "{workdir}/state"
disabled_plugins = ["io.containerd.internal.v1.opt", "io.containerd.tracing.processor.v1.otlp"]
[grpc]
  address = "{workdir}/containerd.sock"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{sandbox_image}"
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{cni_bin}"
    conf_dir = "{workdir}/cni/conf"
  [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
    runtime_type = "io.containerd.runc.v2"
"""


class Containerd:
    """A running private containerd: its socket, a CRI client, images and pods made through it."""

    def __init__(self, workdir: Path, process: subprocess.Popen[bytes]):
        self.workdir = workdir
        self.socket = str(workdir / "containerd.sock")
        self.process = process
        self.client = RuntimeClient(self.socket, log_root=str(workdir / "pods"), before_sandbox=self._claim_cgroups)

    @property
    def pid(self) -> int:
        return self.process.pid

    def ctr(self, *args: str, timeout: float = 60) -> str:
        """Run ``ctr`` against this instance in the CRI's namespace; its stdout."""
        argv = ["ctr", "--address", self.socket, "--namespace", CRI_NAMESPACE, *args]
        try:
            done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
        except (OSError, subprocess.TimeoutExpired) as exc:
            raise ContainerdError(f"ctr {' '.join(args[:2])}: {exc}") from exc
        if done.returncode != 0:
            raise ContainerdError(f"ctr {' '.join(args[:2])}: {' '.join(done.stderr.split())[-300:]}")
        return done.stdout

    def import_image(self, spec: ImageSpec) -> None:
        """Build ``spec`` as an archive and import (and unpack) it: no registry is asked."""
        archive = self.workdir / "images" / f"{hashlib.sha256(spec.name.encode()).hexdigest()[:16]}.tar"
        archive.parent.mkdir(exist_ok=True)
        write_image_archive(spec, archive)
        self.ctr("images", "import", "--no-unpack=false", str(archive))

    def _claim_cgroups(self, pod: SandboxSpec) -> None:
        """The pod's cgroup, and those of its parents (``/kubepods``, its QoS level) that no one had
        made yet: a kubelet keeps those, a private runtime removes what it added."""
        parent = pod.cgroup_parent
        roots, claimed = cgroup_roots(), recorded_cgroups(self.workdir)
        path = ""
        for part in parent.strip("/").split("/"):
            path = f"{path}/{part}"
            if path not in claimed and (path == parent or not any(os.path.isdir(root + path) for root in roots)):
                record_cgroup(self.workdir, path)
                claimed.append(path)

    def start_pod(self, spec: SandboxSpec) -> RunningPod:
        """A pod sandbox as the kubelet makes it, left running until ``stop_pod`` or the end."""
        return RunningPod(self.client, spec, self.client.run_pod_sandbox(spec))

    def stop_pod(self, pod: RunningPod) -> None:
        """Stop and remove the sandbox and its containers (the kubelet's pod deletion, no grace)."""
        self.client.stop_pod_sandbox(pod.sandbox_id)
        self.client.remove_pod_sandbox(pod.sandbox_id)

    @contextlib.contextmanager
    def pod(self, spec: SandboxSpec) -> Iterator[RunningPod]:
        """``start_pod`` for the ``with`` block: stopped and removed with its containers at the end."""
        pod = self.start_pod(spec)
        try:
            yield pod
        finally:
            self.stop_pod(pod)

    def logs_tail(self, lines: int = 5) -> str:
        try:
            text = (self.workdir / "containerd.log").read_text(errors="replace")
        except OSError:
            return ""
        return " | ".join(text.strip().splitlines()[-lines:])

    # --- tear-down, each step a backstop for the one before ---------------------------------------

    def _remove_sandboxes(self) -> list[str]:
        problems = []
        try:
            sandboxes = self.client.list_pod_sandboxes(timeout=5)
        except CriError as exc:
            return [str(exc)]
        for sandbox in sandboxes:
            try:
                self.client.stop_pod_sandbox(sandbox.id, timeout=STOP_TIMEOUT)
                self.client.remove_pod_sandbox(sandbox.id, timeout=STOP_TIMEOUT)
            except CriError as exc:
                problems.append(str(exc))
        return problems

    def _stop_daemon(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(STOP_TIMEOUT)

    def close(self) -> list[str]:
        """Stop and remove everything; what needed a backstop or could not be removed, one line each."""
        problems = self._remove_sandboxes()
        self.client.close()
        self._stop_daemon()
        return problems + remove_run(self.workdir)  # shims, containers, mounts, cgroups, the dir


def _start(workdir: Path, start_timeout: float) -> Containerd:
    for sub in ("root", "state", "pods", "cni/conf"):
        (workdir / sub).mkdir(parents=True, exist_ok=True)
    config = workdir / "config.toml"
    cni_bin = cni_bin_dir()
    config.write_text(config_toml(workdir, cni_bin=cni_bin or CNI_PLUGIN_DIRS[0]))
    if cni_bin:  # else only host-network pods can start (lab pod refuses to run: check_runnable)
        (workdir / "cni" / "conf" / "10-loopback-only.conflist").write_text(json.dumps(LOOPBACK_ONLY_CNI))
    exe = _host_binary("containerd", "/usr/bin/containerd")
    with open(workdir / "containerd.log", "wb") as log:
        process = subprocess.Popen(
            [exe, "--config", str(config)],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # setsid: a Ctrl-C to the caller does not kill it half-way
        )
    ctd = Containerd(workdir, process)
    deadline = time.monotonic() + start_timeout
    while True:
        if process.poll() is not None:
            tail = ctd.logs_tail()
            ctd.close()
            raise ContainerdError(f"containerd exited {process.returncode} at start: {tail}")
        if os.path.exists(ctd.socket):
            with contextlib.suppress(CriError):
                ctd.client.version(timeout=1)
                return ctd
        if time.monotonic() > deadline:
            tail = ctd.logs_tail()
            ctd.close()
            raise ContainerdError(f"containerd did not answer within {start_timeout:g} s: {tail}")
        time.sleep(0.05)


@contextlib.contextmanager
def private_containerd(
    *,
    images: tuple[ImageSpec, ...] | None = None,
    state_root: Path = LAB_STATE_ROOT,
    start_timeout: float = START_TIMEOUT,
) -> Iterator[Containerd]:
    """A private containerd with the pause and busybox images (or ``images``) imported; everything
    removed when the block ends. Raises ContainerdError if it cannot start or import, and after the
    block if something could not be removed."""
    workdir = new_run_dir(state_root)
    try:
        ctd = _start(workdir, start_timeout)
    except BaseException:
        shutil.rmtree(workdir, ignore_errors=True)
        raise
    problems: list[str] = []
    try:
        for spec in images if images is not None else (pause_image(), busybox_image()):
            ctd.import_image(spec)
        yield ctd
    finally:
        problems = ctd.close()
    left = [p for p in problems if p.startswith("cannot")]
    if left:
        raise ContainerdError("; ".join(left))
