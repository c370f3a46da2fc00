"""The steps every measured pod takes, on any runtime: ``lab run``'s scenarios and ``lab pod``'s manifests.

start → settle → observe → (between) → delete as the kubelet does → wait for the memory → observe
again, sampled all along; a subclass says how its pod settles, what happens between the
observations and what one worker holds. ``Measurement.lab_run`` turns what was measured into the
one ``LabRun`` both kinds return.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable

from gpuzombie.gpu.nvml import NvmlBackend
from gpuzombie.k8s.names import SOCKET_ENV as CRI_SOCKET_ENV
from gpuzombie.lab.errors import ScenarioError
from gpuzombie.lab.events import EventLog
from gpuzombie.lab.labrun import LabConfig, LabRun, RunSubject
from gpuzombie.lab.metrics import RunMetrics, SamplerStats, release_tolerance, scenario_metrics
from gpuzombie.lab.observation import Observation, observe, smi_snapshot
from gpuzombie.lab.runtime.pod import Deletion, LabPod
from gpuzombie.lab.sampler import Probe, Sampler, nvml_or_standin

Progress = Callable[[str], None]


def wait_until(cond: Callable[[], bool], timeout: float, step: float = 0.005) -> bool:
    """Poll ``cond`` every ``step`` s until it holds or ``timeout`` passes; its last answer."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(step)
    return cond()


def trace_from_host(cri_socket: str | None = None, timeout: float = 60.0) -> str:
    """``gpuzombie trace`` on the host (the original experiment's gpu-pod-trace.sh on the node); on a CRI runtime
    it asks that runtime's socket for the pods' real names."""
    cmd = [sys.executable, "-m", "gpuzombie", "trace"]
    env = dict(os.environ, **({CRI_SOCKET_ENV: cri_socket} if cri_socket else {}))
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=False, env=env)
    except subprocess.TimeoutExpired:
        return f"# gpuzombie trace timed out after {timeout:.0f} s\n"
    out = (done.stdout + done.stderr).rstrip()
    return f"# gpuzombie trace (on the host), exit {done.returncode}\n{out}\n"


class Measurement:
    """One pod while it is measured, on either runtime: its sampler, what it has recorded, and the
    steps every run takes (start, settle, observe, delete as the kubelet does, wait for the memory,
    observe again). ``lab run``'s scenarios and ``lab pod``'s manifests differ only in ``settle``,
    ``between`` and what they report."""

    grace: float
    keep_prestop_log = False
    """Write the hook's output to prestop.log (``lab pod``; a scenario's is in results.json)."""

    def __init__(
        self,
        pod: LabPod,
        events: EventLog,
        *,
        nvml: NvmlBackend,
        gpu_index: int,
        standin: Probe | None,
        sample_interval: float,
        progress: Progress,
        cri_socket: str | None,
        label: str = "",
    ) -> None:
        self.pod, self.events, self.nvml, self.progress = pod, events, nvml, progress
        self.standin = standin is not None
        self.cri_socket = cri_socket
        self.label = label
        """What progress lines start with (a scenario's name)."""
        self.roles: dict[int, str] = {}
        self.observations: list[Observation] = []
        self.logs: dict[str, str] = {}
        try:
            probe = nvml_or_standin(pod, nvml, gpu_index, standin)
        except LookupError as exc:
            raise ScenarioError(str(exc)) from exc
        self.sampler = Sampler(probe, events, sample_interval)

    def say(self, line: str) -> None:
        self.progress(self.label + line)

    def held_now(self) -> int:
        """Memory held at the latest sample (0 before the first)."""
        latest = self.sampler.latest()
        return latest.held_bytes if latest else 0

    def snapshot(self, title: str) -> str:
        return smi_snapshot(self.pod, self.nvml, title, standin=self.standin)

    def observe(self, point: str) -> None:
        obs, text = observe(self.pod, point, self.events.now(), self.roles)
        self.observations.append(obs)
        self.logs[f"observe-{point}.log"] = text
        self.events.add(f"observe-{point}", f"zombies={obs.zombies} orphans={obs.orphans}", at=obs.t)
        self.say(f"observe {point}: zombies={obs.zombies} orphans={obs.orphans}")

    def settle(self) -> None:
        """Until the workload is set up (its memory held)."""
        raise NotImplementedError

    def between(self) -> None:
        """What happens between the first observation and the deletion (nothing by default)."""

    def deleting(self) -> str:
        """The progress line that announces the deletion."""
        return f"deleting the pod (grace {self.grace:g} s)"

    def worker_bytes(self, deletion: Deletion) -> int:
        """What one worker holds: the release tolerance and the kill -9 drop are taken from it."""
        raise NotImplementedError

    def measure(self) -> tuple[Deletion, RunMetrics]:
        """The run's steps; the pod is gone when this returns, whatever happened."""
        try:
            with self.sampler:
                self.pod.start()
                self.settle()
                self.observe("after-spawn")
                self.between()
                self.logs["nvidia-smi-before-delete.log"] = self.snapshot("before deleting the pod")
                self.logs["gpu-pod-trace.log"] = trace_from_host(self.cri_socket)
                self.say(self.deleting())
                deletion = self.pod.delete(grace=self.grace)
                worker_bytes = self.worker_bytes(deletion)
                threshold = release_tolerance(worker_bytes)
                wait_until(lambda: self.held_now() <= threshold, 5.0)
                time.sleep(0.3)  # a tail of samples after the release, for the plot
        finally:
            self.pod.kill()
        self.logs["pod.log"] = self.pod.log_text()
        if self.keep_prestop_log and deletion.prestop_rc is not None:
            self.logs["prestop.log"] = (
                f"# exit {deletion.prestop_rc}\n{deletion.prestop_stdout}{deletion.prestop_stderr}"
            )
        self.logs["nvidia-smi-after-delete.log"] = self.snapshot("after deleting the pod")
        self.observe("after-delete")
        kill9 = self.events.first("kill-9")
        marks = {
            "delete": deletion.requested_at,
            "sigkill": deletion.sigkill_at,
            "pod_exit": deletion.exited_at,
            "kill9": kill9.t if kill9 else None,
        }
        metrics = scenario_metrics(
            samples=self.sampler.samples, marks=marks, grace=self.grace, worker_bytes=worker_bytes
        )
        if metrics.released_at_s is not None:
            self.events.add(
                "memory-released", f"{metrics.release_latency_s} s after the deletion", at=metrics.released_at_s
            )
        return deletion, metrics

    def lab_run(
        self,
        deletion: Deletion,
        metrics: RunMetrics,
        *,
        subject: RunSubject,
        config: LabConfig,
        init: str,
        attempt: int = 1,
    ) -> LabRun:
        """What ``measure`` measured, as the one run both kinds return."""
        return LabRun(
            subject=subject,
            config=config,
            init=init,
            pod_command=self.pod.command_line,
            probe_source=self.sampler.probe.source,
            events=tuple(self.events.events),
            samples=tuple(self.sampler.samples),
            observations=tuple(self.observations),
            deletion=deletion,
            pod_ids=self.pod.ids,
            metrics=metrics,
            sampler=SamplerStats.of(self.sampler),
            origin_epoch=self.events.origin_epoch,
            logs=self.logs,
            attempt=attempt,
        )
