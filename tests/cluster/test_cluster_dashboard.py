"""The Grafana dashboard for on-call (issue 35, item 5), read as Grafana's own schema reads it.

No Grafana server can run here (Debian and npm ship none; the Grafana Go module is AGPL): the
Grafana Foundation SDK's strict decoder (tests/cluster/grafana_sdk, Go, Apache-2.0) reads the file
and the chart's rendering of it, with every panel's options by its panel plugin's schema and every
query by Prometheus's. Its first row is the six stat panels on-call reads first; no per-node panel
draws every node; a GPU is its node and index; and every panel that reads the series an alert fires
on links that alert's runbook. What each query returns on a real Prometheus is
test_cluster_prometheus.py's; what it looks like, tests/cluster/dashboard_preview.py's screenshot."""

from __future__ import annotations

import copy
import json
import re
import shutil
import subprocess
from functools import cache
from pathlib import Path
from typing import Any

import pytest

yaml = pytest.importorskip("yaml", reason="PyYAML is in the 'chart' extra")

from cluster_support import ALERTS, CHART, DASHBOARD, DOCS, REPO, by_kind, render  # noqa: E402

SDK = Path(__file__).resolve().parent / "grafana_sdk"
ADMISSION_ALERTS = CHART / "files" / "gpuzombie-admission-alerts.yaml"
ON_CALL = {
    "Dirty GPUs now": "short",
    "Held by stale holders": "bytes",
    "Held by ghosts": "bytes",
    "Held by D-state holders": "bytes",
    "Pods in grace waste": "short",
    "Exporters down": "short",
}
FINDINGS_ONLY = ("gpuzombie_dirty_gpu_holders", "gpuzombie_gpu_held_memory_bytes")
"""Series the exporter serves only while there is a finding: a panel of them draws only offenders."""


def board() -> dict[str, Any]:
    return json.loads(DASHBOARD.read_text())


def panels(dashboard: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    return [p for p in (dashboard or board())["panels"] if p["type"] != "row"]


@cache
def sdk_binary(out: str) -> str:
    if shutil.which("go") is None:
        pytest.skip("go is not installed (the Grafana Foundation SDK check is a Go program)")
    binary = str(Path(out) / "grafana_sdk")
    built = subprocess.run(
        ["go", "build", "-mod=readonly", "-o", binary, "."], cwd=SDK, capture_output=True, text=True, timeout=900
    )
    assert built.returncode == 0, built.stderr
    return binary


def sdk_check(binary: str, dashboard: dict[str, Any], tmp_path: Path) -> subprocess.CompletedProcess[str]:
    path = tmp_path / "dashboard.json"
    path.write_text(json.dumps(dashboard))
    return subprocess.run([binary, str(path)], capture_output=True, text=True, timeout=60)


def test_the_grafana_sdk_decodes_the_file_and_the_charts_rendering_strictly(helm_binary, tmp_path_factory):
    """Before: 66 errors (panel links without their schema's fields, options without their panel
    plugin's required ones, the datasource variable's empty `current`)."""
    binary = sdk_binary(str(tmp_path_factory.mktemp("sdk")))
    tmp = tmp_path_factory.mktemp("boards")
    got = sdk_check(binary, board(), tmp)
    assert got.returncode == 0, got.stderr
    assert [p["title"] for p in json.loads(got.stdout)["panels"]] == [p["title"] for p in board()["panels"]]
    values = {"prometheusRule": {"runbookBaseUrl": "https://git.example.org/ops/gpuzombie/docs/cluster.md"}}
    rendered = json.loads(by_kind(render(helm_binary, values))["ConfigMap"]["data"]["gpuzombie.json"])
    got = sdk_check(binary, rendered, tmp)
    assert got.returncode == 0, got.stderr


def test_the_grafana_sdk_refuses_a_mistake(tmp_path_factory):
    binary = sdk_binary(str(tmp_path_factory.mktemp("sdk")))
    broken = board()
    broken["panels"][1]["gridpos"] = broken["panels"][1].pop("gridPos")
    got = sdk_check(binary, broken, tmp_path_factory.mktemp("broken"))
    assert got.returncode == 1 and "gridpos" in got.stderr, got.stderr
    mistyped = board()
    mistyped["panels"][1]["options"]["colorMode"] = 3
    got = sdk_check(binary, mistyped, tmp_path_factory.mktemp("mistyped"))
    assert got.returncode == 1 and "colorMode" in got.stderr, got.stderr


def test_the_first_row_is_what_on_call_reads_first():
    row, *rest = board()["panels"]
    assert row["type"] == "row" and row["gridPos"]["y"] == 0
    stats = rest[: len(ON_CALL)]
    assert {p["title"]: p["fieldConfig"]["defaults"]["unit"] for p in stats} == ON_CALL
    assert all(p["type"] == "stat" and p["gridPos"]["y"] == 1 for p in stats)
    assert sum(p["gridPos"]["w"] for p in stats) == 24  # one line
    for p in stats:
        (target,) = p["targets"]
        assert target["instant"] is True and target["expr"].endswith(" or vector(0)"), p["title"]  # 0, not No data
        steps = p["fieldConfig"]["defaults"]["thresholds"]["steps"]
        assert [s["color"] for s in steps] == ["green", "red"] and steps[1]["value"] == 1, p["title"]
    assert rest[len(ON_CALL)]["type"] == "row"


def test_panels_tile_the_grid():
    cells: dict[tuple[int, int], str] = {}
    for p in board()["panels"]:
        g = p["gridPos"]
        assert g["x"] >= 0 and g["x"] + g["w"] <= 24, p["title"]
        for x in range(g["x"], g["x"] + g["w"]):
            for y in range(g["y"], g["y"] + g["h"]):
                assert (x, y) not in cells, (p["title"], cells.get((x, y)))
                cells[(x, y)] = p["title"]
    ids = [p["id"] for p in board()["panels"]]
    assert len(ids) == len(set(ids))


def test_no_panel_draws_every_node():
    """Per-node lines are the 10 most (or least) or only offenders: "Zombies per node" and "Orphans
    per node" drew every node, "Exporters up" and "NVML available" too."""
    unbounded = []
    for p in panels():
        for t in p.get("targets", []):
            per_node = re.search(r"\{\{(node|Hostname)\}\}", t["legendFormat"])
            bounded = re.match(r"(topk|bottomk)\(\d+,", t["expr"]) or "topk(" in t["expr"]
            only_findings = any(m in t["expr"] for m in FINDINGS_ONLY) or re.search(r"== [01]$", t["expr"])
            if p["type"] == "timeseries" and per_node and not (bounded or only_findings):
                unbounded.append(f"{p['title']} {t['refId']}")
    assert unbounded == []


def test_gpu_memory_accounted_keeps_each_gpu_apart():
    """Under "All" it summed GPU index k of every node into one line (sum by (gpu))."""
    (p,) = [p for p in panels() if p["title"].startswith("GPU memory accounted")]
    for t in p["targets"]:
        assert "by (node, gpu, UUID)" in t["expr"] and "sum by (gpu)" not in t["expr"], t["expr"]
        assert "{{node}} GPU {{gpu}}" in t["legendFormat"]


@cache
def alerts() -> dict[str, tuple[str, str]]:
    """Each alert: (the series its expression starts from, the runbook variable of its page)."""
    found = {}
    for path, variable in ((ALERTS, "runbook"), (ADMISSION_ALERTS, "admission_runbook")):
        for group in yaml.safe_load(path.read_text())["groups"]:
            for rule in group["rules"]:
                if "alert" in rule:
                    metric = re.search(r"\b(gpuzombie[_:][a-z0-9_:]+|up)\b", rule["expr"]).group(1)
                    found[rule["alert"]] = ("gpuzombie:exporter_target" if metric == "up" else metric, variable)
    return found


def reads(panel: dict[str, Any], metric: str) -> bool:
    return any(re.search(rf"(?<![\w:]){re.escape(metric)}(?![\w:])", t["expr"]) for t in panel.get("targets", []))


def runbook_links(panel: dict[str, Any]) -> dict[str, str]:
    return {link["title"].removeprefix("Runbook: "): link["url"] for link in panel.get("links", [])}


def test_every_panel_that_backs_an_alert_links_its_runbook():
    missing, linked = [], set()
    for p in panels():
        links = runbook_links(p)
        linked |= set(links)
        for alert, (metric, variable) in alerts().items():
            if reads(p, metric) and links.get(alert) != f"${{{variable}}}#{alert.lower()}":
                missing.append((p["title"], alert))
        for alert, url in links.items():
            assert alert in alerts() and url == f"${{{alerts()[alert][1]}}}#{alert.lower()}", (p["title"], url)
    assert missing == []
    assert linked == set(alerts())  # every alert's runbook is a click away
    anchors = set()  # a heading's anchor, or an explicit <a id>
    for page in (DOCS, REPO / "docs" / "admission.md"):
        text = page.read_text()
        anchors |= {h.lower() for h in re.findall(r"^#+ (\w+)$", text, re.MULTILINE)}
        anchors |= set(re.findall(r'<a id="([\w-]+)"></a>', text))
    assert {a.lower() for a in alerts()} - anchors == set()


def test_the_runbook_links_go_where_the_alerts_runbook_urls_go(helm_binary):
    def constants(values: dict[str, Any]) -> dict[str, str]:
        cm = by_kind(render(helm_binary, values))["ConfigMap"]
        listed = json.loads(cm["data"]["gpuzombie.json"])["templating"]["list"]
        return {v["name"]: v["query"] for v in listed if v["type"] == "constant"}

    assert constants({}) == {"runbook": "docs/cluster.md", "admission_runbook": "docs/admission.md"}
    page = "https://git.example.org/ops/gpuzombie/src/branch/main/docs/cluster.md"
    values = {"prometheusRule": {"enabled": True, "runbookBaseUrl": page}}
    assert constants(values) == {"runbook": page, "admission_runbook": page.replace("cluster.md", "admission.md")}
    rule = by_kind(render(helm_binary, values))["PrometheusRule"]
    urls = {
        r["annotations"]["runbook_url"].split("#")[0]
        for g in rule["spec"]["groups"]
        for r in g["rules"]
        if "alert" in r
    }
    assert urls == {page}
    quoted = copy.deepcopy(values)
    quoted["prometheusRule"]["runbookBaseUrl"] = 'https://git.example.org/a"b/docs/cluster.md'
    assert constants(quoted)["runbook"] == 'https://git.example.org/a"b/docs/cluster.md'  # JSON-escaped, still valid
