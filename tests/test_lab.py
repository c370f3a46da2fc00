"""`gpuzombie lab run`: the seed's four scenarios end to end on the CPU stand-in, short grace.

One run of all four (module fixture, about 15 s), then the seed's outcomes per scenario, the
results/ layout, `lab report`, and that no process or namespace of any pod is left.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import sys
from pathlib import Path

import pytest

from gpuzombie.cli.main import main
from gpuzombie.lab.runtime.pidns import pids_in_pidns
from markers import needs_root, needs_tini

GRACE = 2.0
SEED_FILES = (
    "observe-after-spawn.log",
    "observe-after-kill.log",
    "gpu-pod-trace.log",
    "nvidia-smi-before-delete.log",
    "nvidia-smi-after-delete.log",
    "notes.md",
)

pytestmark = [needs_root, needs_tini]


CONSOLE: dict[str, str] = {}
"""What the module's lab run printed on stdout (its table)."""


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict]:
    out = tmp_path_factory.mktemp("results")
    with contextlib.redirect_stdout(io.StringIO()) as stdout:
        status = main(["lab", "run", "--grace", str(GRACE), "--size-mib", "64", "--device", "cpu", "--out", str(out)])
    CONSOLE["stdout"] = stdout.getvalue()
    assert status == 0
    return out, json.loads((out / "results.json").read_text())


def scenario(lab: tuple[Path, dict], name: str) -> dict:
    return lab[1]["scenarios"][name]


def obs(entry: dict, point: str) -> dict:
    return next(o for o in entry["observations"] if o["point"] == point)


def test_s1_leaves_zombies_and_deletion_waits_the_whole_grace(lab):
    e = scenario(lab, "s1-nofix")
    assert e["init"] == "sleep"
    assert obs(e, "after-spawn")["orphans"] == 2
    assert obs(e, "after-kill")["zombies"] >= 1 and not e["victim_reaped"]  # sleep never reaps
    m = e["metrics"]
    assert m["waited_whole_grace"] and GRACE - 0.05 <= m["release_latency_s"] <= GRACE + 1.0
    assert m["grace_waste_gib_s"] > 0.05


def test_s2_tini_reaps_and_its_exit_ends_the_namespace(lab):
    e = scenario(lab, "s2-tini")
    assert obs(e, "after-kill")["zombies"] == 0 and e["victim_reaped"]
    # Measured, against the seed's expectation (30 s): tini forwards SIGTERM to its child
    # (sleep), exits with it, and the kernel SIGKILLs the rest of the namespace at once.
    m = e["metrics"]
    assert not m["waited_whole_grace"] and m["release_latency_s"] < 1.0
    assert e["deletion"]["pod_exit_code"] == 143


def test_s3_prestop_sigkill_fallback_frees_within_the_grace(lab):
    e = scenario(lab, "s3-tini-prestop")
    d, m = e["deletion"], e["metrics"]
    names = [ev["name"] for ev in e["events"]]
    assert names.index("prestop-start") < names.index("prestop-end") < names.index("sigterm")
    if d["prestop_rc"] == 124:
        # A 2 s grace leaves the hook 1.2 s to start besides its 0.5 s timeout and 0.3 s kill-wait;
        # its Python started in 0.30-0.67 s at load average 14 on 2 cores, and once (in 4) too late.
        # Then the kubelet's rule holds: it waits at most the grace for the hook, SIGTERM follows.
        sigterm = next(ev["t"] for ev in e["events"] if ev["name"] == "sigterm")
        assert sigterm - d["requested_at"] == pytest.approx(GRACE, abs=0.3)
        return
    assert d["prestop_rc"] == 0
    assert [o["outcome"] for o in d["prestop_outcomes"]] == ["exited_after_sigkill"]
    assert e["config"]["prestop_timeout"] * 0.9 <= m["release_latency_s"] < GRACE
    assert not m["waited_whole_grace"]


def test_s4_frees_memory_on_prestops_sigterm_before_the_grace_ends(lab):
    e = scenario(lab, "s4-fullfix")
    m, d = e["metrics"], e["deletion"]
    assert "released pid=" in (lab[0] / "s4-fullfix" / "pod.log").read_text()  # the handler's cleanup ran
    if d["prestop_rc"] == 124:
        # The hook is a Python that starts on a loaded CPU: 0.68-0.98 s from its start to its end at
        # load 10 on 2 cores, and past the 2 s grace twice at load 11-12 (issue 29's suite beside
        # stress-ng). Then the kubelet's rule holds (SIGTERM at the grace's end) and S4's handler
        # still frees on that SIGTERM, well before a SIGKILL would come.
        sigterm = next(ev["t"] for ev in e["events"] if ev["name"] == "sigterm")
        assert sigterm - d["requested_at"] == pytest.approx(GRACE, abs=0.3)
        assert m["release_latency_s"] < GRACE + 1.0
        return
    assert [o["outcome"] for o in d["prestop_outcomes"]] == ["exited_after_sigterm"]
    # 0.06-0.08 s idle; 1.04 s beside stress-ng --cpu 2. What S4 must show: freed by the handler,
    # before the grace's end.
    assert m["release_latency_s"] < GRACE and not m["waited_whole_grace"]


def test_s5_share_process_namespace_pause_reaps_and_the_grace_is_not_wasted(lab):
    e = scenario(lab, "s5-sharepid")
    assert e["init"] == "pause" and e["victim_reaped"]  # catatonit -P, PID 1, reaped the killed worker
    assert obs(e, "after-kill")["zombies"] == 1  # the parent's: its parent is the container's sleep
    names = [ev["name"] for ev in e["events"]]
    assert names.index("sigterm") < names.index("runtime-kill-all") < names.index("sandbox-removed")
    assert not e["metrics"]["waited_whole_grace"] and e["metrics"]["release_latency_s"] < 1.0


def test_observe_inside_the_pod_agrees_with_the_host_count(lab):
    for name in ("s1-nofix", "s2-tini", "s3-tini-prestop", "s4-fullfix", "s5-sharepid"):
        for point in ("after-spawn", "after-kill"):
            o = obs(scenario(lab, name), point)
            assert o["observe_summary"] is not None, o["observe_error"]
            assert (o["observe_summary"]["zombies"], o["observe_summary"]["orphans"]) == (o["zombies"], o["orphans"])


def test_results_layout_is_the_seeds_and_labelled(lab):
    out, data = lab
    assert data["schema"] == "gpuzombie.lab/2"
    assert data["provenance"]["kernel"].startswith("Linux") and "lab run" in data["provenance"]["command"]
    for name in ("s1-nofix", "s2-tini", "s3-tini-prestop", "s4-fullfix", "s5-sharepid"):
        for f in SEED_FILES:
            assert (out / name / f).stat().st_size > 0, f"{name}/{f}"
        assert "CPU STAND-IN" in (out / name / "nvidia-smi-before-delete.log").read_text()
        assert "CPU STAND-IN" in (out / name / "notes.md").read_text()
        assert scenario(lab, name)["cpu_standin"]
        assert (out / name / "memory.png").read_bytes()[:4] == b"\x89PNG"
    comparison = (out / "comparison.md").read_text()
    assert "CPU STAND-IN" in comparison and "| S1 No Fix | S2 tini only |" in comparison
    assert "seed expected: 30 s (no handler)" in comparison  # S2 differs from the seed
    for name in ("s1-nofix", "s5-sharepid"):  # PID 1 SIGKILLed: unshare's util-linux#2614 line is explained
        log = (out / name / "pod.log").read_text()
        assert "sigprocmask unblock failed" not in log or "util-linux#2614" in log, name
    assert "좀비" not in comparison and "삭제" not in comparison  # an English report (issue 35 (7))


def test_report_rebuilds_from_results_json(lab, capsys):
    out, _ = lab
    (out / "comparison.md").unlink()
    assert main(["lab", "report", str(out)]) == 0
    assert (out / "comparison.md").exists() and "comparison.md" in capsys.readouterr().out


def test_no_process_or_namespace_of_any_pod_is_left(lab):
    for name, e in lab[1]["scenarios"].items():
        assert e["deletion"]["leftovers"] == []
        assert [p for p in pids_in_pidns(e["pod"]["pidns"]) if _started_before_pod_exit(p, e)] == [], name
        for pid in (e["pod"]["unshare_pid"], e["pod"]["pid1"]):
            in_pod = _pidns(pid) == f"pid:[{e['pod']['pidns']}]" and _started_before_pod_exit(pid, e)
            assert not in_pod, (name, pid)


def _pidns(pid: int) -> str:
    try:
        return os.readlink(f"/proc/{pid}/ns/pid")
    except OSError:
        return ""


def _started_before_pod_exit(pid: int, entry: dict) -> bool:
    """The kernel hands a freed namespace's inode number to the next new namespace at once (here:
    another test's pod), so a process found under the pod's inode is the pod's only if it
    started before the pod exited. Start times are CLOCK_BOOTTIME ticks, as in /proc/PID/stat."""
    import time

    try:
        with open(f"/proc/{pid}/stat") as f:
            start_ticks = int(f.read().rsplit(")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return False
    exited_epoch = entry["origin_epoch"] + entry["deletion"]["exited_at"]
    exited_boottime = time.clock_gettime(time.CLOCK_BOOTTIME) - (time.time() - exited_epoch)
    return start_ticks / os.sysconf("SC_CLK_TCK") <= exited_boottime + 0.02


def test_nccl_scenario_missing_is_one_line_error(tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "gpuzombie.lab.nccl", None)  # as if not installed
    assert main(["lab", "run", "--scenario", "nccl", "--device", "cpu", "--out", str(tmp_path)]) == 2
    assert "nccl scenario not available" in capsys.readouterr().err


@pytest.mark.parametrize("content", ["[1, 2]", '{"schema": "something/9"}', "not json"])
def test_report_of_a_foreign_results_json_is_one_line_error(tmp_path, capsys, content):
    (tmp_path / "results.json").write_text(content)
    assert main(["lab", "report", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("gpuzombie: error: cannot rebuild") and err.count("\n") == 1


def test_unshare_failure_is_one_line_error_with_the_reason(tmp_path, capsys, monkeypatch):
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "unshare").write_text("#!/bin/sh\necho 'unshare: unshare failed: Operation not permitted' >&2\nexit 1\n")
    (fake / "unshare").chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake}{os.pathsep}{os.environ['PATH']}")
    status = main(
        [
            "lab",
            "run",
            "--scenario",
            "s1-nofix",
            "--grace",
            "1",
            "--size-mib",
            "8",
            "--device",
            "cpu",
            "--out",
            str(tmp_path / "out"),
        ]
    )
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert status == 2 and "Operation not permitted" in err and err.startswith("gpuzombie: error: pod")


def test_observe_log_is_rendered_from_the_same_json_snapshot(lab):
    out, data = lab
    for name, e in data["scenarios"].items():
        for point in ("after-spawn", "after-kill"):
            s = obs(e, point)["observe_summary"]
            text = (out / name / f"observe-{point}.log").read_text()
            assert f"summary: {s['zombies']} zombies, {s['orphans']} orphans," in text, (name, point)
            assert "[2] Process tree" in text and "[8] Orphaned contexts and ghost memory" in text  # observe's own


def test_comparison_symbols_mean_one_thing(lab):
    comparison = (lab[0] / "comparison.md").read_text()
    row = {line.split(" | ")[0].lstrip("| "): line for line in comparison.splitlines() if line.startswith("| ")}
    s1, s2 = row["Zombies reaped"].split(" | ")[1:3]
    assert s1.startswith("❌") and s2.startswith("✅")  # zombies are bad, reaping is good
    assert row["Orphans left"].split(" | ")[1].startswith("❌")  # orphans never reaped in S1
    assert "✅ none: RSS freed" in row["Orphaned CUDA ctx after kill -9"]
    assert row["Node reboot needed"].count("✅ not needed") >= 4
    assert "say what is good for the user: ✅ the good outcome" in comparison
    held = row["How long the memory is held after pod deletion"].split(" | ")[1:6]
    assert held[0].startswith("❌") and held[1].startswith("✅")  # S1 held the whole grace, S2 freed at once
    assert len(held) == 5 and held[4].startswith("✅")  # S5 has its column, and frees at once


def test_the_console_says_which_count_each_column_is(lab):
    table = CONSOLE["stdout"]
    assert "after kill -9" in table and "spawn → end" in table and "left after" in table and "…" not in table
    s4 = next(line for line in table.splitlines() if "s4-fullfix" in line)
    cells = [c.strip() for c in s4.split("│")[1:-1]]
    assert cells[3] == "2 → 0" and cells[4] == "0"  # orphans after the parent's exit, none at the end
