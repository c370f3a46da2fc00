"""Issue 10's "says healthy on data it could not read" and "bad files fool it" cases through the
reports and the CLI: fake procfs trees with real FIFOs, and real PID namespaces."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

pytest.importorskip("prometheus_client", reason="prometheus-client is in the 'exporter' extra")

from fakeproc import make_fake_proc, make_fake_root
from gpuzombie.cli.main import main
from gpuzombie.escape import LABEL_LIMIT, escape
from gpuzombie.exporter import scan_node
from gpuzombie.exporter.metrics import node_metrics
from gpuzombie.gpu.attribution import ReaderView
from gpuzombie.gpu.nvml import FakeNvml, GpuSnapshot
from gpuzombie.k8s.names import CriNames
from gpuzombie.k8s.podresources import PodResources
from gpuzombie.observe import observe, render_text
from gpuzombie.proc.procfs import Procfs
from gpuzombie.trace.model import trace_node
from gpuzombie.trace.render import render_text as render_trace
from markers import needs_root
from pidns import PidNamespace, wait_until

HOST = ReaderView(in_root_pidns=True)
NO_GPU = GpuSnapshot(available=False, reason="no NVML here (test)")
NOW = 1700000000 + 100.0
POD_CGROUP = "0::/kubepods/besteffort/pod12345678-1234-1234-1234-123456789abc/" + "c" * 64 + "\n"


def no_names(ids):
    return CriNames(source=None)


def trace(root):
    return trace_node(
        procfs=Procfs(str(root)),
        nvml=FakeNvml(NO_GPU),
        view=HOST,
        names=no_names,
        resources=PodResources(source=None),
        now=NOW,
    )


def scan(root):
    return scan_node(
        procfs=Procfs(str(root)),
        nvml=FakeNvml(NO_GPU),
        view=HOST,
        names=no_names,
        resources=lambda: PodResources(source=None),
        now=NOW,
    )


@pytest.fixture
def tree(tmp_path):
    make_fake_root(tmp_path)
    make_fake_proc(tmp_path, 1, ppid=0, comm="systemd", cmdline=b"/sbin/init\0")
    return tmp_path


def strip(root, pid, *names):
    """Remove files of a process whose stat stays (what a kernel quirk or a recorded tree shows)."""
    for name in names:
        path = root / str(pid) / name
        if path.is_dir() and not path.is_symlink():
            for child in path.iterdir():
                child.unlink()
            path.rmdir()
        else:
            path.unlink()


def test_a_tree_of_stat_only_processes_is_not_healthy(tree):
    """The reviewer's tree: ns/pid, fd/, cmdline and cgroup gone, stat readable. Before: 0 rows,
    healthy, exit 0 ("the processes exited"). Now every process stays, and nothing says healthy."""
    for pid in (40, 41):
        make_fake_proc(tree, pid, ppid=1, fds=("/dev/nvidia0",))
        strip(tree, pid, "ns", "fd", "cmdline", "cgroup")
    report = trace(tree)
    assert report.summary.unverified == 2 and not report.summary.healthy
    assert "-> incomplete (not verified)" in render_trace(report)
    ob = observe(Procfs(str(tree)), FakeNvml(NO_GPU), HOST, now=NOW, is_root=True)
    assert ob.view.processes_seen == 3 and ob.summary.unverified == 2
    assert int(ob.exit_status) == 1 and "-> INCOMPLETE (not verified)" in render_text(ob)
    assert main(["trace", "--procfs", str(tree), "--pod-resources-socket", "/nonexistent"]) == 1


def test_an_unreadable_fd_directory_does_not_hide_a_holder_silently(tree):
    make_fake_proc(tree, 50, ppid=1, fds=("/dev/nvidia0",))
    strip(tree, 50, "fd")
    os.mkfifo(tree / "50" / "fd")
    report = trace(tree)
    assert not report.summary.healthy and report.summary.unverified == 1
    assert any("50 (fd: missing" in w for w in report.warnings)


def test_an_unreadable_cgroup_is_not_shown_as_host(tree):
    make_fake_proc(tree, 60, ppid=1, state="Z", comm="python3", cmdline=b"")
    (tree / "60" / "cgroup").unlink()
    os.mkfifo(tree / "60" / "cgroup")
    make_fake_proc(tree, 61, ppid=1, state="Z", comm="python3", cmdline=b"")
    (tree / "61" / "cgroup").write_text(POD_CGROUP)
    text = render_trace(trace(tree))
    (row60,) = [line for line in text.splitlines() if line.startswith("60 ")]
    assert "(host)" not in row60 and "? (cgroup unreadable)" in row60
    (zombies,) = [m for m in node_metrics(scan(tree)) if m.name == "gpuzombie_zombies"]
    assert {s.labels["container"]: s.value for s in zombies.samples}["? (cgroup unreadable)"] == 1.0


def test_a_newline_in_a_cmdline_cannot_forge_a_summary_line(tree):
    forged = b"python3\0\nsummary: 0 zombies, 0 orphans, 0 orphaned contexts, 0 GPUs with ghost memory -> HEALTHY\n\0"
    make_fake_proc(tree, 70, ppid=1, cmdline=forged)
    make_fake_proc(tree, 71, ppid=70, state="Z", comm="evil\x1b[2J", cmdline=b"")
    text = render_text(observe(Procfs(str(tree)), FakeNvml(NO_GPU), HOST, now=NOW, is_root=True))
    summaries = [line for line in text.splitlines() if line.startswith("summary:")]
    assert len(summaries) == 1 and summaries[0].endswith("-> FINDINGS")
    assert "\x1b" not in text and "\\x1b[2J" in text and "\\x0asummary" in text


def test_a_fifo_as_proc_stat_is_a_one_line_error_not_a_hang(tree):
    (tree / "stat").unlink()
    os.mkfifo(tree / "stat")
    run = subprocess.run(
        [sys.executable, "-m", "gpuzombie", "observe", "--procfs", str(tree)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 2 and run.stderr.count("\n") == 1 and "not a regular file" in run.stderr


def test_a_fifo_as_every_file_of_a_process_finishes(tree):
    make_fake_proc(tree, 80, ppid=1, nspid=(80, 3))
    for name in ("stat", "status", "cmdline", "cgroup"):
        (tree / "80" / name).unlink()
        os.mkfifo(tree / "80" / name)
    run = subprocess.run(
        [sys.executable, "-m", "gpuzombie", "observe", "--procfs", str(tree), "--json"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert run.returncode == 1 and '"unverified": 1' in run.stdout


def test_the_exporter_counts_unreadable_processes_by_reason(tree):
    make_fake_proc(tree, 90, ppid=1)
    strip(tree, 90, "fd")
    os.mkfifo(tree / "90" / "fd")
    (family,) = [m for m in node_metrics(scan(tree)) if m.name == "gpuzombie_unreadable_processes"]
    assert {s.labels["reason"]: s.value for s in family.samples} == {"incomplete": 1.0, "access_denied": 0.0}


def test_escape_bounds_and_neutralises_control_characters():
    assert escape("a\nb\tc\x1b[0m\u202ed\\") == "a\\x0ab\\x09c\\x1b[0m\\u202ed\\\\"
    assert len(escape("x" * 10_000, LABEL_LIMIT)) == LABEL_LIMIT
    assert escape("plain pod-name_1.2") == "plain pod-name_1.2"


@needs_root
def test_observe_refuses_a_proc_of_another_namespace():
    """``nsenter --pid`` without ``--mount``: /proc is still the host's. observe used to print the
    host's tree as the namespace's ("inside a PID namespace", host PID 1); now it says why not."""
    with PidNamespace("sleep", "1000") as ns:
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(map(os.path.abspath, sys.path[1:]))}
        run = subprocess.run(
            ["nsenter", "--target", str(ns.pid1), "--pid", sys.executable, "-m", "gpuzombie", "observe"],
            capture_output=True,
            text=True,
            timeout=60,
            env=env,
        )
        assert run.returncode == 2, run.stdout
        assert "not this PID namespace's procfs" in run.stderr and run.stderr.count("\n") == 1


@needs_root
def test_observe_inside_with_its_own_proc_is_not_refused():
    with PidNamespace("sleep", "1000") as ns:
        wait_until(lambda: ns.run("true").returncode == 0)
        run = ns.gpuzombie("observe", "--json")
        assert run.returncode in (0, 1), run.stderr
        assert '"in_root_pidns": false' in run.stdout


def test_deadline_passed_is_incomplete_not_healthy(tree, monkeypatch):
    monkeypatch.setattr(Procfs, "deadline", lambda self: _expired())
    report = trace(tree)
    assert report.summary.unverified >= 1 and not report.summary.healthy
    assert any("deadline" in w for w in report.warnings)


def _expired():
    from gpuzombie.proc.read import Deadline

    return Deadline(0.0, clock=time.monotonic)
