"""trace.stale's judgments and k8s.liveness's pod states as pure functions (the real runtime and
PodResources paths are tests/test_stale.py's)."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys

from gpuzombie.gpu.deviceids import kubelet_ids
from gpuzombie.k8s.liveness import PodState, RuntimePods, Sandbox, judge_pods, pods_of
from gpuzombie.k8s.podresources import DeviceAssignment, PodResources
from gpuzombie.trace.stale import Dirty, Holder, judge
from markers import needs_root

UID = "11111111-2222-3333-4444-555555555555"
RUNNING = "66666666-7777-8888-9999-000000000000"
PODS = RuntimePods(source="/run/containerd/containerd.sock", ready=frozenset({RUNNING}), runtime="containerd")
HOLDER = Holder(
    pid=42,
    start_ticks=1000,
    pod_uid=UID,
    namespace="ml",
    pod="trainer-0",
    runtime="containerd",
    gpu_uuid="GPU-0000",
    live=True,
    holds_gpu=True,
    device_ids=kubelet_ids("GPU-0000", 0, None),
)
NO_RESOURCES = PodResources(source=None)


def verdict(holder: Holder, *, pods=PODS, resources=NO_RESOURCES, alive=True):
    (got,), checks = judge([holder], pods=pods, resources=resources, still_there=lambda pid, ticks: alive)
    return got, checks


def test_one_ready_sandbox_makes_a_pod_run():
    ready, not_ready = pods_of(
        [(UID, "SANDBOX_NOTREADY"), (UID, "SANDBOX_READY"), (RUNNING, "SANDBOX_NOTREADY"), ("", "x")]
    )
    assert (ready, not_ready) == (frozenset({UID}), frozenset({RUNNING}))
    pods = RuntimePods(source="s", ready=ready, not_ready=not_ready)
    assert [pods.state(u) for u in (UID, RUNNING, "other")] == [
        PodState.RUNNING,
        PodState.NOT_READY,
        PodState.NOT_LISTED,
    ]
    assert dataclasses.replace(pods, problem="down").state(UID) is PodState.UNKNOWN


SOCKET = "/run/containerd/containerd.sock"
KUBELET = "/var/lib/kubelet/pod-resources/kubelet.sock"


def kubelet_lists(*pods: tuple[str, str]) -> PodResources:
    return PodResources(source=KUBELET, pods=frozenset(pods))


def judged(sandboxes, kubelet, **kw) -> RuntimePods:
    return judge_pods(SOCKET, sandboxes, kubelet, kubelet_socket=KUBELET, runtime="containerd", **kw)


GONE = Sandbox(UID, "ml", "trainer-0", "SANDBOX_NOTREADY")
LIVE = Sandbox(RUNNING, "ml", "serve-0", "SANDBOX_READY", live_containers=1)


def test_the_kubelet_naming_a_pod_the_runtime_lacks_makes_every_pod_unknown():
    """Issue 29 item 1: asked a second runtime (one unrelated pod), every kubelet pod looked gone."""
    other = judged([Sandbox("x" * 32, "default", "other-0", "SANDBOX_READY")], kubelet_lists(("ml", "serve-0")))
    assert other.state(RUNNING) is PodState.UNKNOWN and other.state(UID) is PodState.UNKNOWN
    assert "the kubelet runs 1 pod(s) containerd at /run/containerd/containerd.sock has no sandbox of" in (
        other.problem or ""
    )
    assert "e.g. ml/serve-0" in (other.problem or "")
    agreed = judged([GONE, LIVE], kubelet_lists(("ml", "serve-0")))
    assert agreed.problem is None
    assert (agreed.state(UID), agreed.state(RUNNING), agreed.state("gone")) == (
        PodState.NOT_READY,
        PodState.RUNNING,
        PodState.NOT_LISTED,
    )
    # A runtime that lists nothing, and a kubelet that runs nothing: they agree, nothing runs.
    assert judged([], kubelet_lists()).state(UID) is PodState.NOT_LISTED


def test_without_the_kubelet_nothing_is_judged_unless_the_runtime_is_trusted():
    missing = PodResources(source=None)
    refused = judged([GONE, LIVE], missing)
    assert refused.state(UID) is PodState.UNKNOWN and f"no PodResources socket at {KUBELET}" in (refused.problem or "")
    assert "--trust-runtime-without-kubelet" in (refused.problem or "")
    failed = dataclasses.replace(kubelet_lists(), warning="kubelet PodResources: UNAVAILABLE: refused")
    assert "UNAVAILABLE: refused" in (judged([GONE], failed).problem or "")
    trusted = judged([GONE, LIVE], missing, trust_runtime=True)
    assert trusted.problem is None and trusted.state(UID) is PodState.NOT_READY
    assert "lists no pod at all" in (judged([], missing, trust_runtime=True).problem or "")


def test_a_not_ready_pod_the_kubelet_still_runs_or_with_a_live_container_is_not_stale():
    """Issue 29 item 4: the pause died (sandbox NOTREADY), the workload runs: not stale."""
    paused = dataclasses.replace(GONE, live_containers=1)
    assert judged([paused], PodResources(source=None), trust_runtime=True).state(UID) is PodState.RUNNING
    assert judged([paused], kubelet_lists()).state(UID) is PodState.RUNNING
    assert judged([GONE], kubelet_lists(("ml", "trainer-0"))).state(UID) is PodState.RUNNING  # the kubelet's
    # A StatefulSet pod recreated under a new UID: the kubelet's trainer-0 is the ready one.
    recreated = Sandbox("99999999-8888-7777-6666-555555555555", "ml", "trainer-0", "SANDBOX_READY")
    again = judged([GONE, recreated], kubelet_lists(("ml", "trainer-0")))
    assert again.state(UID) is PodState.NOT_READY and again.state(recreated.uid) is PodState.RUNNING


def test_stale_only_when_the_runtime_answered_and_the_process_is_still_there():
    got, checks = verdict(HOLDER)
    assert got[0] is Dirty.STALE and "is gone from containerd at /run/containerd" in got[1] and checks.stale
    assert verdict(dataclasses.replace(HOLDER, pod_uid=RUNNING))[0] is None
    assert verdict(HOLDER, alive=False)[0] is None  # exited with its pod: what a deletion does
    got, checks = verdict(HOLDER, pods=dataclasses.replace(PODS, problem="no CRI socket"))
    assert got[0] is Dirty.UNKNOWN and not checks.stale and checks.stale_problem == "no CRI socket"
    got, _ = verdict(dataclasses.replace(HOLDER, runtime="cri-o"))
    assert got[0] is Dirty.UNKNOWN and "runs under cri-o" in got[1]  # asked the wrong runtime: no verdict
    assert verdict(dataclasses.replace(HOLDER, pod_uid=None))[0] is None  # a host process
    assert verdict(dataclasses.replace(HOLDER, holds_gpu=False))[0] is None  # a zombie holds nothing
    assert verdict(HOLDER, pods=None)[0] is None  # nobody asked


def test_foreign_is_about_nvml_entries_on_a_gpu_given_to_other_pods():
    resources = PodResources(
        source="kubelet.sock",
        assignments=(DeviceAssignment("ml", "owner-0", "main", "nvidia.com/gpu", "GPU-0000::3"),),
    )
    running = dataclasses.replace(HOLDER, pod_uid=RUNNING)
    got, checks = verdict(running, resources=resources)
    assert got == (Dirty.FOREIGN, "the kubelet assigned GPU-0000 to ml/owner-0") and checks.foreign
    assert verdict(dataclasses.replace(running, pod="owner-0"), resources=resources)[0] is None
    assert verdict(dataclasses.replace(running, live=False), resources=resources)[0] is None  # an fd holder
    assert verdict(dataclasses.replace(running, pod=None), resources=resources)[0] is None  # no name: no verdict
    other = dataclasses.replace(running, gpu_uuid="GPU-1111", device_ids=kubelet_ids("GPU-1111", 1, None))
    got, _ = verdict(other, resources=resources)
    assert got == (Dirty.FOREIGN, "the kubelet assigned GPU-1111 to no pod")
    failed = dataclasses.replace(resources, warning="kubelet PodResources: UNAVAILABLE")
    got, checks = verdict(running, resources=failed)
    assert got is None and not checks.foreign
    assert verdict(HOLDER, resources=resources)[0][0] is Dirty.STALE  # stale wins over foreign


def test_reap_bad_pod_uid_is_one_line_exit_2(capsys):
    from gpuzombie.cli.main import main

    for bad in ("trainer-0", "6a9f5c9e9b4f4b3d8d3e1f2a3b4c5d6", "ABCDEF01-2222-3333-4444-555555555555"):
        assert main(["reap", "--pod-uid", bad]) == 2
        err = capsys.readouterr().err.strip()
        assert "is no pod UID" in err and len(err.splitlines()) == 1


@needs_root
def test_reap_refuses_outside_the_hosts_pid_namespace(tmp_path):
    """Inside a pod's PID namespace the stale pods' processes are not visible: exit 2, nothing read."""
    done = subprocess.run(
        ["unshare", "--pid", "--fork", "--mount-proc", sys.executable, "-m", "gpuzombie", "reap", "--yes"],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    assert done.returncode == 2, done.stderr
    assert "host's PID namespace" in done.stderr and len(done.stderr.strip().splitlines()) == 1
