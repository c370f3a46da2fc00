"""`gpuzombie lab report` of the committed results: what is committed is what the report renders
from the recorded results.json (no number typed, nothing stale), and its marks mean "good for the
user" on the recorded H200 run."""

from __future__ import annotations

import json
import shutil
import zlib
from pathlib import Path

import pytest

from gpuzombie.lab.labrun import PodSubject, ScenarioSubject
from gpuzombie.lab.records import LabResults
from gpuzombie.lab.report import build, comparison_md
from gpuzombie.lab.results import SCHEMA, load, merge_results

RESULTS = Path(__file__).resolve().parents[1] / "results"
COMMITTED = [RESULTS, RESULTS / "runtimes", RESULTS / "runtimes-cpu", RESULTS / "labpod-cpu", RESULTS / "labpod-h200"]
"""Every committed lab results folder that ``lab report`` renders (results/nccl is the NCCL run's own)."""


def _png_software(data: bytes) -> str | None:
    """The PNG's ``Software`` text chunk: matplotlib writes its version there."""
    pos = 8
    while pos + 8 <= len(data):
        length = int.from_bytes(data[pos : pos + 4], "big")
        kind, body = data[pos + 4 : pos + 8], data[pos + 8 : pos + 8 + length]
        if kind == b"tEXt" and body.startswith(b"Software\0"):
            return body.split(b"\0", 1)[1].decode(errors="replace")
        if kind == b"zTXt" and body.startswith(b"Software\0"):
            return zlib.decompress(body.split(b"\0", 1)[1][1:]).decode(errors="replace")
        pos += 12 + length
    return None


@pytest.mark.parametrize("folder", COMMITTED, ids=lambda p: str(p.relative_to(RESULTS.parent)))
@pytest.mark.slow
def test_committed_results_are_what_lab_report_renders(folder, tmp_path):
    shutil.copy(folder / "results.json", tmp_path / "results.json")
    rendered = build(tmp_path)
    assert len(rendered) > 1
    stale, plots_skipped = [], 0
    for path in rendered:
        relative = path.relative_to(tmp_path)
        committed = folder / relative
        if path.suffix == ".png":
            if not committed.exists():
                stale.append(f"{relative} missing")
                continue
            ours, theirs = path.read_bytes(), committed.read_bytes()
            # Byte-equal only from the same matplotlib (a newer one draws the same plot otherwise).
            if _png_software(ours) != _png_software(theirs):
                plots_skipped += 1
            elif ours != theirs:
                stale.append(str(relative))
        elif not committed.exists() or committed.read_text() != path.read_text():
            stale.append(str(relative))
    assert not stale, f"re-render with: gpuzombie lab report {folder.relative_to(RESULTS.parent)}  ({stale[:5]})"


def _row(markdown: str, label: str) -> list[str]:
    line = next(line for line in markdown.splitlines() if line.startswith(f"| {label} |"))
    return [cell.strip() for cell in line.split(" | ")[1:]]


def test_marks_mean_good_for_the_user_on_the_h200_run():
    text = comparison_md(load(RESULTS))
    held = _row(text, "How long the memory is held after pod deletion")
    # S1 held it 30 s and S3 20 s: bad; S2 (0.185 s, the fastest) and S4: good.
    assert [cell[0] for cell in held[:4]] == ["❌", "✅", "❌", "✅"], held
    assert _row(text, "SIGTERM handling")[1].startswith("⚠️")  # ignored, but the pod ended at once
    assert all(cell.startswith("✅ all freed") for cell in _row(text, "Memory after pod deletion")[:4])
    assert all(cell.startswith("✅") for cell in _row(text, "Node reboot needed")[:4])
    assert "✅ 2 orphans" not in text and "❌ not needed" not in text and "❌ none" not in text


def test_a_run_without_nccl_quotes_the_seed_as_the_seed():
    text = comparison_md(LabResults.from_json(json.loads((RESULTS / "results.json").read_text()) | {"nccl": None}))
    nccl = _row(text, "NCCL hang: GPU memory held")
    assert nccl[0].startswith("not run here (the seed measured 5.7 GB")
    assert all(cell.startswith("not run (seed expected") for cell in nccl[1:4])


def test_s5_has_its_column_where_it_ran():
    text = comparison_md(load(RESULTS / "runtimes"))
    assert "| S4 Full Fix | S5 shareProcessNamespace |" in text
    assert _row(text, "Zombies reaped")[4] != "—"


def test_every_committed_results_json_loads_typed():
    """results.load reads every lab results.json in results/ (written by older versions too) into
    typed runs: each run's metrics, deletion and samples are there by name."""
    folders = [p.parent for p in RESULTS.rglob("results.json") if '"gpuzombie.lab/' in p.read_text()[:200]]
    assert len(folders) >= 4, folders
    for folder in folders:
        results = load(folder)
        raw = json.loads((folder / "results.json").read_text())["scenarios"]
        assert list(results.runs) == list(raw)
        for key, run in results.runs.items():
            assert run.metrics.grace_s == raw[key]["metrics"]["grace_s"]
            assert run.deletion.leftovers == tuple(raw[key]["deletion"]["leftovers"])
            assert len(run.samples.t) == len(raw[key]["samples"]["t"]) and run.observed("after-spawn") is not None
            assert isinstance(run.subject, PodSubject) == ("pod_manifest" in raw[key])


def test_a_lab_pod_run_is_its_manifests_pod_not_a_made_up_scenario():
    """gpuzombie.lab/1 gave a ``lab pod`` run a scenario numbered 0 and ``victim_reaped: true``; read
    back, its subject is the manifest's pod alone, and a scenario's run keeps its scenario."""
    pods = load(RESULTS / "labpod-cpu")
    assert pods.runs and not pods.scenario_runs and pods.pod_runs.keys() == pods.runs.keys()
    run = pods.runs["pod-gpu-zombie-nofix-containerd"]
    assert run.subject == PodSubject("pod-gpu-zombie-nofix", run.subject.manifest)
    assert run.subject.title == "lab pod gpu-zombie-test/gpu-zombie-nofix"
    assert not hasattr(run.subject, "scenario") and not hasattr(run.subject, "victim_reaped")
    s1 = load(RESULTS / "runtimes").runs["s1-nofix"].subject
    assert isinstance(s1, ScenarioSubject) and s1.scenario.number == 1 and not s1.victim_reaped


def test_a_version_1_results_json_merges_into_the_current_version(tmp_path):
    """Runs written before the subject split (gpuzombie.lab/1) merge into a file written as the
    current version, and read back the same."""
    source = tmp_path / "old"
    source.mkdir()
    shutil.copy(RESULTS / "labpod-cpu" / "results.json", source / "results.json")
    merge_results(tmp_path / "new", [source])
    assert json.loads((tmp_path / "new" / "results.json").read_text())["schema"] == SCHEMA != "gpuzombie.lab/1"
    assert comparison_md(load(tmp_path / "new")) == comparison_md(load(source))


def test_a_results_json_missing_a_runs_metrics_is_a_value_error(tmp_path):
    data = json.loads((RESULTS / "runtimes" / "results.json").read_text())
    del next(iter(data["scenarios"].values()))["metrics"]
    (tmp_path / "results.json").write_text(json.dumps(data))
    with pytest.raises(ValueError, match="not a complete"):
        load(tmp_path)
