"""Fixtures of the chart tests, shared by name.

The 'chart' extra is optional (the GPU device has none of it): nothing here imports it at collection
time, so a run without it skips the chart modules (their own ``pytest.importorskip``) instead of failing.
"""

from __future__ import annotations

from typing import Any

import pytest


@pytest.fixture(scope="session")
def default_objects() -> dict[str, dict[str, Any]]:
    """The chart rendered with its default values, once per session."""
    from k8s_support import render

    return render()
