"""The lab's kubernetes runtime on the real single-node cluster: scenarios as Pods the kubelet runs
and deletes (on the session's cluster, which the lab uses and leaves up), a manifest kubectl apply'd
by ``lab pod``, and a run whose kubelet or API server is SIGKILLed under it: it fails with a line
naming which, and ``down`` (the lab's own, or ``gpuzombie cluster down``) still leaves nothing.

Bounds: the grace (2 s, 5 s) against well under it; beside ``stress-ng --cpu 2`` a pod's start took
1-4 s here and the kubelet's SIGTERM came 0.1-0.8 s after the deletion, so no bound is tighter than
the grace plus 30 s.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kube.conftest import Kube

pytest.importorskip("grpc", reason="the kubernetes runtime asks the node's containerd over CRI: the 'node' extra")

ROOT = Path(__file__).resolve().parents[2]
GRACE = 2
SMALL = ("--size-mib", "32", "--device", "cpu")
SLACK_S = 30.0


def results(out: Path) -> dict[str, dict]:
    return json.loads((out / "results.json").read_text())["scenarios"]


def at(entry: dict, name: str) -> float | None:
    return next((ev["t"] for ev in entry["events"] if ev["name"] == name), None)


def lab_pods(kube: Kube) -> list[str]:
    done = kube.kubectl("get", "pods", "-A", "-l", "gpuzombie.dev/lab-run", "-o", "name")
    return done.stdout.split()


@pytest.mark.timeout(900)
def test_scenarios_run_as_pods_the_kubelet_deletes(kube: Kube, tmp_path: Path) -> None:
    out = tmp_path / "out"
    done = kube.cli(
        "lab", "run", "--runtime", "kubernetes", "--scenario", "s1-nofix", "--scenario", "s4-fullfix",
        "--grace", str(GRACE), *SMALL, "--out", str(out),
        timeout=600, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    said = " ".join(done.stderr.split())  # the progress lines, as rich wraps them on a pipe
    assert "using the cluster up at" in said and "it stays up" in said
    runs = results(out)
    assert set(runs) == {"s1-nofix-kubernetes", "s4-fullfix-kubernetes"}
    s1, s4 = runs["s1-nofix-kubernetes"], runs["s4-fullfix-kubernetes"]
    for e in (s1, s4):
        assert e["runtime"] == "kubernetes" and e["deletion"]["leftovers"] == []
        assert e["pod"]["pod"].startswith("gpuzombie-lab/") and e["pod"]["pod_uid"]
        assert at(e, "pod-deleted") is not None  # deleted through the API server, not behind its back
        sigterm = at(e, "sigterm")
        assert sigterm is not None and e["deletion"]["requested_at"] < sigterm < e["deletion"]["requested_at"] + SLACK_S
    # S1: sleep as PID 1 drops SIGTERM; the kubelet waited the grace and containerd SIGKILLed it
    assert s1["metrics"]["waited_whole_grace"] and s1["deletion"]["pod_exit_code"] == 137
    kill = s1["deletion"]["sigkill_at"]
    assert kill is not None and kill - s1["deletion"]["sigterm_at"] >= GRACE - 0.05
    assert GRACE <= s1["metrics"]["release_latency_s"] < GRACE + SLACK_S
    assert [o["zombies"] for o in s1["observations"] if o["point"] == "after-kill"] == [2]
    # S4: the kubelet ran the preStop hook, whose SIGTERM the fixed worker obeyed, well before the grace's end
    assert s4["deletion"]["prestop_rc"] == 0
    assert [o["outcome"] for o in s4["deletion"]["prestop_outcomes"]] == ["exited_after_sigterm"]
    assert at(s4, "prestop-start") is not None and s4["deletion"]["sigkill_at"] is None
    assert not s4["metrics"]["waited_whole_grace"]
    applied = json.loads((out / "s4-fullfix-kubernetes" / "pod.json").read_text())
    assert applied["spec"]["containers"][0]["imagePullPolicy"] == "Never"
    assert kube.cli("cluster", "status", check=False).returncode == 0  # the lab left the cluster up
    assert lab_pods(kube) == []


@pytest.mark.timeout(900)
def test_lab_pod_applies_the_manifest_and_deletes_it_through_the_api_server(kube: Kube, tmp_path: Path) -> None:
    manifest = tmp_path / "pod.yaml"
    manifest.write_text((ROOT / "deploy" / "pod-nofix.yaml").read_text().replace("--size-mib 2048", "--size-mib 32"))
    out = tmp_path / "out"
    done = kube.cli(
        "lab", "pod", str(manifest), "--runtime", "kubernetes", "--grace", "5", "--device", "cpu", "--json",
        "--out", str(out),
        timeout=600, check=False,
    )  # fmt: skip
    assert done.returncode == 1, done.stderr[-3000:]  # sleep as PID 1: the whole grace, as on containerd
    (line,) = done.stdout.splitlines()
    run = json.loads(line)
    assert run["run"] == "pod-gpu-zombie-nofix-kubernetes" and run["metrics"]["waited_whole_grace"]
    assert run["pod"]["pod"] == "gpu-zombie-test/gpu-zombie-nofix"  # the manifest's own name and namespace
    assert "nvidia.com/gpu taken out of the resources" in " ".join(done.stderr.split())
    applied = json.loads((out / "pod-gpu-zombie-nofix-kubernetes" / "pod.json").read_text())
    assert "nvidia.com/gpu" not in json.dumps(applied["spec"]["containers"][0].get("resources", {}))
    assert run["deletion"]["leftovers"] == [] and lab_pods(kube) == []


# --- a component SIGKILLed under a run ----------------------------------------------------------------


def _cluster_env(tmp_name: str) -> tuple[Path, int, dict[str, str]]:
    root = Path("/var/lib") / f"gpuzombie-cluster-{tmp_name}-{os.getpid()}"
    instance = (int(os.environ.get("GPUZOMBIE_CLUSTER_INSTANCE", "0")) + 5) % 10
    src = str(ROOT / "src")
    env = dict(
        os.environ,
        GPUZOMBIE_CLUSTER_DIR=str(root),
        GPUZOMBIE_CLUSTER_INSTANCE=str(instance),
        PYTHONPATH=os.pathsep.join(filter(None, [src, os.environ.get("PYTHONPATH")])),
    )
    return root, instance, env


def _gpuzombie(env: dict[str, str], *args: str, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gpuzombie", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def _pid_of(root: Path, component: str) -> int:
    state = json.loads((root / "state.json").read_text())
    return next(p["pid"] for p in state["processes"] if p["name"] == component)


def _left(root: Path, instance: int) -> dict[str, object]:
    """What of the cluster at ``root`` is still on the host: processes naming it, mounts under it,
    its bridge, its cgroup root, the directory."""
    with open("/proc/self/mountinfo") as f:
        mounts = [line.split(" ")[4] for line in f if str(root) in line]
    processes = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            if str(root).encode() + b"/" in Path(f"/proc/{pid}/cmdline").read_bytes():
                processes.append(pid)
        except OSError:
            continue
    link = subprocess.run(
        ["ip", "-o", "link", "show", f"gzcluster{instance}"], capture_output=True, text=True, check=False
    )
    cgroups = list(Path("/sys/fs/cgroup").glob(f"*/gpuzombie-cluster{instance}"))
    cgroups += [p for p in [Path(f"/sys/fs/cgroup/gpuzombie-cluster{instance}")] if p.exists()]
    return {
        "mounts": mounts,
        "processes": processes,
        "bridge": link.stdout.strip(),
        "cgroups": [str(p) for p in cgroups],
        "dir": root.exists(),
    }


NOTHING = {"mounts": [], "processes": [], "bridge": "", "cgroups": [], "dir": False}


def _run_and_kill(env: dict[str, str], root: Path, component: str, when: str, out: Path) -> tuple[int, str]:
    """``lab run --runtime kubernetes`` (S1, 30 s grace); SIGKILL ``component`` once the run's
    progress shows ``when``; the run's exit code and its stderr."""
    run = subprocess.Popen(
        [sys.executable, "-m", "gpuzombie", "lab", "run", "--runtime", "kubernetes", "--scenario", "s1-nofix",
         "--grace", "30", *SMALL, "--out", str(out)],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert run.stderr is not None
    lines = []
    killed = False
    try:
        for line in run.stderr:
            lines.append(line)
            if not killed and when in line:
                os.kill(_pid_of(root, component), signal.SIGKILL)
                killed = True
        run.wait(300)
    finally:
        if run.poll() is None:
            run.kill()
            run.wait(60)
    assert killed, "".join(lines)[-3000:]
    return run.returncode, "".join(lines)


@pytest.mark.timeout(900)
def test_a_kubelet_killed_mid_run_fails_it_by_name_and_cluster_down_cleans_up(tmp_path: Path) -> None:
    """On a cluster that was up before the run (the lab leaves it to ``gpuzombie cluster down``):
    the kubelet dies while the pod is being deleted, so nothing would ever stop its containers."""
    if os.geteuid() != 0:
        pytest.skip("needs root")
    root, instance, env = _cluster_env("labkill")
    try:
        up = _gpuzombie(env, "cluster", "up")
        assert up.returncode == 0, up.stderr[-3000:]
        rc, err = _run_and_kill(env, root, "kubelet", "deleting the pod", tmp_path / "out")
        assert rc == 2, err[-3000:]
        last = err.strip().splitlines()[-1]
        assert last.startswith("gpuzombie: error: the kubelet (pid ") and "is gone" in last, last
        assert "gpuzombie cluster down" in last
        assert _left(root, instance)["processes"], "the cluster the run used was stopped by the run"
        started = time.monotonic()
        down = _gpuzombie(env, "cluster", "down", timeout=300)
        assert down.returncode == 0, down.stderr
        assert time.monotonic() - started < 300
        assert _left(root, instance) == NOTHING
    finally:
        _gpuzombie(env, "cluster", "down", timeout=300)


@pytest.mark.timeout(900)
def test_an_api_server_killed_mid_run_fails_it_by_name_and_the_labs_own_cluster_goes(tmp_path: Path) -> None:
    """No cluster up: the run starts its own; the API server dies between two observations (kubectl
    exec has no server to go through); the run says so and stops the cluster it started."""
    if os.geteuid() != 0:
        pytest.skip("needs root")
    root, instance, env = _cluster_env("labapikill")
    try:
        rc, err = _run_and_kill(env, root, "kube-apiserver", "observe after-spawn", tmp_path / "out")
        assert rc == 2, err[-3000:]
        assert "starting one for this run" in " ".join(err.split())
        last = err.strip().splitlines()[-1]
        assert last.startswith("gpuzombie: error: the API server (kube-apiserver) (pid ") and "is gone" in last, last
        assert "the lab stops the cluster it started" in last
        assert _left(root, instance) == NOTHING
        down = _gpuzombie(env, "cluster", "down", timeout=300)
        assert down.returncode == 0 and "nothing at" in down.stderr
    finally:
        _gpuzombie(env, "cluster", "down", timeout=300)
