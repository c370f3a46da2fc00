"""The NCCL scenario's GPU-side arithmetic on a recorded-like series (no GPU needed): per-survivor
memory-free times from NVML's per-pid memory, the ghost left on the dead rank's GPU, the table and
the files, including a case still hung at the end of the window."""

from __future__ import annotations

import json

from gpuzombie.gpu.nvml import NO_GPU, FakeNvml
from gpuzombie.lab.nccl.cases import case_specs
from gpuzombie.lab.nccl.launch import CaseLaunch, RankProc
from gpuzombie.lab.nccl.report import write_results
from gpuzombie.lab.nccl.run import _summarize
from gpuzombie.lab.nccl.sampling import GpuPoint, MemorySample, freed_at


def series() -> list[MemorySample]:
    """Two cases on 2 GPUs: rank 0s (pids 10, 20) on GPU0, rank 1s (11, 21) on GPU1, 2658 MiB each.
    Case e killed at 1.0 s, its survivor exits at 1.4 s; case a killed at 4.0 s and never recovers.
    Each survivor leaves 291 MiB unlisted on GPU0 while it lives (its peer context)."""
    samples = []
    for i in range(100):
        t = i * 0.1
        pids = {}
        if t < 1.0:
            pids[10] = 2658.0
        if t < 1.4:
            pids[11] = 2658.0
        if t < 4.0:
            pids[20] = 2658.0
        pids[21] = 2658.0
        ghost0 = (291.0 if 1.0 <= t < 1.4 else 0.0) + (291.0 if t >= 4.0 else 0.0)
        gpu0 = 615 + sum(v for p, v in pids.items() if p in (10, 20)) + ghost0
        gpu1 = 615 + sum(v for p, v in pids.items() if p in (11, 21))
        samples.append(
            MemorySample(t=round(t, 2), by_pid=pids, gpus=(GpuPoint(0, gpu0, ghost0), GpuPoint(1, gpu1, 0.0)))
        )
    return samples


def launch(key: str, pids: tuple[int, int], exits: tuple[float | None, float | None]) -> CaseLaunch:
    case = CaseLaunch(spec=case_specs()[key], port=0, procs=[], logs=[], ready_files=[])
    case.ranks = [
        RankProc(
            rank=r, pid=pids[r], gpu=r, handle=None, exited_at=exits[r], exit_code=75 if key == "e" and r else None
        )
        for r in (0, 1)
    ]
    return case


def test_gpu_summary_times_ghost_and_files(tmp_path):
    samples = series()
    assert freed_at(samples, 11, 1.0) == 1.4
    launches = [launch("a", (20, 21), (4.0, None)), launch("e", (10, 11), (1.0, 1.4))]
    summary = _summarize(
        launches,
        {"a": 4.0, "e": 1.0},
        samples,
        t_end=9.9,
        device="cuda",
        ranks=2,
        size_mib=2048,
        observe_seconds=5.9,
        nvml=FakeNvml(NO_GPU),
    )
    a, e = summary.cases
    assert e.survivors[0].memory_free_s == 0.4 and e.survivors[0].exit_s == 0.4
    assert e.survivors[0].held_mib_at_kill == 2658.0
    assert e.goal_met and e.ghost_mib == 291.0 and e.dead_rank_gpu == 0
    assert a.survivors[0].exit_s is None and a.survivors[0].memory_free_s is None
    assert a.survivors[0].still_running_at_s == 5.9 and a.ghost_mib is None
    assert not a.goal_met
    assert summary.gpu_end[0].unexplained_mib == 291.0
    table = summary.table_md
    assert "| e gpuzombie.graceful |" in table and "still running at 6 s" in table
    assert "GPU0 used" in table and "unexplained 291 MiB" in table
    write_results(tmp_path, summary, samples)
    assert json.loads((tmp_path / "results.json").read_text())["cases"][1]["ghost_mib"] == 291.0
    assert (tmp_path / "memory.png").stat().st_size > 0
