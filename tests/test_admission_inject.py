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
from pathlib import Path
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
from test_admission_webhook import Served, post

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


# -- item 6: the gate only for what it can read -----------------------------------------------------


@pytest.mark.parametrize(
    ("pod", "said"),
    [
        (gpu_pod(train({"limits": {"amd.com/gpu": "1"}})), "container train's amd.com/gpu"),
        (gpu_pod(train(CLAIMED), **claimed("one-nic")), "container train's claim dev (device class not known here)"),
    ],
    ids=["amd.com/gpu", "a DRA claim served (a NIC's, or a GPU's: the pod does not say)"],
)
def test_served_a_gpu_nvml_does_not_show_gets_no_gate_and_a_warning(served, pod, said):
    """Before: the gate was added (asking for amd.com/gpu, or naming the claim), and in a container
    NVML shows no GPU it exits 1 at every try (`gpuzombie preflight`: "NVML unavailable")."""
    patched, warnings = reviewed(served, pod)
    assert gate(patched) is None
    assert "gpuzombie.dev/injected" not in patched["metadata"]["annotations"]  # the pod runs its own init
    (line,) = [w for w in warnings if "preflight gate" in w]
    assert "is not added" in line and said in line and "NVML" in line, line


def test_served_the_gate_checks_the_nvidia_gpus_of_a_pod_and_says_what_it_leaves(served):
    pod = gpu_pod(
        train({"limits": {"nvidia.com/gpu": "2"}}),
        train({"limits": {"amd.com/gpu": "1"}}, name="amd"),
        train(CLAIMED, name="nic"),
        **claimed("one-nic"),
    )
    patched, warnings = reviewed(served, pod)
    checked = gate(patched)
    assert checked is not None and patched["spec"]["initContainers"][0] is checked  # first of all
    assert checked["resources"]["limits"] == {"cpu": "500m", "memory": "128Mi", "nvidia.com/gpu": "2"}
    assert "claims" not in checked["resources"]
    (line,) = [w for w in warnings if "does not check" in w]
    assert "container amd's amd.com/gpu" in line and "container nic's claim dev" in line, line


def test_served_a_claim_is_gated_where_the_pod_itself_asks_for_the_gate(served):
    """The pod's own annotation vouches for its claims (its owner knows they are NVIDIA GPUs); a
    namespace default or --preflight does not."""
    patched, warnings = reviewed(served, gpu_pod(train(CLAIMED), annotations=OPTED_IN, **claimed("one-gpu")))
    checked = gate(patched)
    assert checked is not None and checked["resources"]["claims"] == [{"name": "dev"}]
    assert not [w for w in warnings if "not added" in w or "does not check" in w], warnings


def test_served_nvidia_gpus_are_gated_as_before(served):
    for resources in ({"limits": {"nvidia.com/gpu": "1"}}, {"limits": {"nvidia.com/mig-1g.18gb": "1"}}):
        patched, _ = reviewed(served, gpu_pod(train(resources)))
        checked = gate(patched)
        assert checked is not None and set(resources["limits"]) <= set(checked["resources"]["limits"])


CLAIM_TEMPLATES = {
    "amd": "gpu.amd.com",
    "vfio": "vfio.gpu.nvidia.com",
    "nvidia": "gpu.nvidia.com",
    "mig": "mig.nvidia.com",
}


def _claim_template(name: str, device_class: str) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name},
        "spec": {"spec": {"devices": {"requests": [{"name": "d", "exactly": {"deviceClassName": device_class}}]}}},
    }


def _pod_doc(name: str, template: str) -> dict[str, Any]:
    c = {"name": "train", "image": "x", "command": TINI_CMD, "resources": CLAIMED}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {"containers": [c], **claimed(template)},
    }


def test_patch_gates_only_the_claims_of_an_nvml_class(tmp_path: Path):
    """`webhook --patch --preflight` reads the claim templates beside the pods: gpu.amd.com and
    vfio.gpu.nvidia.com (bound to vfio-pci for a VM: no NVIDIA driver) are left ungated, said on
    stderr; gpu.nvidia.com and mig.nvidia.com are gated. Before: all four gated."""
    documents = [_claim_template(t, c) for t, c in CLAIM_TEMPLATES.items()]
    documents += [_pod_doc(f"on-{t}", t) for t in CLAIM_TEMPLATES]
    manifest = tmp_path / "pods.yaml"
    manifest.write_text(yaml.safe_dump_all(documents, sort_keys=False))
    argv = [sys.executable, "-m", "gpuzombie", "webhook", "--patch", str(manifest), "--image", "img:1", "--preflight"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    pods = {d["metadata"]["name"]: d for d in yaml.safe_load_all(done.stdout) if d and d["kind"] == "Pod"}
    gated = {name for name, pod in pods.items() if gate(pod) is not None}
    assert gated == {"on-nvidia", "on-mig"}
    for name, device_class in (("on-amd", "gpu.amd.com"), ("on-vfio", "vfio.gpu.nvidia.com")):
        (line,) = [w for w in done.stderr.splitlines() if f"Pod/{name}:" in w and "preflight gate" in w]
        assert f"claim dev ({device_class})" in line and "is not added" in line, line


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
    """`check` and the webhook read one model (podspec.model.windows_only): no rule of a Linux PID 1
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


# -- item 8: our container names taken, the pod's seccomp profile -----------------------------------


def test_served_a_container_named_like_the_gate_keeps_only_the_gate_out_and_says_so(pki):
    """The real CLI, `gpuzombie webhook --preflight`. Before: the whole pod was left alone, silently
    (no tini, no warning)."""
    pod = gpu_pod(container(command=S1), container(GATE, gpu=False, command=["true"]))
    server = Served(pki / "server.pem", pki / "server.key", "--preflight")
    try:
        patched, warnings = reviewed((server.port, ssl.create_default_context(cafile=str(pki / "ca.pem"))), pod)
    finally:
        server.close()
    assert patched["spec"]["containers"][0]["command"][0] == "/.gpuzombie/tini-static"
    assert [c["name"] for c in patched["spec"].get("initContainers", [])] == [INIT_CONTAINER]
    assert any(f"preflight gate is not added: a container is named {GATE} already" in w for w in warnings), warnings


def test_served_a_container_named_like_the_installer_leaves_the_pod_alone_and_says_so(served):
    """A second gpuzombie-install would make the pod invalid: left alone, as before, but no longer
    silently (`--patch` said it; the served webhook said nothing)."""
    pod = gpu_pod(container(command=S1), initContainers=[container(INIT_CONTAINER, gpu=False, command=["true"])])
    patched, warnings = reviewed(served, pod)
    assert patched == pod
    assert any(f"left alone: a container is named {INIT_CONTAINER} already" in w for w in warnings), warnings


LOCALHOST = {"type": "Localhost", "localhostProfile": "profiles/train-strict.json"}


def _effective_seccomp(pod: dict[str, Any], c: dict[str, Any]) -> Any:
    """The profile the kubelet applies: the container's own, else the pod's."""
    return c.get("securityContext", {}).get("seccompProfile") or pod["spec"].get("securityContext", {}).get(
        "seccompProfile"
    )


def test_served_the_injected_containers_keep_the_pods_own_seccomp_profile(served):
    """Before: both injected containers set seccompProfile RuntimeDefault, which overrides the pod's
    stricter Localhost profile for them."""
    pod = gpu_pod(container(command=S1), securityContext={"runAsNonRoot": True, "seccompProfile": LOCALHOST})
    patched, _ = reviewed(served, pod)
    injected = patched["spec"]["initContainers"]
    assert [c["name"] for c in injected] == [GATE, INIT_CONTAINER]
    assert [_effective_seccomp(patched, c) for c in injected] == [LOCALHOST, LOCALHOST]
    plain, _ = reviewed(served, gpu_pod(container(command=S1)))  # no profile of the pod's: RuntimeDefault
    assert [_effective_seccomp(plain, c) for c in plain["spec"]["initContainers"]] == [{"type": "RuntimeDefault"}] * 2
    unconfined = gpu_pod(container(command=S1), securityContext={"seccompProfile": {"type": "Unconfined"}})
    patched, _ = reviewed(served, unconfined)
    assert {_effective_seccomp(patched, c)["type"] for c in patched["spec"]["initContainers"]} == {"RuntimeDefault"}
