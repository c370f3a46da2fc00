"""``run_nccl_comparison``: every case at once, rank 0 SIGKILLed in each, survivors measured.

The cases run concurrently (distinct ports, their own processes), so one observation window
serves all of them and the defaults case gets the longest window the budget allows. Rank 0 of
each case is killed ``stagger_s`` after the previous case's, so their releases can be told apart
on the device-level series too. Per survivor: seconds from the kill to its exit and to its GPU
memory being free (its pid no longer listed by NVML; its exit on the stand-in). Per case: the
ghost on the dead rank's GPU, read as the unexplained memory that vanished when the case's last
survivor exited (None while it still runs).
"""

from __future__ import annotations

import functools
import json
import signal
import tempfile
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from gpuzombie.gpu.nvml import NvmlBackend, default_backend
from gpuzombie.lab.errors import LabError
from gpuzombie.lab.nccl.cases import DEFAULT_COLLECTIVE_TIMEOUT_S, CaseSpec, case_specs
from gpuzombie.lab.nccl.launch import CaseLaunch, launch_case, wait_ready
from gpuzombie.lab.nccl.report import comparison_table, write_results
from gpuzombie.lab.nccl.sampling import (
    MemorySample,
    MemorySampler,
    freed_at,
    held_before,
    unexplained_at,
)
from gpuzombie.lab.nccl.summary import NcclCase, NcclSummary, Survivor
from gpuzombie.workloads.memory import torch_installed

TORCH_HINT = (
    "the NCCL scenario needs torch: in the gpuzombie clone run `make torch`, the CPU build (about 200 MB; "
    ".venv/bin/pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu); a plain "
    "`pip install torch` takes PyPI's CUDA build, about 5 GB with its CUDA wheels"
)
"""The version is the test extra's pin (pyproject.toml), which the +cpu build satisfies too."""
SCHEMA = "gpuzombie.nccl/1"
GOAL_S = 5.0
WRAP_UP_S = 25.0
CPU_STANDIN_LABEL = (
    "CPU stand-in: gloo backend, host RAM instead of GPU memory; NCCL knobs have "
    "no effect on gloo, which also notices a dead peer's closed socket by itself"
)


class NcclScenarioError(LabError):
    """The scenario cannot run here (too few GPUs, no torch): exit 2 with one line."""


def _gpu_count(nvml: NvmlBackend) -> int:
    snap = nvml.read()
    return len(snap.devices) if snap.available else 0


def _resolve(ranks: int | None, device: str, nvml: NvmlBackend) -> tuple[int, str]:
    gpus = _gpu_count(nvml) if device in ("auto", "cuda") else 0
    if device == "auto":
        device = "cuda" if gpus >= 2 else "cpu"
    if device == "cuda":
        if gpus < 2:
            raise NcclScenarioError(f"the NCCL scenario needs 2+ GPUs, NVML sees {gpus}: use --device cpu")
        ranks = ranks or gpus
        if ranks > gpus:
            raise NcclScenarioError(f"{ranks} ranks need {ranks} GPUs (NCCL: one GPU per rank); {gpus} seen")
    ranks = ranks or 2
    if ranks < 2:
        raise NcclScenarioError("--ranks must be at least 2 (rank 0 dies, the others survive)")
    return ranks, device


def _chosen(specs: dict[str, CaseSpec], cases: list[str] | None) -> list[str]:
    """The cases to run, in their table's order; NcclScenarioError for a name it lacks."""
    keys = [k for k in specs if cases is None or k in cases]
    unknown = sorted(set(cases or ()) - set(specs))
    if unknown or not keys:
        raise NcclScenarioError(f"unknown case(s) {unknown}; choose from {', '.join(specs)}")
    return keys


def _defaults(
    gpu: bool, size_mib: int | None, observe_seconds: float | None, stagger_s: float | None
) -> tuple[int, float, float]:
    """The buffer size, the window after the first kill and the kills' stagger, on a GPU or the CPU."""
    return (
        size_mib or (2048 if gpu else 64),
        observe_seconds or (420.0 if gpu else 20.0),
        stagger_s if stagger_s is not None else (3.0 if gpu else 0.5),
    )


def _ready(ranks: int | None, device: str, nvml: NvmlBackend | None) -> tuple[NvmlBackend, tuple[int, str]]:
    """NVML and the ranks and device to run on; NcclScenarioError without torch."""
    if not torch_installed():
        raise NcclScenarioError(TORCH_HINT)
    nvml = nvml or default_backend()
    return nvml, _resolve(ranks, device, nvml)


def _since(origin: float) -> float:
    return time.monotonic() - origin


def run_nccl_comparison(
    *,
    ranks: int | None,
    device: str,
    out_dir: Path,
    cases: list[str] | None,
    observe_seconds: float | None,
    progress: Callable[[str], None],
    size_mib: int | None = None,
    collective_timeout_s: float = DEFAULT_COLLECTIVE_TIMEOUT_S,
    stagger_s: float | None = None,
    startup_timeout_s: float = 240.0,
    budget_s: float | None = None,
    nvml: NvmlBackend | None = None,
    specs: dict[str, CaseSpec] | None = None,
) -> NcclSummary:
    """Run the cases side by side; write out_dir/"nccl"; return the summary.

    ``budget_s`` caps the whole run (a device call has 10 minutes): the window then ends early
    enough to leave ``WRAP_UP_S`` for stopping the ranks and writing the results."""
    nvml, (ranks, device) = _ready(ranks, device, nvml)
    specs = specs or case_specs(collective_timeout_s)
    keys = _chosen(specs, cases)
    gpu = device == "cuda"
    size_mib, observe_seconds, stagger_s = _defaults(gpu, size_mib, observe_seconds, stagger_s)
    nccl_dir = Path(out_dir) / "nccl"
    log_dir = nccl_dir / "logs"
    log_dir.mkdir(parents=True, exist_ok=True)
    backend = "nccl" if gpu else "gloo, " + CPU_STANDIN_LABEL.split(":")[0]
    window = f"observing up to {observe_seconds:g} s after the first kill"
    progress(f"nccl: {len(keys)} case(s) x {ranks} ranks on {device} ({backend}); {window}")
    now = functools.partial(_since, time.monotonic())
    launches: list[CaseLaunch] = []
    kills: dict[str, float] = {}
    sampler = MemorySampler(
        nvml=nvml if gpu else None,
        clock=now,
        pids=lambda: [r.pid for c in launches for r in c.ranks if r.exited_at is None],
    )
    # The ready files live in a directory removed at the end; every rank launched so far is
    # killed whatever happens (Ctrl-C during the start-up included).
    with tempfile.TemporaryDirectory(prefix="gpuzombie-nccl-") as tmp:
        try:
            launch = functools.partial(launch_case, ranks=ranks, device=device, size_mib=size_mib, log_dir=log_dir)
            for k in keys:  # one at a time: every rank launched so far is stopped below
                launches.append(launch(specs[k], run_dir=Path(tmp)))
            _kill_and_watch(
                launches,
                kills,
                sampler,
                now=now,
                ranks=ranks,
                stagger_s=stagger_s,
                observe_seconds=observe_seconds,
                budget_s=budget_s,
                startup_timeout_s=startup_timeout_s,
                progress=progress,
            )
        finally:
            sampler.stop()
            t_end = now()
            for c in launches:
                c.stop_all()
        observed = round(t_end - min(kills.values()), 1) if kills else 0.0
        summary = _summarize(
            launches,
            kills,
            sampler.samples,
            t_end=t_end,
            device=device,
            ranks=ranks,
            size_mib=size_mib,
            observe_seconds=observed,
            nvml=nvml if gpu else None,
        )
    write_results(nccl_dir, summary, sampler.samples)
    progress(f"nccl: wrote {nccl_dir}/ (comparison.md, results.json, memory.png, logs/)")
    return summary


def _kill_and_watch(
    launches: list[CaseLaunch],
    kills: dict[str, float],
    sampler: MemorySampler,
    *,
    now: Callable[[], float],
    ranks: int,
    stagger_s: float,
    observe_seconds: float,
    budget_s: float | None,
    startup_timeout_s: float,
    progress: Callable[[str], None],
) -> None:
    """Wait for the ranks, SIGKILL rank 0 of each case ``stagger_s`` apart (``kills`` records
    when), then record the survivors' exits until the window or the budget ends."""
    wait_ready(launches, startup_timeout_s)
    for c in launches:
        progress(
            f"nccl: case {c.spec.key} ({c.spec.name}): "
            + (f"FAILED to start: {c.error}" if c.error else f"{ranks} ranks ready")
        )
    running = [c for c in launches if c.error is None]
    sampler.start()
    time.sleep(1.0)  # a baseline with every rank holding its memory
    next_note = now() + 30.0

    def watch(until: float) -> bool:
        """Record exits until ``until``; True when every rank of every case has exited."""
        nonlocal next_note
        while now() < until:
            for c in running:
                for r in c.ranks:
                    r.poll(now())
            if kills and all(r.exited_at is not None for c in running for r in c.ranks):
                return True
            if now() >= next_note:
                next_note = now() + 30.0
                hung = [c.spec.key for c in running if any(r.exited_at is None for r in c.ranks[1:])]
                progress(
                    f"nccl: {now() - min(kills.values(), default=now()):.0f} s after the first "
                    f"kill; survivors still running in case(s): {', '.join(hung) or 'none'}"
                )
            time.sleep(0.02)
        return False

    for i, c in enumerate(running):
        if i:
            watch(now() + stagger_s)
        victim = c.ranks[0]
        if victim.handle is not None:
            victim.handle.send(signal.SIGKILL)
        kills[c.spec.key] = now()
        progress(f"nccl: case {c.spec.key}: SIGKILL rank 0 (pid {victim.pid}) at {kills[c.spec.key]:.2f} s")
    end = min(kills.values(), default=now()) + observe_seconds
    if budget_s is not None:
        end = min(end, budget_s - WRAP_UP_S)
    watch(end)
    time.sleep(min(1.0, max(0.0, end - now())))  # let the last release show in the samples


def _summarize(
    launches: list[CaseLaunch],
    kills: dict[str, float],
    samples: list[MemorySample],
    *,
    t_end: float,
    device: str,
    ranks: int,
    size_mib: int,
    observe_seconds: float,
    nvml: NvmlBackend | None,
) -> NcclSummary:
    summary = NcclSummary(
        schema=SCHEMA,
        device=device,
        backend="nccl" if device == "cuda" else "gloo",
        stand_in=device != "cuda",
        label=CPU_STANDIN_LABEL if device != "cuda" else "real NCCL on GPUs",
        ranks=ranks,
        size_mib=size_mib,
        observe_seconds=observe_seconds,
        goal_s=GOAL_S,
        torch=_torch_version(launches),
        cases=tuple(_case(c, kills.get(c.spec.key), samples, t_end, nvml) for c in launches),
        gpu_end=samples[-1].gpus if samples else (),
    )
    return replace(summary, table_md=comparison_table(summary))


def _case(
    c: CaseLaunch, kill_t: float | None, samples: list[MemorySample], t_end: float, nvml: NvmlBackend | None
) -> NcclCase:
    """What one case's survivors did after its rank 0 was killed at ``kill_t`` (None: never killed)."""
    survivors = []
    for r in c.ranks[1:]:
        if kill_t is None:
            break
        exit_s = round(r.exited_at - kill_t, 3) if r.exited_at is not None else None
        held = held_before(samples, r.pid, kill_t)
        # A running rank NVML never listed is unknown, not free.
        known = r.exited_at is not None or (nvml is not None and held > 0)
        free_t = freed_at(samples, r.pid, kill_t) if known else None
        survivors.append(
            Survivor(
                rank=r.rank,
                pid=r.pid,
                gpu=r.gpu,
                held_mib_at_kill=round(held, 1),
                exit_s=exit_s,
                exit_code=r.exit_code,
                memory_free_s=round(free_t - kill_t, 3) if free_t is not None else None,
                still_running_at_s=None if exit_s is not None else round(t_end - kill_t, 1),
            )
        )
    frees = [s.memory_free_s for s in survivors]
    measured = [f for f in frees if f is not None]
    all_free_s = max(measured) if measured and len(measured) == len(frees) else None
    dead_gpu = c.ranks[0].gpu if c.ranks else None
    spec = c.spec
    return NcclCase(
        case=spec.key,
        name=spec.name,
        description=spec.description,
        env=dict(spec.env),  # a copy: the frozen record shares no mutable dict with the spec
        collective_timeout_s=spec.timeout_s,
        launcher=spec.launcher,
        error=c.error,
        killed_at_s=round(kill_t, 3) if kill_t is not None else None,
        survivors=tuple(survivors),
        all_free_s=all_free_s,
        goal_met=all_free_s is not None and all_free_s <= GOAL_S,
        dead_rank_gpu=dead_gpu,
        ghost_mib=_ghost_drop(samples, dead_gpu, c) if nvml is not None else None,
    )


def _ghost_drop(samples: list[MemorySample], gpu: int | None, case: CaseLaunch) -> float | None:
    """Unexplained MiB on the dead rank's GPU that vanished when the case's last survivor exited."""
    exits = [r.exited_at for r in case.ranks[1:]]
    if gpu is None or not exits or any(e is None for e in exits):
        return None
    last = max(e for e in exits if e is not None)
    before = unexplained_at(samples, gpu, last - 0.15)
    after = unexplained_at(samples, gpu, last + 1.0)
    if before is None or after is None:
        return None
    return round(max(0.0, before - after), 1)


def _torch_version(launches: list[CaseLaunch]) -> str | None:
    """The torch version the ranks reported in their ready files."""
    for c in launches:
        for p in c.ready_files:
            try:
                return json.loads(p.read_text()).get("torch")
            except (OSError, ValueError):
                continue
    return None


__all__ = ["NcclScenarioError", "run_nccl_comparison"]
