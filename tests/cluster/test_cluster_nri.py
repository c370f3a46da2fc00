"""The chart's NRI plugin DaemonSet through the real helm binary: off by default; on, it lints
strictly and validates against the Kubernetes schemas (the oldest version the chart supports and the
newest), runs where the exporter runs, least privileged with only the two host directories NRI needs,
and its command is one the real plugin binary (go/nri) accepts."""

from __future__ import annotations

import os
import shutil
import subprocess
from typing import Any

import pytest

kubernetes_validate = pytest.importorskip("kubernetes_validate", reason="kubernetes-validate is in the 'chart' extra")
yaml = pytest.importorskip("yaml", reason="PyYAML is in the 'chart' extra")

from cluster_support import CHART, OLDEST_K8S, helm, render, validate_strictly  # noqa: E402

from gpuzombie.cluster.build import NRI_PLUGIN_ENV, ensure_nri_plugin  # noqa: E402

NAMESPACE = "gpuzombie"
ON = {"nri": {"enabled": True}}
COMPONENT = "nri-plugin"


def nri_daemonset(objects: list[dict[str, Any]]) -> dict[str, Any]:
    (ds,) = [o for o in objects if o["metadata"]["labels"].get("app.kubernetes.io/component") == COMPONENT]
    return ds


def test_off_by_default(helm_binary):
    objects = render(helm_binary, {}, namespace=NAMESPACE)
    assert not [o for o in objects if o["metadata"]["labels"].get("app.kubernetes.io/component") == COMPONENT]
    assert yaml.safe_load((CHART / "values.yaml").read_text())["nri"]["enabled"] is False


@pytest.mark.parametrize(
    "values",
    [
        ON,
        {
            "nri": {"enabled": True, "skipNamespaces": ["batch"], "extraArgs": ["--verbose"]},
            "exporter": {"enabled": False},
        },
    ],
    ids=["beside-the-exporter", "alone"],
)
def test_lints_strictly_and_validates(helm_binary, values):
    for kube_version in (OLDEST_K8S, kubernetes_validate.latest_version()):
        got = helm(helm_binary, "lint", "--strict", str(CHART), "--kube-version", f"v{kube_version}", values=values)
        assert got.returncode == 0 and "[WARNING]" not in got.stdout, got.stdout + got.stderr
    objects = render(helm_binary, values, namespace=NAMESPACE)
    for obj in objects:
        validate_strictly(obj)
    assert nri_daemonset(objects)["metadata"]["name"] == "gpuzombie-nri"


def test_the_pod_is_least_privileged_with_the_two_host_directories(helm_binary):
    ds = nri_daemonset(render(helm_binary, ON, namespace=NAMESPACE))
    spec = ds["spec"]["template"]["spec"]
    (c,) = spec["containers"]
    assert not {"hostPID", "hostNetwork", "hostIPC"} & set(spec)
    assert spec["automountServiceAccountToken"] is False
    assert c["securityContext"] == {
        "privileged": False,
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "runAsUser": 0,
        "capabilities": {"drop": ["ALL"]},
    }
    volumes = {v["name"]: v["hostPath"] for v in spec["volumes"]}
    assert volumes == {
        "nri-socket": {"path": "/var/run/nri", "type": "DirectoryOrCreate"},
        "nri-host": {"path": "/opt/nri", "type": "DirectoryOrCreate"},
    }
    assert {m["mountPath"] for m in c["volumeMounts"]} == {"/var/run/nri", "/opt/nri"}
    assert c["resources"]["limits"]["memory"]


def test_it_runs_where_the_exporter_runs(helm_binary):
    objects = render(helm_binary, {**ON, "nodeSelector": {"pool": "gpu"}}, namespace=NAMESPACE)
    exporter = next(o for o in objects if o["kind"] == "DaemonSet" and o is not nri_daemonset(objects))
    placement = ("nodeSelector", "affinity", "tolerations", "priorityClassName")
    want = {k: exporter["spec"]["template"]["spec"].get(k) for k in placement}
    assert {k: nri_daemonset(objects)["spec"]["template"]["spec"].get(k) for k in placement} == want
    assert want["affinity"]["nodeAffinity"] and want["nodeSelector"] == {"pool": "gpu"}


def test_the_plugin_binary_accepts_the_command(helm_binary):
    if shutil.which("go") is None and NRI_PLUGIN_ENV not in os.environ:
        pytest.skip("no Go toolchain to build go/nri")
    values = {"nri": {"enabled": True, "skipNamespaces": ["batch"], "index": "20"}}
    (c,) = nri_daemonset(render(helm_binary, values, namespace=NAMESPACE))["spec"]["template"]["spec"]["containers"]
    argv = c["command"]
    assert argv[0] == "gpuzombie-nri"
    assert argv[argv.index("--socket") + 1] == "/var/run/nri/nri.sock"
    assert argv[argv.index("--tini") + 1] == "/opt/nri/gpuzombie/tini-static"
    assert argv[argv.index("--install-tini") + 1] == "/usr/bin/tini-static"  # what the node image ships
    assert argv[argv.index("--idx") + 1] == "20"
    assert [argv[i + 1] for i, a in enumerate(argv) if a == "--skip-namespace"] == [NAMESPACE, "batch"]
    plugin = str(ensure_nri_plugin(lambda line: None))
    usage = subprocess.run([plugin, "--help"], capture_output=True, text=True, timeout=30, check=True).stderr
    assert [a for a in argv if a.startswith("--") and f"  -{a[2:]} " not in usage] == []


@pytest.mark.parametrize(
    ("values", "complaint"),
    [
        ({"nri": {"enable": True}}, "additional properties 'enable'"),
        ({"nri": {"enabled": True, "index": "1"}}, "does not match"),
        ({"nri": {"enabled": True, "socketDir": "var/run/nri"}}, "does not match"),
    ],
    ids=["typo", "one-digit-index", "relative-socket-dir"],
)
def test_values_schema_rejects_mistakes(helm_binary, values, complaint):
    got = helm(helm_binary, "template", "x", str(CHART), values=values)
    assert got.returncode != 0 and complaint in got.stderr, got.stderr


def test_the_notes_name_the_plugin(helm_binary):
    values = {"nri": {"enabled": True}, "exporter": {"enabled": False}}
    got = helm(helm_binary, "install", "gz", str(CHART), "-n", NAMESPACE, "--dry-run=client", values=values)
    assert got.returncode == 0, got.stderr
    notes = got.stdout.split("NOTES:\n", 1)[1]
    assert f"in namespace {NAMESPACE}: the NRI plugin (" in notes
    assert f"kubectl -n {NAMESPACE} logs ds/gz-gpuzombie-nri" in notes
    assert "pod-security.kubernetes.io/enforce=privileged" in notes  # hostPath
    assert "CRI socket" not in notes and "port-forward" not in notes
