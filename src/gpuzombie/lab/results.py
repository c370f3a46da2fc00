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
from gpuzombie.lab.labrun import LabRun
from gpuzombie.lab.nccl.summary import NcclSummary
from gpuzombie.lab.records import LabResults, RunRecord, group_key
from gpuzombie.proc.own import cgroup_v2_only, cpu_model
from gpuzombie.units import MIB
from gpuzombie.workloads.memory import CPU_STANDIN, torch_installed

SCHEMA = "gpuzombie.lab/2"
"""/2: a ``lab pod`` run holds its manifest's pod only (/1 gave it a made-up scenario, number 0,
and ``victim_reaped``: true); a scenario's run is as in /1."""
READABLE = ("gpuzombie.lab/1", SCHEMA)
RESULTS_JSON = "results.json"


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
    nccl: NcclSummary | None = None,
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
        record = RunRecord.of(run, prov)
        data["scenarios"][record.key] = record.to_json()
        folder = out_dir / record.key
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
