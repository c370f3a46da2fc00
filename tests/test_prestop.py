"""prestop against real processes in real PID namespaces (root), and its planning on fake trees."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fakeproc import make_fake_proc, make_fake_root
from gpuzombie.gpu.nvml import GpuDevice, GpuProcess, GpuSnapshot
from gpuzombie.prestop import plan_targets
from gpuzombie.proc import Procfs
from markers import needs_root
from test_prestop_pod import POD_DEV_SETUP

POD = Path(__file__).with_name("test_prestop_pod.py")
SRC = str(Path(__file__).resolve().parents[1] / "src")


def run_pod(scenario: str, tmp_path: Path) -> dict:
    """Run ``scenario`` in a fresh pod (PID + mount namespace, own /dev) and return its findings."""
    out = tmp_path / f"{scenario}.json"
    env = {**os.environ, "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", "")}
    subprocess.run(
        [
            "unshare",
            "--pid",
            "--fork",
            "--mount-proc",
            "--mount",
            "--kill-child",
            "sh",
            "-c",
            f'{POD_DEV_SETUP} && exec "$0" "$1" "$2" "$3"',
            sys.executable,
            str(POD),
            scenario,
            str(out),
        ],
        check=True,
        timeout=60,
        env=env,
    )
    result = json.loads(out.read_text())
    result["pid1_log"] = Path(str(out) + ".pid1.log").read_text()
    return result


@needs_root
def test_prestop_stops_ignoring_and_handling_workers_and_orphans(tmp_path):
    res = run_pod("e2e", tmp_path)
    assert res["rc"] == 0, res["stderr"]
    report, pids = res["report"], res["pids"]
    outcomes = {r["target"]["pid"]: r["outcome"] for r in report["results"]}
    # SIGTERM is enough for the handling worker and the plain orphan; the ignoring one needs SIGKILL.
    assert outcomes[pids["handle"]] == "exited_after_sigterm"
    assert outcomes[pids["sleep"]] == "exited_after_sigterm"
    assert outcomes[pids["ignore"]] == "exited_after_sigkill"
    ignore = next(r for r in report["results"] if r["target"]["pid"] == pids["ignore"])
    assert ignore["signals"][0].startswith("SIGTERM") and ignore["signals"][1].startswith("SIGKILL")
    assert 1.4 <= float(ignore["signals"][1].split("@")[1]) < 3.0
    assert any("holds /dev/nvidia0" in reason for reason in ignore["target"]["reasons"])
    # Never touched: another PID namespace's GPU holder, PID 1's own group leader, PID 1.
    assert res["alive"] == {
        "ignore": False,
        "handle": False,
        "sleep": False,
        "nested_unshare": True,
        "nested": True,
        "bystander": True,
    }
    assert set(outcomes) == {pids["ignore"], pids["handle"], pids["sleep"]}
    excluded = {e["pid"]: e["reason"] for e in report["excluded"]}
    assert excluded[pids["nested"]] == "in another PID namespace"
    assert report["survivors"] == 0 and report["exit_status"] == 0
    assert res["wall_s"] < 6
    # The live log reached PID 1's stdout (the container log `kubectl logs` shows).
    assert "gpuzombie prestop:" in res["pid1_log"] and "SIGKILL" in res["pid1_log"]
    assert report["pid1_log"] == "written to /proc/1/fd/1"


@needs_root
def test_children_orphaned_by_the_first_round_are_stopped_too(tmp_path):
    res = run_pod("cascade", tmp_path)
    assert res["rc"] == 0, res["stderr"]
    results = {r["target"]["pid"]: r for r in res["report"]["results"]}
    family, child = res["pids"]["family"], res["pids"]["child"]
    assert results[family]["outcome"] == "exited_after_sigterm" and not results[family]["found_by_rescan"]
    assert results[child]["outcome"] == "exited_after_sigterm" and results[child]["found_by_rescan"]
    assert res["alive"] == {"family": False, "child": False}
    assert res["wall_s"] < 3  # done when the last one exits, not at the timeout


@needs_root
def test_dry_run_signals_nothing(tmp_path):
    res = run_pod("dry-run", tmp_path)
    assert res["rc"] == 0
    outcomes = {r["target"]["pid"]: r["outcome"] for r in res["report"]["results"]}
    pids = res["pids"]
    assert outcomes == {pids[r]: "would_signal (dry run)" for r in ("ignore", "handle", "sleep")}
    assert all(res["alive"].values())
    assert res["wall_s"] < 3


@needs_root
@pytest.mark.parametrize("scenario", ["reuse", "reuse-nopidfd"])
def test_recycled_pid_is_never_signalled(tmp_path, scenario):
    res = run_pod(scenario, tmp_path)
    assert res["victim"] in res["planned"]
    assert res["replacement"] == res["victim"], "could not recycle the pid"
    assert res["outcomes"][str(res["victim"])] == "pid_reused_not_signalled"
    assert res["replacement_alive"]


def _orphan_tree(root: Path) -> None:
    make_fake_root(root)
    make_fake_proc(root, 1, ppid=0, comm="sleep", cmdline=b"sleep\0infinity\0", fds=("/dev/nvidia0",))
    make_fake_proc(root, 7, ppid=1, comm="python3", fds=("/dev/nvidia0", "/dev/nvidiactl"))
    make_fake_proc(root, 8, ppid=1, pgid=5)  # a re-parented orphan: keeps its dead parent's group
    make_fake_proc(root, 9, ppid=1, comm="sleep")  # PID 1's own child leading its group: left alone
    make_fake_proc(root, 10, ppid=1, state="Z", pgid=5)
    make_fake_proc(root, 20, ppid=1, pgid=5)  # this process


def test_plan_on_a_fake_tree_uses_nvml_fds_and_orphans(tmp_path):
    _orphan_tree(tmp_path)
    table = Procfs(str(tmp_path)).snapshot(now=time.time())
    gpus = GpuSnapshot(
        available=True,
        devices=(
            GpuDevice(
                index=0,
                uuid="GPU-0",
                name="H200",
                memory_total=1 << 37,
                memory_used=3281 << 20,
                memory_free=0,
                memory_reserved=615 << 20,
                processes=(GpuProcess(pid=7, used_memory=2658 << 20, kind="compute"),),
            ),
        ),
    )
    plan = plan_targets(table, gpus, own_pid=20)
    targets = {t.pid: t.reasons for t in plan.targets}
    assert set(targets) == {7, 8}
    assert "listed by NVML (2658 MiB)" in targets[7]
    assert targets[8] == ("orphan (re-parented to PID 1)",)
    excluded = {e.pid: e.reason for e in plan.excluded}
    assert excluded[1].startswith("PID 1") and excluded[20] == "this process"
    assert excluded[10].startswith("zombie")
    assert 9 not in excluded


def test_plan_without_orphans_and_from_another_namespace(tmp_path):
    _orphan_tree(tmp_path)
    make_fake_proc(tmp_path, 11, ppid=1, fds=("/dev/nvidia0",), pidns=4026532999)
    table = Procfs(str(tmp_path)).snapshot(now=time.time())
    plan = plan_targets(table, GpuSnapshot(available=False, reason="no GPU"), own_pid=20, include_orphans=False)
    assert [t.pid for t in plan.targets] == [7]  # the GPU holder; orphan 8 is left alone
    assert {e.pid: e.reason for e in plan.excluded}[11] == "in another PID namespace"


def test_cli_refuses_a_foreign_procfs(tmp_path):
    _orphan_tree(tmp_path)
    done = subprocess.run(
        [sys.executable, "-m", "gpuzombie", "prestop", "--procfs", str(tmp_path), "--no-pid1-log"],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 2
    assert "gpuzombie: error:" in done.stderr


@needs_root
def test_stdlib_entry_point_in_a_pod_without_click(tmp_path):
    """``python3 -m gpuzombie.prestop`` (what a training image runs) needs neither click nor rich."""
    script = (
        "import sys; sys.modules['click'] = None; sys.modules['rich'] = None; "
        "from gpuzombie.prestop.hook import main; sys.exit(main(['--json', '--no-nvml']))"
    )
    env = {**os.environ, "PYTHONPATH": SRC}
    done = subprocess.run(
        ["unshare", "--pid", "--fork", "--mount-proc", "--kill-child", sys.executable, "-c", script],
        capture_output=True,
        text=True,
        env=env,
        timeout=30,
    )
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["schema"] == "gpuzombie.prestop/1" and report["results"] == []
    assert report["pid1_log"] == "PID 1's stdout is our own stdout"


def test_same_cgroup_keeps_to_this_container(tmp_path):
    """shareProcessNamespace: another container's GPU holder shares the PID namespace, not the cgroup."""
    _orphan_tree(tmp_path)
    (tmp_path / "7" / "cgroup").write_text("0::/kubepods.slice/other-container\n")
    table = Procfs(str(tmp_path)).snapshot(now=time.time())
    gpus = GpuSnapshot(available=False, reason="no GPU")
    assert {t.pid for t in plan_targets(table, gpus, own_pid=20).targets} == {7, 8}
    plan = plan_targets(table, gpus, own_pid=20, same_cgroup=True)
    assert {t.pid for t in plan.targets} == {8}
    assert {e.pid: e.reason for e in plan.excluded}[7] == "in another cgroup (another container of the pod)"


@pytest.mark.parametrize(
    ("args", "env"),
    [
        (["--timeout", "x"], {}),
        (["--timeout", "nan"], {}),
        (["--kill-wait", "-1"], {}),
        ([], {"GPUZOMBIE_PRESTOP_TIMEOUT": "abc"}),
    ],
    ids=["not-a-number", "nan", "negative", "bad-env"],
)
def test_stdlib_entry_point_usage_errors_are_one_line_exit_2(args, env):
    done = subprocess.run(
        [sys.executable, "-m", "gpuzombie.prestop", "--dry-run", "--no-nvml", "--no-pid1-log", *args],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": SRC, **env},
    )
    assert done.returncode == 2
    assert done.stderr.startswith("gpuzombie: ") and done.stderr.count("\n") == 1, done.stderr
    assert done.stdout == ""


def test_host_pid_namespace_keeps_to_its_own_cgroup(tmp_path):
    """A hostPID pod's hook (or a node shell) shares the namespace with nvidia-persistenced and
    every other hostPID pod: only its own cgroup's GPU holders are targets, and no orphans."""
    from gpuzombie.prestop.targets import ROOT_PIDNS_INODE

    make_fake_root(tmp_path)
    host = {"pidns": ROOT_PIDNS_INODE}
    make_fake_proc(tmp_path, 1, ppid=0, comm="systemd", **host)
    make_fake_proc(tmp_path, 300, ppid=1, comm="nvidia-persiste", fds=("/dev/nvidiactl",), pgid=300, **host)
    make_fake_proc(tmp_path, 400, ppid=1, comm="python3", fds=("/dev/nvidia0",), pgid=5, **host)
    make_fake_proc(tmp_path, 500, ppid=1, comm="python3", fds=("/dev/nvidia0",), pgid=5, **host)
    make_fake_proc(tmp_path, 20, ppid=1, pgid=5, **host)  # this process
    for pid, cgroup in ((300, "/system.slice/nvidia-persistenced.service"), (400, "/kubepods.slice/other")):
        (tmp_path / str(pid) / "cgroup").write_text(f"0::{cgroup}\n")
    table = Procfs(str(tmp_path)).snapshot(now=time.time())
    plan = plan_targets(table, GpuSnapshot(available=False, reason="no GPU"), own_pid=20)
    assert plan.in_root_pidns and not plan.orphans_included
    assert [t.pid for t in plan.targets] == [500]  # same cgroup as this process
    excluded = {e.pid: e.reason for e in plan.excluded}
    assert excluded[300].startswith("in another cgroup (host PID namespace")
    assert excluded[400].startswith("in another cgroup (host PID namespace")
