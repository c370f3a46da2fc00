"""The checks every admission test applies to an answer: the JSONPatch applied with the jsonpatch
library, the patched pod validated strictly with kubernetes-validate (1.29 and the newest schema it
ships). The requests themselves: admission_requests.py."""

from __future__ import annotations

import base64
import copy
import json
from typing import Any

import pytest

from admission_requests import admission_review, api_server_pod, container

jsonpatch = pytest.importorskip("jsonpatch", reason="jsonpatch is in the 'admission' extra")
kubernetes_validate = pytest.importorskip("kubernetes_validate", reason="kubernetes-validate is in the 'chart' extra")

K8S_VERSIONS = ("1.29.0", kubernetes_validate.latest_version())
__all__ = ["admission_review", "api_server_pod", "apply", "container", "patch_of", "validate_pod"]


def patch_of(answer: dict[str, Any]) -> list[dict[str, Any]]:
    """The JSONPatch of an AdmissionReview answer ([] when it has none)."""
    response = answer["response"]
    if "patch" not in response:
        assert "patchType" not in response
        return []
    assert response["patchType"] == "JSONPatch"
    ops = json.loads(base64.b64decode(response["patch"]))
    assert all(op["op"] in ("add", "replace") for op in ops), ops  # explicit operations only
    return ops


def apply(pod: dict[str, Any], ops: list[dict[str, Any]]) -> dict[str, Any]:
    return jsonpatch.JsonPatch(ops).apply(copy.deepcopy(pod))


def validate_pod(pod: dict[str, Any]) -> None:
    """Strictly, as the API server would after the patch (unknown fields rejected)."""
    for version in K8S_VERSIONS:
        kubernetes_validate.validate(pod, version, strict=True)
