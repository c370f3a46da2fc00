"""`gpuzombie webhook --patch` against the serving webhook (its review function) on the pods the policy
is compared on (tests/policy_cases.py): the same fix, except where --patch sees more than the pod (a DRA
claim's template beside it). tests/kube/test_admission_kubernetes.py compares the serving webhook,
deployed, with the MutatingAdmissionPolicy on the real API server; this ties --patch to both."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import pytest

yaml = pytest.importorskip("yaml", reason="PyYAML is in the 'admission' extra")

from admission_requests import admission_review  # noqa: E402
from admission_support import apply, patch_of  # noqa: E402
from gpuzombie.admission import mutate, review  # noqa: E402
from policy_cases import RELEASE_NAMESPACE, admission_cases, fleet_cases  # noqa: E402

IMAGE = "REGISTRY.example.com/gpu-zombie/gpuzombie-node:0.1.0"
PATCH_SEES_MORE = {
    "fleet jobset/site_static_examples_workload-aware-scheduling_dra_jobset.yaml#0:/spec/replicatedJobs/0/template/spec/template": (
        "--patch reads the claim template beside it (device class gpu.example.com: no GPU); the serving webhook "
        "sees the pod alone and takes a DRA claim for a GPU"
    ),
}


def serving(pod: dict[str, Any]) -> dict[str, Any]:
    policy = mutate.Policy(image=IMAGE, skip_namespaces=frozenset({"kube-system", RELEASE_NAMESPACE}))
    answer = review.review(json.dumps(admission_review(pod)).encode(), policy)
    return apply(pod, patch_of(answer.body))


def test_patch_gives_the_serving_webhooks_fix(tmp_path):
    fleet, claims = fleet_cases()
    cases = admission_cases() | fleet
    stream = tmp_path / "pods.yaml"
    stream.write_text("".join(f"---\n{json.dumps(d)}\n" for d in [*cases.values(), *claims]))
    command = [sys.executable, "-m", "gpuzombie", "webhook", "--patch", str(stream), "--image", IMAGE]
    got = subprocess.run([*command, "--namespace", RELEASE_NAMESPACE], capture_output=True, text=True, timeout=120)
    assert got.returncode == 0, got.stderr
    patched = [d for d in yaml.safe_load_all(got.stdout) if d][: len(cases)]
    differ = {name for (name, pod), mine in zip(cases.items(), patched, strict=True) if serving(pod) != mine}
    assert differ == set(PATCH_SEES_MORE)
    changed = [name for name, pod in cases.items() if serving(pod) != pod]
    assert len(changed) >= 40, changed  # the comparison is not of pods left alone
