"""AdmissionReview v1: the API server's request in, the webhook's answer out. Never a crash and
never a denial: a pod it cannot understand is allowed unchanged with a warning; a body that is not an
AdmissionReview (no uid to answer) gets the API's error response, a v1 Status with HTTP 400.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from gpuzombie.admission.mutate import MAX_WARNINGS, Mutation, Policy, mutate
from gpuzombie.admission.rules import Budget, OverBudget, short
from gpuzombie.escape import escape

API_VERSION = "admission.k8s.io/v1"
WARNING_PREFIX = "gpuzombie: "
MAX_WARNING_CHARS = 240
"""The API server may truncate warnings longer than 256 characters."""


@dataclass(frozen=True)
class Answer:
    """An HTTP status and the JSON body to send."""

    status: int
    body: dict[str, Any]
    note: str | None = None
    """One escaped line for the webhook's log: what was done to which pod (None: nothing to say)."""

    def encode(self) -> bytes:
        return json.dumps(self.body, separators=(",", ":")).encode()


def status_error(code: int, reason: str, message: str) -> Answer:
    """The API's error response (metav1.Status), as kube-apiserver writes one."""
    return Answer(
        code,
        {
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": message,
            "reason": reason,
            "code": code,
        },
    )


def _warnings(lines: list[str]) -> list[str]:
    """At most MAX_WARNINGS lines for kubectl, each escaped (a container's name may hold a terminal
    escape) and cut to MAX_WARNING_CHARS."""
    width = MAX_WARNING_CHARS - len(WARNING_PREFIX)
    out = [WARNING_PREFIX + escape(short(line, width), width) for line in lines[:MAX_WARNINGS]]
    if len(lines) > MAX_WARNINGS:
        out.append(f"{WARNING_PREFIX}{len(lines) - MAX_WARNINGS} more warnings left out")
    return out


def respond(uid: str, mutation: Mutation | None = None, warnings: list[str] | None = None) -> Answer:
    response: dict[str, Any] = {"uid": uid, "allowed": True}
    lines = list(warnings or []) + (mutation.warnings if mutation is not None else [])
    if mutation is not None and mutation.tell and mutation.skipped:
        lines.append(f"left alone: {mutation.skipped}")
    if mutation is not None and mutation.ops:
        response["patchType"] = "JSONPatch"
        response["patch"] = base64.b64encode(json.dumps(mutation.ops, separators=(",", ":")).encode()).decode()
    if lines:
        response["warnings"] = _warnings(lines)
    return Answer(200, {"apiVersion": API_VERSION, "kind": "AdmissionReview", "response": response})


def _request(review: Any) -> tuple[Mapping[str, Any] | None, str | None]:
    """(request, None), or (None, why it is not an AdmissionReview v1 request with a uid)."""
    if not isinstance(review, Mapping):
        return None, "the body is not a JSON object"
    if review.get("apiVersion") != API_VERSION or review.get("kind") != "AdmissionReview":
        return None, f"expected apiVersion {API_VERSION}, kind AdmissionReview"
    request = review.get("request")
    if not isinstance(request, Mapping):
        return None, "the AdmissionReview has no request"
    uid = request.get("uid")
    if not isinstance(uid, str) or not uid:
        return None, "the AdmissionReview request has no uid"
    return request, None


def _is_pod(request: Mapping[str, Any]) -> bool:
    kind = request.get("kind")
    resource = request.get("resource")
    return (
        isinstance(kind, Mapping)
        and kind.get("kind") == "Pod"
        and kind.get("group", "") == ""
        and (not isinstance(resource, Mapping) or resource.get("resource") == "pods")
        and not request.get("subResource")
    )


def review(body: bytes, policy: Policy, budget: Budget | None = None) -> Answer:
    """Answer one AdmissionReview (the raw request body); past ``budget``, allowed unchanged with a
    warning saying so."""
    try:
        parsed = json.loads(body)
    except (ValueError, RecursionError) as exc:  # not JSON, a number too long, nesting too deep
        return status_error(400, "BadRequest", f"gpuzombie webhook: the body is not JSON ({type(exc).__name__})")
    request, why = _request(parsed)
    if request is None:
        return status_error(400, "BadRequest", f"gpuzombie webhook: {why}")
    uid = request["uid"]
    if not _is_pod(request):
        return respond(uid, warnings=["only Pods are mutated; this request is left alone"])
    if request.get("operation") != "CREATE":
        return respond(uid)
    pod = request.get("object")
    if not isinstance(pod, Mapping):
        return respond(uid, warnings=["the request has no pod object; admitted unchanged"])
    meta: Mapping[str, Any] = pod["metadata"] if isinstance(pod.get("metadata"), Mapping) else {}
    namespace = request.get("namespace")
    if not isinstance(namespace, str):
        namespace = meta.get("namespace") if isinstance(meta.get("namespace"), str) else None
    name = meta.get("name") or f"{meta.get('generateName') or ''}*"
    who = escape(f"{namespace or ''}/{name} (uid {uid})", 160)
    try:
        mutation = mutate(pod, namespace, policy, budget or Budget())
    except OverBudget as exc:
        why = f"{exc}; admitted unchanged"
        return replace(respond(uid, warnings=[why]), note=f"{who}: {why}")
    except ValueError as exc:  # a spec of wrong types, a bad opt-in value
        why = f"could not understand the pod ({short(str(exc), 120)}); admitted unchanged"
        return replace(respond(uid, warnings=[why]), note=f"{who}: {escape(why)}")
    except Exception as exc:  # noqa: BLE001 -- a pod on the creation path is admitted, whatever went wrong here
        why = f"internal error ({type(exc).__name__}); admitted unchanged"
        return replace(respond(uid, warnings=[why]), note=f"{who}: {why}")
    answer = respond(uid, mutation)
    if mutation.actions:
        done = ("would do " if not mutation.ops else "") + ",".join(mutation.actions)
        return replace(answer, note=f"{who}: {escape(done)}")
    return answer
