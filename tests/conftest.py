"""Shared fixtures: every test leaves no child process behind."""

from __future__ import annotations

import os
import shutil

import psutil
import pytest

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root for PID namespaces")
needs_tini = pytest.mark.skipif(shutil.which("tini") is None, reason="tini not installed")


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
