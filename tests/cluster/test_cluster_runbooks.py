"""Runbook links and chart metadata point at this repository's docs, never at a placeholder host.

The plain rule file and the chart's PrometheusRule agree: with the default values the rule's
runbook_url is the file's (the path docs/cluster.md#<alert>), and prometheusRule.runbookBaseUrl puts
where users read that page in front of it (issue 18: both shipped https://GIT.example.com/...).
"""

from __future__ import annotations

import pytest

pytest.importorskip("yaml", reason="PyYAML is in the 'chart' extra")

import yaml
from cluster_support import ALERTS, CHART, EXPERIMENT_CHART, by_kind, render

ADMISSION_ALERTS = CHART / "files" / "gpuzombie-admission-alerts.yaml"

PLACEHOLDER = "example.com"


def runbooks(groups) -> dict[str, str]:
    """Each alert's runbook (recording rules have none)."""
    return {r["alert"]: r["annotations"]["runbook_url"] for g in groups for r in g["rules"] if "alert" in r}


def test_no_placeholder_host_is_shipped():
    for path in [
        ALERTS,
        ADMISSION_ALERTS,
        CHART / "values.yaml",
        CHART / "Chart.yaml",
        EXPERIMENT_CHART / "Chart.yaml",
    ]:
        assert "GIT.example" not in path.read_text(), path
    for chart in (CHART, EXPERIMENT_CHART):
        meta = yaml.safe_load((chart / "Chart.yaml").read_text())
        links = [meta.get("home", ""), *meta.get("sources", [])]
        assert not [link for link in links if PLACEHOLDER in link.lower()], links


def test_the_plain_file_names_this_repositorys_page():
    for alert, url in runbooks(yaml.safe_load(ALERTS.read_text())["groups"]).items():
        assert url == f"docs/cluster.md#{alert.lower()}", url


def test_the_admission_file_names_its_page():
    for alert, url in runbooks(yaml.safe_load(ADMISSION_ALERTS.read_text())["groups"]).items():
        assert url == f"docs/admission.md#{alert.lower()}", url


def test_the_rule_by_default_is_the_plain_file(helm_binary):
    rule = by_kind(render(helm_binary, {"prometheusRule": {"enabled": True}}))["PrometheusRule"]
    assert rule["spec"] == yaml.safe_load(ALERTS.read_text())


def test_the_base_url_is_put_in_front(helm_binary):
    page = "https://git.example.org/ops/gpuzombie/src/branch/main/docs/cluster.md"
    values = {"prometheusRule": {"enabled": True, "runbookBaseUrl": page}, "webhook": {"enabled": True}}
    rule = next(o for o in render(helm_binary, values) if o["kind"] == "PrometheusRule")
    urls = runbooks(rule["spec"]["groups"])
    admission = page.removesuffix("cluster.md") + "admission.md"
    expected = {a: f"{admission if a == 'GpuzombieWebhookMissedGpuPod' else page}#{a.lower()}" for a in urls}
    assert "GpuzombieWebhookMissedGpuPod" in urls and urls == expected, urls
