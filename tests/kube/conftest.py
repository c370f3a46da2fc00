"""The real single-node cluster (``gpuzombie cluster up``), started once per test session in its own
directory and removed at the end. Started through the real CLI in a subprocess: its processes then
belong to no test (the suite's autouse reaper kills a test's descendants)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

UP_TIMEOUT_S = 600
"""Beside load a first start took 25-60 s here; the binary is built before pytest (make test)."""


@dataclass(frozen=True)
class Kube:
    """The running cluster: where it is and how to reach it."""

    root: Path
    kubeconfig: Path
    env: dict[str, str]

    def cli(self, *args: str, timeout: float = 120, check: bool = True) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(
            [sys.executable, "-m", "gpuzombie", *args],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
        if check and done.returncode != 0:
            raise AssertionError(f"gpuzombie {' '.join(args)} exited {done.returncode}: {done.stderr[-2000:]}")
        return done

    def kubectl(self, *args: str, timeout: float = 120, check: bool = True) -> subprocess.CompletedProcess[str]:
        return self.cli("cluster", "kubectl", "--", *args, timeout=timeout, check=check)

    def get(self, *args: str) -> dict:
        return json.loads(self.kubectl("get", *args, "-o", "json").stdout)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.kube)
            item.add_marker(pytest.mark.slow)


@pytest.fixture(scope="session")
def kube(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Kube]:
    if os.geteuid() != 0:
        pytest.skip("the real cluster needs root")
    root = Path("/var/lib") / f"gpuzombie-cluster-test-{os.getpid()}"
    src = str(Path(__file__).resolve().parents[2] / "src")
    env = dict(
        os.environ,
        GPUZOMBIE_CLUSTER_DIR=str(root),
        PYTHONPATH=os.pathsep.join(filter(None, [src, os.environ.get("PYTHONPATH")])),
    )
    done = subprocess.run(
        [sys.executable, "-m", "gpuzombie", "cluster", "up"],
        env=env,
        capture_output=True,
        text=True,
        timeout=UP_TIMEOUT_S,
        check=False,
    )
    if done.returncode != 0:
        subprocess.run(
            [sys.executable, "-m", "gpuzombie", "cluster", "down"],
            env=env,
            capture_output=True,
            timeout=300,
            check=False,
        )
        pytest.fail(f"cluster up exited {done.returncode}: {done.stderr[-3000:]}")
    kubeconfig = Path(done.stdout.strip().splitlines()[-1])
    env["KUBECONFIG"] = str(kubeconfig)
    try:
        yield Kube(root, kubeconfig, env)
    finally:
        down = subprocess.run(
            [sys.executable, "-m", "gpuzombie", "cluster", "down"],
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        assert down.returncode == 0, down.stderr
