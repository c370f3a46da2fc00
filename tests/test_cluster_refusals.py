"""``gpuzombie cluster up`` refuses in one line, exit 2, with nothing started and nothing made, when it
cannot run: not root, a port taken, a binary missing (the real CLI; no cluster is started here)."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from gpuzombie_cli import run_gpuzombie
from markers import needs_root

SRC = str(Path(__file__).resolve().parents[1] / "src")


def free_instance() -> int:
    """A cluster instance none of whose ports is taken now (other clusters may run beside the suite)."""
    from gpuzombie.cluster.layout import Ports

    for instance in range(9, -1, -1):
        try:
            for port in Ports.for_instance(instance).all().values():
                with socket.socket() as probe:
                    probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                    probe.bind(("127.0.0.1", port))
        except OSError:
            continue
        return instance
    pytest.skip("every cluster instance's ports are taken")


def up(tmp_path: Path, instance: int, **env: str) -> tuple[subprocess.CompletedProcess[str], Path]:
    root = tmp_path / "cluster"
    full = dict(
        os.environ, GPUZOMBIE_CLUSTER_DIR=str(root), GPUZOMBIE_CLUSTER_INSTANCE=str(instance), PYTHONPATH=SRC, **env
    )
    done = run_gpuzombie(full, "cluster", "up", timeout=120)
    return done, root


def one_line(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1, done.stderr
    return done.stderr


@needs_root
def test_a_taken_port_is_named_and_nothing_starts(tmp_path: Path) -> None:
    instance = free_instance()
    port = 16443 + 100 * instance  # its API server's
    with socket.socket() as holder:
        holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # past a TIME_WAIT, as up's probe
        holder.bind(("127.0.0.1", port))
        holder.listen()
        done, root = up(tmp_path, instance)
    assert f"port {port} (apiserver) is taken" in one_line(done)
    assert not root.exists()


@needs_root
def test_a_missing_binary_is_named(tmp_path: Path) -> None:
    bare = tmp_path / "bin"
    bare.mkdir()
    (bare / "python3").symlink_to(sys.executable)
    done, root = up(tmp_path, free_instance(), PATH=str(bare))
    assert "missing containerd" in one_line(done)
    assert not root.exists()


def test_not_root_is_refused(tmp_path: Path) -> None:
    if os.geteuid() == 0:
        if not shutil.which("setpriv"):
            pytest.skip("setpriv (util-linux) not installed")
        tmp_path.chmod(0o777)
        argv = [
            "setpriv",
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            sys.executable,
            "-m",
            "gpuzombie",
            "cluster",
            "up",
        ]
        env = dict(os.environ, GPUZOMBIE_CLUSTER_DIR=str(tmp_path / "cluster"), PYTHONPATH=SRC, HOME=str(tmp_path))
        done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120, check=False)
    else:
        done, _ = up(tmp_path, 9)
    assert "needs root" in one_line(done)
    assert not (tmp_path / "cluster").exists()
