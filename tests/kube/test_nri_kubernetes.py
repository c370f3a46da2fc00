"""The NRI plugin (go/nri) in the real node's containerd 2.4.2, with no webhook and no policy
anywhere: S1's pod (deploy/pod-nofix.yaml, no ``command``: what the webhook can only answer with
``shareProcessNamespace``) starts with tini as PID 1, its kill -9'd worker is reaped, its deletion
frees in S2's time, not the 30 s grace; the same pod opted out keeps ``sleep`` and its zombie. And
what a dead plugin costs: frozen (it takes the request and never answers), one container start waits
containerd's plugin_request_timeout (2 s), once, then containerd drops the plugin and starts the
container as it is; crashed (its connection gone), or wedged before it registered, nothing;
restarted, it fixes the next pod.

Its own cluster on containerd 2 (conftest's ``containerd2_cluster``, instance N+3, one module at a
time); the stand-ins are named in tests/kube/nri.py. Last, the chart's DaemonSet runs the same
plugin from the node image."""

from __future__ import annotations

import json
import os
import signal
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from kube import nri, pods
from kube.api import Api
from kube.conftest import (
    CONTAINERD2_BUILD_TIMEOUT_S,
    NODE_IMAGE_TIMEOUT_S,
    UP_TIMEOUT_S,
    Kube,
    containerd2_cluster,
    standin_gpus,
)
from pidns import wait_until

pytestmark = pytest.mark.timeout(CONTAINERD2_BUILD_TIMEOUT_S + UP_TIMEOUT_S + NODE_IMAGE_TIMEOUT_S)
NAMESPACE = "default"
TINI_ARGV = "/.gpuzombie/tini-static -s -g -- sh -c python3 -m gpuzombie.workloads.parent"
REQUEST_TIMEOUT_S = 2.0
"""containerd's plugin_request_timeout as configs.containerd2_config writes it."""
DELETED_WITHIN_S = 10.0
"""S1 under the plugin's tini, from the DELETE to the object gone (the kubelet's sync and status
update included): 0.53-1.56 s in five runs here, one beside stress-ng --cpu 2; S1's own is the 30 s
grace."""
NORMAL_CREATE_S = 1.0
"""A CreateContainer here with the plugin answering, or dropped, or gone: 0.009-0.035 s in five
runs (one beside stress-ng --cpu 2); frozen, 2.016-2.029 s."""


@pytest.fixture(scope="module")
def cluster() -> Iterator[Kube]:
    with containerd2_cluster("nri") as kube:
        yield kube


@pytest.fixture(scope="module")
def api(cluster: Kube) -> Iterator[Api]:
    api = Api(cluster.kubeconfig)
    with standin_gpus(api):
        yield api


@pytest.fixture
def plugin(cluster: Kube, tmp_path: Path) -> Iterator[nri.Plugin]:
    started = nri.start_plugin(cluster, tmp_path)
    try:
        yield started
    finally:
        started.stop()


def _pid1(api: Api, pod: dict) -> tuple[int, str]:
    live = pods.wait_ready(api, pod)
    found = wait_until(lambda: nri.pod_pid1(pods.host_pids(live["metadata"]["uid"])), timeout=30)
    return found


def _workers(api: Api, pod: dict, cluster: Kube) -> list[int]:
    """The host pids of the pod's workers, once the parent has exited (its last line logged)."""
    name = pod["metadata"]["name"]
    wait_until(
        lambda: "parent exiting" in cluster.kubectl("logs", name, "-n", NAMESPACE, check=False).stdout, timeout=120
    )
    uid = api.call("GET", f"/api/v1/namespaces/{NAMESPACE}/pods/{name}").body["metadata"]["uid"]
    return [p for p, cmd in pods.host_pids(uid).items() if "gpuzombie.workloads.worker" in cmd]


def test_s1_starts_under_tini_its_killed_worker_is_reaped_and_it_frees_in_s2s_time(
    cluster: Kube, api: Api, plugin: nri.Plugin
) -> None:
    pod = nri.s1_pod("s1-nri", NAMESPACE)
    pods.kubectl_apply(cluster, pod)
    tini, argv = _pid1(api, pod)
    assert argv.startswith(TINI_ARGV), argv
    assert "namespace=default pod=s1-nri container=worker" in plugin.log_text()
    (worker,) = _workers(api, pod, cluster)
    assert nri.parent_of(worker) == tini  # the parent exited without wait(): its worker is tini's now
    worker_killed = time.monotonic()
    os.kill(worker, signal.SIGKILL)
    wait_until(lambda: nri.state_of(worker) is None, timeout=10)  # reaped: not even a zombie
    reaped_s = time.monotonic() - worker_killed
    # What tini cannot reach: the parent's zombie, a child of the shell that exec'd sleep (as in S5).
    uid = api.call("GET", f"/api/v1/namespaces/{NAMESPACE}/pods/s1-nri").body["metadata"]["uid"]
    zombies = [p for p in pods.host_pids(uid) if nri.state_of(p) == "Z"]
    assert len(zombies) == 1 and "sleep" in pods.host_pids(uid).get(nri.parent_of(zombies[0]) or 0, ""), zombies
    took = pods.delete_and_wait(api, pod)
    print(f"S1 under the plugin's tini: worker reaped {reaped_s:.3f} s after kill -9, deleted in {took:.2f} s")
    assert took < DELETED_WITHIN_S  # tini passes the kubelet's SIGTERM on: not the 30 s grace


def test_opted_out_s1_keeps_sleep_as_pid1_and_its_zombie(cluster: Kube, api: Api, plugin: nri.Plugin) -> None:
    """The control: the webhook's opt-out annotation, honoured by the plugin; S1 as it is."""
    pod = nri.s1_pod("s1-opted-out", NAMESPACE, annotations={"gpuzombie.dev/inject": "false"})
    pods.kubectl_apply(cluster, pod)
    _, argv = _pid1(api, pod)
    assert argv == "sleep infinity", argv
    (worker,) = _workers(api, pod, cluster)
    os.kill(worker, signal.SIGKILL)
    wait_until(lambda: nri.state_of(worker) == "Z", timeout=10)
    time.sleep(1)
    assert nri.state_of(worker) == "Z"  # sleep, PID 1, never waits
    cluster.kubectl("delete", "pod", "s1-opted-out", "-n", NAMESPACE, "--grace-period=0", "--force", "--wait=false")


def _create_seconds(cluster: Kube, container: str) -> float:
    (took,) = wait_until(lambda: nri.create_container_seconds(nri.containerd_log(cluster), container), timeout=120)
    return took


def _started(cluster: Kube, api: Api, name: str) -> tuple[float, str]:
    """A small GPU pod (S1's, container named ``name``): its CreateContainer's seconds and PID 1."""
    pod = nri.s1_pod(name, NAMESPACE)
    pod["spec"]["containers"][0]["name"] = name
    pods.kubectl_apply(cluster, pod)
    _, argv = _pid1(api, pod)
    took = _create_seconds(cluster, name)
    cluster.kubectl("delete", "pod", name, "-n", NAMESPACE, "--grace-period=0", "--force", "--wait=false")
    return took, argv


def test_a_frozen_plugin_costs_one_request_timeout_then_is_dropped(cluster: Kube, api: Api, plugin: nri.Plugin) -> None:
    taken = nri.synchronized(cluster)
    plugin.signal(signal.SIGSTOP)  # connected, its socket takes the request, nothing answers
    frozen, argv = _started(cluster, api, "frozen-1")
    assert REQUEST_TIMEOUT_S <= frozen < REQUEST_TIMEOUT_S + NORMAL_CREATE_S, frozen
    assert not argv.startswith("/.gpuzombie/"), argv  # started as it is, not failed
    assert "closing plugin 10-gpuzombie-init, failed to handle CreateContainer request" in nri.containerd_log(cluster)
    after, _ = _started(cluster, api, "frozen-2")
    assert after < NORMAL_CREATE_S, after  # dropped: the next start does not wait
    plugin.signal(signal.SIGCONT)
    plugin.wait_synchronized(taken)  # it sees the closed connection and registers again
    back, argv = _started(cluster, api, "frozen-3")
    assert argv.startswith(TINI_ARGV), argv
    print(f"frozen plugin: CreateContainer {frozen:.3f} s once, then {after:.3f} s; thawed and back: {back:.3f} s")


def test_a_crashed_plugin_costs_nothing_and_a_restarted_one_fixes_the_next_pod(
    cluster: Kube, api: Api, plugin: nri.Plugin, tmp_path: Path
) -> None:
    plugin.signal(signal.SIGKILL)
    plugin.process.wait(timeout=10)
    crashed, argv = _started(cluster, api, "crashed-1")
    assert crashed < NORMAL_CREATE_S and not argv.startswith("/.gpuzombie/"), (crashed, argv)
    again = nri.start_plugin(cluster, tmp_path / "again")
    try:
        _, argv = _started(cluster, api, "crashed-2")
        assert argv.startswith(TINI_ARGV), argv
    finally:
        again.stop()
    print(f"crashed plugin: CreateContainer {crashed:.3f} s")


REGISTRATION_TIMEOUT_S = 5.0
"""containerd's plugin_registration_timeout as configs.containerd2_config writes it."""
NOT_REGISTERED = "failed to start external plugin: plugin registration timed out"


def test_a_plugin_that_never_registers_delays_no_start_and_is_dropped(cluster: Kube, api: Api) -> None:
    """A process that connects to the NRI socket and says nothing (a plugin wedged before its
    registration): the registration runs beside the container starts, not in front of them."""
    before = nri.containerd_log(cluster).count(NOT_REGISTERED)
    with socket.socket(socket.AF_UNIX) as silent:
        silent.connect(str(nri.layout(cluster).nri_socket))
        connected = time.time()
        took, argv = _started(cluster, api, "unregistered-1")
        assert took < NORMAL_CREATE_S and not argv.startswith("/.gpuzombie/"), (took, argv)
        line = wait_until(
            lambda: [x for x in nri.containerd_log(cluster).splitlines() if NOT_REGISTERED in x][before:],
            timeout=REGISTRATION_TIMEOUT_S + 30,
        )[0]
    dropped = nri.log_time(line.split('"')[1]) - connected
    print(f"unregistered plugin: CreateContainer {took:.3f} s, dropped {dropped:.2f} s after it connected")
    assert dropped < REGISTRATION_TIMEOUT_S + NORMAL_CREATE_S, dropped


def test_the_charts_daemonset_runs_the_plugin_from_the_node_image(cluster: Kube, api: Api, tmp_path: Path) -> None:
    """`helm template --set nri.enabled=true` (the exporter off), applied as it is but for this
    node's NRI socket directory and a host directory of the test's: the DaemonSet's pod runs
    gpuzombie-nri from the node image, copies its tini to the node, and S1 starts under it."""
    from kube import chart

    image = cluster.cli("cluster", "node-image", timeout=NODE_IMAGE_TIMEOUT_S).stdout.strip().splitlines()[-1]
    host = tmp_path / "opt-nri"
    values = {
        "exporter": {"enabled": False},
        "nri": {"enabled": True, "socketDir": str(nri.layout(cluster).nri_socket.parent), "hostDir": str(host)},
        "gpuNodesOnly": False,
        "priorityClassName": "",
    }
    version = json.loads(cluster.cli("cluster", "status", "--json").stdout)["kubernetes_version"]
    objects = chart.render(values, version)
    (ds,) = [o for o in objects if o["kind"] == "DaemonSet"]
    assert ds["spec"]["template"]["spec"]["containers"][0]["image"] == image
    api.ensure_namespace(chart.NAMESPACE)
    cluster.kubectl(
        "label", "--overwrite", "namespace", chart.NAMESPACE, "pod-security.kubernetes.io/enforce=privileged"
    )
    taken = nri.synchronized(cluster)
    chart.apply_all(api, objects)
    try:
        wait_until(lambda: nri.synchronized(cluster) > taken, timeout=180)
        assert (host / "gpuzombie" / "tini-static").read_bytes() == Path(nri.TINI).read_bytes()
        pod = nri.s1_pod("s1-daemonset", NAMESPACE)
        pods.kubectl_apply(cluster, pod)
        _, argv = _pid1(api, pod)
        assert argv.startswith(TINI_ARGV), argv
        logs = cluster.kubectl("logs", "-n", chart.NAMESPACE, f"daemonset/{ds['metadata']['name']}").stdout
        assert "namespace=default pod=s1-daemonset container=worker" in logs, logs
        pods.delete_and_wait(api, pod)
    finally:
        chart.delete_all(api, objects)
