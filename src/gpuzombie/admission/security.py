"""The security context of every container the webhook injects (the tini installer, the preflight
gate): least privilege, and Pod Security "restricted" on its own."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

CONFINING_SECCOMP = frozenset({"RuntimeDefault", "Localhost"})
"""The seccomp profile types Pod Security "restricted" takes, at the pod's level or on each container."""


def pod_seccomp(spec: Mapping[str, Any]) -> str | None:
    """The seccomp profile type the pod sets for all its containers, when it is a confining one."""
    context = spec.get("securityContext")
    profile = context.get("seccompProfile") if isinstance(context, Mapping) else None
    kind = profile.get("type") if isinstance(profile, Mapping) else None
    return kind if kind in CONFINING_SECCOMP else None


def restricted_security_context(spec: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """A fresh dict each call: the patches that carry it are edited by their callers.

    ``seccompProfile: RuntimeDefault`` is on the container unless the pod ``spec`` sets a confining
    profile itself: a container's profile overrides the pod's, so ours would replace a pod's
    ``Localhost`` profile with the runtime's default. Without one of the two, a pod that sets it per
    container would be refused by Pod Security "restricted" after the patch."""
    context: dict[str, Any] = {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "runAsNonRoot": True,
        "runAsUser": 65532,
        "capabilities": {"drop": ["ALL"]},
    }
    if spec is None or pod_seccomp(spec) is None:
        context["seccompProfile"] = {"type": "RuntimeDefault"}
    return context
