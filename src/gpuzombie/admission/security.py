"""The security context of every container the webhook injects (the tini installer, the preflight
gate): least privilege, and Pod Security "restricted" on its own."""

from __future__ import annotations

from typing import Any


def restricted_security_context() -> dict[str, Any]:
    """A fresh dict each call: the patches that carry it are edited by their callers.

    ``seccompProfile`` is on every container because Pod Security "restricted" needs it on each one
    unless the pod sets it: without it a pod that sets it per container would be refused after the
    patch."""
    return {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "runAsNonRoot": True,
        "runAsUser": 65532,
        "capabilities": {"drop": ["ALL"]},
        "seccompProfile": {"type": "RuntimeDefault"},
    }
