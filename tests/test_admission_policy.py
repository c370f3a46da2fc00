"""The MutatingAdmissionPolicy (deploy/admission/mutating-admission-policy.yaml, the chart's policy.enabled
rendered) against the webhook. Its CEL is evaluated by cel-python, a STAND-IN for the API server's
cel-go (tests/cel_standin.py says what it adds and what it does not check), on the fleet corpus and on
pods as the API server sends them; the JSONPatch it returns is applied with jsonpatch, and each pod is
compared with what `gpuzombie webhook --patch` writes for it. They are the same except where CEL cannot
do what the webhook does: DIFFERENCES names those pods and why (docs/admission.md, "The policy instead
of the webhook"), and a difference that goes away fails too, so the list stays true."""

from __future__ import annotations

import copy
import json
import pathlib
import subprocess
import sys
from typing import Any

import pytest

pytest.importorskip("celpy", reason="cel-python is in the 'test' extra")
yaml = pytest.importorskip("yaml", reason="PyYAML is in the 'admission' extra")

import cel_standin  # noqa: E402
from admission_support import api_server_pod, container, kubernetes_validate  # noqa: E402
from gpuzombie.admission import mutate  # noqa: E402
from gpuzombie.k8s import podspec  # noqa: E402

REPO = pathlib.Path(__file__).resolve().parents[1]
MANIFEST = REPO / "deploy" / "admission" / "mutating-admission-policy.yaml"
FLEET = REPO / "tests" / "fixtures" / "fleet"
IMAGE = "REGISTRY.example.com/gpu-zombie/gpuzombie-node:0.1.0"
"""The manifest's init container image, given to the webhook too."""
RELEASE_NAMESPACE = "gpuzombie"
POLICY_K8S_VERSIONS = ("1.36.0", kubernetes_validate.latest_version())
"""The versions that have the policy (GA in 1.36): the pods it makes are validated in those."""
S1 = ["sh", "-c", "python3 train.py & exec sleep infinity"]
SHELL_PARSING = (
    "the webhook reads the shell script (exec tini): CEL cannot parse shell, the policy runs it under tini too"
)
DIFFERENCES = {
    "argv: sh -c 'exec tini ...'": SHELL_PARSING,
    "argv: bash -c 'exec dumb-init ...'": SHELL_PARSING,
    "opt-in: prestop": "opt-ins are the webhook's: the policy makes the fix without the hook",
    "opt-in: grace-seconds": "opt-ins are the webhook's: the policy leaves the grace as it is",
    "fleet jobset/site_static_examples_workload-aware-scheduling_dra_jobset.yaml#0:/spec/replicatedJobs/0/template/spec/template": (
        "--patch reads the claim template beside it (device class gpu.example.com: no GPU); the policy sees the "
        "pod alone and takes a DRA claim for a GPU, as the serving webhook does"
    ),
}


def _container(command: list[str] | None = None, args: list[str] | None = None, **fields: Any) -> dict[str, Any]:
    c = container(**fields)
    if command is not None:
        c["command"] = command
    if args is not None:
        c["args"] = args
    return c


def _annotated(pod: dict[str, Any], **annotations: str) -> dict[str, Any]:
    pod["metadata"].setdefault("annotations", {}).update(annotations)
    return pod


def _with(pod: dict[str, Any], **spec: Any) -> dict[str, Any]:
    pod["spec"].update(spec)
    return pod


def _os_affinity(values: list[str]) -> dict[str, Any]:
    term = {"matchExpressions": [{"key": "kubernetes.io/os", "operator": "In", "values": values}]}
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [term]}}}


def admission_cases() -> dict[str, dict[str, Any]]:
    """Pods as the API server sends them: the cases of the webhook's own tests that CEL must decide."""
    init_gpu = _container(["python3", "warm.py"], name="warm")
    sidecar = container("log-shipper", gpu=False, command=["fluent-bit"], restartPolicy="Always")
    mounted = _container(S1)
    mounted["volumeMounts"].append({"name": "mine", "mountPath": "//.gpuzombie/."})
    bare = _container(S1)
    del bare["volumeMounts"]
    argv = {
        "sh -c '... & exec sleep infinity'": (S1, None),
        "bash & sleep": (["bash", "-c", "python3 t.py & sleep infinity"], None),
        "python as PID 1": (["python3", "train.py"], None),
        "script in args": (["sh", "-c"], ["exec python3 t.py"]),
        "tini in command": (["tini", "--"], ["python3", "t.py"]),
        "dumb-init by path": (["/usr/bin/dumb-init", "python3"], None),
        "s6-overlay /init": (["/init"], None),
        "catatonit": (["catatonit", "--", "sleep", "1"], None),
        "supervisord": (["/usr/bin/supervisord", "-n"], None),
        "sh -c 'exec tini ...'": (["sh", "-c", "exec tini -- python3 t.py"], None),
        "bash -c 'exec dumb-init ...'": (["bash", "-c", "exec dumb-init python3 t.py"], None),
        "args only": (None, S1),
        "image ENTRYPOINT and CMD": (None, None),
        "empty command is unset": ([], ["python3"]),
    }
    cases = {f"argv: {name}": api_server_pod(_container(c, a)) for name, (c, a) in argv.items()}
    resources = {
        "MIG": {"requests": {"nvidia.com/mig-1g.10gb": "1"}},
        "AMD": {"limits": {"amd.com/gpu": "1"}},
        "shared GPU": {"limits": {"nvidia.com/gpu.shared": "1"}},
        "a number": {"limits": {"nvidia.com/gpu": 2}},
        "zero GPUs": {"limits": {"nvidia.com/gpu": "0"}},
        "CPU only": {"limits": {"cpu": "8", "memory": "64Gi"}},
    }
    cases |= {f"resources: {name}": api_server_pod(_container(S1, resources=r)) for name, r in resources.items()}
    cases |= {
        "mixed: share once, tini for the one with a command": api_server_pod(
            _container(None, S1), _container(name="eval"), _container(S1, name="aux")
        ),
        "sidecars and istio left alone": api_server_pod(
            _container(S1),
            container("istio-proxy", gpu=False, command=["pilot-agent", "proxy"]),
            initContainers=[sidecar],
        ),
        "a GPU init container moves down one": api_server_pod(
            _container(S1), initContainers=[container("fetch", gpu=False, command=["true"]), init_gpu]
        ),
        "no volumes, mounts or annotations yet": api_server_pod(bare, volumes=[]),
        "annotations there already": _annotated(api_server_pod(_container(S1)), team="ml"),
        "KAI fraction, named container": _annotated(
            api_server_pod(_container(S1, gpu=False), _container(S1, name="second", gpu=False)),
            **{"gpu-fraction": "0.5", "gpu-fraction-container-name": "second"},
        ),
        "KAI fraction 0": _annotated(api_server_pod(_container(S1, gpu=False)), **{"gpu-fraction": "0"}),
        "DRA claim": api_server_pod(
            _container(S1, gpu=False, resources={"claims": [{"name": "gpu"}]}),
            resourceClaims=[{"name": "gpu", "resourceClaimTemplateName": "one-gpu"}],
        ),
        "mounted at /.gpuzombie already": api_server_pod(mounted, volumes=[{"name": "mine", "emptyDir": {}}]),
        "opted out": _annotated(api_server_pod(_container(S1)), **{"gpuzombie.dev/inject": "False"}),
        "mutated already": _annotated(api_server_pod(_container(S1)), **{"gpuzombie.dev/injected": "tini:train"}),
        "a container named gpuzombie-install": api_server_pod(_container(S1), _container(S1, name="gpuzombie-install")),
        "windows": _with(api_server_pod(_container(S1)), os={"name": "windows"}),
        "windows by nodeSelector": _with(api_server_pod(_container(S1)), nodeSelector={"kubernetes.io/os": "windows"}),
        "windows by node affinity": _with(api_server_pod(_container(S1)), affinity=_os_affinity(["windows"])),
        "windows or linux by node affinity": _with(
            api_server_pod(_container(S1)), affinity=_os_affinity(["linux", "windows"])
        ),
        "hostPID": _with(api_server_pod(_container(S1)), hostPID=True),
        "shares its process namespace already": _with(api_server_pod(_container(S1)), shareProcessNamespace=True),
        "kube-system": api_server_pod(_container(S1), namespace="kube-system"),
        "the release's namespace": api_server_pod(_container(S1), namespace=RELEASE_NAMESPACE),
        "opt-in: prestop": _annotated(api_server_pod(_container(S1)), **{"gpuzombie.dev/prestop": "true"}),
        "opt-in: grace-seconds": _annotated(api_server_pod(_container(S1)), **{"gpuzombie.dev/grace-seconds": "60"}),
    }
    return cases


def fleet_cases() -> tuple[dict[str, dict[str, Any]], list[dict[str, Any]]]:
    """Every pod template of the fleet corpus as the Pod it makes, and the corpus's DRA claims (so
    that --patch can resolve them). Argo's container templates are left out: --patch leaves them."""
    pods: dict[str, dict[str, Any]] = {}
    claims: list[dict[str, Any]] = []
    for path in sorted(FLEET.rglob("*.yaml")):
        documents = podspec.load_documents(path.read_text())
        for obj in podspec.objects(documents):
            if isinstance(obj.data, dict) and obj.data.get("kind") in ("ResourceClaim", "ResourceClaimTemplate"):
                claims.append(obj.data)
        for ref in podspec.pod_templates(documents):
            if ref.container is not None:
                continue
            metadata = {**(ref.pod.get("metadata") or {}), "namespace": ref.namespace or "default"}
            pod = {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": copy.deepcopy(ref.pod["spec"])}
            pods[f"fleet {path.parent.name}/{path.name}#{ref.document}:{ref.pointer}"] = pod
    return pods, claims


@pytest.fixture(scope="module")
def policy() -> tuple[dict[str, Any], dict[str, Any]]:
    found = {d["kind"]: d for d in yaml.safe_load_all(MANIFEST.read_text()) if d}
    return found["MutatingAdmissionPolicy"], found["MutatingAdmissionPolicyBinding"]


@pytest.fixture(scope="module")
def compared(policy, tmp_path_factory) -> dict[str, tuple[dict[str, Any], dict[str, Any], dict[str, Any]]]:
    """id -> (pod, the policy's result, `gpuzombie webhook --patch`'s result): one CLI run for all."""
    fleet, claims = fleet_cases()
    cases = admission_cases() | fleet
    stream = tmp_path_factory.mktemp("policy") / "pods.yaml"
    stream.write_text("".join(f"---\n{json.dumps(d)}\n" for d in [*cases.values(), *claims]))
    command = [sys.executable, "-m", "gpuzombie", "webhook", "--patch", str(stream), "--image", IMAGE]
    got = subprocess.run([*command, "--namespace", RELEASE_NAMESPACE], capture_output=True, text=True, timeout=120)
    assert got.returncode == 0, got.stderr
    patched = [d for d in yaml.safe_load_all(got.stdout) if d][: len(cases)]
    out = {}
    for (name, pod), webhook in zip(cases.items(), patched, strict=True):
        mine = cel_standin.admit(*policy, copy.deepcopy(pod), pod["metadata"]["namespace"])
        out[name] = (pod, mine, webhook)
    return out


def test_the_policy_makes_the_webhooks_fix_where_cel_can(compared):
    assert set(DIFFERENCES) <= set(compared)
    unexpected = [name for name, (_, mine, webhook) in compared.items() if (mine == webhook) is (name in DIFFERENCES)]
    assert not unexpected, "\n".join(
        f"{name}: {DIFFERENCES.get(name, 'differs')}\n  policy:  {json.dumps(compared[name][1])}\n"
        f"  webhook: {json.dumps(compared[name][2])}"
        for name in unexpected
    )
    changed = [name for name, (pod, mine, _) in compared.items() if mine != pod]
    assert len(changed) >= 40, changed  # the comparison is not of pods left alone
    fleet = sum(name.startswith("fleet ") for name in compared)
    told = " ".join((REPO / "docs" / "admission.md").read_text().split())
    said = f"on {len(compared)} pods: the {fleet} pod templates of the fleet corpus"
    assert (
        said in told and f"the same for {len(compared) - len(DIFFERENCES)}, and the {len(DIFFERENCES)} others" in told
    )


def test_what_differs_is_what_the_reason_says(compared):
    """Each difference is the named one, and the rest of the fix is the same."""
    for name in ("argv: sh -c 'exec tini ...'", "argv: bash -c 'exec dumb-init ...'"):
        pod, mine, webhook = compared[name]
        assert webhook == pod and mine["spec"]["containers"][0]["command"][:4] == [mutate.TINI, "-s", "-g", "--"]
    pod, mine, webhook = compared["opt-in: prestop"]
    assert (
        "preStop" in webhook["spec"]["containers"][0]["lifecycle"] and "lifecycle" not in mine["spec"]["containers"][0]
    )
    assert mine["spec"]["containers"][0]["command"] == webhook["spec"]["containers"][0]["command"]
    pod, mine, webhook = compared["opt-in: grace-seconds"]
    assert webhook["spec"]["terminationGracePeriodSeconds"] == 60
    assert mine["spec"]["terminationGracePeriodSeconds"] == pod["spec"]["terminationGracePeriodSeconds"] == 30


def test_the_policys_pods_are_valid_and_it_never_applies_twice(compared, policy):
    for name, (pod, mine, _) in compared.items():
        if name.startswith("fleet ") or mine == pod:
            continue
        for version in POLICY_K8S_VERSIONS:
            kubernetes_validate.validate(mine, version, strict=True)
        again = cel_standin.admit(*policy, copy.deepcopy(mine), pod["metadata"]["namespace"])
        assert again == mine, name
        assert mutate.mutate(mine, pod["metadata"]["namespace"], mutate.Policy(image=IMAGE)).ops == [], name


def test_a_pod_the_webhook_patched_is_left_alone(compared, policy):
    for name, (pod, _, webhook) in compared.items():
        if webhook != pod:
            assert cel_standin.admit(*policy, copy.deepcopy(webhook), pod["metadata"]["namespace"]) == webhook, name


def test_the_stand_in_checks_initializer_names_as_the_api_server_does(policy):
    """k8s.io/apiserver's own case (json_patch_test.go): a nested initializer named unlike its field."""
    evaluator = cel_standin.Evaluator(policy[0]["spec"], api_server_pod(_container(S1)))
    good = "Object.spec.containers{volumeMounts: [Object.spec.containers.volumeMounts{name: 'a'}]}"
    assert cel_standin.to_json(evaluator.evaluate(good)) == {"volumeMounts": [{"name": "a"}]}
    with pytest.raises(cel_standin.PolicyError, match="unexpected type name"):
        evaluator.evaluate("Object.spec.containers{volumeMounts: [Object.spec.containers.volumeMountsZ{name: 'a'}]}")


def test_the_policy_knows_the_gpu_resources_podspec_knows(policy):
    """podspec's table is the one list of GPU resources: a name added there and not to the policy fails here."""
    gpu_names = [*podspec._GPU_NAMES, *(f"{prefix}1g.10gb" for prefix in podspec._GPU_PREFIXES)]
    others = ["cpu", "nvidia.com/gpux", "nvidia.com/mig", "amd.com/gpu.shared", "gpu.intel.com/i915", "habana.ai/gaudi"]
    for name in gpu_names + others:
        pod = api_server_pod(_container(S1, resources={"limits": {name: "1"}}))
        fixed = cel_standin.admit(*policy, copy.deepcopy(pod), "ml-train") != pod
        assert fixed is (podspec.gpu_resource(name) is not None), name
