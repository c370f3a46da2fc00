"""A real PID namespace for tests: ``unshare --pid --fork --mount-proc --kill-child <argv>``.

The namespace's PID 1 is found by its host pid (the child of ``unshare``); commands run inside it
through ``nsenter --target <pid1> --pid --mount``, as ``kubectl exec`` would. Leaving the context
SIGKILLs ``unshare``, which ``--kill-child`` turns into the end of the namespace.

``cgroup`` puts the pod in that cgroup (v2) before ``unshare`` starts, so every process of it is
there from the start, as a container's are; ``log`` receives PID 1's stdout and stderr (what
``kubectl logs`` shows).
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import psutil

T = TypeVar("T")


def wait_until(probe: Callable[[], T], *, timeout: float = 10.0, interval: float = 0.02) -> T:
    """Poll ``probe`` until it returns something truthy; fail the test after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = probe()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {timeout} s: {probe}")
        time.sleep(interval)


class PidNamespace:
    def __init__(self, *argv: str, cgroup: Path | None = None, log: Path | None = None) -> None:
        self.argv = argv
        self.cgroup = cgroup
        self.log = log
        self.unshare: subprocess.Popen[bytes] | None = None
        self.pid1 = 0

    def __enter__(self) -> PidNamespace:
        join = ["sh", "-c", 'echo $$ > "$0/cgroup.procs" && exec "$@"', str(self.cgroup)] if self.cgroup else []
        with open(self.log or "/dev/null", "ab") as out:
            self.unshare = subprocess.Popen(
                [*join, "unshare", "--pid", "--fork", "--mount-proc", "--kill-child", *self.argv],
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        unshare = psutil.Process(self.unshare.pid)
        self.pid1 = wait_until(lambda: next((c.pid for c in unshare.children()), 0))
        return self

    def __exit__(self, *exc: object) -> None:
        assert self.unshare is not None
        self.unshare.kill()
        self.unshare.wait(timeout=10)

    def children(self, pid: int | None = None) -> list[psutil.Process]:
        """Host-side children of ``pid`` (default: the namespace's PID 1)."""
        try:
            return psutil.Process(pid or self.pid1).children()
        except psutil.NoSuchProcess:
            return []

    def enter(self, *argv: str) -> list[str]:
        return ["nsenter", "--target", str(self.pid1), "--pid", "--mount", *argv]

    def run(self, *argv: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
        """Run a command inside the namespace and wait for it."""
        return subprocess.run(self.enter(*argv), capture_output=True, text=True, timeout=timeout)

    def gpuzombie(self, *args: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
        """``python3 -m gpuzombie <args>`` inside the namespace (the pod lab's way of running it)."""
        return self.run(sys.executable, "-m", "gpuzombie", *args, timeout=timeout)
