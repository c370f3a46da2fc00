"""The NCCL scenario's orchestration on the gloo stand-in (CPU): 2 ranks, every case side by side."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpuzombie.gpu.nvml import NO_GPU, FakeNvml
from gpuzombie.lab.nccl import CASE_KEYS, NcclScenarioError, run_nccl_comparison
from gpuzombie.lab.nccl.summary import NcclSummary


def run_standin(tmp_path: Path, ranks: int, cases: list[str] | None = None) -> NcclSummary:
    pytest.importorskip("torch.distributed")
    lines: list[str] = []
    summary = run_nccl_comparison(
        ranks=ranks,
        device="cpu",
        out_dir=tmp_path,
        cases=cases,
        observe_seconds=15,
        progress=lines.append,
        nvml=FakeNvml(NO_GPU),
    )
    assert any("SIGKILL rank 0" in line for line in lines)
    return summary


def check_summary(summary: NcclSummary, tmp_path: Path, ranks: int, cases: tuple[str, ...]) -> None:
    assert summary.stand_in and summary.backend == "gloo" and summary.ranks == ranks
    assert [c.case for c in summary.cases] == list(cases)
    for case in summary.cases:
        assert case.error is None, case
        assert [s.rank for s in case.survivors] == list(range(1, ranks))
        for s in case.survivors:
            # On gloo every survivor ends (a closed socket is noticed); the point is the orchestration.
            assert s.exit_s is not None and s.exit_s < 15
            assert s.held_mib_at_kill > 0
    graceful = next(c for c in summary.cases if c.case == "e")
    assert graceful.goal_met
    assert all(s.exit_code == 75 for s in graceful.survivors)
    out = tmp_path / "nccl"
    saved = json.loads((out / "results.json").read_text())
    assert saved["schema"] == "gpuzombie.nccl/1" and saved["samples"]
    table = (out / "comparison.md").read_text()
    assert "CPU stand-in" in table and table.count("\n| ") == len(cases) + 1
    assert (out / "memory.png").stat().st_size > 0
    assert (out / "logs").is_dir()


@pytest.mark.slow
def test_two_ranks_all_cases(tmp_path):
    summary = run_standin(tmp_path, 2)
    check_summary(summary, tmp_path, 2, CASE_KEYS)


def test_bad_arguments_are_one_line_errors(tmp_path):
    with pytest.raises(NcclScenarioError, match="at least 2"):
        run_nccl_comparison(
            ranks=1,
            device="cpu",
            out_dir=tmp_path,
            cases=None,
            observe_seconds=1,
            progress=print,
            nvml=FakeNvml(NO_GPU),
        )
    with pytest.raises(NcclScenarioError, match="unknown case"):
        run_nccl_comparison(
            ranks=2,
            device="cpu",
            out_dir=tmp_path,
            cases=["z"],
            observe_seconds=1,
            progress=print,
            nvml=FakeNvml(NO_GPU),
        )
    with pytest.raises(NcclScenarioError, match="2\\+ GPUs"):
        run_nccl_comparison(
            ranks=2,
            device="cuda",
            out_dir=tmp_path,
            cases=None,
            observe_seconds=1,
            progress=print,
            nvml=FakeNvml(NO_GPU),
        )


@pytest.mark.slow
def test_lab_run_nccl_prints_the_table(tmp_path):
    """``python3 -m gpuzombie lab run --scenario nccl`` as docs/nccl.md and the device script run it
    (one case, the window the docs' --observe-seconds gives)."""
    pytest.importorskip("torch.distributed")
    import os
    import subprocess
    import sys

    src = str(Path(__file__).resolve().parents[1] / "src")
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "gpuzombie",
            "lab",
            "run",
            "--scenario",
            "nccl",
            "--device",
            "cpu",
            "--cases",
            "e",
            "--observe-seconds",
            "10",
            "--out",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={**os.environ, "PYTHONPATH": src},
    )
    assert done.returncode == 0, done.stderr
    assert (
        "e gpuzombie.graceful" in done.stdout and "| e gpuzombie.graceful |" not in done.stdout
    )  # a table, not markdown
    assert "| e gpuzombie.graceful |" in (tmp_path / "nccl" / "comparison.md").read_text()
    assert (tmp_path / "nccl" / "comparison.md").exists()


@pytest.mark.slow
def test_a_survivor_that_never_exits_is_reported_and_stopped(tmp_path):
    """The NCCL hang, on gloo: a rank that waits forever after its collective failed. The window
    ends, the row says "still running", and the orchestrator kills what is left."""
    pytest.importorskip("torch.distributed")
    import psutil

    from gpuzombie.lab.nccl import CaseSpec

    specs = {
        "h": CaseSpec("h", "hangs", "test double of NCCL's hang", on_error="hang"),
        "e": CaseSpec("e", "gpuzombie.graceful", "graceful", graceful=True),
    }
    summary = run_nccl_comparison(
        ranks=2,
        device="cpu",
        out_dir=tmp_path,
        cases=None,
        observe_seconds=4,
        progress=lambda line: None,
        nvml=FakeNvml(NO_GPU),
        specs=specs,
    )
    hung, graceful = summary.cases
    survivor = hung.survivors[0]
    assert survivor.exit_s is None and survivor.memory_free_s is None
    assert 3.5 <= survivor.still_running_at_s < 10 and not hung.goal_met
    assert graceful.goal_met
    assert "still running at" in (tmp_path / "nccl" / "comparison.md").read_text()
    assert not psutil.pid_exists(survivor.pid) or psutil.Process(survivor.pid).status() == "zombie"


@pytest.mark.slow
def test_ctrl_c_during_start_up_leaves_no_rank_and_no_temp_dir(tmp_path):
    """Ctrl-C before the sampler started used to fail in the cleanup itself (joining a thread
    never started), which left every rank running and the ready-file directory behind."""
    pytest.importorskip("torch.distributed")
    import os

    import psutil

    from gpuzombie.lab.runtime.pidns import children_of

    ranks: list[psutil.Process] = []
    ready_dirs: set[Path] = set()

    def interrupt(line: str) -> None:
        if "ranks ready" in line:
            ranks.extend(psutil.Process(pid) for pid in children_of(os.getpid()))
            ready_dirs.update(Path(r.cmdline()[-1]).parent for r in ranks)
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_nccl_comparison(
            ranks=2,
            device="cpu",
            out_dir=tmp_path,
            cases=["a"],
            observe_seconds=4,
            progress=interrupt,
            nvml=FakeNvml(NO_GPU),
        )
    assert len(ranks) == 2 and len(ready_dirs) == 1
    for rank in ranks:
        assert not rank.is_running() or rank.status() == psutil.STATUS_ZOMBIE
    assert not any(d.exists() for d in ready_dirs)
