"""The original experiment's four scenarios, each with the original experiment's steps, measured.

start the pod → the parent spawns its workers and exits without wait() → observe → kill -9 one
worker → observe → delete the pod (the kubelet's order) → observe. The parent spawns
``workers + 1`` workers: one is the kill -9 victim (the original experiment's orphaned-context test) and
``workers`` are alive when the pod is deleted (the original experiment's grace-period measurement).
"""

from __future__ import annotations

import atexit
import functools
import json
import os
import re
import shlex
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from typing import IO, TYPE_CHECKING, Any

from gpuzombie.gpu.nvml import NvmlBackend, default_backend
from gpuzombie.k8s.podspec.model import PreStop
from gpuzombie.lab.errors import ScenarioError
from gpuzombie.lab.events import EventLog
from gpuzombie.lab.labrun import LabConfig, LabRun, Scenario, ScenarioSubject
from gpuzombie.lab.manifest import Container, PodManifest, Resources
from gpuzombie.lab.measure import Measurement, Progress, wait_until
from gpuzombie.lab.metrics import kill_drop
from gpuzombie.lab.observation import host_view
from gpuzombie.lab.runtime.pidns import PAUSE, Pod, init_argv
from gpuzombie.lab.runtime.pod import Deletion, LabPod, pids_in_pidns
from gpuzombie.lab.sampler import RssProbe
from gpuzombie.proc.own import PROCFS
from gpuzombie.proc.pidfd import read_start_and_state
from gpuzombie.proc.procfs import Procfs
from gpuzombie.units import MIB
from gpuzombie.workloads.memory import CPU_STANDIN

if TYPE_CHECKING:  # the CRI runtime needs grpcio, an extra: imported only when used
    from gpuzombie.lab.runtime.cri import CriRuntime
    from gpuzombie.lab.runtime.kube import KubeRuntime

    PodRuntime = CriRuntime | KubeRuntime

SPAWNED = re.compile(r"^parent pid=(\d+) spawned \d+ worker\(s\): ([\d ]+)$", re.MULTILINE)
READY = re.compile(r"^ready pid=(\d+) ", re.MULTILINE)
PARENT = "gpuzombie.workloads.parent"


SCENARIOS: Mapping[str, Scenario] = {
    s.name: s
    for s in (
        Scenario("s1-nofix", 1, "No Fix", "sleep", prestop=False, fixed=False),
        Scenario("s2-tini", 2, "tini only", "tini", prestop=False, fixed=False),
        Scenario("s3-tini-prestop", 3, "tini + preStop", "tini", prestop=True, fixed=False),
        Scenario("s4-fullfix", 4, "Full Fix", "tini", prestop=True, fixed=True),
        Scenario("s5-sharepid", 5, "shareProcessNamespace", PAUSE, prestop=False, fixed=False),
        Scenario("s4-fullfix-fasthook", 4, "Full Fix, fast hook", "tini", prestop=True, fixed=True, hook="zipapp"),
    )
}
"""S1-S4 are the original experiment's; S5 is Kubernetes' own fix: S1's workload with ``shareProcessNamespace:
true`` (the pod's pause is PID 1 and reaps; no tini). ``s4-fullfix-fasthook`` is S4 with the fast
hook (the stdlib-only zipapp), run by name beside S4 to compare the two hooks in one run."""
DEFAULT_SCENARIOS = ("s1-nofix", "s2-tini", "s3-tini-prestop", "s4-fullfix", "s5-sharepid")
"""What ``--scenario all`` runs."""
RUNTIMES = ("namespaces", "containerd", "kubernetes")


def _memory_flags(config: LabConfig) -> list[str]:
    """How much each worker holds and where: the flags the parent and a worker-as-main share."""
    return [
        "--size-mib",
        str(config.size_mib),
        "--device",
        config.device,
        "--backend",
        "auto" if config.backend == CPU_STANDIN else config.backend,
        "--gpu-index",
        str(config.gpu_index),
    ]


def parent_command(scenario: Scenario, config: LabConfig) -> list[str]:
    cmd = [
        sys.executable,
        "-m",
        PARENT,
        "--workers",
        str(config.workers + 1),
        *_memory_flags(config),
    ]
    if scenario.fixed:
        cmd.append("--fixed")
    if config.uid is not None:
        cmd += ["--uid", str(config.uid)]
    return cmd


def main_process(scenario: Scenario, config: LabConfig) -> list[str]:
    """What the container's shell execs last (S1 always sleep: its PID 1 is sleep)."""
    if config.main == "sleep" or scenario.init in ("sleep", PAUSE):
        return ["sleep", "infinity"]
    module = "gpuzombie.workloads.worker_fixed" if scenario.fixed else "gpuzombie.workloads.worker"
    return [
        sys.executable,
        "-m",
        module,
        *_memory_flags(config),
    ]


@functools.cache
def fast_hook() -> str:
    """The fast hook's zipapp, built once per lab process into a temp dir removed at exit."""
    from gpuzombie.prestop.zipapp import build

    directory = tempfile.mkdtemp(prefix="gpuzombie-hook-")
    os.chmod(directory, 0o755)  # a pod's uid reads it too
    atexit.register(shutil.rmtree, directory, True)
    return str(build(os.path.join(directory, "prestop.pyz")))


def prestop_command(config: LabConfig, hook: str = "module", zipapp: str | None = None) -> list[str]:
    """The hook as a pod would run it: the stdlib-only entry of ``gpuzombie prestop`` (same options
    and JSON), which starts without click and rich, or the fast hook's zipapp under ``-S -I`` (at
    ``zipapp``, else built here); its start-up is part of S4's latency."""
    entry = ["-S", "-I", zipapp or fast_hook()] if hook == "zipapp" else ["-m", "gpuzombie.prestop"]
    return [
        sys.executable,
        *entry,
        "--json",
        "--timeout",
        f"{config.prestop_timeout:g}",
        "--kill-wait",
        f"{config.prestop_kill_wait:g}",
    ]


def scenario_manifest(
    scenario: Scenario, config: LabConfig, init: str, then: Sequence[str], *, image: str, namespace: str, zipapp: str
) -> PodManifest:
    """The scenario as the one-container Pod a CRI runtime runs: the init's command line, the
    preStop hook (the fast one at ``zipapp``, where the pod mounts it), one GPU on a GPU, and
    ``shareProcessNamespace`` for S5."""
    share = scenario.init == PAUSE  # the pod's pause is PID 1; the container runs S1's command
    argv = init_argv("sleep" if share else init, shlex.join(parent_command(scenario, config)), shlex.join(then))
    hook = PreStop(command=tuple(prestop_command(config, scenario.hook, zipapp))) if scenario.prestop else None
    container = Container(
        name="workload",
        image=image,
        argv=tuple(argv),
        command_given=True,
        prestop=hook,
        resources=Resources(gpus=1 if config.device == "cuda" else 0),
    )
    return PodManifest(
        name=scenario.name,
        namespace=namespace,
        annotations={},
        grace_s=int(config.grace),
        share_process_namespace=share,
        init_containers=(),
        containers=(container,),
        volumes=(),
        no_effect=(),
    )


def _state(pid: int) -> str | None:
    """The process state letter (``Z`` for a zombie); None once the pid is gone."""
    found = read_start_and_state(PROCFS, pid)
    return found[1] if found else None


def _tail(log: str, lines: int = 10) -> str:
    """The pod's last lines of output, to end an error message with (or why there are none)."""
    last = log.strip().splitlines()[-lines:]
    return "; its last lines:\n" + "\n".join(last) if last else " (it wrote no output)"


class _Run(Measurement):
    """One scenario while it runs: its pod and its steps (kill -9 a worker between the observations)."""

    def __init__(
        self,
        scenario: Scenario,
        config: LabConfig,
        nvml: NvmlBackend,
        progress: Progress,
        log: IO[str],
        runtime: PodRuntime | None,
        attempt: int,
    ) -> None:
        self.scenario, self.config, self.attempt = scenario, config, attempt
        self.grace = config.grace
        self.victim_reaped = False
        self.init = config.init if (config.init and scenario.init not in ("sleep", PAUSE)) else scenario.init
        self.then = main_process(scenario, config)
        self.pod_document: Mapping[str, Any] | None = None
        """On the kubernetes runtime: the Pod object the lab applied (written beside the logs)."""
        events = EventLog()
        pod = self._make_pod(runtime, log, events)
        super().__init__(
            pod,
            events,
            nvml=nvml,
            gpu_index=config.gpu_index,
            standin=RssProbe(pod) if config.backend == CPU_STANDIN else None,
            sample_interval=config.sample_interval,
            progress=progress,
            cri_socket=runtime.socket if runtime else None,
            label=f"{scenario.name}: ",
        )
        if self.pod_document is not None:
            self.logs["pod.json"] = json.dumps(self.pod_document, indent=2) + "\n"

    def _make_pod(self, runtime: PodRuntime | None, log: IO[str], events: EventLog) -> LabPod:
        s, c = self.scenario, self.config
        if runtime is None:
            hook = prestop_command(c, s.hook) if s.prestop else None
            return Pod(s.name, self.init, parent_command(s, c), log=log, events=events, then=self.then, prestop=hook)
        from gpuzombie.k8s.cri import BindMount
        from gpuzombie.lab.runtime.cri import LAB_NAMESPACE
        from gpuzombie.lab.runtime.kube import KubePod, KubeRuntime
        from gpuzombie.lab.runtime.manifestpod import HOOK_PATH, ManifestPod, PodRunConfig

        manifest = scenario_manifest(
            s, c, self.init, self.then, image=runtime.image, namespace=LAB_NAMESPACE, zipapp=HOOK_PATH
        )
        init = manifest.containers[0].argv[0]  # the init's binary, where the lab's mounts may miss it
        config = PodRunConfig(device=c.device, gpu_index=c.gpu_index)
        if isinstance(runtime, KubeRuntime):
            extra_paths = [init] if os.path.isabs(init) else []
            pod = KubePod(runtime, manifest, config, events, extra_mounts=extra_paths, capture_hook=True)
            self.pod_document = pod.document
            return pod
        extra = (BindMount(init, init, readonly=True),) if os.path.isabs(init) else ()
        return ManifestPod(runtime, manifest, config, events, extra_mounts=extra)

    def deleting(self) -> str:
        return f"deleting the pod (grace {self.grace:g} s" + (", preStop first)" if self.scenario.prestop else ")")

    def worker_bytes(self, deletion: Deletion) -> int:
        return self.config.size_mib * MIB

    def settle(self) -> None:
        self.wait_for_workers()

    def between(self) -> None:
        self.victim_reaped = self.kill_victim()
        self.observe("after-kill")

    def wait_for_workers(self) -> None:
        """Wait for every ``ready`` line and the parent's exit; name the pod's processes.

        The parent prints its own pid and its workers' pids as the pod sees them; they are mapped
        to host pids once all are ready (a worker forked but not yet exec'd still looks like the
        parent). A ``ready`` pid that the parent did not spawn is the container's main worker.
        """
        main_worker = self.then[0] != "sleep"
        want = self.config.workers + 1 + main_worker
        spawned: list[int] = []

        def ready() -> bool:
            text = self.pod.log_text()
            if "error pid=" in text or "Traceback" in text:
                raise ScenarioError(f"{self.scenario.name}: a workload failed:\n{text[-2000:]}")
            if not spawned and (m := SPAWNED.search(text)):
                spawned.extend(int(p) for p in [m.group(1), *m.group(2).split()])
                self.events.add("spawn", f"parent spawned {len(spawned) - 1} worker(s)")
            if len(READY.findall(text)) >= want and "parent exiting" in text:
                return True
            if self.pod.container_exited():
                raise ScenarioError(
                    f"{self.scenario.name}: the container exited before its workers were ready{_tail(text)}"
                )
            if not spawned and text.strip() and not self._parent_running():
                raise ScenarioError(f"{self.scenario.name}: the parent exited before spawning its workers{_tail(text)}")
            return False

        if not wait_until(ready, self.config.ready_timeout, 0.01):
            raise ScenarioError(
                f"{self.scenario.name}: workers not ready after "
                f"{self.config.ready_timeout:.0f} s:\n{self.pod.log_text()[-2000:]}"
            )
        by_pod_pid = {p.pod_pid: p.host_pid for p in host_view(self.pod, {})}
        parent_pod_pid, worker_pod_pids = spawned[0], set(spawned[1:])
        for pod_pid in map(int, READY.findall(self.pod.log_text())):
            if pod_pid in by_pod_pid:
                self.roles[by_pod_pid[pod_pid]] = "worker" if pod_pid in worker_pod_pids else "main"
        parent = by_pod_pid.get(parent_pod_pid)
        if parent is not None:
            self.roles[parent] = "parent"
            # Its parent is the container's shell, which exec'd sleep: with a pause as PID 1 too.
            self.wait_settled(parent, 10.0, zombie_stays=self.init in ("sleep", PAUSE))
        self.events.add("parent-exit", "the parent exited without wait()")

    def _parent_running(self) -> bool:
        """A process of the pod runs the parent (a zombie has no command line). Asked only once the
        pod wrote something before the parent's first line: a shell's "not found", an ImportError."""
        table = Procfs().snapshot(pids=pids_in_pidns(self.pod.pidns), now=time.time(), with_cgroup=False)
        return any(PARENT in p.cmdline for p in table)

    def wait_settled(self, pid: int, timeout: float, *, zombie_stays: bool) -> None:
        """Until an exited ``pid`` stays as it is: gone, or a zombie when its parent never reaps
        (``sleep``). A zombie an init or a shell is about to reap would be counted by the host and
        missed by observe a moment later (the lab's 1-in-3 flake)."""
        wait_until(lambda: (state := _state(pid)) is None or (zombie_stays and state == "Z"), timeout)

    def kill_victim(self) -> bool:
        workers = sorted(pid for pid, role in self.roles.items() if role == "worker")
        if not workers:
            raise ScenarioError(f"{self.scenario.name}: no worker to kill")
        victim = workers[0]
        held_before = self.held_now()
        self.roles[victim] = "victim"
        self.events.add("kill-9", f"worker host pid {victim}")
        os.kill(victim, signal.SIGKILL)
        self.wait_settled(victim, 5.0, zombie_stays=self.init == "sleep")  # orphans go to PID 1
        # Let the driver (or the kernel) hand the memory back and the init reap, as the original experiment's
        # observe.sh ran some seconds after the kill.
        threshold = kill_drop(self.config.size_mib * MIB)
        wait_until(lambda: self.held_now() <= held_before - threshold, 5.0)
        time.sleep(0.2)
        return _state(victim) is None

    def run(self) -> LabRun:
        s, c = self.scenario, self.config
        self.say(f"starting the pod on {c.runtime} ({self.init} as PID 1)")
        deletion, metrics = self.measure()
        subject = ScenarioSubject(s, victim_reaped=self.victim_reaped)
        return self.lab_run(deletion, metrics, subject=subject, config=c, init=self.init, attempt=self.attempt)


def run_scenario(
    scenario: Scenario,
    config: LabConfig,
    *,
    nvml: NvmlBackend | None = None,
    progress: Progress = lambda _: None,
    runtime: PodRuntime | None = None,
    attempt: int = 1,
) -> LabRun:
    """Run one scenario end to end (as a CRI pod or a Kubernetes Pod on ``runtime``, else as PID
    namespaces made here);
    the pod is gone when this returns, whatever happened."""
    with tempfile.NamedTemporaryFile("w+", prefix=f"gpuzombie-{scenario.name}-", suffix=".log") as log:
        return _Run(scenario, config, nvml or default_backend(), progress, log, runtime, attempt).run()
