"""The one pod-spec model (``k8s.podspec``) on fixture strings: GPU recognition shared by admission,
the lab and the node agent; containers of every kind; the strict (lab) and lenient (admission)
readers; pod templates located by JSON pointers in their documents."""

from __future__ import annotations

import pytest

pytest.importorskip("yaml", reason="PyYAML is in the 'admission' and 'labpod' extras")

import yaml

from gpuzombie.admission import rules
from gpuzombie.k8s.podresources import DeviceAssignment, PodResources
from gpuzombie.k8s.podspec.fields import ManifestError
from gpuzombie.k8s.podspec.gpus import GpuForm, gpu_resource
from gpuzombie.k8s.podspec.loader import line_of, load_documents
from gpuzombie.k8s.podspec.model import ContainerKind, PreStop, read_pod_spec
from gpuzombie.k8s.podspec.pointers import resolve
from gpuzombie.k8s.podspec.templates import pod_templates
from gpuzombie.lab.manifest import load_pod, parse_pod


def gpu_pod(resource: str) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p"},
        "spec": {
            "containers": [
                {
                    "name": "c",
                    "command": ["sh", "-c", "python3 train.py & sleep infinity"],
                    "resources": {"limits": {resource: "1"}},
                }
            ]
        },
    }


# resource, GPU form (None: not a GPU), the lab runs it
RESOURCES = [
    ("nvidia.com/gpu", GpuForm.WHOLE, True),
    ("nvidia.com/gpu.shared", GpuForm.SHARED, False),
    ("nvidia.com/mig-1g.10gb", GpuForm.MIG, False),
    ("nvidia.com/mig-1g.10gb.shared", GpuForm.MIG, False),
    ("amd.com/gpu", GpuForm.WHOLE, False),
    ("nvidia.com/hostdev", None, False),
    ("example.com/fpga", None, False),
]


@pytest.mark.parametrize(("resource", "form", "lab_runs"), RESOURCES)
def test_one_gpu_recognition_for_admission_the_lab_and_the_node(resource, form, lab_runs):
    """Before, admission knew gpu, mig-* and amd.com/gpu, the lab nvidia.com/gpu alone and the node
    agent every ``nvidia.com/`` name: a time-sliced GPU (``nvidia.com/gpu.shared``) was no GPU to
    ``check``, an NVIDIA NIC's PCI address a GPU id to the node. Now all three ask gpu_resource."""
    gpu = gpu_resource(resource)
    assert (gpu.form if gpu else None) is form
    pod = gpu_pod(resource)
    assert bool(rules.check_pod_spec(pod["spec"])) is (form is not None)  # admission
    resources = PodResources("k.sock", (DeviceAssignment("ns", "p", "c", resource, "GPU-0"),))
    assert bool(resources.gpu_assignments) is (gpu is not None and gpu.vendor == "nvidia")  # node agent
    if lab_runs:
        assert parse_pod(pod).containers[0].resources.gpus == 1
    else:
        with pytest.raises(ManifestError) as raised:
            parse_pod(pod)
        assert str(raised.value).startswith(f"spec.containers[0].resources.limits.{resource}: not supported")
        assert ("a GPU the lab cannot give" in str(raised.value)) is (form is not None)


SPEC = yaml.safe_load(
    """
initContainers:
- {name: fetch, command: [cp, a, b]}
- name: proxy
  restartPolicy: Always
  command: [envoy]
  resources: {limits: {nvidia.com/gpu: 1}}
containers:
- name: train
  command: [tini, --, python3, train.py]
  env: [{name: A, value: "1"}, {name: B, valueFrom: {fieldRef: {fieldPath: metadata.name}}}]
  lifecycle: {preStop: {exec: {command: [sleep, "5"]}}}
  resources: {limits: {nvidia.com/gpu: "2"}}
- name: web
  args: [serve]
  lifecycle: {preStop: {httpGet: {port: 80}}}
ephemeralContainers:
- {name: debug, command: [sh]}
terminationGracePeriodSeconds: 45
"""
)


def test_containers_of_every_kind_with_their_place_in_the_pod():
    pod = read_pod_spec(SPEC)
    assert [(c.kind, c.name, c.pointer, c.where) for c in pod.every_container] == [
        (ContainerKind.INIT, "fetch", "/spec/initContainers/0", "spec.initContainers[0]"),
        (ContainerKind.SIDECAR, "proxy", "/spec/initContainers/1", "spec.initContainers[1]"),
        (ContainerKind.REGULAR, "train", "/spec/containers/0", "spec.containers[0]"),
        (ContainerKind.REGULAR, "web", "/spec/containers/1", "spec.containers[1]"),
        (ContainerKind.EPHEMERAL, "debug", "/spec/ephemeralContainers/0", "spec.ephemeralContainers[0]"),
    ]
    assert [c.name for c in pod.every_container if c.gpu] == ["proxy", "train"]  # a GPU sidecar is seen
    assert [c.name for c in pod.gpu_containers] == ["proxy", "train"]  # the rules judge GPU sidecars too (issue 24)
    train = pod.containers[0]
    assert train.gpus[0].quantity == "2" and train.gpus[0].resource.name == "nvidia.com/gpu"
    assert pod.grace_seconds == 45 and not pod.share_process_namespace


def test_the_lenient_reader_leaves_out_what_it_cannot_judge():
    train, web = read_pod_spec(SPEC).containers
    assert train.env == {"A": "1"}  # B comes from the API: not known here
    assert train.prestop == PreStop(command=("sleep", "5"))
    assert web.prestop is None and web.command is None and web.args == ("serve",)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda s: s["containers"][1]["lifecycle"].update(preStop={}), "spec.containers[1].lifecycle.preStop: exactly"),
        (lambda s: s["containers"][0]["env"].pop(), None),
        (lambda s: s["containers"][0].update(name="Train"), "spec.containers[0].name: 'Train' is not a DNS-1123"),
        (lambda s: s["containers"][1].update(name="train"), "spec.containers: two containers with one name"),
        (lambda s: s["containers"][0]["env"].append({"name": "N", "value": 1}), "spec.containers[0].env[1]: a name"),
        (lambda s: s.update(terminationGracePeriodSeconds=-1), "spec.terminationGracePeriodSeconds: expected an"),
    ],
)
def test_the_strict_reader_refuses_what_the_api_server_would(change, message):
    spec = yaml.safe_load(yaml.safe_dump(SPEC))
    spec["containers"][1]["lifecycle"]["preStop"] = {"sleep": {"seconds": 1}}  # a hook the lab can run
    spec["containers"][0]["env"].pop()  # a valueFrom the lab refuses by name
    change(spec)
    if message is None:
        assert read_pod_spec(spec, strict=True).containers[0].env == {}
        return
    with pytest.raises(ManifestError) as raised:
        read_pod_spec(spec, strict=True)
    assert str(raised.value).startswith(message), raised.value


def test_a_wrong_type_is_one_message_in_both_modes():
    for strict in (False, True):
        with pytest.raises(ManifestError, match=r"^spec.containers\[0\].args holds something other than strings$"):
            read_pod_spec({"containers": [{"name": "c", "args": ["sleep", 30]}]}, strict=strict)
        with pytest.raises(ManifestError, match=r"^spec.containers is not a list \(a string\)$"):
            read_pod_spec({"containers": "c"}, strict=strict)


MANIFESTS = """
apiVersion: v1
kind: List
metadata: {namespace: team}
items:
- apiVersion: apps/v1
  kind: Deployment
  metadata: {name: d}
  spec: {template: {spec: {containers: [{name: c}]}}}
- apiVersion: batch/v1
  kind: CronJob
  metadata: {name: cj, namespace: other}
  spec: {jobTemplate: {spec: {template: {spec: {containers: [{name: c}]}}}}}
---
apiVersion: v1
kind: Pod
metadata: {generateName: p-}
spec: {containers: [{name: c}]}
---
apiVersion: v1
kind: ConfigMap
metadata: {name: cm}
---
apiVersion: example.com/v1
kind: Trainer
metadata: {name: t}
spec: {template: {spec: {containers: [{name: c}]}}}
"""


def test_pod_templates_are_located_by_a_json_pointer_in_their_document():
    documents = load_documents(MANIFESTS)
    found = [(t.document, t.label, t.pointer) for t in pod_templates(documents)]
    assert found == [
        (0, "Deployment/team/d", "/items/0/spec/template"),
        (0, "CronJob/other/cj", "/items/1/spec/jobTemplate/spec/template"),
        (1, "Pod/p-", ""),
        (3, "Trainer/t", "/spec/template"),
    ]
    for t in pod_templates(documents):
        assert resolve(documents[t.document].data, t.pointer) is t.pod
    assert line_of(documents[0].node, "/items/1/spec/jobTemplate") == 13  # its key's line


def test_the_lab_reads_its_one_pod_with_the_same_loader():
    assert load_pod("kind: PodList\nitems: [{kind: Pod}]\n") == {"kind": "Pod"}
    with pytest.raises(ManifestError, match="runs one Pod, the input has 2 objects"):
        load_pod("kind: Pod\n---\nkind: Pod\n")
