"""A lab run as results.json holds it, read back typed: what ``lab report`` renders and the CLI prints.

``results.load()`` returns a ``LabResults``; each run is a ``RunRecord`` (frozen, every field
named), so the report reads ``run.metrics.release_latency_s`` instead of string keys. The reader
is lenient where older files are (results/ holds runs written before ``variant``, ``runtime``,
``attempt`` and the scenario's ``hook`` existed): a missing key takes the value those runs had.
A run's subject is what it ran: a scenario (``scenario``, ``victim_reaped``) or, for ``lab pod``, a
manifest's pod (``pod_manifest``; gpuzombie.lab/1 files also hold a made-up scenario for it, ignored).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from gpuzombie.lab.events import Event
from gpuzombie.lab.labrun import LabConfig, PodSubject, RunSubject, Scenario, ScenarioSubject
from gpuzombie.lab.metrics import RunMetrics, SamplerStats
from gpuzombie.lab.observation import Observation, PodProcess


def _known(cls: type, data: Mapping[str, Any]) -> dict[str, Any]:
    """The keys of ``data`` that are fields of ``cls`` (a newer file's extra key is left out)."""
    names = {f.name for f in fields(cls)}
    return {k: v for k, v in data.items() if k in names}


@dataclass(frozen=True)
class PrestopOutcome:
    """One target of the preStop hook, from its JSON report."""

    pid: int | None = None
    comm: str | None = None
    outcome: str | None = None
    signals: Any = None
    exited_after_s: float | None = None


@dataclass(frozen=True)
class DeletionRecord:
    """What deleting the pod took (results.json's ``deletion``), on the events' clock."""

    grace_s: float
    requested_at: float
    sigterm_at: float
    sigkill_at: float | None
    exited_at: float
    pod_exit_code: int | None
    prestop_rc: int | None
    prestop_log: str
    prestop_outcomes: tuple[PrestopOutcome, ...] | None
    leftovers: tuple[int, ...]
    prestop_started_after_delete_s: float | None = None

    @property
    def outcomes(self) -> list[str]:
        """Each preStop target's outcome (``exited_after_sigterm``...), none without a hook."""
        return [o.outcome or "" for o in self.prestop_outcomes or ()]


@dataclass(frozen=True)
class Series:
    """The memory samples as columns: seconds, MiB held, MiB of the pod's processes."""

    t: tuple[float, ...]
    held_mib: tuple[float, ...]
    process_mib: tuple[float, ...] = ()


@dataclass(frozen=True)
class RunRecord:
    """One run of a scenario (or of ``lab pod``'s manifest), as results.json holds it."""

    key: str
    subject: RunSubject
    """What ran: a scenario, or ``lab pod``'s manifest."""
    config: LabConfig
    """The lab's settings (results.json also holds preStop's two waits, which ``LabConfig`` derives)."""
    memory: str
    cpu_standin: bool
    init: str
    pod_command: str
    probe: str
    metrics: RunMetrics
    sampler: SamplerStats
    pod: Mapping[str, Any]
    observations: tuple[Observation, ...]
    deletion: DeletionRecord
    origin_epoch: float
    events: tuple[Event, ...]
    samples: Series
    provenance: Mapping[str, Any] = field(default_factory=dict)
    variant: str = ""
    group: str = ""
    runtime: str = "namespaces"
    attempt: int = 1

    def observed(self, point: str) -> Observation | None:
        return next((o for o in self.observations if o.point == point), None)

    @classmethod
    def from_json(cls, key: str, e: Mapping[str, Any]) -> RunRecord:
        return cls(
            **{
                **_known(cls, e),
                "key": key,
                "subject": _subject(key, e),
                "config": LabConfig(**_known(LabConfig, e["config"])),
                "metrics": RunMetrics.from_json(e["metrics"]),
                "sampler": SamplerStats.from_json(e["sampler"]),
                "observations": tuple(_observation(o) for o in e["observations"]),
                "deletion": _deletion(e["deletion"]),
                "events": tuple(Event(**_known(Event, ev)) for ev in e["events"]),
                "samples": Series(**{k: tuple(v) for k, v in _known(Series, e["samples"]).items()}),
                "variant": e.get("variant", key),
                "group": e.get("group", key),
            }
        )


def _subject(key: str, e: Mapping[str, Any]) -> RunSubject:
    if e.get("pod_manifest"):
        return PodSubject(name=e.get("variant", key), manifest=e["pod_manifest"])
    return ScenarioSubject(Scenario(**_known(Scenario, e["scenario"])), victim_reaped=e["victim_reaped"])


def _deletion(d: Mapping[str, Any]) -> DeletionRecord:
    outcomes = d.get("prestop_outcomes")
    return DeletionRecord(
        **{
            **_known(DeletionRecord, d),
            "prestop_outcomes": None
            if outcomes is None
            else tuple(PrestopOutcome(**_known(PrestopOutcome, o)) for o in outcomes),
            "leftovers": tuple(d["leftovers"]),
        }
    )


def _observation(o: Mapping[str, Any]) -> Observation:
    return Observation(
        **{
            **_known(Observation, o),
            "processes": tuple(PodProcess(**_known(PodProcess, p)) for p in o.get("processes") or ()),
        }
    )


@dataclass(frozen=True)
class LabResults:
    """A results.json: what the memory was, the latest provenance, every run by its folder's name."""

    schema: str
    kind: str
    provenance: Mapping[str, Any]
    runs: Mapping[str, RunRecord]
    nccl: Any = None

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> LabResults:
        runs = data.get("scenarios") or {}
        return cls(
            schema=data["schema"],
            kind=str(data.get("kind", "")),
            provenance=data.get("provenance") or {},
            runs={key: RunRecord.from_json(key, e) for key, e in runs.items()},
            nccl=data.get("nccl"),
        )

    def _runs_of(self, subject: type) -> dict[str, RunRecord]:
        return {k: r for k, r in self.runs.items() if isinstance(r.subject, subject)}

    @property
    def pod_runs(self) -> dict[str, RunRecord]:
        """``lab pod``'s runs (manifests), by folder."""
        return self._runs_of(PodSubject)

    @property
    def scenario_runs(self) -> dict[str, RunRecord]:
        """``lab run``'s runs (the scenarios and their variants), by folder."""
        return self._runs_of(ScenarioSubject)
