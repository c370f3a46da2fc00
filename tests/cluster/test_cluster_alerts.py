"""The alert rules (charts/gpuzombie/files/gpuzombie-alerts.yaml, also the chart's PrometheusRule)
through the real promtool: `check rules`, and `test rules` with every promtool/*.test.yaml, where
each alert has a case that fires and one that must not (and the recording rules expected samples). Every alert has a severity, a summary,
a description and a runbook_url whose anchor docs/cluster.md has."""

from __future__ import annotations

import pathlib
import re

import pytest

pytest.importorskip("yaml", reason="PyYAML is in the 'chart' extra")

import yaml
from cluster_support import ALERTS, DOCS, promtool

UNIT_TESTS = sorted((pathlib.Path(__file__).resolve().parent / "promtool").glob("*.test.yaml"))
SEVERITIES = {"critical", "warning", "info"}


def all_rules() -> list[dict]:
    return [r for g in yaml.safe_load(ALERTS.read_text())["groups"] for r in g["rules"]]


def rules() -> list[dict]:
    """The alerting rules (the recording rules have no alert, labels or annotations)."""
    return [r for r in all_rules() if "alert" in r]


def test_promtool_checks_the_rules():
    got = promtool("check", "rules", str(ALERTS))
    assert got.returncode == 0, got.stdout + got.stderr
    assert f"SUCCESS: {len(all_rules())} rules found" in got.stdout


def test_promtool_unit_tests_pass():
    got = promtool("test", "rules", *map(str, UNIT_TESTS))
    assert got.returncode == 0, got.stdout + got.stderr
    assert "SUCCESS" in got.stdout


def test_every_alert_is_tested_firing_and_not_firing():
    cases = [c for f in UNIT_TESTS for t in yaml.safe_load(f.read_text())["tests"] for c in t["alert_rule_test"]]
    for rule in rules():
        mine = [c for c in cases if c["alertname"] == rule["alert"]]
        assert any(c.get("exp_alerts") for c in mine), f"{rule['alert']}: no case where it fires"
        assert any(not c.get("exp_alerts") for c in mine), f"{rule['alert']}: no case where it must not fire"


def test_ghost_alert_keys_on_the_exporters_verdict():
    """The 291 MiB NCCL peer-context ghost fires: no fixed byte threshold, the exporter's own verdict."""
    (ghost,) = [r for r in rules() if r["alert"] == "GpuzombieGhostGpuMemory"]
    assert 'gpuzombie_gpu_memory_verdict{verdict="ghost"} == 1' in ghost["expr"]
    assert not re.search(r"[<>]=?\s*\d", ghost["expr"])
    assert any("305135616" in f.read_text() for f in UNIT_TESTS)  # 291 MiB, in the firing case


def test_every_alert_has_severity_text_and_a_runbook_anchor_in_the_docs():
    headings = re.findall(r"^#+ (.+)$", DOCS.read_text(), re.MULTILINE)
    anchors = {re.sub(r"[^a-z0-9 _-]", "", h.lower()).replace(" ", "-") for h in headings}
    for rule in rules():
        assert rule["labels"]["severity"] in SEVERITIES, rule["alert"]
        annotations = rule["annotations"]
        assert annotations["summary"] and annotations["description"], rule["alert"]
        page, _, anchor = annotations["runbook_url"].partition("#")
        assert page.endswith("docs/cluster.md") and anchor == rule["alert"].lower(), rule["alert"]
        assert anchor in anchors, f"docs/cluster.md has no heading for {rule['alert']}"


def test_pod_alerts_keep_node_namespace_pod_container():
    """An aggregation may only drop labels the alert does not need: pod alerts keep the pod's (pod_uid
    too: it tells apart the pods no runtime named)."""
    for rule in rules():
        for by in re.findall(r"by \(([^)]*)\)", rule["expr"]):
            kept = {label.strip() for label in by.split(",")}
            assert "node" in kept, rule["alert"]
            if "gpuzombie_unreadable_processes" not in rule["expr"]:
                assert {"namespace", "pod", "pod_uid", "container"} <= kept, rule["alert"]


def test_pod_alerts_name_the_pod_and_word_processes_outside_any_pod():
    """A pod alert says namespace/pod where the series has a pod name (a deleted pod's too: the exporter
    keeps the names it saw), the uid where it has only that, and "outside any pod" where it has neither,
    never "/uid" or "in / container  on node" (the promtool cases render each)."""
    always_named = {
        "GpuzombieTerminatingPodHoldsGpuMemory": "kube-state-metrics' names",
        "GpuzombieForeignGpuHolder": "judged only for a named pod",
    }
    in_a_pod = {"GpuzombieStaleGpuHolder": "a removed pod's cgroup"}
    for rule in rules():
        if "pod_uid" not in rule["expr"]:
            continue
        texts = rule["annotations"]["summary"] + rule["annotations"]["description"]
        assert "{{ $labels.namespace }}/{{ $labels.pod }}" in texts, rule["alert"]
        assert "/{{ or $labels.pod $labels.pod_uid }}" not in texts, rule["alert"]
        if rule["alert"] not in always_named:
            assert "{{ if $labels.pod }}" in texts, rule["alert"]
        if rule["alert"] not in always_named | in_a_pod:
            assert "outside any pod" in texts, rule["alert"]
