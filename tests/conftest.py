"""Shared fixtures: every test leaves no child process behind."""

from __future__ import annotations

import psutil
import pytest

from containerd_fixture import containerd, kube_pods  # noqa: F401  (a private containerd for any test)
from markers import needs_root, needs_tini  # noqa: F401  (defined once; kept importable from here)
from pki import make_pki

# Fixtures whose set-up makes every test using them ``slow`` (measured beside load, docs/development.md):
# a private containerd (1–5 s each) and the module-scoped ``lab`` run of the four scenarios (43–69 s).
SLOW_FIXTURES = frozenset({"containerd", "lab"})


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if SLOW_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)


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
