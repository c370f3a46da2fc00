"""The real gpuzombie CLI in a subprocess, as a user runs it (the cluster tests start and stop
clusters through it: its processes then belong to no test)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Mapping


def run_gpuzombie(env: Mapping[str, str], *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """``python -m gpuzombie ARGS`` with ``env``; never raises on its exit code."""
    return subprocess.run(
        [sys.executable, "-m", "gpuzombie", *args],
        env=dict(env),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
