"""The real single-node cluster (``gpuzombie cluster up``), started once per test session in its own
directory and removed at the end. Started through the real CLI in a subprocess: its processes then
belong to no test (the suite's autouse reaper kills a test's descendants)."""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import shlex
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from gpuzombie_cli import run_gpuzombie
from kube.api import Api, object_path, wait_for

CLUSTER_EXTRAS = ("grpc", "yaml", "cryptography", "prometheus_client")
"""What the real-cluster tests import (the node, admission, cluster and exporter extras): without one
of them tests/kube is not collected at all, as the other extras' tests skip."""
collect_ignore_glob = [] if all(importlib.util.find_spec(m) for m in CLUSTER_EXTRAS) else ["test_*.py"]

UP_TIMEOUT_S = 600
"""Beside load a first start took 25-60 s here; the binary is built before pytest (make test)."""
NODE_IMAGE_TIMEOUT_S = 900
"""A cold build of the node image (pip of the node requirements) took 45 s here, an import 5-10 s."""
WEBHOOK_READY_TIMEOUT_S = 300
"""Two webhook pods from a fresh image: 15-20 s here."""
TEST_TIMEOUT_S = UP_TIMEOUT_S + NODE_IMAGE_TIMEOUT_S + WEBHOOK_READY_TIMEOUT_S
"""pytest-timeout's bound of a kube test without one of its own: the suite's 120 s counts the session
fixtures' set-up against the first test that uses them, and beside stress-ng --cpu 2 the cluster,
the node image and the webhook took 122 s before test_admission_kubernetes' first test began (each
fixture's own wait is bounded above)."""


@dataclass(frozen=True)
class Kube:
    """The running cluster: where it is and how to reach it."""

    root: Path
    kubeconfig: Path
    env: dict[str, str]

    def cli(
        self, *args: str, timeout: float = 120, check: bool = True, input_text: str | None = None
    ) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(
            [sys.executable, "-m", "gpuzombie", *args],
            input=input_text,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if check and done.returncode != 0:
            raise AssertionError(f"gpuzombie {' '.join(args)} exited {done.returncode}: {done.stderr[-2000:]}")
        return done

    def kubectl(
        self, *args: str, timeout: float = 120, check: bool = True, input_text: str | None = None
    ) -> subprocess.CompletedProcess[str]:
        return self.cli("cluster", "kubectl", "--", *args, timeout=timeout, check=check, input_text=input_text)

    def node_env(self) -> dict[str, str]:
        """This environment with `gpuzombie cluster env`'s exports: KUBECONFIG, the CRI and
        PodResources sockets, kubectl on PATH (what `eval "$(gpuzombie cluster env)"` gives a shell)."""
        lines = self.cli("cluster", "env").stdout.splitlines()
        exported = dict(line.removeprefix("export ").split("=", 1) for line in lines)
        return {**self.env, **{k: shlex.split(v)[0] for k, v in exported.items()}}

    def get(self, *args: str) -> dict:
        return json.loads(self.kubectl("get", *args, "-o", "json").stdout)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.kube)
            item.add_marker(pytest.mark.slow)
            if item.get_closest_marker("timeout") is None:
                item.add_marker(pytest.mark.timeout(TEST_TIMEOUT_S))


@pytest.fixture(scope="session")
def kube(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Kube]:
    if os.geteuid() != 0:
        pytest.skip("the real cluster needs root")
    root = Path("/var/lib") / f"gpuzombie-cluster-test-{os.getpid()}"
    src = str(Path(__file__).resolve().parents[2] / "src")
    env = dict(
        os.environ,
        GPUZOMBIE_CLUSTER_DIR=str(root),
        PYTHONPATH=os.pathsep.join(filter(None, [src, os.environ.get("PYTHONPATH")])),
    )
    done = run_gpuzombie(env, "cluster", "up", timeout=UP_TIMEOUT_S)
    if done.returncode != 0:
        subprocess.run(
            [sys.executable, "-m", "gpuzombie", "cluster", "down"],
            env=env,
            capture_output=True,
            timeout=300,
            check=False,
        )
        pytest.fail(f"cluster up exited {done.returncode}: {done.stderr[-3000:]}")
    kubeconfig = Path(done.stdout.strip().splitlines()[-1])
    env["KUBECONFIG"] = str(kubeconfig)
    try:
        yield Kube(root, kubeconfig, env)
    finally:
        down = run_gpuzombie(env, "cluster", "down", timeout=300)
        assert down.returncode == 0, down.stderr


CONTAINERD2_BUILD_TIMEOUT_S = 1200
"""A cold build of containerd 2 (go/containerd): ~6 min on two loaded cores (docs/kubernetes.md)."""


@contextlib.contextmanager
def containerd2_cluster(name: str) -> Iterator[Kube]:
    """A cluster of its own on containerd 2.4.2 (GPUZOMBIE_CLUSTER_RUNTIME=containerd2), beside the
    session's: instance N+3 (its own ports, bridge, pod subnet, cgroup root), in
    /var/lib/gpuzombie-cluster-<name>-<pid> (short enough for containerd's 42-character shim
    socket_dir); containerd 2 built first when it is not cached. For one module at a time."""
    if os.geteuid() != 0:
        pytest.skip("the real cluster needs root")
    root = Path("/var/lib") / f"gpuzombie-cluster-{name}-{os.getpid()}"
    src = str(Path(__file__).resolve().parents[2] / "src")
    instance = (int(os.environ.get("GPUZOMBIE_CLUSTER_INSTANCE", "0")) + 3) % 10
    env = dict(
        os.environ,
        GPUZOMBIE_CLUSTER_DIR=str(root),
        GPUZOMBIE_CLUSTER_INSTANCE=str(instance),
        GPUZOMBIE_CLUSTER_RUNTIME="containerd2",
        PYTHONPATH=os.pathsep.join(filter(None, [src, os.environ.get("PYTHONPATH")])),
    )
    built = run_gpuzombie(env, "cluster", "build", "--containerd2", timeout=CONTAINERD2_BUILD_TIMEOUT_S)
    if built.returncode != 0:
        pytest.fail(f"cluster build --containerd2 exited {built.returncode}: {built.stderr[-2000:]}")
    done = run_gpuzombie(env, "cluster", "up", timeout=UP_TIMEOUT_S)
    if done.returncode != 0:
        run_gpuzombie(env, "cluster", "down", timeout=300)
        pytest.fail(f"cluster up exited {done.returncode}: {done.stderr[-3000:]}")
    kubeconfig = Path(done.stdout.strip().splitlines()[-1])
    env["KUBECONFIG"] = str(kubeconfig)
    try:
        yield Kube(root, kubeconfig, env)
    finally:  # a test may have run `down` already
        down = run_gpuzombie(env, "cluster", "down", timeout=300)
        assert down.returncode == 0, down.stderr


@pytest.fixture(scope="session")
def api(kube: Kube) -> Api:
    """The API server over REST as the admin (tests/kube/api.py)."""
    return Api(kube.kubeconfig)


@pytest.fixture(scope="session")
def node_image(kube: Kube) -> str:
    """The chart's node image, built from this machine's files and imported into the node's
    containerd (``gpuzombie cluster node-image``; cached: a second session imports it in seconds)."""
    done = kube.cli("cluster", "node-image", timeout=NODE_IMAGE_TIMEOUT_S)
    return done.stdout.strip().splitlines()[-1]


@dataclass(frozen=True)
class Webhook:
    """The chart's webhook deployed: every object applied, and its MutatingWebhookConfiguration
    (deleted and applied again by the tests that switch it off)."""

    objects: list[dict]
    configuration: dict
    ca: Path
    version: str
    """The cluster's Kubernetes version, as helm is given it (--kube-version)."""


@pytest.fixture(scope="session")
def webhook(kube: Kube, api: Api, node_image: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Webhook]:
    """`helm template` of the chart with the webhook on and no cert-manager (a TLS Secret made here
    and its CA as webhook.caBundle: the chart's own path without it), applied as it is; its two
    replicas run `gpuzombie webhook` from the node image, and the API server reaches them through
    the Service's endpoints (--enable-aggregator-routing: no kube-proxy here)."""
    from kube import chart
    from pki import make_pki

    pki = make_pki(tmp_path_factory.mktemp("webhook-pki"), ecdsa=True)
    version = json.loads(kube.cli("cluster", "status", "--json").stdout)["kubernetes_version"]
    objects = chart.admission_objects(
        chart.render(chart.webhook_values((pki / "ca.pem").read_bytes(), "webhook-tls"), version)
    )
    assert {o["kind"] for o in objects} == {
        "Deployment",
        "Service",
        "ServiceAccount",
        "PodDisruptionBudget",
        "MutatingWebhookConfiguration",
    }
    for namespace in (chart.NAMESPACE, chart.PROBE_NAMESPACE):
        api.ensure_namespace(namespace)
    secret = chart.tls_secret("webhook-tls", pki / "server.pem", pki / "server.key")
    chart.apply_all(api, [secret, *objects])
    (deployment,) = [o for o in objects if o["kind"] == "Deployment"]
    wanted = deployment["spec"]["replicas"]
    wait_for(
        "the webhook's replicas to be available",
        lambda: api.call("GET", object_path(deployment)).body.get("status", {}).get("availableReplicas") == wanted,
        timeout=WEBHOOK_READY_TIMEOUT_S,
    )
    chart.wait_until_admission(api, fixed=True, webhook_called=True)
    (configuration,) = [o for o in objects if o["kind"] == "MutatingWebhookConfiguration"]
    try:
        yield Webhook(objects, configuration, pki / "ca.pem", version)
    finally:
        chart.delete_all(api, [*objects, secret])


GPUS = 4
"""STAND-IN for a GPU node's device plugin: the node has no GPU and no nvidia device plugin, so its
status is given ``nvidia.com/gpu: 4`` (an extended resource, patched into the node's status as the
Kubernetes docs' "Advertise Extended Resources for a Node" does): GPU pods schedule and run, and the
kubelet allocates no device to them (PodResources lists none)."""


@contextlib.contextmanager
def standin_gpus(api: Api) -> Iterator[int]:
    """The node's status given GPUS ``nvidia.com/gpu`` (the STAND-IN above) until the block ends."""
    path = "/api/v1/nodes/gpuzombie-node/status"

    def patch(value: str | None) -> None:
        body = {"status": {"capacity": {"nvidia.com/gpu": value}}}
        reply = api.call("PATCH", path, body, content_type="application/merge-patch+json")
        assert reply.ok, reply.body

    patch(str(GPUS))
    wait_for(
        "the node's allocatable GPUs",
        lambda: (
            api.call("GET", "/api/v1/nodes/gpuzombie-node").body["status"]["allocatable"].get("nvidia.com/gpu")
            == str(GPUS)
        ),
    )
    try:
        yield GPUS
    finally:
        patch(None)


@pytest.fixture(scope="session")
def gpus(kube: Kube, api: Api) -> Iterator[int]:
    with standin_gpus(api) as count:
        yield count
