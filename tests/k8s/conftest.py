"""Fixtures of the Kubernetes delivery tests (helpers live in k8s_support)."""

from __future__ import annotations

from typing import Any

import pytest


@pytest.fixture(scope="session")
def default_objects() -> dict[str, dict[str, Any]]:
    """The chart rendered with its default values, once per session."""
    from k8s_support import render

    return render()
