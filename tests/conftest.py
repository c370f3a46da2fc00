"""Shared fixtures: every test leaves no child process behind."""

from __future__ import annotations

import psutil
import pytest

from containerd_fixture import containerd, kube_pods  # noqa: F401  (a private containerd for any test)
from markers import needs_root, needs_tini  # noqa: F401  (defined once; kept importable from here)
from pki import make_pki


@pytest.fixture(autouse=True)
def reap_children():
    """Kill and reap whatever a test left running (psutil's reap_children idea)."""
    yield
    me = psutil.Process()
    leftovers = me.children(recursive=True)
    for child in leftovers:
        try:
            child.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(leftovers, timeout=5)


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    """A CA with a server and a client certificate (tests/pki.py), made once per test module."""
    return make_pki(tmp_path_factory.mktemp("pki"))
