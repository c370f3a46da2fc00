"""docs/examples/devicetaintrule-*.yaml (issue 25 item 4): the DRA device taints docs/handover.md
ships validate strictly against Kubernetes' own resource.k8s.io schemas, for every release that serves
their API version (kubernetes-validate 1.37.0 carries them: v1alpha3 from 1.33, v1beta2 from 1.36, v1
from 1.37), and
the validation is not vacuous (a misspelt field or a missing taint fails)."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

kubernetes_validate = pytest.importorskip("kubernetes_validate", reason="kubernetes-validate is in the 'chart' extra")
yaml = pytest.importorskip("yaml", reason="PyYAML is in the 'chart' extra")

EXAMPLES = Path(__file__).resolve().parent.parent / "docs" / "examples"
RELEASES = {
    "resource.k8s.io/v1alpha3": ("1.33.0", "1.34.0", "1.35.0", "1.36.0", "1.37.0"),
    "resource.k8s.io/v1beta2": ("1.36.0", "1.37.0"),
    "resource.k8s.io/v1": ("1.37.0",),
}


def example(api: str) -> dict:
    return yaml.safe_load((EXAMPLES / f"devicetaintrule-{api.rsplit('/', 1)[1]}.yaml").read_text())


@pytest.mark.parametrize("api", sorted(RELEASES))
def test_the_example_validates_for_every_release_that_serves_it(api):
    rule = example(api)
    assert (rule["apiVersion"], rule["kind"]) == (api, "DeviceTaintRule")
    for release in RELEASES[api]:
        kubernetes_validate.validate(rule, release, strict=True)
    assert rule["spec"]["taint"]["effect"] == "NoSchedule"  # keeps new claims off, evicts nobody


@pytest.mark.parametrize("api", sorted(RELEASES))
def test_the_two_examples_say_the_same(api):
    assert {k: v for k, v in example(api).items() if k != "apiVersion"} == {
        k: v for k, v in example("resource.k8s.io/v1").items() if k != "apiVersion"
    }


@pytest.mark.parametrize(
    "break_it",
    [
        lambda r: r["spec"]["deviceSelector"].update(uuid="GPU-0"),  # no such selector field
        lambda r: r["spec"].pop("taint"),
        lambda r: r["spec"]["taint"].pop("effect"),
    ],
    ids=["unknown-selector-field", "no-taint", "no-effect"],
)
def test_a_broken_rule_fails_validation(break_it):
    rule = copy.deepcopy(example("resource.k8s.io/v1"))
    break_it(rule)
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(rule, "1.37.0", strict=True)


def test_before_1_33_there_is_no_device_taint_rule():
    rule = example("resource.k8s.io/v1alpha3")
    with pytest.raises(kubernetes_validate.SchemaNotFoundError):
        kubernetes_validate.validate(rule, "1.32.0", strict=True)
