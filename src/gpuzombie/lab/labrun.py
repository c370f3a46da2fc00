"""What one lab run is: its settings, what it ran (a scenario or a manifest's pod) and what it measured.

Below the scenarios and ``lab pod`` (which build a ``LabRun`` through ``measure.Measurement``) and
the records (which write it to results.json and read it back), so none of them imports another for it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from gpuzombie.lab.events import Event
from gpuzombie.lab.metrics import RunMetrics, SamplerStats
from gpuzombie.lab.observation import Observation
from gpuzombie.lab.runtime.pod import Deletion
from gpuzombie.lab.sampler import Sample
from gpuzombie.workloads.memory import CPU_STANDIN


@dataclass(frozen=True)
class Scenario:
    name: str
    number: int
    title: str
    init: str
    prestop: bool
    fixed: bool
    hook: str = "module"
    """How the preStop hook runs: ``module`` (``python3 -m gpuzombie.prestop``) or ``zipapp`` (the
    fast hook the webhook injects: ``python3 -S -I prestop.pyz``)."""


@dataclass(frozen=True)
class LabConfig:
    workers: int = 1
    """Workers alive when the pod is deleted (the parent spawns one more, the kill -9 victim)."""
    grace: float = 30.0
    device: str = "cpu"
    """Resolved: ``cuda`` or ``cpu``."""
    backend: str = CPU_STANDIN
    """Resolved: ``torch``, ``ctypes`` or ``cpu-standin``."""
    size_mib: int = 2048
    uid: int | None = None
    gpu_index: int = 0
    init: str | None = None
    """Another init for the scenarios that use tini (``tini-g``, ``dumb-init``)."""
    main: str = "sleep"
    """The container's main process under the init (S2-S4): ``sleep`` (experiments run through
    ``kubectl exec``, the original experiment's way) or ``worker`` (the workload itself is the main process:
    a SIGTERM-ignoring worker, the fixed one in S4)."""
    sample_interval: float = 0.01
    ready_timeout: float = 180.0
    runtime: str = "namespaces"
    """``namespaces`` (PID namespaces made here), ``containerd`` (CRI pods on a real runtime) or
    ``kubernetes`` (Pods through the API server of a real cluster, run by its kubelet)."""

    @property
    def prestop_timeout(self) -> float:
        """preStop's own SIGTERM→SIGKILL wait: the original experiment's 20 s in a 30 s grace; in a shorter
        grace, what leaves a third of it (at least 1.5 s) for the hook's start and SIGKILL."""
        return round(max(0.2, min(20.0, self.grace - max(1.5, self.grace / 3))), 1)

    @property
    def prestop_kill_wait(self) -> float:
        """How long preStop waits after its SIGKILL; with the timeout it must fit the grace."""
        return round(min(2.0, self.grace / 6), 1)


@dataclass(frozen=True)
class ScenarioSubject:
    """What a ``lab run`` run ran: one of the scenarios, and whether its init reaped the kill -9 victim."""

    scenario: Scenario
    victim_reaped: bool

    @property
    def name(self) -> str:
        return self.scenario.name


@dataclass(frozen=True)
class PodSubject:
    """What a ``lab pod`` run ran: a manifest's pod (no scenario number, no kill -9 victim)."""

    name: str
    """The run's name (``pod-<name>``, and what the webhook did to it)."""
    manifest: Mapping[str, Any]
    """The pod as it ran: names, grace, QoS, its containers, the lab's notes."""

    @property
    def title(self) -> str:
        return f"lab pod {self.manifest.get('namespace')}/{self.manifest.get('name')}"


RunSubject = ScenarioSubject | PodSubject


@dataclass(frozen=True)
class LabRun:
    """Everything one run produced (a scenario's or a manifest's pod); ``records.RunRecord.of`` makes
    it results.json's entry."""

    subject: RunSubject
    config: LabConfig
    init: str
    pod_command: str
    probe_source: str
    events: tuple[Event, ...]
    samples: tuple[Sample, ...]
    observations: tuple[Observation, ...]
    deletion: Deletion
    pod_ids: Mapping[str, int | str]
    """Host pids (unshare, PID 1, the main process), the PID namespace's inode, and on a CRI runtime
    the pod's name, UID, sandbox and container ids: to check nothing is left."""
    metrics: RunMetrics
    sampler: SamplerStats
    origin_epoch: float
    """Wall-clock time of t = 0 of the events and samples."""
    logs: Mapping[str, str] = field(default_factory=dict)
    """File name → content: the observe logs, gpu-pod-trace.log, the nvidia-smi logs, pod.log."""
    attempt: int = 1
    """Which repetition of the scenario this is (``--repeat``)."""
