"""The NRI plugin on a real node: the plugin binary (go/nri) started on the host against the node's
containerd 2 NRI socket, S1's pod (deploy/pod-nofix.yaml) made runnable on this node, what each
container's PID 1 is, and the CreateContainer times containerd logs. For tests/kube/test_nri_kubernetes.py
and benchmarks/bench_nri.py.

STAND-INs, named: the node has no GPU and no device plugin; its status advertises ``nvidia.com/gpu``
(conftest's ``standin_gpus``) and the pod itself sets ``NVIDIA_VISIBLE_DEVICES``, what NVIDIA's
device plugin gives a GPU container (the plugin's evidence of a GPU: it sees no resource requests).
The workload holds host memory (``--device cpu``), not GPU memory."""

from __future__ import annotations

import copy
import datetime
import re
import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import yaml

from gpuzombie.cluster.build import ensure_nri_plugin
from gpuzombie.cluster.layout import Layout
from kube.conftest import Kube
from kube.pods import BUSYBOX, HOST_PYTHON_DIRS
from pidns import wait_until

REPO = Path(__file__).resolve().parents[2]
S1_MANIFEST = REPO / "deploy" / "pod-nofix.yaml"
SRC = REPO / "src"
STANDIN_DEVICES = "GPU-00000000-0000-0000-0000-standin00001"
TINI = "/usr/bin/tini-static"
REGISTERED_TIMEOUT_S = 30


def layout(kube: Kube) -> Layout:
    return Layout(kube.root, int(kube.env["GPUZOMBIE_CLUSTER_INSTANCE"]), "containerd2")


SYNCHRONIZED = 'plugin \\"10-gpuzombie-init\\" connected and synchronized'
"""What containerd logs once the plugin is in its list (asked from then on)."""


def synchronized(kube: Kube) -> int:
    """How often containerd has taken the plugin in."""
    return containerd_log(kube).count(SYNCHRONIZED)


@dataclass
class Plugin:
    """gpuzombie-nri running on the host, connected to the node's containerd."""

    kube: Kube
    process: subprocess.Popen[bytes]
    log: Path
    tini: Path

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")

    def wait_synchronized(self, before: int) -> None:
        """Until containerd has taken the plugin in once more than ``before`` times."""
        wait_until(lambda: synchronized(self.kube) > before, timeout=REGISTERED_TIMEOUT_S)

    def signal(self, signum: int) -> None:
        self.process.send_signal(signum)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGCONT)
            self.process.kill()
        self.process.wait(timeout=30)


def start_plugin(kube: Kube, workdir: Path, *extra: str) -> Plugin:
    """The plugin binary on the host, installing Debian's static tini where it bind-mounts it from."""
    binary = ensure_nri_plugin(lambda line: None)
    tini = workdir / "opt-nri" / "gpuzombie" / "tini-static"
    log = workdir / "gpuzombie-nri.log"
    workdir.mkdir(parents=True, exist_ok=True)
    before = synchronized(kube)
    out: IO[bytes] = log.open("wb")
    argv = [str(binary), "--socket", str(layout(kube).nri_socket), "--tini", str(tini), "--install-tini", TINI, *extra]
    process = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)
    out.close()
    plugin = Plugin(kube, process, log, tini)
    try:
        plugin.wait_synchronized(before)
    except Exception:
        plugin.stop()
        raise
    return plugin


def s1_pod(name: str, namespace: str, *, annotations: dict[str, str] | None = None, gpu: bool = True) -> dict[str, Any]:
    """deploy/pod-nofix.yaml (S1: ``sh -c 'python3 -m gpuzombie.workloads.parent ... & exec sleep
    infinity'``, no ``command``: the image's ENTRYPOINT and the args) as this node runs it: the
    lab's busybox image (no ENTRYPOINT), this machine's Python and gpuzombie's sources by read-only
    hostPath, 16 MiB of host memory per worker instead of 2 GiB of GPU memory, the stand-in GPU."""
    pod = copy.deepcopy(yaml.safe_load(S1_MANIFEST.read_text()))
    pod["metadata"] = {"name": name, "namespace": namespace, "annotations": dict(annotations or {})}
    spec = pod["spec"]
    spec.pop("imagePullSecrets", None)
    (c,) = spec["containers"]
    assert "command" not in c and c["args"][:2] == ["sh", "-c"], c
    c["args"][2] = c["args"][2].replace("--size-mib 2048", "--size-mib 16 --device cpu")
    c["image"], c["imagePullPolicy"] = BUSYBOX, "Never"
    c["resources"] = {"limits": {"nvidia.com/gpu": "1"}} if gpu else {}
    c["env"] = [{"name": "PYTHONPATH", "value": str(SRC)}]
    if gpu:
        c["env"].append({"name": "NVIDIA_VISIBLE_DEVICES", "value": STANDIN_DEVICES})
    host = [(f"host{d.replace('/', '-')}", d) for d in (*HOST_PYTHON_DIRS, str(SRC))]
    spec["volumes"] = [{"name": n, "hostPath": {"path": p}} for n, p in host]
    c["volumeMounts"] = [{"name": n, "mountPath": p, "readOnly": True} for n, p in host]
    return pod


def _status_field(pid: int, field: str) -> str | None:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        return None
    return None


PAUSE_ARGV = "/catatonit -P"
"""The cluster's pause container (configs.PAUSE_IMAGE), PID 1 of the sandbox's own namespace."""


def pod_pid1(processes: dict[int, str]) -> tuple[int, str] | None:
    """(host pid, command line) of the container's PID 1 among a pod's processes (not the pause's)."""
    for pid, cmdline in processes.items():
        if cmdline == PAUSE_ARGV:
            continue
        nspid = _status_field(pid, "NSpid")
        if nspid is not None and nspid.split()[-1] == "1" and len(nspid.split()) > 1:
            return pid, cmdline
    return None


def parent_of(pid: int) -> int | None:
    ppid = _status_field(pid, "PPid")
    return int(ppid) if ppid else None


def state_of(pid: int) -> str | None:
    """The process's state letter (Z: a zombie), None once it is gone (reaped)."""
    state = _status_field(pid, "State")
    return state.split()[0] if state else None


_CREATE = re.compile(
    r'time="([^"]+)" level=info msg="CreateContainer within sandbox \\"(\w+)\\" for container name:\\"([^\\]+)\\""'
)
_CREATED = re.compile(
    r'time="([^"]+)" level=info msg="CreateContainer within sandbox \\"(\w+)\\" for name:\\"([^\\]+)\\" returns container id \\"(\w+)\\"'
)
"""containerd 2.4's lines for a CreateContainer request and its reply (internal/cri/instrument)."""


def log_time(text: str) -> float:
    """containerd's log time (RFC 3339, nanoseconds) as seconds since the epoch."""
    return datetime.datetime.fromisoformat(text).timestamp()


def create_container_seconds(containerd_log: str, container: str) -> list[float]:
    """Every CreateContainer of a container named ``container`` that containerd logged, request to
    reply, in seconds (the NRI plugins' CreateContainer runs inside it)."""
    began: dict[tuple[str, str], float] = {}
    took = []
    for line in containerd_log.splitlines():
        if "returns container id" in line:
            done = _CREATED.search(line)
            if done and done.group(3) == container and (done.group(2), container) in began:
                took.append(log_time(done.group(1)) - began.pop((done.group(2), container)))
        elif (start := _CREATE.search(line)) and start.group(3) == container:
            began[(start.group(2), container)] = log_time(start.group(1))
    return took


def containerd_log(kube: Kube) -> str:
    return (kube.root / "logs" / "containerd.log").read_text(errors="replace")
