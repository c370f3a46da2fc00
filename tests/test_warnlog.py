"""What the exporter logs of its scans' warnings (exporter.warnlog), and label values capped with a
digest (escape.label_value): pure functions on strings."""

from __future__ import annotations

import pytest

pytest.importorskip("prometheus_client", reason="prometheus-client is in the 'exporter' extra")


from gpuzombie.escape import LABEL_LIMIT, label_value
from gpuzombie.exporter.warnlog import WarningLog, kind_of


def churning(scan: int) -> list[str]:
    """Warnings as a churning node gives them: pids, ids and counts new on every scan."""
    return [
        f"CRI: {scan % 7 + 1} container(s) unknown to the CRI runtime (e.g. {scan:013x}, {scan + 1:013x}): shown by id",
        f"{scan % 5} processes could not be read (pid {1000 + scan}, {2000 + scan}): incomplete",
    ]


def test_churn_logs_a_warning_when_its_kind_appears_not_on_every_scan():
    """Issue 17 (7): 2,653 lines over 884 scans under churn."""
    log = WarningLog(remind_after_scans=240)
    lines = [line for scan in range(884) for line in log.lines(churning(scan))]
    first, reminders = lines[:2], lines[2:]
    assert all(line.startswith("warning: ") for line in first)
    # Still there but changing: one reminder per 240 scans for each of the two kinds, with its count.
    assert len(reminders) == 2 * 3 and all("(for 241 scans, changing)" in r for r in reminders[:2])
    assert log.lines([]) == [
        f"warning cleared after 884 scans: {churning(883)[0]}",
        f"warning cleared after 884 scans: {churning(883)[1]}",
    ]


def test_a_warning_that_stays_the_same_is_logged_once_and_its_end_with_a_count():
    log = WarningLog()
    absent = "CRI socket /run/containerd/containerd.sock: No such file or directory: shown by id"
    assert log.lines([absent]) == [f"warning: {absent}"]
    assert all(log.lines([absent]) == [] for _ in range(1000))
    assert log.lines([]) == [f"warning cleared after 1001 scans: {absent}"]
    assert log.lines([absent]) == [f"warning: {absent}"]  # back: logged again


def test_logged_warnings_are_escaped():
    log = WarningLog()
    (line,) = log.lines(["CRI: ListPodSandbox: evil\x1b[2J\x07\x00"])
    assert line == "warning: CRI: ListPodSandbox: evil\\x1b[2J\\x07\\x00"


def test_kinds_ignore_numbers_ids_and_lists():
    assert kind_of("3 container(s) (e.g. aaaaaaaaaaaaa, bbbbbbbbbbbbb)") == kind_of(
        "41 container(s) (e.g. 0123456789abc)"
    )
    assert kind_of("CRI socket /a: No such file") != kind_of("CRI socket /a: Permission denied")


def test_label_values_past_the_cap_stay_apart_and_bounded():
    a, b = "x" * 150 + "a", "x" * 150 + "b"
    assert label_value(a) != label_value(b)
    assert all(len(label_value(v)) == LABEL_LIMIT for v in (a, b))
    assert label_value("trainer-0") == "trainer-0"
    assert label_value("evil\nline") == "evil\\x0aline"
    # A short value written to look like a capped one cannot take a capped value's series.
    forged = label_value(a)
    assert len(forged) == LABEL_LIMIT and label_value(forged) != forged
    # Escaping that grows a value past the cap caps it too (a digest, never an over-long label).
    assert len(label_value("\x00" * 100)) == LABEL_LIMIT
