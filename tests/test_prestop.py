"""prestop against real processes in real PID namespaces (root), and its planning on fake trees."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fakeproc import make_fake_proc, make_fake_root
from gpuzombie.errors import GpuzombieError
from gpuzombie.gpu.nvml import GpuDevice, GpuProcess, GpuSnapshot
from gpuzombie.observe.orphans import find_orphans
from gpuzombie.observe.pid1 import find_pid1
from gpuzombie.prestop import (
    Outcome,
    PrestopReport,
    Scope,
    Target,
    TargetResult,
    Terminator,
    plan_targets,
    render_text,
)
from gpuzombie.proc import Procfs
from gpuzombie.proc.pidfd import PinnedPids, read_start_and_state
from gpuzombie.proc.pidns import ROOT_PIDNS_INODE
from gpuzombie.proc.read import Reason, Unreadable
from markers import needs_root
from test_prestop_pod import CID, POD_DEV_SETUP

POD = Path(__file__).with_name("test_prestop_pod.py")
SRC = str(Path(__file__).resolve().parents[1] / "src")


def run_pod(scenario: str, tmp_path: Path, *, pid_namespace: bool = True, timeout: float = 60) -> dict:
    """Run ``scenario`` in a fresh pod (PID + mount namespace, own /dev) and return its findings;
    without ``pid_namespace``, in a mount namespace only (the host's PID namespace, own /dev)."""
    out = tmp_path / f"{scenario}.json"
    env = {**os.environ, "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", "")}
    pid_ns = ("--pid", "--fork", "--mount-proc", "--kill-child") if pid_namespace else ()
    subprocess.run(
        [
            "unshare",
            *pid_ns,
            "--mount",
            "sh",
            "-c",
            f'{POD_DEV_SETUP} && exec "$0" "$1" "$2" "$3"',
            sys.executable,
            str(POD),
            scenario,
            str(out),
        ],
        check=True,
        timeout=timeout,
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
    # 1.5 s timeout + 1 s kill wait + the CLI's start, which took up to 2.1 s at load 14 on 2 cores.
    assert res["wall_s"] < 10
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
    # Done when the last one exits, not at the 20 s timeout: 3.4 s at load 15 (start-up up to 2.1 s).
    assert res["wall_s"] < 10


@needs_root
@pytest.mark.parametrize("kind", ["holders", "orphans"])
@pytest.mark.slow
def test_a_target_that_forks_after_sigterm_leaves_nothing_alive_behind_an_ok(tmp_path, kind):
    """A target ignores SIGTERM and then forks a child every 20 ms (GPU holders, or plain children
    that become orphans when it dies). Before: exit 0 with 1-2 holders alive (7 of 11 runs) or ~95
    orphans (every run), because no scan followed the SIGKILL. Now the SIGKILL rounds end only on a
    scan that finds nothing in scope; whatever a final scan finds is a survivor (exit 1)."""
    trials = run_pod(f"forker-{kind}", tmp_path, timeout=240)["trials"]
    for t in trials:
        assert (t["rc"] == 0) == (t["left"] == []), t  # never "OK" while one of them lives
        assert t["rc"] in (0, 1), t
        assert t["left"] == [] and t["survivors"] == 0, t
        assert t["found_by_rescan"] >= 1, t  # the children were found by the rounds, not the plan
    print(
        f"{kind}: {len(trials)} trials, targets {[t['targets'] for t in trials]}, wall {[round(t['wall_s'], 2) for t in trials]}"
    )


@needs_root
def test_dry_run_signals_nothing(tmp_path):
    res = run_pod("dry-run", tmp_path)
    assert res["rc"] == 0
    outcomes = {r["target"]["pid"]: r["outcome"] for r in res["report"]["results"]}
    pids = res["pids"]
    assert outcomes == {pids[r]: "would_signal (dry run)" for r in ("ignore", "handle", "sleep")}
    assert all(res["alive"].values())
    assert res["wall_s"] < 10  # waits for nothing: its timeout is 20 s here
    # Nothing reached PID 1's stdout (the pod log), and the text report says its summary once.
    assert res["pid1_log"] == ""
    assert res["report"]["pid1_log"] == "off (dry run: nothing is written to PID 1)"
    assert sum(line.startswith("DRY RUN:") or "DRY RUN:" in line for line in res["text"].splitlines()) == 1


@needs_root
def test_recycled_pid_is_never_signalled(tmp_path):
    """A planned target exits and is reaped; ``ns_last_pid`` makes the next process take its pid, often
    in the same clock tick (then a (pid, start time) check would pass it); the plan is then executed."""
    res = run_pod("reuse", tmp_path)
    trials = res["trials"]
    assert len(trials) == 20 and all(t["planned"] for t in trials)
    recycled = [t for t in trials if t["recycled"]]
    assert len(recycled) >= 15, "could not recycle the pid"
    for t in recycled:
        assert t["outcome"] == "gone_before_signal", t
        assert t["replacement_exit"] == -signal.SIGKILL, t  # only our SIGKILL: it never got SIGTERM
        # What pinning by (pid, start time) after the plan would have done: taken the new process
        # exactly when it started in the victim's clock tick.
        assert t["late_pin_takes_replacement"] == t["same_tick"], t
    print(f"pid recycled in {len(recycled)} of 20 trials, {sum(t['same_tick'] for t in recycled)} in the same tick")


def _orphan_tree(root: Path) -> None:
    """PID 1 is a program (python3 train.py): neither an init nor a non-forking one."""
    make_fake_root(root)
    make_fake_proc(root, 1, ppid=0, comm="python3", cmdline=b"python3\0train.py\0", fds=("/dev/nvidia0",))
    make_fake_proc(root, 7, ppid=1, comm="python3", fds=("/dev/nvidia0", "/dev/nvidiactl"))
    make_fake_proc(root, 8, ppid=1, pgid=5)  # a re-parented orphan: keeps its dead parent's group
    make_fake_proc(root, 9, ppid=1, comm="sleep")  # leads its own group: PID 1 may have started it
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
    assert targets[8] == ("orphan: its process-group leader (pid 5) has exited",)
    excluded = {e.pid: e.reason for e in plan.excluded}
    assert excluded[1].startswith("PID 1")
    assert excluded[9] == "child of PID 1 that PID 1 may have started (cannot tell)"
    assert 10 not in excluded and 20 not in excluded  # a zombie, this process: no reason to stop them
    assert plan.unread == ()


def test_orphans_are_observes_orphans_when_pid1_is_a_program(tmp_path):
    """One rule: prestop stops exactly what observe calls an orphan and leaves its "cannot tell" alone."""
    _orphan_tree(tmp_path)
    table = Procfs(str(tmp_path)).snapshot(now=time.time())
    verdicts = {o.pid: o.verdict for o in find_orphans(table, find_pid1(table), exclude=frozenset({20}), now=0)}
    assert verdicts == {7: "cannot_tell", 8: "orphan", 9: "cannot_tell"}
    plan = plan_targets(table, GpuSnapshot(available=False, reason="no GPU"), own_pid=20)
    orphan_targets = {t.pid for t in plan.targets if any(r.startswith("orphan") for r in t.reasons)}
    assert orphan_targets == {pid for pid, v in verdicts.items() if v == "orphan"}


def test_names_a_process_chose_cannot_forge_a_line(tmp_path):
    """A comm with newlines and a terminal escape stays on its own row (a /dev/nvidia* path with them
    names no device: it is a malformed fd, never shown as a device)."""
    _orphan_tree(tmp_path)
    forged = "x\nOK: 0 targets\x1b[2J"
    fds = ("/dev/nvidia0", f"/dev/nvidia0{forged}")
    make_fake_proc(tmp_path, 40, ppid=1, comm=forged[:15], fds=fds, pgid=40)
    plan = plan_targets(Procfs(str(tmp_path)).snapshot(now=time.time()), GpuSnapshot(False, reason="-"), own_pid=20)
    results = tuple(TargetResult(t, Outcome.SURVIVED, (), None) for t in plan.targets)
    report = PrestopReport(
        plan=plan,
        unread=plan.unread,
        schema="gpuzombie.prestop/1",
        started_at=0.0,
        duration_s=0.0,
        dry_run=False,
        timeout_s=0.0,
        kill_wait_s=0.0,
        results=results,
        incomplete=0,
        survivors=len(results),
        exit_status=1,
    )
    text = render_text(report)
    assert len(text.splitlines()) == 1 + len(results) + len(plan.excluded) + len(plan.unread) + 1
    assert "\x1b" not in text and "x\\x0aOK" in text and text.splitlines()[-1].startswith("3 SURVIVED")


def test_plan_without_orphans_and_from_another_namespace(tmp_path):
    _orphan_tree(tmp_path)
    make_fake_proc(tmp_path, 11, ppid=1, fds=("/dev/nvidia0",), pidns=4026532999)
    table = Procfs(str(tmp_path)).snapshot(now=time.time())
    plan = plan_targets(table, GpuSnapshot(available=False, reason="no GPU"), own_pid=20, include_orphans=False)
    assert [t.pid for t in plan.targets] == [7]  # the GPU holder; orphan 8 is left alone
    assert {e.pid: e.reason for e in plan.excluded}[11] == "in another PID namespace"


@needs_root
def test_pid1_program_in_a_real_pod_agrees_with_observe(tmp_path):
    res = run_pod("pid1-program", tmp_path)
    pids = res["pids"]
    observed = {o["pid"]: o["verdict"] for o in res["observe"]["orphans"]}
    assert observed[pids["orphan"]] == "orphan" and observed[pids["own_child"]] == "cannot_tell"
    report = res["report"]
    assert {r["target"]["pid"] for r in report["results"]} == {p for p, v in observed.items() if v == "orphan"}
    excluded = {e["pid"]: e["reason"] for e in report["excluded"]}
    assert excluded[pids["own_child"]] == "child of PID 1 that PID 1 may have started (cannot tell)"


@needs_root
def test_host_pid_namespace_real_cgroups(tmp_path):
    """Real processes holding /dev/nvidia0 in the host's PID namespace, in real cgroups."""
    res = run_pod("host-scope", tmp_path, pid_namespace=False)
    if "skip" in res:
        pytest.skip(res["skip"])
    pids, runs = res["pids"], res["runs"]
    refused = runs["none"]
    assert refused["rc"] == 2 and "--cgroup PATH or --container ID" in refused["stderr"], refused
    assert refused["stderr"].count("\n") == 1 and all(refused["alive"].values())
    for run, inside in (("cgroup", "a"), ("container", "container")):
        report = runs[run]["report"]
        assert runs[run]["rc"] == 0, runs[run]
        assert report["in_root_pidns"] and report["scope"] and report["scope_matched"] == 1
        assert {r["target"]["pid"]: r["outcome"] for r in report["results"]} == {pids[inside]: "exited_after_sigterm"}
        assert report["pid1_log"].startswith("off (not inside a pod")
        assert not runs[run]["alive"][inside]
    assert runs["container"]["alive"] == {"a": False, "b": True, "container": False, "outside": True}


@needs_root
@pytest.mark.slow
def test_a_low_hard_open_files_limit_on_a_busy_node(tmp_path):
    """``ulimit -n 256`` (soft and hard, prlimit) with more processes on the node than that: prestop
    --cgroup pins only what is in scope. Before: a pidfd for every process of the node, then
    ``internal error: OSError: [Errno 24] Too many open files: '/proc/stat'`` and the scoped
    target never signalled. More targets than pidfds: exit 2 naming the limit, nothing signalled."""
    res = run_pod("fd-limit", tmp_path, pid_namespace=False, timeout=180)
    if "skip" in res:
        pytest.skip(res["skip"])
    assert res["visible"] > res["limit"] + 100
    one, many = res["runs"]["a"], res["runs"]["b"]
    assert one["rc"] == 0, one["stderr"][-1500:]
    assert one["report"]["scope_matched"] == 1 and one["alive"] == 0
    assert [r["outcome"] for r in one["report"]["results"]] == ["exited_after_sigterm"]
    assert many["rc"] == 2 and many["alive"] == res["limit"] + 40, many["stderr"][-1500:]
    error = many["stderr"].strip().splitlines()[-1]
    assert error.startswith("gpuzombie: error: the open-files limit (ulimit -n 256 (hard 256)) is too low"), error
    assert "nothing was signalled" in error and "internal error" not in many["stderr"]
    print(
        f"{res['visible']} /proc entries, limit {res['limit']}: {one['wall_s']:.2f} s, refused in {many['wall_s']:.2f} s"
    )


def test_a_scope_that_matches_no_process_is_an_error(tmp_path):
    """--cgroup with a path no process is in: exit 2 and one line, not a silent "OK" (JSON keeps
    scope_matched 0)."""
    path = f"/gpuzombie-no-such-cgroup-{os.getpid()}.slice"
    env = {**os.environ, "PYTHONPATH": SRC}
    for entry in (["-m", "gpuzombie", "prestop"], ["-m", "gpuzombie.prestop"]):
        for as_json in ([], ["--json"]):
            done = subprocess.run(
                [sys.executable, *entry, "--cgroup", path, "--no-nvml", "--no-pid1-log", *as_json],
                capture_output=True,
                text=True,
                env=env,
            )
            assert done.returncode == 2, done
            assert (
                done.stderr.splitlines()[-1]
                == f"gpuzombie: error: scope matched no process (cgroup {path}): is the path mistyped?"
            )
            if as_json:
                report = json.loads(done.stdout)
                assert report["scope_matched"] == 0 and report["exit_status"] == 2 and report["results"] == []
            else:
                assert done.stdout.splitlines()[-1].startswith("ERROR: scope matched no process")


def _runs_as_uid_1000() -> bool:
    """Can uid 1000 import this checkout with this interpreter (a venv under /root cannot)?"""
    if shutil.which("setpriv") is None:
        return False
    probe = ["setpriv", "--reuid=1000", "--regid=1000", "--clear-groups", sys.executable, "-c", "import gpuzombie"]
    return subprocess.run(probe, env={**os.environ, "PYTHONPATH": SRC}, capture_output=True).returncode == 0


@needs_root
def test_processes_it_cannot_read_are_reported_and_fail_the_run(tmp_path):
    if not _runs_as_uid_1000():
        pytest.skip("uid 1000 cannot run this interpreter or checkout")
    res = run_pod("unread", tmp_path)
    report, orphan = res["report"], res["pids"]["sleep"]
    assert res["rc"] == 1, res["stderr"]
    assert report["results"] == [] and res["alive"] == {"sleep": True}
    assert orphan in {u["pid"] for u in report["unread"]} and report["incomplete"] == len(report["unread"])
    assert f"could not read pid {orphan}" in res["stderr"]
    assert "1 process(es) could not be read" in res["stderr"]


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


def _host_tree(root: Path) -> Procfs:
    """The host's PID namespace: the node's GPU daemon, two pods' containers, and a session that
    shares this process's cgroup (what the old own-cgroup rule SIGTERMed)."""
    make_fake_root(root)
    host = {"pidns": ROOT_PIDNS_INODE}
    make_fake_proc(root, 1, ppid=0, comm="systemd", **host)
    make_fake_proc(root, 300, ppid=1, comm="nvidia-persiste", fds=("/dev/nvidiactl",), pgid=300, **host)
    make_fake_proc(root, 400, ppid=1, comm="python3", fds=("/dev/nvidia0",), nspid=(400, 7))
    make_fake_proc(root, 401, ppid=1, comm="tini", fds=("/dev/nvidia0",), nspid=(401, 1))
    make_fake_proc(root, 500, ppid=1, comm="python3", fds=("/dev/nvidia0",), nspid=(500, 9))
    make_fake_proc(root, 600, ppid=1, comm="python3", fds=("/dev/nvidia0",), pgid=5, **host)  # another session
    make_fake_proc(root, 20, ppid=1, pgid=5, **host)  # this process
    pod = "/kubepods.slice/kubepods-podaaaa.slice"
    cgroups = {
        300: "/system.slice/nvidia-persistenced.service",
        400: f"{pod}/cri-containerd-{CID}.scope",
        401: f"{pod}/cri-containerd-{CID}.scope",
        500: "/kubepods.slice/kubepods-podbbbb.slice/cri-containerd-" + "1" * 64 + ".scope",
        600: "/user.slice/session-1.scope",
        20: "/user.slice/session-1.scope",
    }
    for pid, cgroup in cgroups.items():
        (root / str(pid) / "cgroup").write_text(f"0::{cgroup}\n")
    return Procfs(str(root))


def test_host_pid_namespace_without_a_scope_is_refused(tmp_path):
    table = _host_tree(tmp_path).snapshot(now=time.time())
    for same_cgroup in (False, True):
        with pytest.raises(GpuzombieError, match="--cgroup PATH or --container ID") as refused:
            plan_targets(table, GpuSnapshot(available=False, reason="no GPU"), own_pid=20, same_cgroup=same_cgroup)
        assert refused.value.status == 2


@pytest.mark.parametrize(
    "scope",
    [
        Scope(cgroup="/kubepods.slice/kubepods-podaaaa.slice"),
        Scope(container=CID[:13]),
        Scope.from_options(None, f"containerd://{CID}"),
    ],
    ids=["cgroup", "container-prefix", "container-uri"],
)
def test_host_pid_namespace_acts_only_inside_the_scope(tmp_path, scope):
    table = _host_tree(tmp_path).snapshot(now=time.time())
    plan = plan_targets(table, GpuSnapshot(available=False, reason="no GPU"), own_pid=20, scope=scope)
    assert plan.in_root_pidns and not plan.orphans_included and plan.scope == scope.describe()
    assert plan.scope_matched == 2  # the container's python and its init
    assert [t.pid for t in plan.targets] == [400]
    excluded = {e.pid: e.reason for e in plan.excluded}
    assert excluded[401] == "PID 1 of its container's PID namespace (its runtime stops it)"
    assert all(excluded[pid].startswith("outside the scope") for pid in (300, 500, 600))


@pytest.mark.parametrize(
    ("cgroup", "container"),
    [
        ("/", None),
        ("kubepods.slice", None),
        ("/sys/fs/cgroup/kubepods.slice", None),
        ("/a/../b", None),
        (None, "abc"),
        (None, "XYZ" * 20),
        (None, "9ec39b91f3d"),
    ],
)
def test_scope_options_are_checked(cgroup, container):
    with pytest.raises(GpuzombieError) as bad:
        Scope.from_options(cgroup, container)
    assert bad.value.status == 2 and "\n" not in str(bad.value)


def test_unreadable_processes_are_counted_not_signalled(tmp_path):
    """A process whose namespace or files cannot be read may be ours: never a target, always reported."""
    _orphan_tree(tmp_path)
    make_fake_proc(tmp_path, 30, ppid=1, pgid=5, fds=("/dev/nvidia0",))
    os.remove(tmp_path / "30" / "ns" / "pid")
    os.symlink("garbage", tmp_path / "30" / "ns" / "pid")
    make_fake_proc(tmp_path, 31, ppid=1, pgid=5, fds=("/dev/nvidia0",))
    (tmp_path / "31" / "stat").unlink()
    os.mkfifo(tmp_path / "31" / "stat")  # a hostile tree: never opened blocking, never a target
    table = Procfs(str(tmp_path)).snapshot(now=time.time())
    denied = dataclasses.replace(
        table.processes[9], incomplete=(Unreadable("fd", Reason.ACCESS_DENIED),), nvidia_fds=()
    )
    table = dataclasses.replace(table, processes={**table.processes, 9: denied}, unread=(40,))
    plan = plan_targets(table, GpuSnapshot(available=False, reason="no GPU"), own_pid=20)
    assert {t.pid for t in plan.targets} == {7, 8}
    assert {u.pid: u.reason for u in plan.unread} == {
        30: "PID namespace unreadable",
        31: "not fully read (stat: not_regular): its state, parent and start time are unknown",
        9: "not fully read (fd: access_denied): a /dev/nvidia* fd or an orphan could hide there",
        40: "not read before the scan's deadline",
    }


def _targets_of(procs: list[subprocess.Popen]) -> list[Target]:
    """Targets that are these real processes (what a scan of a pod holding them would give)."""
    targets = []
    for p in procs:
        found = read_start_and_state("/proc", p.pid)
        assert found is not None
        targets.append(Target(p.pid, found[0], "sleep", "sleep 60", found[1], ("holds /dev/nvidia0",)))
    return targets


def test_a_scope_that_never_empties_ends_in_survivors_found_by_the_final_scan():
    """Every scan finds one more process (real ``sleep`` processes; the scanner is a stand-in that
    reports each new one as a target, as a pod that keeps forking would): the SIGKILL rounds kill
    each, and the kill wait ends with a final scan whose new target is a survivor: exit 1, never OK."""
    started: list[subprocess.Popen] = []

    def rescan() -> tuple[list[Target], PinnedPids]:
        started.append(subprocess.Popen(["sleep", "60"]))
        return _targets_of(started[-1:]), PinnedPids([started[-1].pid])

    try:
        first = [subprocess.Popen(["sleep", "60"])]
        started += first
        results = Terminator(procfs_root="/proc", rescan=rescan).run(
            _targets_of(first), PinnedPids([first[0].pid]), timeout=0.3, kill_wait=0.6
        )
        outcomes = [r.outcome for r in results]
        assert outcomes[0] is Outcome.EXITED_AFTER_SIGTERM  # sleep dies of SIGTERM
        assert outcomes[-1] is Outcome.SURVIVED and results[-1].found_by_rescan
        assert results[-1].signals and results[-1].signals[-1].startswith("SIGKILL")  # still sent its SIGKILL
        assert Outcome.EXITED_AFTER_SIGKILL in outcomes  # the rounds after the timeout
        assert set(outcomes) <= {Outcome.EXITED_AFTER_SIGTERM, Outcome.EXITED_AFTER_SIGKILL, Outcome.SURVIVED}
        assert len(results) == len(started)  # every process any scan found is in the report
    finally:
        for p in started:
            p.kill()
            p.wait()
