"""The MutatingAdmissionPolicy and the webhook, each evaluated by the real API server (v1.37): every
pod of tests/policy_cases.py (the webhook tests' cases and the fleet corpus's pod templates) is
created with a server-side dry run (defaulting, every admission plugin, validation; nothing stored),
once through the chart's webhook, deployed (its matchConditions, Service, TLS), and once through the
chart's policy and binding, and the two pods are compared. They are the same except where CEL cannot
do what the webhook does: DIFFERENCES names those pods and why (docs/admission.md), and a difference
that goes away fails too, so the list stays true."""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from admission_requests import admission_review
from admission_support import patch_of
from gpuzombie.admission import mutate, review
from gpuzombie.k8s.podspec.gpus import _GPU_NAMES, _GPU_PREFIXES, gpu_resource
from kube import chart
from kube.api import Api, metric
from kube.chart import REPO
from kube.conftest import Webhook
from kube.pods import resubmitted
from policy_cases import RELEASE_NAMESPACE, S1, admission_cases, fleet_cases

SHELL_PARSING = (
    "the webhook reads the shell script (exec tini): CEL cannot parse shell, the policy runs it under tini too"
)
DIFFERENCES = {
    "argv: sh -c 'exec tini ...'": SHELL_PARSING,
    "argv: bash -c 'exec dumb-init ...'": SHELL_PARSING,
    "opt-in: prestop": "opt-ins are the webhook's: the policy makes the fix without the hook",
    "opt-in: grace-seconds": "opt-ins are the webhook's: the policy leaves the grace as it is",
}
IMAGE = "localhost/gpu-zombie/gpuzombie-node:0.1.0"
"""The chart's default image: the webhook's --image and the policy's init container alike."""
SERVICE_ACCOUNT_PATH = "/var/run/secrets/kubernetes.io/serviceaccount"
PLACEHOLDER_IMAGE = "registry.example.com/completed-by-the-test:1"
GPU_NAMES = [*_GPU_NAMES, *(f"{prefix}1g.10gb" for prefix in _GPU_PREFIXES)]
NOT_GPUS = ["cpu", "nvidia.com/gpux", "nvidia.com/mig", "amd.com/gpu.shared", "gpu.intel.com/i915", "habana.ai/gaudi"]


def completed(api: Api, pod: dict[str, Any], name: str) -> tuple[dict[str, Any], list[str]]:
    """``pod`` named ``name``, with what its controller would add for the API server to take it as a
    Pod (a pod template of an operator's resource is completed by that operator): its service
    account made, a volume for each mount that names none, an image, a handler for a probe that has
    none. None of these is read by the webhook or the policy. Returns the pod and what was added."""
    pod = copy.deepcopy(pod)
    meta = pod["metadata"]
    for key in ("generateName", "managedFields", "creationTimestamp"):
        meta.pop(key, None)
    meta["name"] = name
    spec, added = pod["spec"], []
    volumes = {v["name"] for v in spec.get("volumes") or []}
    for c in [*(spec.get("initContainers") or []), *spec["containers"]]:
        if "image" not in c:
            c["image"] = PLACEHOLDER_IMAGE
            added.append(f"image of {c['name']}")
        for mount in c.get("volumeMounts") or []:
            if mount["name"] not in volumes:
                spec.setdefault("volumes", []).append({"name": mount["name"], "emptyDir": {}})
                volumes.add(mount["name"])
                added.append(f"volume {mount['name']}")
        for probe in ("livenessProbe", "readinessProbe", "startupProbe"):
            if probe in c and not {"exec", "httpGet", "tcpSocket", "grpc"} & set(c[probe]):
                c[probe]["tcpSocket"] = {"port": 8080}
                added.append(f"{probe} handler of {c['name']}")
    account = spec.get("serviceAccountName")
    if account and account != "default":
        api.apply(
            {
                "apiVersion": "v1",
                "kind": "ServiceAccount",
                "metadata": {"name": account, "namespace": meta["namespace"]},
            }
        )
        added.append(f"service account {account}")
    return pod, added


def normal(pod: dict[str, Any]) -> dict[str, Any]:
    """The pod without what the API server sets apart from admission (uid, times, status) and the
    ServiceAccount plugin's token volume and mounts (a random name; and a pod sent again gets the
    mount in the injected init container too, which the plugin, running before every mutating
    step, never sees on a first creation)."""
    pod = resubmitted(pod)
    spec = pod["spec"]
    tokens = {
        m["name"]
        for c in spec["containers"]
        for m in c.get("volumeMounts") or []
        if m["mountPath"] == SERVICE_ACCOUNT_PATH
    }
    spec["volumes"] = [v for v in spec.get("volumes") or [] if v["name"] not in tokens]
    for c in [*(spec.get("initContainers") or []), *spec["containers"]]:
        c["volumeMounts"] = [m for m in c.get("volumeMounts") or [] if m["mountPath"] != SERVICE_ACCOUNT_PATH]
    return json.loads(re.sub(r"kube-api-access-[a-z0-9]{5}", "kube-api-access", json.dumps(pod)))


def injected(pod: dict[str, Any]) -> str | None:
    return (pod["metadata"].get("annotations") or {}).get(chart.INJECTED)


def serving_verdict(pod: dict[str, Any]) -> str | None:
    """The annotation the webhook's own review function gives ``pod`` (the deployed webhook's
    arguments: the chart's image, its release namespace skipped), None for no change."""
    policy = mutate.Policy(image=IMAGE, skip_namespaces=frozenset({"kube-system", RELEASE_NAMESPACE}))
    answer = review.review(json.dumps(admission_review(pod)).encode(), policy).body["response"]
    if "patch" not in answer:
        return None
    (annotate,) = [op for op in patch_of({"response": answer}) if "annotations" in op["path"]]
    return annotate["value"] if isinstance(annotate["value"], str) else annotate["value"][chart.INJECTED]


def resource_pod(resource: str) -> dict[str, Any]:
    pod = chart.probe_pod(f"res-{re.sub(r'[^a-z0-9]+', '-', resource)}")
    pod["spec"]["containers"][0]["command"] = S1
    pod["spec"]["containers"][0]["resources"] = {"limits": {resource: "1"}}
    return pod


@dataclass
class Through:
    """Per case: the pod sent, what the webhook made of it, what the policy made of it, the policy's
    pod sent again through the policy, the webhook's pod sent again through the policy."""

    sent: dict[str, dict[str, Any]]
    completions: dict[str, list[str]]
    webhook: dict[str, dict[str, Any]]
    policy: dict[str, dict[str, Any]]
    policy_again: dict[str, dict[str, Any]]
    webhook_then_policy: dict[str, dict[str, Any]]
    webhook_resources: dict[str, bool]
    policy_resources: dict[str, bool]
    policy_errors: float
    match_condition_errors: float


def _dry_run(api: Api, pod: dict[str, Any]) -> dict[str, Any]:
    reply = api.dry_run_pod(pod)
    assert reply.ok, (pod["metadata"]["name"], reply.body.get("message"))
    return reply.body


def _errors(api: Api) -> tuple[float, float]:
    text = api.metrics()
    checks = metric(text, "apiserver_mutating_admission_policy_check_total", policy=chart.POLICY_NAME)
    good = metric(
        text, "apiserver_mutating_admission_policy_check_total", policy=chart.POLICY_NAME, error_type="no_error"
    )
    return checks - good, metric(text, "apiserver_admission_match_condition_evaluation_errors_total")


@pytest.fixture(scope="module")
def through(kube, api: Api, webhook: Webhook) -> Iterator[Through]:
    fleet, _claims = fleet_cases()
    cases = admission_cases() | fleet
    for namespace in sorted({p["metadata"]["namespace"] for p in cases.values()}):
        api.ensure_namespace(namespace)
    sent, completions = {}, {}
    for i, (name, pod) in enumerate(cases.items()):
        sent[name], added = completed(api, pod, f"case-{i}")
        if added:
            completions[name] = added
    # The webhook alone (the session's deployment, its configuration applied).
    webhook_raw = {name: _dry_run(api, pod) for name, pod in sent.items()}
    webhook_resources = {r: injected(_dry_run(api, resource_pod(r))) is not None for r in GPU_NAMES + NOT_GPUS}
    # The policy alone: the chart's policy and binding (policy.enabled, the chart's image), the
    # webhook's configuration deleted (the chart refuses both at once).
    policy_objects = chart.admission_objects(chart.render({"policy": {"enabled": True}}, webhook.version))
    assert {o["kind"] for o in policy_objects} == {"MutatingAdmissionPolicy", "MutatingAdmissionPolicyBinding"}
    errors_before = _errors(api)
    chart.delete_all(api, [webhook.configuration])
    try:
        chart.wait_until_admission(api, fixed=False, webhook_called=False)
        chart.apply_all(api, policy_objects)
        chart.wait_until_admission(api, fixed=True, webhook_called=False)
        policy_raw = {name: _dry_run(api, pod) for name, pod in sent.items()}
        policy_again = {name: _dry_run(api, resubmitted(pod)) for name, pod in policy_raw.items()}
        webhook_then_policy = {name: _dry_run(api, resubmitted(pod)) for name, pod in webhook_raw.items()}
        policy_resources = {r: injected(_dry_run(api, resource_pod(r))) is not None for r in GPU_NAMES + NOT_GPUS}
        errors_after = _errors(api)
    finally:
        chart.delete_all(api, policy_objects)
        chart.wait_until_admission(api, fixed=False, webhook_called=False)
        chart.apply_all(api, [webhook.configuration])
        chart.wait_until_admission(api, fixed=True, webhook_called=True)
    yield Through(
        sent,
        completions,
        {n: normal(p) for n, p in webhook_raw.items()},
        {n: normal(p) for n, p in policy_raw.items()},
        {n: normal(p) for n, p in policy_again.items()},
        {n: normal(p) for n, p in webhook_then_policy.items()},
        webhook_resources,
        policy_resources,
        errors_after[0] - errors_before[0],
        errors_after[1] - errors_before[1],
    )


def test_the_policy_gives_the_webhooks_pod_where_cel_can(through: Through):
    assert set(DIFFERENCES) <= set(through.sent)
    unexpected = [n for n in through.sent if (through.policy[n] == through.webhook[n]) is (n in DIFFERENCES)]
    assert not unexpected, "\n".join(
        f"{n}: {DIFFERENCES.get(n, 'differs')}\n  policy:  {json.dumps(through.policy[n])}\n"
        f"  webhook: {json.dumps(through.webhook[n])}"
        for n in unexpected
    )
    changed = [n for n in through.sent if injected(through.policy[n]) != injected(through.sent[n])]
    assert len(changed) >= 40, changed  # the comparison is not of pods left alone
    fleet = sum(n.startswith("fleet ") for n in through.sent)
    told = " ".join((REPO / "docs" / "admission.md").read_text().split())
    said = f"on {len(through.sent)} pods: the {fleet} pod templates of the fleet corpus"
    same = f"the same for {len(through.sent) - len(DIFFERENCES)}, and the {len(DIFFERENCES)} others"
    assert said in told and same in told
    assert f"{len(through.completions)} of the fleet's templates" in told


def test_what_differs_is_what_the_reason_says(through: Through):
    """Each difference is the named one, and the rest of the fix is the same."""
    for name in ("argv: sh -c 'exec tini ...'", "argv: bash -c 'exec dumb-init ...'"):
        webhook, policy = through.webhook[name], through.policy[name]
        assert injected(webhook) is None
        assert policy["spec"]["containers"][0]["command"][:4] == [mutate.TINI, "-s", "-g", "--"]
    webhook, policy = through.webhook["opt-in: prestop"], through.policy["opt-in: prestop"]
    assert "preStop" in webhook["spec"]["containers"][0]["lifecycle"]
    assert "lifecycle" not in policy["spec"]["containers"][0]
    assert policy["spec"]["containers"][0]["command"] == webhook["spec"]["containers"][0]["command"]
    webhook, policy = through.webhook["opt-in: grace-seconds"], through.policy["opt-in: grace-seconds"]
    assert webhook["spec"]["terminationGracePeriodSeconds"] == 60
    assert policy["spec"]["terminationGracePeriodSeconds"] == 30


def test_the_policy_never_applies_twice_and_leaves_the_webhooks_pods_alone(through: Through):
    for name in through.sent:
        assert through.policy_again[name] == through.policy[name], name
        if injected(through.webhook[name]) != injected(through.sent[name]):
            assert through.webhook_then_policy[name] == through.webhook[name], name


def test_no_cel_error_on_any_pod(through: Through):
    """The API server counts an expression's runtime error per policy (and admits the pod unchanged:
    failurePolicy Ignore); none happened on the cases. The metric names docs/admission.md gives."""
    assert through.policy_errors == 0
    assert through.match_condition_errors == 0


def test_the_deployed_webhook_decides_as_its_review_function(through: Through):
    """For every case, the webhook behind the API server (its matchConditions evaluated by the API
    server first) gives the annotation the review function gives the pod as sent: a pod the webhook
    would fix that the matchConditions kept from it would fail here."""
    wrong = {}
    for name, pod in through.sent.items():
        expected = serving_verdict(pod) or injected(pod)
        if injected(through.webhook[name]) != expected:
            wrong[name] = (expected, injected(through.webhook[name]))
    assert not wrong, wrong


def test_both_know_the_gpu_resources_podspec_knows(through: Through):
    """podspec's table is the one list of GPU resources: a name added there and not to the chart's
    CEL (the webhook's matchConditions, the policy's) fails here."""
    for resource in GPU_NAMES + NOT_GPUS:
        is_gpu = gpu_resource(resource) is not None
        assert through.webhook_resources[resource] is is_gpu, resource
        assert through.policy_resources[resource] is is_gpu, resource


def _called_pod(resources: dict[str, Any] | None = None, annotations: dict[str, str] | None = None) -> dict[str, Any]:
    pod = chart.probe_pod("called")
    pod["spec"]["containers"] = [{"name": "side", "image": chart.BUSYBOX}, {"name": "c", "image": chart.BUSYBOX}]
    if resources is not None:
        pod["spec"]["containers"][1]["resources"] = resources
    if annotations is not None:
        pod["metadata"]["annotations"] = annotations
    return pod


@pytest.mark.parametrize(
    ("pod", "called"),
    [
        (_called_pod({"limits": {"nvidia.com/gpu": "1"}}), True),
        (_called_pod({"limits": {"nvidia.com/mig-3g.40gb": "1"}}), True),
        (_called_pod({"limits": {"amd.com/gpu": "2"}}, {"team": "ml"}), True),
        (_called_pod({"limits": {"cpu": "2"}}), False),
        (_called_pod({}), False),
        (_called_pod(), False),
        (_called_pod({"limits": {"nvidia.com/gpu": "1"}}, {"gpuzombie.dev/inject": "false"}), False),
        (_called_pod({"limits": {"nvidia.com/gpu": "1"}}, {"gpuzombie.dev/inject": "true"}), True),
    ],
)
def test_the_api_server_calls_the_webhook_only_for_gpu_pods(api: Api, webhook: Webhook, pod, called):
    """The chart's matchConditions, evaluated by the API server: the webhook's request counter
    (apiserver_admission_webhook_request_total) moves for a GPU pod, not for the others."""
    before = chart.webhook_calls(api)
    reply = api.dry_run_pod(pod)
    assert reply.ok, reply.body
    assert (chart.webhook_calls(api) > before) is called
