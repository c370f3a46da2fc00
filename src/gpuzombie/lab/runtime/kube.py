"""The lab's third runtime: real Pods on the single-node cluster of ``gpuzombie cluster``.

A pod is created with ``kubectl apply`` and deleted with ``kubectl delete --grace-period`` through
the cluster's API server; its kubelet runs it, runs its preStop hook, sends SIGTERM (StopContainer),
waits out the grace and SIGKILLs. The lab only watches, from the host, as on the other runtimes: the
pod's processes by their PID namespace (the container's pid from the node's containerd, asked
read-only over CRI as ``trace`` asks it), the memory they hold, and the moments of the kubelet's
signals as the node's containerd logs them (``Stop container … with signal terminated``, ``Kill
container …``, to the nanosecond), the container's exit from its status.

The cluster is one that runs (``gpuzombie cluster up`` at ``$GPUZOMBIE_CLUSTER_DIR``) or, when none
is up there, one the lab starts for the run and stops at its end. A component that dies under a run
(the kubelet, the API server, ...) fails it with a line that names it.
"""

from __future__ import annotations

import contextlib
import datetime
import json
import os
import re
import shlex
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from gpuzombie.errors import needs_extra
from gpuzombie.k8s.cri import BindMount, CriError, RuntimeClient
from gpuzombie.lab.errors import LabError, PodError
from gpuzombie.lab.events import EventLog
from gpuzombie.lab.manifest import LAB_GPU, PodManifest
from gpuzombie.lab.runtime.containerd import BUSYBOX_IMAGE
from gpuzombie.lab.runtime.cri import (
    KUBELET_RUNTIME_TIMEOUT_S,
    GpuParts,
    find_gpu_parts,
    parse_cri_log,
    python_paths,
    workload_mounts,
)
from gpuzombie.lab.runtime.kubespec import HostMount, NodeParts, node_document, scenario_document
from gpuzombie.lab.runtime.manifestpod import (
    HOOK_PATH,
    PREFLIGHT_PATH,
    PodRunConfig,
    describe_pod,
    host_path_grant,
    lab_container_environment,
    opt_children,
)
from gpuzombie.lab.runtime.pod import Deletion, leftovers, pidns_of, pids_in_pidns, pod_ids, pod_pid1
from gpuzombie.lab.runtime.rundirs import cgroup_roots, new_run_dir
from gpuzombie.prestop.zipapp import build as build_hook
from gpuzombie.proc.own import PROCFS
from gpuzombie.proc.pidfd import read_start_and_state
from gpuzombie.proc.procfs import Procfs

if TYPE_CHECKING:
    from gpuzombie.cluster.layout import Layout
    from gpuzombie.cluster.node import ClusterState, Started

LAB_NAMESPACE = "gpuzombie-lab"
KUBECTL_TIMEOUT_S = 60.0
"""One kubectl call (apply, delete, get); a loaded API server answers in well under a second."""
EXIT_STATUS_WAIT_S = 2.0
"""After a container's PID 1 is gone: how long its CRI status may take to say when and how."""
CHECK_EVERY_S = 0.5
"""How often a wait asks whether every process of the cluster still runs."""
DELETED_TIMEOUT_S = 60.0
"""After the pod's containers exited: until the API server has removed it (the kubelet's status
update and final delete take 0.1-1 s here)."""
COMPONENTS = {
    "kube-apiserver": "the API server (kube-apiserver)",
    "kubelet": "the kubelet",
    "etcd": "etcd",
    "containerd": "the node's containerd",
    "kube-scheduler": "the scheduler (kube-scheduler)",
    "kube-controller-manager": "the controller manager (kube-controller-manager)",
}
START_FAILURES = frozenset(
    {
        "ErrImageNeverPull",
        "ErrImagePull",
        "ImagePullBackOff",
        "InvalidImageName",
        "CreateContainerConfigError",
        "CreateContainerError",
        "RunContainerError",
        "CrashLoopBackOff",
    }
)
"""A container waiting for one of these will not start without a change to the pod."""
STOP_LINE = re.compile(r'^time="([^"]+)".*msg="Stop container \\"([0-9a-f]{64})\\" with signal')
KILL_LINE = re.compile(r'^time="([^"]+)".*msg="Kill container \\"([0-9a-f]{64})\\""')
"""containerd 1.6's CRI plugin, at info level: StopContainer's first signal, and its SIGKILL when
the timeout (the grace the kubelet passed) ran out."""
NETWORK_NOTE = (
    "each pod is on the cluster's bridge (its own network namespace, an address of the node's pod "
    "subnet): it reaches the node and the other pods, nothing beyond (no masquerade, no kube-proxy)"
)


class KubeError(LabError):
    """The cluster could not be used, or one of its processes died under the run: one line that says which."""


# --- the cluster ------------------------------------------------------------------------------------


class KubeCluster:
    """The cluster a run uses: where it is, its processes, and kubectl with its admin kubeconfig."""

    def __init__(self, layout: Layout, state: ClusterState, *, own: bool) -> None:
        self.layout, self.state, self.own = layout, state, own
        self.kubeconfig = state.kubeconfig

    @property
    def where(self) -> str:
        return str(self.layout.root)

    def dead(self) -> Started | None:
        """The first of the cluster's processes that is gone (None: all of them run)."""
        from gpuzombie.cluster.node import alive

        return next((p for p in self.state.processes if not alive(p)), None)

    def failure(self, doing: str) -> KubeError | None:
        """A KubeError naming the dead component while ``doing``, or None when all of them run."""
        gone = self.dead()
        if gone is None:
            return None
        what = COMPONENTS.get(gone.name, gone.name)
        after = "the lab stops the cluster it started" if self.own else "gpuzombie cluster down removes what is left"
        return KubeError(f"{what} (pid {gone.pid}) is gone: the run stopped {doing}; {after}")

    def check(self, doing: str) -> None:
        error = self.failure(doing)
        if error is not None:
            raise error

    def argv(self, *args: str) -> list[str]:
        return [str(self.layout.bin / "kubectl"), f"--kubeconfig={self.kubeconfig}", *args]

    def kubectl(
        self, *args: str, doing: str, stdin: str | None = None, timeout: float = KUBECTL_TIMEOUT_S
    ) -> subprocess.CompletedProcess[str]:
        """kubectl ``args``; a KubeError naming the dead component, or kubectl's own last line."""
        try:
            done = subprocess.run(
                self.argv(*args), input=stdin, capture_output=True, text=True, timeout=timeout, check=False
            )
        except subprocess.TimeoutExpired:
            self.check(doing)
            raise KubeError(f"kubectl {args[0]} did not answer within {timeout:.0f} s ({doing})") from None
        except OSError as exc:
            raise KubeError(f"cannot run kubectl ({self.layout.bin / 'kubectl'}): {exc.strerror}") from None
        if done.returncode != 0:
            self.check(doing)
            last = (done.stderr.strip().splitlines() or ["no output"])[-1]
            raise KubeError(f"kubectl {args[0]} ({doing}): {last[:300]}")
        return done

    def ensure_namespace(self, namespace: str) -> None:
        """The namespace, and its default ServiceAccount (the API server admits no pod before it)."""
        document = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}}
        self.kubectl("apply", "-f", "-", stdin=json.dumps(document), doing=f"making namespace {namespace}")
        deadline = time.monotonic() + KUBECTL_TIMEOUT_S
        while True:
            found = self.kubectl(
                "get", "serviceaccount", "default", "-n", namespace, "--ignore-not-found", "-o", "name",
                doing=f"waiting for namespace {namespace}'s default ServiceAccount",
            )  # fmt: skip
            if found.stdout.strip():
                return
            if time.monotonic() > deadline:
                raise KubeError(f"namespace {namespace} has no default ServiceAccount after {KUBECTL_TIMEOUT_S:.0f} s")
            time.sleep(0.25)

    def allocatable(self, resource: str) -> int:
        """How many of ``resource`` the cluster's nodes can allocate (0 when none says a number)."""
        done = self.kubectl("get", "nodes", "-o", "json", doing=f"reading the nodes' allocatable {resource}")
        try:
            nodes = json.loads(done.stdout).get("items") or []
            return sum(int(((n.get("status") or {}).get("allocatable") or {}).get(resource, 0)) for n in nodes)
        except (ValueError, AttributeError, TypeError):
            return 0

    @property
    def containerd_pid(self) -> int | None:
        return next((p.pid for p in self.state.processes if p.name == "containerd"), None)


def _layout() -> Layout:
    from gpuzombie.cluster.layout import Layout

    try:
        return Layout.from_env()
    except ValueError as exc:
        raise KubeError(str(exc)) from None


def attach_or_start(progress: Callable[[str], None], *, gpu: bool = False) -> KubeCluster:
    """The cluster up at ``$GPUZOMBIE_CLUSTER_DIR`` (instance ``$GPUZOMBIE_CLUSTER_INSTANCE``), or a
    new one started there when nothing is (not on a GPU: a new node has no device plugin); one line
    when neither can be had."""
    try:
        from gpuzombie.cluster.node import ClusterError, ClusterState, status, up
    except ImportError as exc:  # cryptography: the cluster extra
        raise KubeError(needs_extra("--runtime kubernetes", "cluster", exc)) from exc
    layout = _layout()
    found = status(layout)
    if found.up:
        state = ClusterState.read(layout.state_file)
        assert state is not None
        progress(f"using the cluster up at {layout.root} (Kubernetes {state.kubernetes_version}); it stays up")
        return KubeCluster(layout, state, own=False)
    if found.processes:
        gone = ", ".join(name for name, running in found.processes.items() if not running)
        raise KubeError(
            f"the cluster at {layout.root} is not up ({gone} gone): gpuzombie cluster down removes it, then run again"
        )
    if gpu:
        raise KubeError(
            "--runtime kubernetes on a GPU: start the cluster and a device plugin that advertises "
            f"{LAB_GPU} first (scripts/device/kube_gpu.sh), or use --device cpu, the stand-in"
        )
    progress(f"no cluster up at {layout.root}: starting one for this run (stopped at its end)")
    try:
        state = up(layout, layout.ports, lambda line: progress(f"cluster: {line}"))
    except ClusterError as exc:
        raise KubeError(f"cannot start a cluster at {layout.root}: {exc}") from None
    return KubeCluster(layout, state, own=True)


# --- the runtime ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class KubeRuntime:
    """Where the lab's Pods run on the kubernetes runtime, and what every container gets."""

    cluster: KubeCluster
    client: RuntimeClient
    """The node's containerd, asked read-only: a container's pid, status and log file."""
    image: str
    mounts: tuple[BindMount, ...]
    workdir: Path
    """The run's directory (the hooks' builds, a scenario's preStop output); ``lab clean`` removes it
    after a crash."""
    gpu: GpuParts | None = None
    """On a GPU: the driver's library directories the workload's environment names (the device
    plugin gives the devices and, through CDI, the driver's files); None: the CPU stand-in."""

    @property
    def socket(self) -> str:
        """The node's CRI socket (``gpuzombie trace`` asks it for the pods' names)."""
        return str(self.cluster.layout.containerd_socket)

    @property
    def run_label(self) -> str:
        return self.workdir.name


@contextlib.contextmanager
def kube_runtime(*, progress: Callable[[str], None], gpu: bool = False) -> Iterator[KubeRuntime]:
    """The kubernetes runtime for one run: a cluster that is up, or one started here (and stopped
    at the end, also on Ctrl-C or an error). On a GPU the cluster must be up already, with a device
    plugin that advertises ``nvidia.com/gpu`` (scripts/device/kube_gpu.sh starts NVIDIA's): the
    kubelet, not the lab, then gives each pod its GPU."""
    if os.geteuid() != 0:
        raise KubeError("--runtime kubernetes needs root (it reads the pods' processes and the node's containerd)")
    cluster = attach_or_start(progress, gpu=gpu)
    failed = True
    try:
        parts = None
        if gpu:
            advertised = cluster.allocatable(LAB_GPU)
            if advertised < 1:
                raise KubeError(
                    f"--runtime kubernetes: the cluster's node advertises no {LAB_GPU} (no device plugin "
                    "registered with its kubelet); use --device cpu, the stand-in"
                )
            progress(f"the node advertises {advertised} {LAB_GPU}: the kubelet allocates each pod's")
            parts = find_gpu_parts()
        workdir = new_run_dir()
        try:
            with RuntimeClient(str(cluster.layout.containerd_socket)) as client:
                mounts = workload_mounts(python_paths(os.environ), None)
                yield KubeRuntime(cluster, client, BUSYBOX_IMAGE, mounts, workdir, gpu=parts)
        finally:
            shutil.rmtree(workdir, ignore_errors=True)
        failed = False
    finally:
        if cluster.own:
            _stop(cluster, progress, failed)


def _stop(cluster: KubeCluster, progress: Callable[[str], None], failed: bool) -> None:
    from gpuzombie.cluster.node import down

    problems = down(cluster.layout)
    if not problems:
        progress(f"stopped the cluster at {cluster.where}")
    elif failed:  # an error is on its way already: say what is left beside it
        progress("cluster down left: " + "; ".join(problems))
    else:
        raise KubeError("cluster down left: " + "; ".join(problems))


# --- the pod's objects, as the API server sends them ----------------------------------------------


class PodWatch:
    """``kubectl get pods --watch`` of one pod in a thread: its latest object and whether the API
    server has removed it."""

    def __init__(self, cluster: KubeCluster, namespace: str, name: str) -> None:
        self.cluster, self.namespace, self.name = cluster, namespace, name
        self.latest: dict[str, Any] | None = None
        self.deleted = False
        self._errors: IO[str] = tempfile.TemporaryFile("w+")  # noqa: SIM115 -- closed by stop()
        self._process: subprocess.Popen[str] | None = None
        self._thread: threading.Thread | None = None
        self.start()

    def start(self) -> None:
        argv = self.cluster.argv(
            "get", "pods", "-n", self.namespace, "--field-selector", f"metadata.name={self.name}",
            "--watch", "--output-watch-events", "-o", "json",
        )  # fmt: skip
        self._process = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=self._errors, text=True
        )
        self._thread = threading.Thread(target=self._read, args=(self._process,), daemon=True)
        self._thread.start()

    def _read(self, process: subprocess.Popen[str]) -> None:
        assert process.stdout is not None
        decoder, buffer = json.JSONDecoder(), ""
        for chunk in iter(lambda: process.stdout.readline() if process.stdout else "", ""):
            buffer += chunk
            while buffer.strip():
                try:
                    event, end = decoder.raw_decode(buffer.lstrip())
                except ValueError:
                    break  # the rest of the object is still on its way
                buffer = buffer.lstrip()[end:]
                if isinstance(event, dict) and isinstance(event.get("object"), dict):
                    self.latest = event["object"]
                    self.deleted = self.deleted or event.get("type") == "DELETED"

    @property
    def ended(self) -> bool:
        return self._process is not None and self._process.poll() is not None

    def error(self) -> str:
        self._errors.seek(0)
        lines = self._errors.read().strip().splitlines()
        return lines[-1][:300] if lines else "no output"

    def stop(self) -> None:
        if self._process is not None and self._process.poll() is None:
            self._process.kill()
            self._process.wait(10)
        if self._thread is not None:
            self._thread.join(5)
        self._errors.close()


def _statuses(pod: Mapping[str, Any], kind: str = "containerStatuses") -> dict[str, dict[str, Any]]:
    return {s["name"]: s for s in (pod.get("status") or {}).get(kind) or () if isinstance(s, dict) and "name" in s}


def _container_id(status: Mapping[str, Any]) -> str:
    return str(status.get("containerID") or "").rpartition("://")[2]


def _condition(pod: Mapping[str, Any], kind: str) -> dict[str, Any]:
    return next((c for c in (pod.get("status") or {}).get("conditions") or () if c.get("type") == kind), {})


def _epoch(stamp: str) -> float | None:
    """containerd's ``time=`` (RFC 3339 with nanoseconds, UTC) as seconds since the epoch."""
    head, _, frac = stamp.rstrip("Z").partition(".")
    try:
        whole = datetime.datetime.fromisoformat(head).replace(tzinfo=datetime.UTC).timestamp()
    except ValueError:
        return None
    digits = "".join(ch for ch in frac if ch.isdigit())
    return whole + (int(digits) / 10 ** len(digits) if digits else 0.0)


def stop_signals(log_text: str, container_id: str) -> tuple[float | None, float | None]:
    """(SIGTERM, SIGKILL) of ``container_id`` as epoch seconds, from the node's containerd log."""
    term = kill = None
    for line in log_text.splitlines():
        if container_id not in line:
            continue
        if term is None and (m := STOP_LINE.match(line)) and m.group(2) == container_id:
            term = _epoch(m.group(1))
        elif kill is None and (m := KILL_LINE.match(line)) and m.group(2) == container_id:
            kill = _epoch(m.group(1))
    return term, kill


HOOK_FAILED = re.compile(r'"PreStop hook failed" err="command .* exited with (\d+): ?(.*?)" pod=')
"""The kubelet's error line of a failed exec hook (its event says only "PreStopHook failed")."""


def hook_failure(kubelet_log: str, container_id: str) -> tuple[int, str] | None:
    """(exit code, output) of a preStop exec hook that failed, from the kubelet's log line."""
    for line in kubelet_log.splitlines():
        if container_id and container_id in line and (m := HOOK_FAILED.search(line)):
            return int(m.group(1)), m.group(2).replace("\\n", "\n")
    return None


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _read_from(path: Path, start: int) -> str:
    """What ``path`` (a log of the node's) got after ``start`` bytes."""
    try:
        with open(path, "rb") as f:
            f.seek(start)
            return f.read().decode(errors="replace")
    except OSError:
        return ""


def _exited(pid: int, ticks: int) -> bool:
    found = read_start_and_state(PROCFS, pid)
    return found is None or found[0] != ticks or found[1] in ("Z", "X")


class KubePod:
    """A Pod on the cluster; the interface of ``lab.runtime.pod.LabPod``.

    ``document``: a ``lab pod`` manifest as written (None: a scenario, rendered from ``manifest``);
    ``capture_hook``: keep the preStop hook's output (a scenario's hook, whose JSON report the
    results read)."""

    def __init__(
        self,
        runtime: KubeRuntime,
        manifest: PodManifest,
        config: PodRunConfig,
        events: EventLog,
        *,
        document: Mapping[str, Any] | None = None,
        extra_mounts: Sequence[str] = (),
        capture_hook: bool = False,
    ) -> None:
        self.runtime, self.manifest, self.config, self.events = runtime, manifest, config, events
        self.cluster = runtime.cluster
        self.grace = config.grace if config.grace is not None else manifest.grace_s
        self.own_name = document is None
        self.name = (
            manifest.name
            if document is not None
            else f"{manifest.name}-{os.getpid()}-{time.time_ns() // 10**6 % 100000}"
        )
        self.namespace = manifest.namespace
        self.workdir = Path(tempfile.mkdtemp(prefix="pod-", dir=runtime.workdir))
        try:
            os.chmod(self.workdir, 0o755)
            hook = build_hook(self.workdir / "hook" / "prestop.pyz")
            preflight = build_hook(self.workdir / "hook" / "preflight.pyz", app="preflight")
            os.chmod(self.workdir / "hook", 0o755)
            self.hook_out = self.workdir / "prestop-out" if capture_hook else None
            if self.hook_out is not None:
                self.hook_out.mkdir(mode=0o777)
                os.chmod(self.hook_out, 0o777)  # a hook of any uid writes there
        except BaseException:
            shutil.rmtree(self.workdir, ignore_errors=True)
            raise
        parts = NodeParts(
            image=runtime.image,
            mounts=self._host_mounts(hook, preflight, extra_mounts),
            env=lab_container_environment(runtime.gpu),
            gpu=runtime.gpu is not None,
        )
        read_only = [v.name for v in manifest.volumes if v.kind == "hostPath" and not self._writable(v.host_path)]
        base = document if document is not None else scenario_document(manifest, name=self.name)
        self.document, self.changes = node_document(
            base,
            parts,
            name=self.name,
            namespace=self.namespace,
            grace=config.grace,
            run_label=runtime.run_label,
            read_only_volumes=read_only,
            hook_out=str(self.hook_out) if self.hook_out is not None else None,
        )
        self.main = next((c for c in manifest.containers if c.resources.gpus), manifest.containers[0])
        self.init = "?"
        self.watch: PodWatch | None = None
        self.applied = self.gone_from_api = False
        self.uid = ""
        self.ids_by_name: dict[str, str] = {}
        self.pids_by_name: dict[str, tuple[int, int]] = {}
        """Each container's PID 1 on the host, with its start time (a pid reused is not it)."""
        self.pid1 = self.main_pid = self.pidns = 0
        self._namespaces: list[int] = []
        self._log_files: dict[str, IO[bytes]] = {}
        self._logs: dict[str, str] = {}
        self._removed = False
        self._hook_seen: dict[int, float] = {}
        self._hook_cut = False
        """The hook still ran when its container exited (the kubelet stopped waiting at the grace's end)."""

    def _writable(self, host_path: str | None) -> bool:
        """A manifest's hostPath is written only where its grant ends in ``:rw``."""
        grant = host_path_grant(host_path, self.config.host_paths) if host_path else None
        return grant is not None and grant.writable

    @staticmethod
    def _host_mounts(hook: Path, preflight: Path, extra: Sequence[str]) -> tuple[HostMount, ...]:
        """The containerd runtime's read-only binds, as hostPath volumes: the host's directories
        (``/opt`` entry by entry, so that ``/opt/gpuzombie`` is the lab's), the lab's Python, the
        project, the hook and the gate at the node image's paths, and the lab's extras (an init binary)."""
        paths = [m.host_path for m in workload_mounts(python_paths(os.environ), None) if m.container_path != "/opt"]
        paths += [p for p in opt_children() if p not in paths]
        paths += [p for p in extra if p not in paths]
        mounts = [HostMount(p, os.path.isfile(p)) for p in paths]
        mounts += [HostMount(str(hook), True, HOOK_PATH), HostMount(str(preflight), True, PREFLIGHT_PATH)]
        return tuple(mounts)

    # --- start -----------------------------------------------------------------------------------

    def start(self) -> None:
        cluster = self.cluster
        cluster.ensure_namespace(self.namespace)
        if not self.own_name:
            found = cluster.kubectl(
                "get", "pod", self.name, "-n", self.namespace, "--ignore-not-found", "-o", "name",
                doing="looking for the pod",
            )  # fmt: skip
            if found.stdout.strip():
                raise PodError(
                    f"pod {self.namespace}/{self.name} exists on the cluster already: delete it first "
                    "(lab pod applies the manifest's own name)"
                )
        self.watch = PodWatch(cluster, self.namespace, self.name)
        self.applied = True
        cluster.kubectl("apply", "-f", "-", stdin=json.dumps(self.document), doing="applying the pod")
        self.events.add("apply", f"kubectl apply: pod {self.namespace}/{self.name}")
        pod = self._wait_running()
        self.uid = str(pod["metadata"].get("uid", ""))
        client = self.runtime.client
        for name, status in _statuses(pod, "initContainerStatuses").items():
            cid = _container_id(status)
            if cid:
                self._open_log(f"init:{name}", cid)
        for c in self.manifest.containers:
            cid = _container_id(_statuses(pod)[c.name])
            self.ids_by_name[c.name] = cid
            try:
                pid = client.container_pid(cid)
            except CriError as exc:
                cluster.check("while asking the node's containerd for the container's pid")
                raise PodError(f"container {c.name}: {exc}") from None
            started = read_start_and_state(PROCFS, pid)
            self.pids_by_name[c.name] = (pid, started[0] if started else 0)
            self._open_log(c.name, cid)
        self.main_pid = self.pids_by_name[self.main.name][0]
        for pid, _ticks in self.pids_by_name.values():
            ns = pidns_of(pid)
            if ns is not None and ns not in self._namespaces:
                self._namespaces.append(ns)
        ns = pidns_of(self.main_pid)
        pid1 = pod_pid1(ns) if ns is not None else None
        if ns is None or pid1 is None:
            last = "\n".join(self.log_text().strip().splitlines()[-10:])
            raise PodError(f"container {self.main.name} exited at once; its last lines:\n{last}")
        self.pid1, self.pidns = pid1, ns
        self.events.add("pod-start", f"PID 1 of {self.main.name}: host pid {pid1}")

    def _wait_running(self) -> dict[str, Any]:
        """Until every container runs; a PodError as soon as the pod cannot get there."""
        assert self.watch is not None
        deadline = time.monotonic() + self.config.ready_timeout
        checked, scheduled, started = 0.0, False, set()
        while True:
            pod = self.watch.latest
            if pod is not None:
                cond = _condition(pod, "PodScheduled")
                if not scheduled and cond.get("status") == "True":
                    scheduled = True
                    self.events.add("scheduled", f"on {pod.get('spec', {}).get('nodeName')}")
                if cond.get("status") == "False" and cond.get("reason") == "Unschedulable":
                    raise PodError(f"the scheduler cannot place pod {self.name}: {cond.get('message')}")
                self._check_inits(pod)
                statuses = _statuses(pod)
                for c in self.manifest.containers:
                    state = (statuses.get(c.name) or {}).get("state") or {}
                    self._check_waiting(c.name, state)
                    if "terminated" in state:
                        last = "\n".join(self._log_now(_container_id(statuses[c.name])).strip().splitlines()[-10:])
                        code = state["terminated"].get("exitCode")
                        raise PodError(
                            f"container {c.name} exited ({code}) before the pod ran; its last lines:\n{last}"
                        )
                    if "running" in state and c.name not in started:
                        started.add(c.name)
                        self.events.add("container-start", f"{c.name}: {shlex.join(c.argv)[:200]}")
                if len(started) == len(self.manifest.containers):
                    return pod
            now = time.monotonic()
            if now - checked > CHECK_EVERY_S:
                checked = now
                self.cluster.check("while the pod starts")
                if self.watch.ended:
                    raise KubeError(f"kubectl's watch of pod {self.name} ended: {self.watch.error()}")
            if now > deadline:
                raise PodError(f"pod {self.name} not running after {self.config.ready_timeout:.0f} s")
            time.sleep(0.02)

    def _check_inits(self, pod: Mapping[str, Any]) -> None:
        for name, status in _statuses(pod, "initContainerStatuses").items():
            state = status.get("state") or {}
            self._check_waiting(f"init container {name}", state)
            done = state.get("terminated")
            if done and done.get("exitCode") not in (0, None):
                tail = " | ".join(self._log_now(_container_id(status)).strip().splitlines()[-3:]) or "no output"
                raise PodError(f"init container {name} exited {done.get('exitCode')}: {tail[-300:]}")

    @staticmethod
    def _check_waiting(name: str, state: Mapping[str, Any]) -> None:
        waiting = state.get("waiting") or {}
        if waiting.get("reason") in START_FAILURES:
            raise PodError(f"container {name}: {waiting['reason']}: {str(waiting.get('message', ''))[:300]}")

    # --- the containers' logs, as the kubelet's files hold them --------------------------------------

    def _log_path(self, cid: str) -> str | None:
        try:
            return str(self.runtime.client.container_status(cid).status.log_path) or None
        except CriError:
            return None

    def _open_log(self, name: str, cid: str) -> None:
        """Keep the container's log file open: another kubelet on this host (a second cluster) may
        remove a pod log directory it does not know (its garbage collection, every minute)."""
        path = self._log_path(cid)
        if path is None:
            return
        try:
            self._log_files[name] = open(path, "rb")  # noqa: SIM115 -- kept open for the pod's life
            return
        except OSError:
            pass
        pid = self.cluster.containerd_pid  # containerd writes the file: its descriptor still reads it
        with contextlib.suppress(OSError):
            for fd in os.listdir(f"/proc/{pid}/fd"):
                with contextlib.suppress(OSError):
                    if os.readlink(f"/proc/{pid}/fd/{fd}") in (path, f"{path} (deleted)"):
                        self._log_files[name] = open(f"/proc/{pid}/fd/{fd}", "rb")  # noqa: SIM115
                        return

    def _log_now(self, cid: str) -> str:
        path = self._log_path(cid) if cid else None
        try:
            return parse_cri_log(Path(path).read_text(errors="replace")) if path else ""
        except OSError:
            return ""

    def log_text(self) -> str:
        """Every container's output, init containers first, each under its name (when more than one)."""
        for name, f in self._log_files.items():
            with contextlib.suppress(OSError, ValueError):
                f.seek(0)
                self._logs[name] = parse_cri_log(f.read().decode(errors="replace"))
        if len(self._logs) == 1:
            return next(iter(self._logs.values()))
        return "".join(f"==> {name} <==\n{text}" for name, text in self._logs.items())

    # --- the LabPod interface ----------------------------------------------------------------------

    @property
    def running(self) -> bool:
        return not self._removed and bool(self.pidns) and pidns_of(self.pid1) == self.pidns

    def container_exited(self) -> bool:
        pid, ticks = self.pids_by_name.get(self.main.name, (0, 0))
        return bool(pid) and _exited(pid, ticks)

    @property
    def command_line(self) -> str:
        return describe_pod(f"Kubernetes pod {self.namespace}/{self.name}", self.manifest)

    @property
    def ids(self) -> dict[str, int | str]:
        container_id = self.ids_by_name.get(self.main.name, "")
        return pod_ids(self, self.namespace, self.name, self.uid, container_id=container_id, cluster=self.cluster.where)

    def processes(self) -> list[int]:
        pids = sorted({p for ns in self._namespaces for p in pids_in_pidns(ns)})
        return sorted(pids, key=lambda p: (p != self.pid1, p))

    def tree(self) -> list[int]:
        return self.processes() if self._namespaces and not self._removed else []

    def exec(self, argv: Sequence[str], *, timeout: float) -> subprocess.CompletedProcess[str]:
        """``kubectl exec`` into the main container, through the API server and the kubelet."""
        args = self.cluster.argv("exec", "-n", self.namespace, self.name, "-c", self.main.name, "--", *argv)
        try:
            done = subprocess.run(args, capture_output=True, text=True, timeout=timeout, check=False)
        except subprocess.TimeoutExpired:
            self.cluster.check("in kubectl exec")
            return subprocess.CompletedProcess(list(argv), 124, "", f"kubectl exec timed out after {timeout:.0f} s")
        if done.returncode != 0:
            self.cluster.check("in kubectl exec")
        stderr = re.sub(r"command terminated with exit code \d+\n?$", "", done.stderr)
        return subprocess.CompletedProcess(list(argv), done.returncode, done.stdout, stderr)

    # --- deletion ----------------------------------------------------------------------------------

    def delete(self, *, grace: float) -> Deletion:
        """``kubectl delete --grace-period``: the kubelet runs the preStop hook, StopContainer with
        what is left of the grace (at least 2 s), SIGKILL at its end; the lab watches."""
        whole = int(grace)
        log_from = {name: _size(path) for name, path in self._node_logs().items()}
        known = set(self.processes())  # before the kubelet can start the hook
        argv = self.cluster.argv(
            "delete", "pod", self.name, "-n", self.namespace, f"--grace-period={whole}", "--wait=false"
        )
        requested = self.events.add("delete", f"kubectl delete --grace-period={whole}").t
        with tempfile.TemporaryFile("w+") as errors:
            request = subprocess.Popen(
                argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=errors, text=True
            )
            try:
                seen = self._wait_exits(whole, known, request, errors)
            finally:
                if request.poll() is None:
                    request.kill()
                    request.wait(10)
        exits = {name: self._exit_of(name, t) for name, t in seen.items()}
        for name, (t, code) in exits.items():
            self.events.add("pod-exit" if name == self.main.name else "container-exit", f"{name}: exit {code}", at=t)
        self.log_text()  # the last of the logs, before the kubelet removes the files
        self._wait_deleted()
        self._removed = True
        logs = {name: _read_from(path, log_from.get(name, 0)) for name, path in self._node_logs().items()}
        hook = self._hook_result(logs["kubelet"])
        terms, kills = [], []
        text = logs["containerd"]
        for name, cid in self.ids_by_name.items():
            term, kill = stop_signals(text, cid)
            origin = self.events.origin_epoch
            if term is not None:
                terms.append(term - origin)
                self.events.add(
                    "sigterm", f"{name}: the kubelet's StopContainer (containerd: SIGTERM)", at=term - origin
                )
            if kill is not None:
                kills.append(kill - origin)
                self.events.add("sigkill", f"{name}: grace over, containerd SIGKILLs it", at=kill - origin)
        main_exit = exits.get(self.main.name, (self.events.now(), None))
        if not terms:
            self.events.add("no-stop-line", "no StopContainer signal in the node's containerd log")
        return Deletion(
            requested_at=requested,
            grace_s=whole,
            prestop_rc=hook[0],
            prestop_stdout=hook[1],
            prestop_stderr=hook[2],
            sigterm_at=min(terms, default=main_exit[0]),
            sigkill_at=min(kills) if kills else None,
            exited_at=max((t for t, _ in exits.values()), default=self.events.now()),
            pod_exit_code=main_exit[1],
            leftovers=tuple(sorted({*leftovers(self._left_in_namespaces), *self._left_in_cgroup()})),
        )

    def _hook_commands(self) -> list[str]:
        return [shlex.join(c.prestop.command) for c in self.manifest.containers if c.prestop and c.prestop.command]

    def _track_hooks(self, hooks: Sequence[str], known: set[int]) -> None:
        """The preStop hook's processes as they come and go (the kubelet's exec, seen from the host)."""
        if not hooks:
            return
        table = Procfs().snapshot(pids=self.processes(), now=time.time(), with_cgroup=False)
        now_running = {p.pid for p in table if p.pid not in known and any(h in shlex.join(p.cmdline) for h in hooks)}
        for pid in now_running - set(self._hook_seen):
            if not self._hook_seen:
                self.events.add("prestop-start", "the kubelet's exec of the preStop hook runs")
            self._hook_seen[pid] = self.events.now()
        if self._hook_seen and not now_running and not self.events.first("prestop-end"):
            self.events.add("prestop-end", "the preStop hook's processes are gone")

    def _wait_exits(
        self, grace: int, known: set[int], request: subprocess.Popen[str], errors: IO[str]
    ) -> dict[str, float]:
        """Until every container's PID 1 is gone: when each was seen gone from the host (and, on the
        way, the API server's answer to ``request``, the deletion)."""
        exits: dict[str, float] = {}
        hooks = self._hook_commands()
        accepted = False
        limit = grace + KUBELET_RUNTIME_TIMEOUT_S + 30
        deadline = time.monotonic() + limit
        checked = last_hook = 0.0
        while len(exits) < len(self.pids_by_name):
            for name, (pid, ticks) in self.pids_by_name.items():
                if name not in exits and _exited(pid, ticks):
                    exits[name] = self.events.now()
            if not accepted and request.poll() is not None:
                accepted = self._accepted(request, errors)
            now = time.monotonic()
            if now - last_hook > 0.02:
                last_hook = now
                self._track_hooks(hooks, known)
            if now - checked > CHECK_EVERY_S:
                checked = now
                self.cluster.check("while the kubelet deleted the pod")
            if now > deadline:
                raise KubeError(f"pod {self.name}: its containers still run {limit} s after the deletion")
            time.sleep(0.005)
        if not accepted:  # the containers were gone before kubectl had its answer
            with contextlib.suppress(subprocess.TimeoutExpired):
                request.wait(KUBECTL_TIMEOUT_S)
            self._accepted(request, errors)
        if self._hook_seen and not self.events.first("prestop-end"):
            self._hook_cut = True
            self.events.add("prestop-cut-off", "the preStop hook went with its container at the grace's end")
        return exits

    def _accepted(self, request: subprocess.Popen[str], errors: IO[str]) -> bool:
        """kubectl delete's answer: an event, or the KubeError of a refusal (or of a dead component)."""
        if request.returncode not in (0, None):
            self.cluster.check("deleting the pod")
            errors.seek(0)
            last = (errors.read().strip().splitlines() or ["no output"])[-1]
            raise KubeError(f"kubectl delete (deleting the pod): {last[:300]}")
        if request.returncode == 0:
            self.events.add("delete-accepted", "kubectl delete returned: the API server set the deletionTimestamp")
        return True

    def _exit_of(self, name: str, seen: float) -> tuple[float, int | None]:
        """When the container exited and its code: its CRI status (the runtime's clock, to the
        nanosecond; the shim reports it a moment after the process is gone), else when the host saw
        it gone and the API's last word."""
        cid = self.ids_by_name.get(name, "")
        deadline = time.monotonic() + EXIT_STATUS_WAIT_S
        while time.monotonic() < deadline:
            try:
                status = self.runtime.client.container_status(cid).status
            except CriError:
                break  # removed already by the kubelet
            if status.finished_at:
                return status.finished_at / 1e9 - self.events.origin_epoch, int(status.exit_code)
            time.sleep(0.01)
        terminated = ((_statuses(self.watch.latest or {}) if self.watch else {}).get(name) or {}).get("state", {})
        return seen, (terminated.get("terminated") or {}).get("exitCode")

    def _wait_deleted(self) -> None:
        """Until the API server has removed the pod (the kubelet's final status and delete)."""
        assert self.watch is not None
        deadline = time.monotonic() + DELETED_TIMEOUT_S
        asked = time.monotonic()
        while not self.watch.deleted:
            now = time.monotonic()
            if now - asked > 2.0:  # a watch that ended (the API server closed it) misses DELETED
                asked = now
                found = self.cluster.kubectl(
                    "get", "pod", self.name, "-n", self.namespace, "--ignore-not-found", "-o", "name",
                    doing="waiting for the API server to remove the pod",
                )  # fmt: skip
                if not found.stdout.strip():
                    break
            if now > deadline:
                raise KubeError(
                    f"pod {self.name}: still in the API {DELETED_TIMEOUT_S:.0f} s after its containers exited"
                )
            time.sleep(0.02)
        self.gone_from_api = True
        self.events.add("pod-deleted", "the API server removed the pod")

    def _hook_result(self, kubelet_log: str) -> tuple[int | None, str, str]:
        """(exit code, stdout, stderr) of the preStop hook: a scenario's from its wrapper's files; a
        manifest's as the kubelet reports it (a FailedPreStopHook event, or nothing: it succeeded)."""
        hooked = [c for c in self.manifest.containers if c.prestop is not None]
        if not hooked:
            return None, "", ""
        if self.hook_out is not None:
            try:
                rc = int((self.hook_out / "rc").read_text().strip())
            except (OSError, ValueError):
                rc = 137 if self._hook_cut else 124
            read = {
                n: (self.hook_out / n).read_text(errors="replace") if (self.hook_out / n).exists() else ""
                for n in ("stdout", "stderr")
            }
            if rc in (124, 137) and not (self.hook_out / "rc").exists():
                read["stderr"] += "cut off: it went with its container at the grace's end\n"
            return rc, read["stdout"], read["stderr"]
        if not any(c.prestop and c.prestop.command for c in hooked):
            return 0, "", ""  # preStop sleep: the kubelet's own wait
        failed = [f for c in hooked if (f := hook_failure(kubelet_log, self.ids_by_name.get(c.name, "")))]
        if failed:  # the kubelet's log says how (its event only that it failed: it keeps secrets out)
            return failed[0][0], "", failed[0][1]
        if self._failed_hook_event():
            return 1, "", "the kubelet's event FailedPreStopHook: PreStopHook failed (no exit code in its log)"
        if self._hook_cut:
            return 137, "", "cut off: it went with its container at the grace's end"
        return 0, "", "the kubelet reports a preStop hook's output only when it fails (no FailedPreStopHook event)"

    def _failed_hook_event(self) -> bool:
        with contextlib.suppress(KubeError, ValueError):
            found = self.cluster.kubectl(
                "get", "events", "-n", self.namespace, "--field-selector",
                f"involvedObject.uid={self.uid},reason=FailedPreStopHook", "-o", "json",
                doing="reading the pod's events",
            )  # fmt: skip
            return bool(json.loads(found.stdout).get("items"))
        return False

    def _node_logs(self) -> dict[str, Path]:
        logs = self.cluster.layout.logs
        return {"containerd": logs / "containerd.log", "kubelet": logs / "kubelet.log"}

    def _left_in_namespaces(self) -> list[int]:
        return sorted({p for ns in self._namespaces for p in pids_in_pidns(ns)})

    def _left_in_cgroup(self) -> list[int]:
        """Processes still in the pod's cgroup once the API server has removed it (must be none)."""
        if not self.uid:
            return []
        pids: set[int] = set()
        pattern = f"pod{self.uid}"
        for root in cgroup_roots():
            base = Path(root + self.cluster.layout.cgroup_root)
            for pod_dir in base.glob(f"kubepods*/**/{pattern}") if base.is_dir() else ():
                for procs in pod_dir.rglob("cgroup.procs"):
                    with contextlib.suppress(OSError, ValueError):
                        pids.update(int(line) for line in procs.read_text().split())
        return sorted(pids)

    def kill(self) -> None:
        """Backstop: the pod goes (force-deleted through the API server, when it still answers),
        and the run's files for it."""
        if self.applied and not self.gone_from_api and self.cluster.failure("") is None:
            with contextlib.suppress(KubeError):
                self.cluster.kubectl(
                    "delete", "pod", self.name, "-n", self.namespace, "--grace-period=0", "--force",
                    "--ignore-not-found", "--wait=true", "--timeout=60s", doing="removing the pod",
                    timeout=90,
                )  # fmt: skip
        self._removed = True
        if self.watch is not None:
            self.watch.stop()
        for f in self._log_files.values():
            with contextlib.suppress(OSError):
                f.close()
        shutil.rmtree(self.workdir, ignore_errors=True)
