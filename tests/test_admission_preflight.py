"""The webhook injects the handover gate (``gpuzombie preflight``) first among a GPU pod's init
containers when opted in (pod annotation, namespace default, ``--preflight`` for all), with the
pod's GPUs, never for a shared GPU. Each answer's patch is applied with jsonpatch and the pod
validated strictly, as test_admission.py does."""

from __future__ import annotations

import copy
import os
import subprocess
import sys
from pathlib import Path

import pytest

from admission_support import api_server_pod, apply, container, kubernetes_validate
from gpuzombie.admission import rules
from gpuzombie.admission.mutate import Policy, mutate
from gpuzombie.admission.preflight import CONTAINER, IMAGE_PREFLIGHT
from test_admission import POLICY, mutated

ROOT = Path(__file__).resolve().parent.parent
OPTED_IN = {"gpuzombie.dev/preflight": "true"}


def pod_with(*containers, annotations=None, **spec):
    pod = api_server_pod(*containers, **spec)
    pod["metadata"]["annotations"] = dict(annotations or {})
    return pod


def gate_of(patched):
    first = patched["spec"]["initContainers"][0]
    assert first["name"] == CONTAINER
    return first


def test_an_opted_in_pod_gets_the_gate_first_with_its_gpus():
    fetch = container("fetch", gpu=False, command=["true"])
    train = container("train", command=["python3", "t.py"])
    train["resources"] = {"limits": {"nvidia.com/gpu": "2"}}
    pod = pod_with(train, container("eval", command=["python3", "e.py"]), annotations=OPTED_IN, initContainers=[fetch])
    patched, response = mutated(pod)
    gate = gate_of(patched)
    names = [c["name"] for c in patched["spec"]["initContainers"]]
    assert names == [CONTAINER, "gpuzombie-install", "fetch"]
    assert gate["resources"]["limits"]["nvidia.com/gpu"] == "3"  # the containers run together: 2 + 1
    # GpuzombieDirtyGpuBlocksPreflight learns a waiting pod's node from kube-state-metrics' series of
    # this request (kube_pod_init_container_resource_requests), DRA or not
    assert gate["resources"]["requests"]["cpu"]
    assert gate["command"][:4] == ["python3", "-S", "-I", IMAGE_PREFLIGHT]
    assert gate["env"] == [{"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}}]
    assert gate["securityContext"]["runAsNonRoot"] is True and gate["image"] == POLICY.image
    assert "preflight" in patched["metadata"]["annotations"]["gpuzombie.dev/injected"].split(",")
    assert any("preflight gate" in w for w in response["warnings"])
    # the gate adds no finding of check: it is one process that forks nothing
    assert [f for f in rules.check_pod_spec(patched["spec"]) if f.container == CONTAINER] == []


def test_init_containers_with_gpus_count_one_at_a_time():
    first = container("warmup", command=["python3", "w.py"])
    first["resources"] = {"limits": {"nvidia.com/gpu": "4"}}
    pod = pod_with(container("train", command=["python3", "t.py"]), annotations=OPTED_IN, initContainers=[first])
    patched, _ = mutated(pod)
    assert gate_of(patched)["resources"]["limits"]["nvidia.com/gpu"] == "4"
    assert patched["spec"]["initContainers"][-1]["name"] == "warmup"


def test_a_mig_pod_gets_its_mig_resource():
    train = container("train", command=["tini", "--", "python3", "t.py"])
    train["resources"] = {"limits": {"nvidia.com/mig-1g.18gb": "1"}}
    patched, _ = mutated(pod_with(train, annotations=OPTED_IN))
    assert gate_of(patched)["resources"]["limits"]["nvidia.com/mig-1g.18gb"] == "1"
    assert [c["name"] for c in patched["spec"]["initContainers"]] == [CONTAINER]  # tini already: no install


@pytest.mark.parametrize(
    ("policy", "annotations", "namespace", "gated"),
    [
        (POLICY, {}, "ml-train", False),
        (POLICY, OPTED_IN, "ml-train", True),
        (Policy(image=POLICY.image, namespace_opt_ins={"ml-train": {"preflight": "true"}}), {}, "ml-train", True),
        (Policy(image=POLICY.image, namespace_opt_ins={"ml-train": {"preflight": "true"}}), {}, "other", False),
        (Policy(image=POLICY.image, preflight=True), {}, "other", True),
        (Policy(image=POLICY.image, preflight=True), {"gpuzombie.dev/preflight": "false"}, "other", False),
    ],
    ids=["off by default", "pod annotation", "namespace opt-in", "another namespace", "--preflight", "pod opts out"],
)
def test_who_gets_the_gate(policy, annotations, namespace, gated):
    pod = pod_with(container("train", command=["tini", "--", "python3", "t.py"]), annotations=annotations)
    got = mutate(pod, namespace, policy)
    assert ("preflight" in got.actions) is gated


@pytest.mark.parametrize(
    ("resources", "annotations", "said"),
    [
        ({"limits": {"nvidia.com/gpu.shared": "1"}}, {}, "nvidia.com/gpu.shared"),
        ({"limits": {"nvidia.com/mig-1g.18gb.shared": "1"}}, {}, "mig-1g.18gb.shared"),
        ({}, {"gpu-fraction": "0.5"}, "gpu-fraction"),
    ],
    ids=["time-slicing/MPS replica", "shared MIG", "KAI fraction"],
)
def test_never_for_a_shared_gpu_and_said_so(resources, annotations, said):
    train = container("train", command=["tini", "--", "python3", "t.py"], resources=resources)
    pod = pod_with(train, annotations={**OPTED_IN, **annotations})
    got = mutate(pod, "ml-train", POLICY)
    assert "preflight" not in got.actions
    assert any("preflight gate is not added" in w and said in w and "shared" in w for w in got.warnings)


def dra_pod(source: dict[str, str]):
    train = container("train", command=["tini", "--", "python3", "t.py"], resources={"claims": [{"name": "gpu"}]})
    return pod_with(train, annotations=OPTED_IN, resourceClaims=[{"name": "gpu", **source}])


def test_a_dra_pod_gets_the_same_claim():
    pod = dra_pod({"resourceClaimTemplateName": "one-gpu"})
    got = mutate(pod, "ml-train", POLICY)
    patched = apply(pod, got.ops)
    kubernetes_validate.validate(patched, kubernetes_validate.latest_version(), strict=True)  # 1.29 had no such claim
    gate = gate_of(patched)
    assert gate["resources"]["claims"] == [{"name": "gpu"}]
    assert set(gate["resources"]["limits"]) == {"cpu", "memory"}


def test_a_named_resource_claim_may_be_shared_and_gets_no_gate():
    got = mutate(dra_pod({"resourceClaimName": "team-gpu"}), "ml-train", POLICY)
    assert "preflight" not in got.actions and any("other pods may share" in w for w in got.warnings)


def test_reinvocation_adds_no_second_gate():
    patched, _ = mutated(pod_with(container("train", command=["python3", "t.py"]), annotations=OPTED_IN))
    again = mutate(copy.deepcopy(patched), "ml-train", POLICY)
    assert again.ops == [] and again.skipped is not None


def test_a_pod_without_gpus_gets_nothing():
    got = mutate(pod_with(container("web", gpu=False, command=["nginx"]), annotations=OPTED_IN), "ml-train", POLICY)
    assert got.ops == []


def test_patch_with_the_preflight_flag(tmp_path: Path):
    manifest = tmp_path / "pod.yaml"
    manifest.write_text(
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: b\nspec:\n  containers:\n  - name: train\n    image: x\n"
        "    command: [tini, --, python3, t.py]\n    resources:\n      limits:\n        nvidia.com/gpu: 1\n"
    )
    run = [sys.executable, "-m", "gpuzombie", "webhook", "--patch", str(manifest), "--image", "img:1"]
    done = subprocess.run([*run, "--preflight"], capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert f"name: {CONTAINER}" in done.stdout and "nvidia.com/gpu: '1'" in done.stdout
    plain = subprocess.run(run, capture_output=True, text=True, timeout=60, check=False)
    assert CONTAINER not in plain.stdout
    no_image = subprocess.run([*run[:-2], "--preflight"], capture_output=True, text=True, timeout=60, check=False)
    assert no_image.returncode == 0 and "the chart's default" in no_image.stderr  # printed: the chart's image
    in_place = [*run[:-2], "--preflight", "--in-place"]
    refused = subprocess.run(in_place, capture_output=True, text=True, timeout=60, check=False)
    assert refused.returncode == 2 and "--image" in refused.stderr  # written back: it must be named


def test_the_lab_runs_the_patched_pod_and_gives_only_the_node_name():
    """lab pod reads the gate's NODE_NAME (fieldRef spec.nodeName) as this host's name; any other
    downward-API field is refused by name, as every field the lab cannot apply."""
    from gpuzombie.lab.handover import gated, pod_b
    from gpuzombie.lab.manifest import ManifestError, parse_pod

    patched = gated(pod_b("b", size_mib=32, device="cpu"))
    gate = next(c for c in parse_pod(patched).init_containers if c.name == CONTAINER)
    assert dict(gate.env)["NODE_NAME"] == os.uname().nodename
    patched["spec"]["initContainers"][0]["env"][0]["valueFrom"]["fieldRef"]["fieldPath"] = "status.podIP"
    with pytest.raises(ManifestError, match=r"fieldPath: 'status.podIP' not supported .*only spec.nodeName"):
        parse_pod(patched)
