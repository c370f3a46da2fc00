"""`gpuzombie lab handover`: its exit codes and its --json, on a stand-in of the experiment (the
experiment itself, on the lab's containerd, is tests/test_handover_pod.py)."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("cri_api", reason="container-runtime-interface-api is in the 'node' extra")

from gpuzombie.cli.main import main
from gpuzombie.lab import handover


def _summary(ok: bool) -> dict:
    return {"device": "cpu", "size_mib": 64, "reap_after_s": 8.0, "runs": [], "spread": {}, "ok": ok}


@pytest.mark.parametrize(("ok", "code"), [(True, 0), (False, 1)])
def test_exit_code_says_whether_the_gate_held(monkeypatch, tmp_path, capsys, ok, code):
    asked = {}

    def run_handover(out, **kwargs):
        asked.update(kwargs, out=out)
        kwargs["say"]("run 1/1: pod A leaves a stale holder of 64 MiB")
        return _summary(ok)

    monkeypatch.setattr(handover, "run_handover", run_handover)
    assert main(["lab", "handover", "--out", str(tmp_path), "--json"]) == code
    out, err = capsys.readouterr()
    assert json.loads(out) == _summary(ok) and "stale holder of 64 MiB" in err
    assert asked["out"] == tmp_path and asked["device"] == "cpu" and asked["size_mib"] == 64
    assert asked["repeat"] == 1 and asked["reap_after_s"] == 8.0 and asked["budget_s"] is None


def test_a_run_that_cannot_start_is_one_line_and_exit_2(monkeypatch, tmp_path, capsys):
    from gpuzombie.lab.errors import PodError

    def run_handover(out, **kwargs):
        raise PodError("pod A's worker did not get ready: ")

    monkeypatch.setattr(handover, "run_handover", run_handover)
    assert main(["lab", "handover", "--out", str(tmp_path), "--device", "cuda"]) == 2
    err = capsys.readouterr().err
    assert err.strip().splitlines() == ["gpuzombie: error: pod A's worker did not get ready:"], err
