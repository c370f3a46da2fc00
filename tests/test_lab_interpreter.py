"""What an interpreter needs mounted in a container: a venv's links lead to an installation outside
it (pyenv, uv, conda), through links that may themselves sit in linked directories."""

from __future__ import annotations

import os

import pytest

pytest.importorskip("cri_api", reason="container-runtime-interface-api is in the 'node' extra")


from gpuzombie.lab.runtime.cri import workload_mounts
from gpuzombie.lab.runtime.interpreter import PythonLayout, interpreter_paths, symlink_chain


def _installation(tmp_path):
    """~/.pyenv-like: versions/3.11.7/bin/python3.11, versions/3.11 -> 3.11.7, and a venv whose
    python3 links to the alias."""
    real = tmp_path / "versions" / "3.11.7"
    (real / "bin").mkdir(parents=True)
    (real / "lib" / "python3.11").mkdir(parents=True)
    (real / "bin" / "python3.11").write_text("")
    os.symlink("3.11.7", tmp_path / "versions" / "3.11")
    venv = tmp_path / "venv" / "bin"
    venv.mkdir(parents=True)
    os.symlink(tmp_path / "versions" / "3.11" / "bin" / "python3.11", venv / "python3")
    os.symlink("python3", venv / "python")
    return real, venv


def test_the_chain_follows_each_link_to_the_real_file(tmp_path):
    real, venv = _installation(tmp_path)
    assert symlink_chain(str(venv / "python")) == [
        str(venv / "python"),
        str(venv / "python3"),
        str(tmp_path / "versions" / "3.11" / "bin" / "python3.11"),
        str(real / "bin" / "python3.11"),
    ]


def test_the_venv_the_installation_and_the_linked_alias_are_all_mounted(tmp_path):
    real, venv = _installation(tmp_path)
    alias = tmp_path / "versions" / "3.11"
    layout = PythonLayout(str(venv / "python"), (str(venv.parent), str(alias)))
    paths = interpreter_paths(layout)
    assert {str(venv.parent), str(alias), str(real), str(alias / "bin"), str(real / "bin")} <= set(paths)
    mounted = [m.host_path for m in workload_mounts(paths, None)]
    # Each tree once: bin/ is inside its prefix's mount; the alias and its target both, at their paths.
    assert [p for p in mounted if p.startswith(str(tmp_path))] == [str(venv.parent), str(alias), str(real)]


def test_a_link_loop_ends(tmp_path):
    os.symlink("b", tmp_path / "a")
    os.symlink("a", tmp_path / "b")
    assert len(symlink_chain(str(tmp_path / "a"))) <= 42
