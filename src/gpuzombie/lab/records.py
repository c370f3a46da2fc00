"""A lab run as results.json holds it, written and read back typed: what ``lab report`` renders.

``RunRecord.of`` makes a ``LabRun`` its record and ``to_json`` its entry (``results.write_results``);
``from_json`` reads the entry back through the same fields. ``results.load()`` returns a ``LabResults``; each run is a ``RunRecord`` (frozen, every field
named), so the report reads ``run.metrics.release_latency_s`` instead of string keys. The reader
is lenient where older files are (results/ holds runs written before ``variant``, ``runtime``,
``attempt`` and the scenario's ``hook`` existed): a missing key takes the value those runs had.
A run's subject is what it ran: a scenario (``scenario``, ``victim_reaped``) or, for ``lab pod``, a
manifest's pod (``pod_manifest``; gpuzombie.lab/1 files also hold a made-up scenario for it, ignored).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from typing import Any

from gpuzombie.jsonout import to_jsonable
from gpuzombie.lab.events import Event
from gpuzombie.lab.labrun import LabConfig, LabRun, PodSubject, RunSubject, Scenario, ScenarioSubject
from gpuzombie.lab.metrics import RunMetrics, SamplerStats
from gpuzombie.lab.nccl.summary import NcclSummary
from gpuzombie.lab.observation import Observation, PodProcess
from gpuzombie.lab.runtime.pod import Deletion
from gpuzombie.lab.sampler import Sample
from gpuzombie.units import MIB
from gpuzombie.workloads.memory import CPU_STANDIN, CPU_STANDIN_LABEL


def _known(cls: type, data: Mapping[str, Any]) -> dict[str, Any]:
    """The keys of ``data`` that are fields of ``cls`` (a newer file's extra key is left out)."""
    names = {f.name for f in fields(cls)}
    return {k: v for k, v in data.items() if k in names}


def variant_key(run: LabRun) -> str:
    """The scenario's name, plus what makes this run a variant of the original experiment's."""
    if isinstance(run.subject, PodSubject):
        return run.subject.name
    c, scenario = run.config, run.subject.scenario
    parts = [scenario.name]
    if c.workers != 1:
        parts.append(f"{c.workers}workers")
    if c.uid is not None:
        parts.append(f"uid{c.uid}")
    if run.init != scenario.init:
        parts.append(run.init)
    if c.main != "sleep" and scenario.init != "sleep":
        parts.append("main-worker")
    if c.backend == "ctypes":
        parts.append("ctypes")
    return "-".join(parts)


def group_key(run: LabRun) -> str:
    """The variant on its runtime: the repetitions of one group are summarised together."""
    return variant_key(run) + ("" if run.config.runtime == "namespaces" else f"-{run.config.runtime}")


def run_key(run: LabRun) -> str:
    """The run's folder: its group, and ``-runN`` for the Nth repetition (the first has none)."""
    return group_key(run) + (f"-run{run.attempt}" if run.attempt > 1 else "")


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

    @classmethod
    def of(cls, d: Deletion, origin_epoch: float) -> DeletionRecord:
        """``d`` rounded, with what the hook's JSON report (its stdout) says of each target."""
        report = _prestop_report(d.prestop_stdout)
        started = report.get("started_at") if report else None
        return cls(
            grace_s=d.grace_s,
            requested_at=round(d.requested_at, 4),
            sigterm_at=round(d.sigterm_at, 4),
            sigkill_at=None if d.sigkill_at is None else round(d.sigkill_at, 4),
            exited_at=round(d.exited_at, 4),
            pod_exit_code=d.pod_exit_code,
            prestop_rc=d.prestop_rc,
            prestop_log=d.prestop_stderr.strip(),
            prestop_outcomes=None if not report else tuple(_outcome(r) for r in report.get("results", [])),
            leftovers=tuple(d.leftovers),
            prestop_started_after_delete_s=None
            if started is None
            else round(started - origin_epoch - d.requested_at, 3),
        )

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> DeletionRecord:
        outcomes = d.get("prestop_outcomes")
        return cls(
            **{
                **_known(cls, d),
                "prestop_outcomes": None
                if outcomes is None
                else tuple(PrestopOutcome(**_known(PrestopOutcome, o)) for o in outcomes),
                "leftovers": tuple(d["leftovers"]),
            }
        )


def _prestop_report(stdout: str) -> Mapping[str, Any] | None:
    """The hook's JSON report, None without one (no hook, or it printed no JSON)."""
    if not stdout.strip():
        return None
    try:
        report = json.loads(stdout)
    except ValueError:
        return None
    return report if isinstance(report, Mapping) else None


def _outcome(r: Mapping[str, Any]) -> PrestopOutcome:
    target = r.get("target", {})
    return PrestopOutcome(
        pid=target.get("pid"),
        comm=target.get("comm"),
        outcome=r.get("outcome"),
        signals=r.get("signals"),
        exited_after_s=r.get("exited_after_s"),
    )


@dataclass(frozen=True)
class Series:
    """The memory samples as columns: seconds, MiB held, MiB of the pod's processes."""

    t: tuple[float, ...]
    held_mib: tuple[float, ...]
    process_mib: tuple[float, ...] = ()

    @classmethod
    def of(cls, samples: Sequence[Sample]) -> Series:
        return cls(
            t=tuple(round(s.t, 4) for s in samples),
            held_mib=tuple(round(s.held_bytes / MIB, 2) for s in samples),
            process_mib=tuple(round(s.process_bytes / MIB, 2) for s in samples),
        )


@dataclass(frozen=True, kw_only=True)
class RunRecord:
    """One run of a scenario (or of ``lab pod``'s manifest), as results.json holds it.

    The fields are the entry's keys in order (``key`` is the entry's name, ``subject`` its
    ``scenario`` and ``victim_reaped`` or its ``pod_manifest``): ``to_json`` writes and ``from_json``
    reads each field, through ``_CODECS`` where it is not plain JSON, so a new field is both."""

    key: str
    subject: RunSubject
    """What ran: a scenario, or ``lab pod``'s manifest."""
    variant: str = ""
    group: str = ""
    runtime: str = "namespaces"
    attempt: int = 1
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
    """Written where results.json holds the run; a run printed alone (``lab pod --json``) has none."""

    @property
    def ran_as(self) -> str:
        """The command that made the run and when, as the notes quote it."""
        return f"`{self.provenance.get('command')}` at {self.provenance.get('date_utc')}"

    def observed(self, point: str) -> Observation | None:
        return next((o for o in self.observations if o.point == point), None)

    @classmethod
    def of(cls, run: LabRun, provenance: Mapping[str, Any] | None = None) -> RunRecord:
        """The record of a run just made (rounded as results.json holds it)."""
        c = run.config
        return cls(
            key=run_key(run),
            subject=run.subject,
            variant=variant_key(run),
            group=group_key(run),
            runtime=c.runtime,
            attempt=run.attempt,
            config=c,
            memory=CPU_STANDIN_LABEL if c.backend == CPU_STANDIN else f"GPU memory through {c.backend}",
            cpu_standin=c.backend == CPU_STANDIN,
            init=run.init,
            pod_command=run.pod_command,
            probe=run.probe_source,
            metrics=run.metrics,
            sampler=run.sampler,
            pod=dict(run.pod_ids),
            observations=run.observations,
            deletion=DeletionRecord.of(run.deletion, run.origin_epoch),
            origin_epoch=run.origin_epoch,
            events=tuple(Event(round(e.t, 4), e.name, e.detail) for e in run.events),
            samples=Series.of(run.samples),
            provenance=provenance or {},
        )

    def to_json(self) -> dict[str, Any]:
        """results.json's entry for this run."""
        out: dict[str, Any] = {}
        for f in fields(self):
            codec = _CODECS.get(f.name)
            value = getattr(self, f.name)
            out.update(codec.write(value) if codec else {f.name: to_jsonable(value)})
        return out

    @classmethod
    def from_json(cls, key: str, e: Mapping[str, Any]) -> RunRecord:
        """The entry ``key`` of results.json; a key older files lack takes its field's default."""
        values: dict[str, Any] = {}
        for f in fields(cls):
            codec = _CODECS.get(f.name)
            if codec is not None:
                values[f.name] = codec.read(key, e)
            elif f.name in e:
                values[f.name] = e[f.name]
        return cls(**values)


@dataclass(frozen=True)
class _Codec:
    """How one field of ``RunRecord`` is written (its keys of the entry) and read back."""

    write: Callable[[Any], dict[str, Any]]
    read: Callable[[str, Mapping[str, Any]], Any]


def _field(name: str, read: Callable[[Any], Any]) -> _Codec:
    """A field written as plain JSON under its name and read back through ``read``."""
    return _Codec(lambda value: {name: to_jsonable(value)}, lambda _key, e: read(e[name]))


def _subject_to_json(subject: RunSubject) -> dict[str, Any]:
    """A scenario's run: the scenario and whether its victim was reaped; ``lab pod``'s: the pod."""
    if isinstance(subject, PodSubject):
        return {"pod_manifest": dict(subject.manifest)}
    return {"scenario": to_jsonable(subject.scenario), "victim_reaped": subject.victim_reaped}


def _subject(key: str, e: Mapping[str, Any]) -> RunSubject:
    if e.get("pod_manifest"):
        return PodSubject(name=e.get("variant", key), manifest=e["pod_manifest"])
    return ScenarioSubject(Scenario(**_known(Scenario, e["scenario"])), victim_reaped=e["victim_reaped"])


def _config_to_json(c: LabConfig) -> dict[str, Any]:
    return {
        "config": {**to_jsonable(c), "prestop_timeout": c.prestop_timeout, "prestop_kill_wait": c.prestop_kill_wait}
    }


def _observation(o: Mapping[str, Any]) -> Observation:
    return Observation(
        **{
            **_known(Observation, o),
            "processes": tuple(PodProcess(**_known(PodProcess, p)) for p in o.get("processes") or ()),
        }
    )


_CODECS: Mapping[str, _Codec] = {
    "key": _Codec(lambda _value: {}, lambda key, _e: key),
    "subject": _Codec(_subject_to_json, _subject),
    "variant": _Codec(lambda value: {"variant": value}, lambda key, e: e.get("variant", key)),
    "group": _Codec(lambda value: {"group": value}, lambda key, e: e.get("group", key)),
    "config": _Codec(_config_to_json, lambda _key, e: LabConfig(**_known(LabConfig, e["config"]))),
    "metrics": _field("metrics", RunMetrics.from_json),
    "sampler": _field("sampler", SamplerStats.from_json),
    "observations": _field("observations", lambda v: tuple(_observation(o) for o in v)),
    "deletion": _field("deletion", DeletionRecord.from_json),
    "events": _field("events", lambda v: tuple(Event(**_known(Event, ev)) for ev in v)),
    "samples": _field("samples", lambda v: Series(**{k: tuple(c) for k, c in _known(Series, v).items()})),
    "provenance": _Codec(
        lambda value: {"provenance": to_jsonable(value)} if value else {}, lambda _key, e: e.get("provenance") or {}
    ),
}
"""The fields of ``RunRecord`` that are not written and read as plain JSON under their own name."""


@dataclass(frozen=True)
class LabResults:
    """A results.json: what the memory was, the latest provenance, every run by its folder's name."""

    schema: str
    kind: str
    provenance: Mapping[str, Any]
    runs: Mapping[str, RunRecord]
    nccl: NcclSummary | None = None

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> LabResults:
        runs = data.get("scenarios") or {}
        return cls(
            schema=data["schema"],
            kind=str(data.get("kind", "")),
            provenance=data.get("provenance") or {},
            runs={key: RunRecord.from_json(key, e) for key, e in runs.items()},
            nccl=NcclSummary.from_json(data["nccl"]) if data.get("nccl") else None,
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
