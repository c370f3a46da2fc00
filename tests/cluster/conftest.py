"""Fixtures of the cluster-install tests."""

from __future__ import annotations

import pytest
from cluster_support import find_helm


@pytest.fixture(scope="session")
def helm_binary() -> str:
    return find_helm()
