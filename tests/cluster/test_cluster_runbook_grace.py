"""The GraceRisk runbook says what was measured: tini first, a handler next, a preStop hook only if it
does not wait. A waiting preStop made S3 worse than S2 (issue 18), so the runbook must not recommend one
as a fix, and it quotes the committed results' medians."""

from __future__ import annotations

import re

from cluster_support import DOCS, REPO

from docs import section

RESULTS = REPO / "results" / "runtimes" / "comparison.md"


def median(scenario: str) -> float:
    """Deletion → free, PID-namespace runtime, from the committed results table."""
    found = re.search(rf"^\| {scenario} \| namespaces \| \d+ \| ([\d.]+) ", RESULTS.read_text(), re.MULTILINE)
    assert found, f"{RESULTS}: no namespaces row for {scenario}"
    return float(found[1])


def test_grace_runbook_quotes_the_measurements_in_order():
    runbook = section(DOCS.read_text(), "### GpuzombieGraceRiskGpuMemory")
    for number in (
        f"{median('s1-nofix'):.1f} s",
        f"{median('s2-tini'):.2f} s",
        f"{median('s3-tini-prestop'):.1f} s",
        f"{median('s4-fullfix'):.2f} s",
    ):
        assert number in runbook, number
    assert runbook.index("tini") < runbook.index("SIGTERM handler") < runbook.index("preStop hook")
    assert "never one that waits" in runbook
