"""Write a lab run in the original experiment's results/ layout, plus results.json (every metric, provenance).

<out>/<scenario>/observe-after-spawn.log, observe-after-kill.log, gpu-pod-trace.log,
    nvidia-smi-before-delete.log, nvidia-smi-after-delete.log, pod.log, notes.md
<out>/results.json   (merged with an earlier run's: a new scenario group replaces all runs of it)
<out>/comparison.md, <out>/memory-timeline.png, <out>/<scenario>/memory.png  (report.build, which
    reads results.json through ``load``: this module never imports the report)
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import platform
import shlex
import shutil
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from gpuzombie import __version__
from gpuzombie.gpu.nvml import GpuSnapshot
from gpuzombie.jsonout import dumps, to_jsonable
from gpuzombie.lab.labrun import LabRun, PodSubject, RunSubject
from gpuzombie.lab.records import LabResults
from gpuzombie.proc.own import cgroup_v2_only, cpu_model
from gpuzombie.units import MIB
from gpuzombie.workloads.memory import CPU_STANDIN, CPU_STANDIN_LABEL, torch_installed

SCHEMA = "gpuzombie.lab/2"
"""/2: a ``lab pod`` run holds its manifest's pod only (/1 gave it a made-up scenario, number 0,
and ``victim_reaped``: true); a scenario's run is as in /1."""
READABLE = ("gpuzombie.lab/1", SCHEMA)
RESULTS_JSON = "results.json"


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


def provenance(command: Sequence[str], gpus: GpuSnapshot) -> dict[str, Any]:
    """Machine, GPU, driver, kernel, date and the exact command."""
    uname = platform.uname()
    torch_version = None
    if torch_installed():
        try:
            torch_version = importlib.metadata.version("torch")
        except importlib.metadata.PackageNotFoundError:
            torch_version = "installed (version unknown)"
    return {
        "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "command": shlex.join(command),
        "cwd": os.getcwd(),
        "hostname": uname.node,
        "kernel": f"{uname.system} {uname.release}",
        "machine": uname.machine,
        "cpu": cpu_model(),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "gpuzombie": __version__,
        "torch": torch_version,
        "gpu_available": gpus.available,
        "gpu_reason": gpus.reason,
        "driver": gpus.driver_version,
        "cuda_driver": gpus.cuda_driver_version,
        "gpus": [
            {
                "index": d.index,
                "name": d.name,
                "memory_total_mib": d.memory_total // MIB,
                "memory_used_mib": d.memory_used // MIB,
            }
            for d in gpus.devices
        ],
        "cgroup": "v2 only" if cgroup_v2_only() else "v1 or hybrid",
    }


def run_to_json(run: LabRun) -> dict[str, Any]:
    d = run.deletion
    prestop_report = None
    if d.prestop_stdout.strip():
        try:
            prestop_report = json.loads(d.prestop_stdout)
        except ValueError:
            prestop_report = None
    return {
        **subject_to_json(run.subject),
        "variant": variant_key(run),
        "group": group_key(run),
        "runtime": run.config.runtime,
        "attempt": run.attempt,
        "config": {
            **to_jsonable(run.config),
            "prestop_timeout": run.config.prestop_timeout,
            "prestop_kill_wait": run.config.prestop_kill_wait,
        },
        "memory": CPU_STANDIN_LABEL
        if run.config.backend == CPU_STANDIN
        else f"GPU memory through {run.config.backend}",
        "cpu_standin": run.config.backend == CPU_STANDIN,
        "init": run.init,
        "pod_command": run.pod_command,
        "probe": run.probe_source,
        "metrics": to_jsonable(run.metrics),
        "sampler": to_jsonable(run.sampler),
        "pod": dict(run.pod_ids),
        "observations": to_jsonable(run.observations),
        "deletion": {
            "grace_s": d.grace_s,
            "requested_at": round(d.requested_at, 4),
            "sigterm_at": round(d.sigterm_at, 4),
            "sigkill_at": None if d.sigkill_at is None else round(d.sigkill_at, 4),
            "exited_at": round(d.exited_at, 4),
            "pod_exit_code": d.pod_exit_code,
            "prestop_rc": d.prestop_rc,
            "prestop_log": d.prestop_stderr.strip(),
            "prestop_outcomes": _prestop_outcomes(prestop_report),
            "leftovers": list(d.leftovers),
            "prestop_started_after_delete_s": (
                None
                if not prestop_report or "started_at" not in prestop_report
                else round(prestop_report["started_at"] - run.origin_epoch - d.requested_at, 3)
            ),
        },
        "origin_epoch": run.origin_epoch,
        "events": [{"t": round(e.t, 4), "name": e.name, "detail": e.detail} for e in run.events],
        "samples": {
            "t": [round(s.t, 4) for s in run.samples],
            "held_mib": [round(s.held_bytes / MIB, 2) for s in run.samples],
            "process_mib": [round(s.process_bytes / MIB, 2) for s in run.samples],
        },
    }


def subject_to_json(subject: RunSubject) -> dict[str, Any]:
    """A scenario's run: the scenario and whether its victim was reaped; ``lab pod``'s: the pod."""
    if isinstance(subject, PodSubject):
        return {"pod_manifest": dict(subject.manifest)}
    return {"scenario": to_jsonable(subject.scenario), "victim_reaped": subject.victim_reaped}


def _prestop_outcomes(report: Mapping[str, Any] | None) -> list[dict[str, Any]] | None:
    if not report:
        return None
    out = []
    for r in report.get("results", []):
        target = r.get("target", {})
        out.append(
            {
                "pid": target.get("pid"),
                "comm": target.get("comm"),
                "outcome": r.get("outcome"),
                "signals": r.get("signals"),
                "exited_after_s": r.get("exited_after_s"),
            }
        )
    return out


def results_kind(runs: Sequence[LabRun], gpus: GpuSnapshot) -> str:
    """What the memory was: ``cpu-standin`` or ``gpu: <names>``; runs of one kind only are merged."""
    standin = (runs[0].config.backend == CPU_STANDIN) if runs else not (gpus.available and gpus.devices)
    if standin:
        return CPU_STANDIN
    return "gpu: " + ", ".join(sorted({d.name for d in gpus.devices}))


def _write(path: Path, data: Mapping[str, Any]) -> Path:
    """Write results.json with one space of indent, as the committed results/ have it."""
    path.write_text(dumps(data, indent=1) + "\n")
    return path


def load_json(out_dir: Path) -> dict[str, Any]:
    """results.json as JSON, checked to be the lab's (ValueError otherwise, not a crash half-way)."""
    data = json.loads((out_dir / RESULTS_JSON).read_text())
    if not isinstance(data, dict) or data.get("schema") not in READABLE:
        raise ValueError(f"not a {' or '.join(READABLE)} file")
    return data


def load(out_dir: Path) -> LabResults:
    """results.json read back typed: every run's metrics, deletion, observations and samples
    (ValueError when it is not the lab's or a run lacks what every lab run has)."""
    data = load_json(out_dir)
    try:
        return LabResults.from_json(data)
    except (KeyError, TypeError, AttributeError) as exc:
        raise ValueError(f"not a complete {data['schema']} file ({type(exc).__name__}: {exc})") from exc


def write_results(
    runs: Sequence[LabRun],
    out_dir: Path,
    *,
    command: Sequence[str],
    gpus: GpuSnapshot,
    nccl: Mapping[str, Any] | None = None,
) -> Path:
    """Write every scenario's files and results.json (``report.build`` renders them afterwards).

    An earlier results.json of the same kind is merged (a new group replaces every run of it); one of
    another kind (GPU results, and now a CPU stand-in run) is replaced, never mixed into one table.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / RESULTS_JSON
    kind = results_kind(runs, gpus)
    data: dict[str, Any] = {"schema": SCHEMA, "kind": kind, "scenarios": {}}
    if path.exists():
        try:
            old = json.loads(path.read_text())
        except ValueError:
            old = {}
        if isinstance(old, dict) and old.get("schema") in READABLE and old.get("kind") == kind:
            data = {**old, "schema": SCHEMA}  # a /1 file's runs read as /2's
    prov = provenance(command, gpus)
    data["provenance"] = prov
    new_groups = {group_key(run) for run in runs}
    data["scenarios"] = {k: e for k, e in data["scenarios"].items() if e.get("group", k) not in new_groups}
    for run in runs:
        key = run_key(run)
        entry = run_to_json(run)
        entry["provenance"] = prov
        data["scenarios"][key] = entry
        folder = out_dir / key
        folder.mkdir(parents=True, exist_ok=True)
        for name, text in run.logs.items():
            (folder / name).write_text(text)
    if nccl is not None:
        data["nccl"] = to_jsonable(nccl)
    return _write(path, data)


def merge_results(dest: Path, sources: Sequence[Path]) -> Path:
    """Merge other lab runs' results.json (and their scenario folders) into ``dest``: runs of the
    same kind made in separate calls (one runtime each on a machine with a time limit per call)."""
    data = load_json(dest) if (dest / RESULTS_JSON).exists() else None
    for source in sources:
        other = load_json(source)
        if data is None:
            data = {**other, "scenarios": {}}
        if other.get("kind") != data.get("kind"):
            raise ValueError(f"{source}: results of another kind ({other.get('kind')} vs {data.get('kind')})")
        for key, entry in other["scenarios"].items():
            data["scenarios"][key] = entry
            if (source / key).is_dir():
                shutil.copytree(source / key, dest / key, dirs_exist_ok=True)
        if other.get("nccl") is not None:
            data["nccl"] = other["nccl"]
    if data is None:
        raise ValueError("nothing to merge")
    dest.mkdir(parents=True, exist_ok=True)
    path = dest / RESULTS_JSON
    return _write(path, {**data, "schema": SCHEMA})
