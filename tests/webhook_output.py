"""The webhook's real output for the lab-pod tests: ``gpuzombie webhook --patch -`` run as a
process (what users pipe into ``gpuzombie lab pod -``), never a copy of it kept beside the tests."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LABPOD_FIXTURES = Path(__file__).with_name("fixtures") / "labpod"
UNPATCHED = {
    "pod-nofix": ROOT / "deploy" / "pod-nofix.yaml",  # args only: shareProcessNamespace
    "pod-nofix-command": LABPOD_FIXTURES / "pod-nofix-command.yaml",  # command: tini from the init container
    "pod-nofix-command-prestop": LABPOD_FIXTURES / "pod-nofix-command-prestop.yaml",  # + the injected preStop
}
"""The unpatched pods whose patched forms the lab-pod tests run, by name."""
LAB_IMAGE = "localhost/gpu-zombie/gpuzombie-node:0.1.0"
"""The install container's image (the lab runs its own busybox with the host's tini, whatever is named)."""


def webhook_patch(text: str) -> str:
    """``text`` as ``gpuzombie webhook --patch -`` prints it (exit 0 asserted)."""
    done = subprocess.run(
        [sys.executable, "-m", "gpuzombie", "webhook", "--patch", "-", "--image", LAB_IMAGE],
        input=text,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert "kind: Pod" in done.stdout, done.stdout
    return done.stdout
