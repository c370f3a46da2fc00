"""The preStop hook run by the real kubelet: a GPU pod applied with the opt-in
``gpuzombie.dev/prestop: "true"`` comes out of the deployed webhook with tini and the hook
(``python3 -S -I /.gpuzombie/prestop.pyz --timeout 20``, the zipapp its init container copies from
the node image); its container is busybox with this machine's python3 by hostPath (tests/kube/pods.py).
On ``kubectl delete`` the kubelet runs the hook before it stops the container: the worker (a holder
of a stand-in /dev/nvidia0) is sent SIGTERM by the hook's own process, which the worker names
(sigwaitinfo's si_pid), within seconds of the deletion; and a worker that ignores SIGTERM holds the
deletion for the hook's --timeout (then its SIGKILL), not for the grace."""

from __future__ import annotations

import time
from pathlib import Path

from kube import chart, pods
from kube.api import Api, wait_for
from kube.conftest import Webhook

HOOK = "python3 -S -I /.gpuzombie/prestop.pyz --timeout 20"
"""What the webhook injects for the default 30 s grace: --timeout two thirds of it."""
SIGTERM_WITHIN_S = 15.0
"""Deletion -> the hook's SIGTERM at the worker: 0.3 s here idle; the hook is a python3 start
(~0.1 s) after the kubelet's preStop exec. Far below the 30 s grace either way."""


def test_the_kubelet_runs_the_injected_hook_which_stops_the_worker(
    kube, api: Api, webhook: Webhook, gpus: int, tmp_path: Path
):
    evidence = pods.evidence_dir(tmp_path / "evidence")
    pod = pods.gpu_pod("hooked", chart.PROBE_NAMESPACE, evidence, annotations={"gpuzombie.dev/prestop": "true"})
    warnings = pods.kubectl_apply(kube, pod)
    assert "add the gpuzombie preStop hook to container train" in warnings
    live = pods.wait_ready(api, pod)
    container = live["spec"]["containers"][0]
    assert container["lifecycle"]["preStop"]["exec"]["command"] == HOOK.split()
    assert container["command"][:4] == ["/.gpuzombie/tini-static", "-s", "-g", "--"]
    wait_for("the worker", lambda: (evidence / "hooked.json.ready").exists(), timeout=60)
    deleted_at = time.time()
    took = pods.delete_and_wait(api, pod)
    got = pods.read_evidence(evidence, "hooked")
    assert got is not None, "the worker never got SIGTERM"
    assert got["sender"] == HOOK  # the kubelet's preStop exec, in the container, signalled it
    assert 0 <= got["at"] - deleted_at < SIGTERM_WITHIN_S
    assert took < 25  # the hook's SIGTERM and tini: not the 30 s grace that `sleep` as PID 1 costs


def test_the_kubelet_waits_for_the_hook_on_a_worker_that_ignores_sigterm(
    kube, api: Api, webhook: Webhook, gpus: int, tmp_path: Path
):
    """The hook waits its --timeout for the worker, then SIGKILLs it; the kubelet waits for the hook
    before it stops the container (S3 in docs/admission.md: 20.4 s on the H200 for --timeout 20). A
    45 s grace (the grace-seconds opt-in: --timeout 30) leaves 15 s between the two for a loaded node."""
    evidence = pods.evidence_dir(tmp_path / "evidence")
    opt_ins = {"gpuzombie.dev/prestop": "true", "gpuzombie.dev/grace-seconds": "45"}
    pod = pods.gpu_pod("stubborn", chart.PROBE_NAMESPACE, evidence, annotations=opt_ins, ignore_sigterm=True)
    pods.kubectl_apply(kube, pod)
    live = pods.wait_ready(api, pod)
    assert live["spec"]["terminationGracePeriodSeconds"] == 45
    wait_for("the worker", lambda: (evidence / "stubborn.json.ready").exists(), timeout=60)
    took = pods.delete_and_wait(api, pod)
    got = pods.read_evidence(evidence, "stubborn")
    assert got is not None and got["sender"] == HOOK.replace("--timeout 20", "--timeout 30")
    print(f"deletion of a pod whose worker ignores SIGTERM: {took:.1f} s (hook --timeout 30, grace 45)")
    assert 29.5 <= took < 44.5  # the hook's 30 s, then its SIGKILL; not the grace (45 s)
