"""`lab run` with S4 and ``s4-fullfix-fasthook`` side by side (the fast hook's zipapp as S4's
preStop) on both runtimes, CPU stand-in, 5 s grace: same outcome, NVML not asked by the fast hook.

5 s, not 2: the module hook is a Python importing the package on a loaded CPU, 0.7-1.0 s from its
start to its end at load 10 on 2 cores and past a 2 s grace at load 11-12 (issue 29's suite beside
stress-ng), where the kubelet's rule then cut it (exit 124). S4's worker exits on the hook's SIGTERM,
so the longer grace costs the run no time."""

from __future__ import annotations

import json

import pytest

from containerd_fixture import needs_containerd
from gpuzombie.cli.main import main
from gpuzombie.lab.scenarios import DEFAULT_SCENARIOS, SCENARIOS

pytestmark = [needs_containerd]


@pytest.mark.slow
def test_both_hooks_in_one_run_on_both_runtimes(tmp_path):
    argv = ["lab", "run", "--scenario", "s4-fullfix", "--scenario", "s4-fullfix-fasthook", "--runtime", "both"]
    assert main([*argv, "--grace", "5", "--size-mib", "32", "--device", "cpu", "--out", str(tmp_path)]) == 0
    data = json.loads((tmp_path / "results.json").read_text())
    assert set(data["scenarios"]) == {
        "s4-fullfix",
        "s4-fullfix-fasthook",
        "s4-fullfix-containerd",
        "s4-fullfix-fasthook-containerd",
    }
    assert "--scenario s4-fullfix --scenario s4-fullfix-fasthook" in data["provenance"]["command"]
    for key, e in data["scenarios"].items():
        d = e["deletion"]
        assert d["prestop_rc"] == 0 and d["leftovers"] == [] and not e["metrics"]["waited_whole_grace"], key
        assert {o["outcome"] for o in d["prestop_outcomes"]} == {"exited_after_sigterm"}, key
        prestop = next(ev["detail"] for ev in e["events"] if ev["name"] == "prestop-start")
        fast = key.startswith("s4-fullfix-fasthook")
        assert ("-S -I" in prestop and "prestop.pyz" in prestop) == fast, prestop
    assert "s4-fullfix-fasthook" in (tmp_path / "comparison.md").read_text()


def test_all_is_still_the_five():
    assert DEFAULT_SCENARIOS == ("s1-nofix", "s2-tini", "s3-tini-prestop", "s4-fullfix", "s5-sharepid")
    assert SCENARIOS["s4-fullfix-fasthook"].hook == "zipapp" and SCENARIOS["s4-fullfix"].hook == "module"
