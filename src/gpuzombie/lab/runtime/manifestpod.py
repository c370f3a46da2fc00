"""The pod of a Pod manifest on a CRI runtime, started and deleted as the kubelet does it (for
``gpuzombie lab pod``; ``lab.podrun`` measures it).

Start: the volumes (an emptyDir is a directory of mode 0777, a tmpfs with medium Memory, as the
kubelet makes them under its pod dir), ``RunPodSandbox``, each init container to completion in
order, then the containers. Delete: every container at once, each through the kubelet's
``killContainer`` (a preStop exec by ``ExecSync``, or a preStop sleep in the kubelet, waited at most
the grace; then ``StopContainer`` with the whole seconds left, at least the kubelet's 2), then
``StopPodSandbox`` and ``RemovePodSandbox``.

Every image is the lab's (busybox with the host's directories mounted read-only, nothing pulled),
whose ENTRYPOINT is empty. ``python3`` in a container is the lab's own (its directory is on PATH
after the image's /bin), with the project on PYTHONPATH, as the scenarios run it. The fast preStop
hook is built fresh and mounted read-only at ``/opt/gpuzombie/prestop.pyz`` in every container, as
the gpuzombie node image ships it (and the preflight gate at ``/opt/gpuzombie/preflight.pyz``), so
a manifest patched by ``gpuzombie webhook --patch`` runs unchanged.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpuzombie.k8s.cri import BindMount, ContainerSpec, CriError, RunningPod, SandboxSpec
from gpuzombie.lab.errors import PodError
from gpuzombie.lab.events import EventLog
from gpuzombie.lab.manifest import Container, Mount, PodManifest, Volume
from gpuzombie.lab.runtime.cri import (
    KUBELET_MIN_GRACE_S,
    KUBELET_RUNTIME_TIMEOUT_S,
    CriRuntime,
    GpuParts,
    find_gpu_parts,
    lab_environment,
    parse_cri_log,
)
from gpuzombie.lab.runtime.pod import Deletion, leftovers, pidns_of, pids_in_pidns, pod_ids, pod_pid1
from gpuzombie.prestop.zipapp import build as build_hook

HOOK_PATH = "/opt/gpuzombie/prestop.pyz"
"""Where the node image has the fast hook; lab pod mounts a fresh build there."""
PREFLIGHT_PATH = "/opt/gpuzombie/preflight.pyz"
"""Where the node image has the handover gate (the webhook's injected init container runs it); lab
pod mounts a fresh build there too."""
TINI_STATIC = "/usr/bin/tini-static"
"""Debian's tini package: the webhook's init container copies it from the node image."""
LAB_PYTHON_BIN = os.path.dirname(sys.executable)
"""On a container's PATH after the image's /bin: ``python3`` (and ``gpuzombie``) are the lab's."""
INIT_TIMEOUT_S = 120.0
LAB_DROPPED_CAPABILITIES = ("NET_RAW",)
"""Dropped from every container on top of the manifest's drops: the runtime's default set less
NET_RAW is the Pod Security Standards' baseline set and CRI-O's default; containerd still grants
NET_RAW (raw and packet sockets: spoofing, and the kernel's packet-socket bugs)."""


def describe_pod(what: str, manifest: PodManifest) -> str:
    """One line of a pod's containers and their argv, for the run's log (both runtimes of manifests)."""
    share = ", shareProcessNamespace: true (pause as PID 1)" if manifest.share_process_namespace else ""
    parts = [f"{c.name}: {shlex.join(c.argv)}" for c in manifest.containers]
    inits = [f"init {c.name}: {shlex.join(c.argv)}" for c in manifest.init_containers]
    return f"{what}{share}; " + "; ".join([*inits, *parts])


@dataclass(frozen=True)
class HostPathGrant:
    """``--allow-host-path PATH[:rw]``: hostPath volumes at or under ``path`` may be bound, read-only
    unless ``writable``."""

    path: str
    writable: bool = False

    def covers(self, host_path: str) -> bool:
        """``host_path`` (its symlinks resolved) is ``path`` or under it."""
        granted, real = os.path.realpath(self.path), os.path.realpath(host_path)
        return real == granted or real.startswith(granted.rstrip("/") + "/")


def host_path_grant(host_path: str, grants: Sequence[HostPathGrant]) -> HostPathGrant | None:
    """The deepest grant that covers ``host_path``; None: the volume is refused."""
    covering = [g for g in grants if g.covers(host_path)]
    return max(covering, key=lambda g: len(os.path.realpath(g.path)), default=None)


@dataclass(frozen=True)
class PodRunConfig:
    device: str
    """``cuda`` or ``cpu`` (resolved)."""
    grace: int | None = None
    """Overrides the manifest's terminationGracePeriodSeconds."""
    gpu_index: int = 0
    ready_timeout: float = 180.0
    sample_interval: float = 0.01
    host_paths: tuple[HostPathGrant, ...] = ()
    """Where hostPath volumes may point (none by default: the manifest is untrusted)."""


def lab_container_environment(gpu: GpuParts | None) -> dict[str, str]:
    """What every lab container's environment starts from: busybox's /bin first on PATH, then the
    lab's Python; the project on PYTHONPATH (the manifest's own variables go on top)."""
    env = lab_environment(os.environ, gpu)
    head, _, rest = env["PATH"].partition(":")  # the image's /bin, then the lab's Python
    env["PATH"] = ":".join([head, LAB_PYTHON_BIN, rest])
    project = str(Path(__file__).resolve().parents[2])  # the gpuzombie package, as the lab image has it
    paths = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys([*paths, project]))
    return env


def opt_children() -> list[str]:
    """The host's /opt entries, mounted one by one (so /opt/gpuzombie can be a mount of its own)."""
    try:
        return sorted(str(p) for p in Path("/opt").iterdir() if p.name != "gpuzombie")
    except OSError:
        return []


class PodVolumes:
    """The pod's volumes on the host, as the kubelet makes them; ``close`` removes them."""

    def __init__(self, workdir: Path, volumes: Sequence[Volume], grants: Sequence[HostPathGrant]) -> None:
        self.paths: dict[str, str] = {}
        self._grants = grants
        self._tmpfs: list[str] = []
        self._workdir = workdir
        try:
            for v in volumes:
                self._make(v)
        except BaseException:
            self.close()  # the tmpfs mounted so far
            raise

    def _make(self, v: Volume) -> None:
        """One volume: a hostPath as it is; an emptyDir a directory (a tmpfs with medium Memory)."""
        if v.kind == "hostPath" and v.host_path:
            if v.host_type == "DirectoryOrCreate":
                os.makedirs(v.host_path, mode=0o755, exist_ok=True)
            real = os.path.realpath(v.host_path)  # bound as resolved now, and checked again now
            if host_path_grant(real, self._grants) is None:
                raise PodError(f"volume {v.name}: hostPath {v.host_path} resolves to {real}, not allowed")
            self.paths[v.name] = real
            return
        path = self._workdir / "volumes" / v.name
        path.mkdir(parents=True)
        if v.memory:
            size = f",size={v.size_limit}" if v.size_limit else ""
            done = subprocess.run(
                ["mount", "-t", "tmpfs", "-o", f"mode=0777{size}", f"gpuzombie-{v.name}", str(path)],
                capture_output=True,
                text=True,
                timeout=30,
                check=False,
            )
            if done.returncode != 0:
                raise PodError(f"volume {v.name}: cannot mount a tmpfs: {done.stderr.strip()[:200]}")
            self._tmpfs.append(str(path))
        os.chmod(path, 0o777)  # the kubelet's emptyDir mode: any uid of the pod writes there
        self.paths[v.name] = str(path)

    def close(self) -> None:
        for path in self._tmpfs:
            subprocess.run(["umount", "--lazy", path], capture_output=True, timeout=30, check=False)
        self._tmpfs.clear()


class ManifestPod:
    """The manifest's pod on a CRI runtime; the interface of ``lab.runtime.pidns.LabPod``."""

    def __init__(
        self,
        runtime: CriRuntime,
        manifest: PodManifest,
        config: PodRunConfig,
        events: EventLog,
        *,
        extra_mounts: tuple[BindMount, ...] = (),
    ) -> None:
        self.runtime, self.manifest, self.config, self.events = runtime, manifest, config, events
        self.extra_mounts = extra_mounts
        """Read-only binds of the lab's own (a scenario's init binary), never a manifest's."""
        self.grace = config.grace if config.grace is not None else manifest.grace_s
        # Its emptyDirs and the hook's build, in the runtime's run directory (``lab clean`` finds
        # them there after a crash); removed by ``kill``.
        self.workdir = Path(tempfile.mkdtemp(prefix="pod-", dir=runtime.state_dir))
        try:
            self.hook = str(build_hook(self.workdir / "hook" / "prestop.pyz"))
            self.preflight = str(build_hook(self.workdir / "hook" / "preflight.pyz", app="preflight"))
            os.chmod(self.workdir, 0o755)
            os.chmod(self.workdir / "hook", 0o755)
            self.volumes = PodVolumes(self.workdir, manifest.volumes, config.host_paths)
        except BaseException:
            shutil.rmtree(self.workdir, ignore_errors=True)
            raise
        self.spec = SandboxSpec(
            name=f"{manifest.name}-{os.getpid()}-{int(time.time() * 1000) % 100000}",
            namespace=manifest.namespace,
            share_process_namespace=manifest.share_process_namespace,
            qos=manifest.qos,
            host_network=False,  # its own network namespace: lo only (the private containerd's CNI)
        )
        self.gpu = find_gpu_parts() if config.device == "cuda" else None
        self.init = "?"
        self.sandbox: RunningPod | None = None
        self.ids_by_name: dict[str, str] = {}
        self.pids_by_name: dict[str, int] = {}
        self.main = next((c for c in manifest.containers if c.resources.gpus), manifest.containers[0])
        self.pid1 = self.main_pid = self.pidns = 0
        self._namespaces: list[int] = []
        self._logs: dict[str, str] = {}
        self._removed = False

    # --- the container specs -------------------------------------------------------------------

    def _mounts(self, c: Container) -> tuple[BindMount, ...]:
        base = [m for m in self.runtime.mounts if m.container_path != "/opt"]
        taken = {m.container_path for m in base}
        base += [BindMount(p, p, readonly=True) for p in opt_children() if p not in taken]
        base.append(BindMount(self.hook, HOOK_PATH, readonly=True))
        base.append(BindMount(self.preflight, PREFLIGHT_PATH, readonly=True))
        base += self.extra_mounts
        base += [BindMount(self.volumes.paths[m.volume], m.path, readonly=self.read_only(m)) for m in c.mounts]
        return tuple(base)

    def read_only(self, m: Mount) -> bool:
        """A hostPath is written only where its grant says ``rw`` and the mount is not readOnly."""
        volume = next(v for v in self.manifest.volumes if v.name == m.volume)
        if volume.kind != "hostPath" or volume.host_path is None:
            return m.read_only
        grant = host_path_grant(volume.host_path, self.config.host_paths)
        return m.read_only or grant is None or not grant.writable

    def _env(self, c: Container) -> dict[str, str]:
        env = lab_container_environment(self.gpu if c.resources.gpus else None)
        if not (c.resources.gpus and self.gpu):
            env = {k: v for k, v in env.items() if k != "CUDA_VISIBLE_DEVICES"}
        env.update(dict(c.env))
        return env

    def container_spec(self, c: Container) -> ContainerSpec:
        sec, res = c.security, c.resources
        return ContainerSpec(
            name=c.name,
            image=self.runtime.image,
            command=c.argv,
            env=self._env(c),
            mounts=self._mounts(c),
            devices=self.runtime.devices if c.resources.gpus else (),
            run_as_user=sec.run_as_user,
            run_as_group=sec.run_as_group if sec.run_as_user is not None else None,
            readonly_rootfs=sec.read_only_root,
            no_new_privs=sec.no_new_privs,
            drop_capabilities=tuple(dict.fromkeys((*sec.drop_capabilities, *LAB_DROPPED_CAPABILITIES))),
            seccomp=sec.seccomp,
            memory_limit=res.memory_limit,
            cpu_request=res.cpu_request,
            cpu_limit=res.cpu_limit,
        )

    # --- start ---------------------------------------------------------------------------------

    def start(self) -> None:
        client = self.runtime.client
        self.sandbox = self.runtime.pods.start_pod(self.spec)
        self.events.add("sandbox", f"RunPodSandbox {self.spec.namespace}/{self.spec.name} (QoS {self.spec.qos})")
        for c in self.manifest.init_containers:
            self._run_to_completion(c)
        for c in self.manifest.containers:
            cid = self.sandbox.start(self.container_spec(c))
            self.ids_by_name[c.name] = cid
            self.pids_by_name[c.name] = client.container_pid(cid)
            self.events.add("container-start", f"{c.name}: {shlex.join(c.argv)[:200]}")
        self.main_pid = self.pids_by_name[self.main.name]
        for pid in self.pids_by_name.values():
            ns = pidns_of(pid)
            if ns is not None and ns not in self._namespaces:
                self._namespaces.append(ns)
        ns = pidns_of(self.main_pid)
        deadline = time.monotonic() + 30
        while ns is not None and time.monotonic() < deadline:
            pid1 = pod_pid1(ns)
            if pid1 is not None:
                self.pid1, self.pidns = pid1, ns
                self.events.add("pod-start", f"PID 1 of {self.main.name}: host pid {pid1}")
                return
            if pidns_of(self.main_pid) is None:  # it exited meanwhile: waiting out the 30 s tells nothing
                break
            time.sleep(0.01)
        if ns is None or pidns_of(self.main_pid) is None:  # gone already: say what it wrote
            last = "\n".join(self.log_text().strip().splitlines()[-10:])
            raise CriError(f"StartContainer: container {self.main.name} exited at once; its last lines:\n{last}")
        raise CriError(f"StartContainer: container {self.main.name} has no PID 1 to find")

    def _run_to_completion(self, c: Container) -> None:
        """An init container: started, and waited for until it exits; anything but 0 fails the pod."""
        assert self.sandbox is not None
        client = self.runtime.client
        cid = self.sandbox.start(self.container_spec(c))
        started = self.events.add("init-start", f"{c.name}: {shlex.join(c.argv)[:200]}").t
        deadline = time.monotonic() + INIT_TIMEOUT_S
        while True:
            status = client.container_status(cid).status
            if status.finished_at:
                break
            if time.monotonic() > deadline:
                raise PodError(f"init container {c.name} still runs after {INIT_TIMEOUT_S:.0f} s")
            time.sleep(0.02)
        log = self._read_log(status.log_path)
        self._logs[f"init:{c.name}"] = log
        self.events.add("init-exit", f"{c.name}: exit {status.exit_code} after {self.events.now() - started:.2f} s")
        if status.exit_code != 0:
            tail = " | ".join(log.strip().splitlines()[-3:]) or "no output"
            raise PodError(f"init container {c.name} exited {status.exit_code}: {tail[-300:]}")

    @staticmethod
    def _read_log(path: str) -> str:
        try:
            return parse_cri_log(Path(path).read_text(errors="replace"))
        except OSError:
            return ""

    # --- the LabPod interface ------------------------------------------------------------------

    @property
    def running(self) -> bool:
        return not self._removed and bool(self.pidns) and pidns_of(self.pid1) == self.pidns

    def container_exited(self) -> bool:
        """The main container's process is gone (its shim reaps it): with a pause, the pod lives on."""
        return bool(self.pidns) and pidns_of(self.main_pid) != self.pidns

    @property
    def command_line(self) -> str:
        return describe_pod(f"CRI pod {self.spec.namespace}/{self.spec.name}", self.manifest)

    @property
    def ids(self) -> dict[str, int | str]:
        sandbox_id = self.sandbox.sandbox_id if self.sandbox else ""
        container_id = self.ids_by_name.get(self.main.name, "")
        spec = self.spec
        return pod_ids(self, spec.namespace, spec.name, spec.uid, sandbox_id=sandbox_id, container_id=container_id)

    def processes(self) -> list[int]:
        pids = sorted({p for ns in self._namespaces for p in pids_in_pidns(ns)})
        return sorted(pids, key=lambda p: (p != self.pid1, p))

    def tree(self) -> list[int]:
        return self.processes() if self._namespaces and not self._removed else []

    def log_text(self) -> str:
        """Every container's output, init containers first, each under its name (when there are more than one)."""
        if not self._removed:
            client = self.runtime.client
            for name, cid in self.ids_by_name.items():
                with contextlib.suppress(CriError):
                    self._logs[name] = self._read_log(client.container_status(cid).status.log_path)
        if len(self._logs) == 1:  # one container (a scenario's): its output as it wrote it
            return next(iter(self._logs.values()))
        return "".join(f"==> {name} <==\n{text}" for name, text in self._logs.items())

    def exec(self, argv: Sequence[str], *, timeout: float) -> subprocess.CompletedProcess[str]:
        """``kubectl exec`` into the main container (the GPU one)."""
        return self._exec(self.ids_by_name[self.main.name], argv, timeout)

    def _exec(self, cid: str, argv: Sequence[str], timeout: float) -> subprocess.CompletedProcess[str]:
        try:
            done = self.runtime.client.exec_sync(cid, list(argv), timeout=timeout)
        except CriError as exc:
            if exc.code != "DEADLINE_EXCEEDED":
                raise
            return subprocess.CompletedProcess(list(argv), 124, "", str(exc))
        return subprocess.CompletedProcess(
            list(argv), done.exit_code, done.stdout.decode(errors="replace"), done.stderr.decode(errors="replace")
        )

    # --- deletion --------------------------------------------------------------------------------

    def delete(self, *, grace: float) -> Deletion:
        """The kubelet's killPodWithSyncResult: every container's killContainer at once, then the sandbox."""
        whole = int(grace)
        requested = self.events.add("delete", f"grace {whole} s").t
        results: dict[str, dict[str, Any]] = {}
        threads = [
            threading.Thread(target=self._kill_container, args=(c, whole, requested, results), daemon=True)
            for c in self.manifest.containers
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(whole + KUBELET_RUNTIME_TIMEOUT_S + 10)
        self.log_text()
        self._remove_sandbox()
        self.events.add("sandbox-removed", "StopPodSandbox + RemovePodSandbox")
        main = results.get(self.main.name, {})
        kills = [r["sigkill_at"] for r in results.values() if r.get("sigkill_at") is not None]
        hook = next((r for r in (main, *results.values()) if r.get("prestop_rc") is not None), {})
        return Deletion(
            requested_at=requested,
            grace_s=whole,
            prestop_rc=hook.get("prestop_rc"),
            prestop_stdout=hook.get("prestop_stdout", ""),
            prestop_stderr=hook.get("prestop_stderr", ""),
            sigterm_at=min((r["sigterm_at"] for r in results.values() if "sigterm_at" in r), default=requested),
            sigkill_at=min(kills) if kills else None,
            exited_at=max((r["exited_at"] for r in results.values() if "exited_at" in r), default=self.events.now()),
            pod_exit_code=main.get("exit_code"),
            leftovers=leftovers(self.processes),
        )

    def _kill_container(self, c: Container, grace: int, requested: float, out: dict[str, dict[str, Any]]) -> None:
        """The kubelet's killContainer: the preStop hook (bounded by the grace), then StopContainer
        with the whole seconds left, never under the kubelet's 2 s minimum."""
        client, cid = self.runtime.client, self.ids_by_name[c.name]
        result: dict[str, Any] = {}
        out[c.name] = result
        left = grace
        hook: list[subprocess.CompletedProcess[str]] = []
        waiter = None
        if c.prestop is not None and grace > 0:
            started = time.monotonic()
            if command := c.prestop.command:
                self.events.add("prestop-start", f"{c.name}: ExecSync {shlex.join(command)}")
                waiter = threading.Thread(
                    target=lambda: hook.append(self._exec(cid, command, KUBELET_RUNTIME_TIMEOUT_S)), daemon=True
                )
                waiter.start()
                waiter.join(grace)
                if hook:
                    self.events.add("prestop-end", f"{c.name}: exit {hook[0].returncode}")
                else:
                    self.events.add("prestop-cut-off", f"{c.name}: the kubelet stops waiting after {grace} s")
            else:
                seconds = min(c.prestop.sleep_s or 0, grace)
                self.events.add("prestop-start", f"{c.name}: the kubelet sleeps {seconds} s")
                time.sleep(seconds)
                result.update(prestop_rc=0)
                self.events.add("prestop-end", f"{c.name}: slept {seconds} s")
            left = grace - int(time.monotonic() - started)
        left = max(left, KUBELET_MIN_GRACE_S)
        sigterm_at = self.events.add("sigterm", f"{c.name}: StopContainer(timeout={left})").t
        result["sigterm_at"] = sigterm_at
        try:
            client.stop_container(cid, grace=left, timeout=KUBELET_RUNTIME_TIMEOUT_S)
            status = client.container_status(cid).status
        except CriError as exc:
            self.events.add("stop-failed", f"{c.name}: {exc}")
            return
        finally:
            if waiter is not None:  # a hook cut off goes with its container, as under the kubelet
                waiter.join(5.0)
                done = hook[0] if hook else None
                result.update(
                    prestop_rc=done.returncode if done else 124,
                    prestop_stdout=done.stdout if done else "",
                    prestop_stderr=done.stderr if done else "cut off at the grace's end",
                )
        exited = status.finished_at / 1e9 - self.events.origin_epoch if status.finished_at else self.events.now()
        if status.exit_code == 137 and exited >= sigterm_at + left - 0.05:
            result["sigkill_at"] = sigterm_at + left
            self.events.add("sigkill", f"{c.name}: grace over, the runtime SIGKILLs it", at=sigterm_at + left)
        result.update(exited_at=exited, exit_code=status.exit_code)
        self.events.add(
            "pod-exit" if c is self.main else "container-exit", f"{c.name}: exit {status.exit_code}", at=exited
        )

    def _remove_sandbox(self) -> None:
        if self.sandbox is None or self._removed:
            return
        self.runtime.pods.stop_pod(self.sandbox)
        self._removed = True

    def kill(self) -> None:
        """Backstop: the sandbox (and its containers) and the volumes go, whatever happened."""
        with contextlib.suppress(CriError):
            self._remove_sandbox()
        self.volumes.close()
        shutil.rmtree(self.workdir, ignore_errors=True)
