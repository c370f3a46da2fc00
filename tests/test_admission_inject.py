"""What the webhook injects, and into which pods (issue 36, items 6-8), with the real CLI: served over
HTTPS on 127.0.0.1 (``gpuzombie webhook --preflight``) and as ``webhook --patch``. Each answer's patch
is applied with jsonpatch and the pod validated strictly.

- The preflight gate reads NVML only: it is given only the GPUs NVML shows it (NVIDIA's GPUs and MIG
  instances), never an AMD GPU, a VFIO passthrough or a DRA claim whose class is not known (the
  served webhook sees a pod alone; a NIC's claim looks the same), and a warning says what it left
  ungated. Given none NVML shows, the gate fails at every try: Init:CrashLoopBackOff for ever.
- A pod that can run on Windows nodes only (a nodeSelector or a required node affinity on the node's
  OS label, not only ``spec.os.name``) gets no Linux init container.
- A container named like the gate keeps only the gate out, said; one named like the installer keeps
  the pod out, said when served too; the injected containers keep the pod's own seccomp profile.
"""

from __future__ import annotations

import json
import ssl
import subprocess
import sys
from typing import Any

import pytest

from admission_requests import INJECT_IMAGE
from admission_support import (
    admission_review,
    api_server_pod,
    apply,
    container,
    kubernetes_validate,
    patch_of,
    validate_pod,
)
from gpuzombie.admission.app import make_app
from gpuzombie.admission.mutate import INIT_CONTAINER, Policy
from gpuzombie.admission.preflight import CONTAINER as GATE
from gpuzombie.serving import ListenAddress, Server, TlsFiles
from test_admission_webhook import post

yaml = pytest.importorskip("yaml", reason="PyYAML is in the 'admission' extra")

S1 = ["sh", "-c", "python3 train.py & exec sleep infinity"]
TINI_CMD = ["tini", "--", "python3", "t.py"]
OPTED_IN = {"gpuzombie.dev/preflight": "true"}


@pytest.fixture(scope="module")
def served(pki):
    """The webhook's app with --preflight's policy (every GPU pod gated), served over HTTPS on
    127.0.0.1 by gpuzombie.serving as the CLI serves it (in this process: the tests' reaper ends
    child processes after each test); its port and TLS context."""
    server = Server(
        {"/mutate": make_app(Policy(image=INJECT_IMAGE, preflight=True))},
        listen=ListenAddress("127.0.0.1", 0),
        tls=TlsFiles(str(pki / "server.pem"), str(pki / "server.key")),
        probes={"/healthz": lambda: (True, "ok")},
        read_timeout=5.0,
        max_connections=8,
    )
    bound = server.start()
    yield bound.port, ssl.create_default_context(cafile=str(pki / "ca.pem"))
    server.stop()


def reviewed(served, pod: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """(the pod as patched, validated strictly; the warnings kubectl prints) from the served webhook."""
    status, answer = post(served, json.dumps(admission_review(pod)).encode())
    assert status == 200 and answer["response"]["allowed"] is True, answer
    patched = apply(pod, patch_of(answer))
    if patched != pod and "resourceClaims" in pod["spec"]:  # 1.29 had another claim form: the newest schema
        kubernetes_validate.validate(patched, kubernetes_validate.latest_version(), strict=True)
    elif patched != pod:
        validate_pod(patched)
    return patched, answer["response"].get("warnings", [])


def gpu_pod(*containers: dict[str, Any], annotations: dict[str, str] | None = None, **spec: Any) -> dict[str, Any]:
    pod = api_server_pod(*containers, **spec)
    pod["metadata"]["annotations"] = dict(annotations or {})
    return pod


def train(resources: dict[str, Any], name: str = "train", command: list[str] | None = None) -> dict[str, Any]:
    return container(name, command=command or TINI_CMD, resources=resources)


def gate(patched: dict[str, Any]) -> dict[str, Any] | None:
    inits = patched["spec"].get("initContainers", [])
    return next((c for c in inits if c["name"] == GATE), None)


CLAIMED = {"claims": [{"name": "dev"}]}


def claimed(template: str) -> dict[str, Any]:
    return {"resourceClaims": [{"name": "dev", "resourceClaimTemplateName": template}]}


# -- item 7: Windows pods however they say it ----------------------------------------------------------


def _affinity(*terms: list[dict[str, Any]]) -> dict[str, Any]:
    required = {"nodeSelectorTerms": [{"matchExpressions": t} for t in terms]}
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": required}}


def _os(operator: str, *values: str, key: str = "kubernetes.io/os") -> dict[str, Any]:
    return {"key": key, "operator": operator, "values": list(values)}


WINDOWS_ONLY = {
    "spec.os.name": {"os": {"name": "windows"}},
    "nodeSelector kubernetes.io/os": {"nodeSelector": {"kubernetes.io/os": "windows"}},
    "nodeSelector beta.kubernetes.io/os": {"nodeSelector": {"beta.kubernetes.io/os": "windows"}},
    "required affinity In [windows]": {"affinity": _affinity([_os("In", "windows")])},
    "required affinity NotIn [linux], two terms": {
        "affinity": _affinity([_os("NotIn", "linux")], [_os("In", "windows"), _os("In", "a", key="zone")])
    },
}
LINUX_TOO = {
    "affinity In [linux, windows]": {"affinity": _affinity([_os("In", "linux", "windows")])},
    "one term of two is windows": {"affinity": _affinity([_os("In", "windows")], [_os("In", "linux")])},
    "nodeSelector linux": {"nodeSelector": {"kubernetes.io/os": "linux"}},
}


@pytest.mark.parametrize("spec", WINDOWS_ONLY.values(), ids=WINDOWS_ONLY.keys())
def test_served_a_windows_only_pod_gets_no_linux_init_container(served, spec):
    """Before: only spec.os.name was read; a pod marked by its nodeSelector or node affinity got
    gpuzombie-install (cp of a Linux tini) and the gate, which a Windows node cannot run."""
    pod = gpu_pod(container(command=S1), **spec)
    patched, _ = reviewed(served, pod)
    assert patched == pod


@pytest.mark.parametrize("spec", LINUX_TOO.values(), ids=LINUX_TOO.keys())
def test_served_a_pod_that_may_run_on_linux_is_fixed(served, spec):
    patched, _ = reviewed(served, gpu_pod(container(command=S1), **spec))
    assert [c["name"] for c in patched["spec"]["initContainers"]] == [GATE, INIT_CONTAINER]


def test_check_reports_nothing_for_a_windows_only_pod():
    """`check` and the webhook read one model (podspec.windows_only): no rule of a Linux PID 1
    applies on a Windows node. Before: GZ001 for the nodeSelector pod, exit 1."""
    for spec in WINDOWS_ONLY.values():
        pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "w"}, "spec": {**spec}}
        pod["spec"]["containers"] = [
            {"name": "t", "image": "x", "command": S1, "resources": {"limits": {"nvidia.com/gpu": 1}}}
        ]
        done = subprocess.run(
            [sys.executable, "-m", "gpuzombie", "check", "--json", "-"],
            input=json.dumps(pod),
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0 and json.loads(done.stdout)["summary"]["findings"] == 0, (spec, done.stdout)
