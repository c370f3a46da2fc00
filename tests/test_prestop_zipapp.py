"""The fast preStop hook: the stdlib-only zipapp of gpuzombie.prestop, run as ``python3 -S -I``
inside real PID namespaces (the same pod scenarios as test_prestop.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import pytest

from gpuzombie.prestop.run import NVML_NOT_ASKED
from gpuzombie.prestop.zipapp import ZipappError, build, hook_modules
from markers import needs_root
from test_prestop import _runs_as_uid_1000, run_pod


@pytest.fixture(scope="module")
def pyz():
    """Built once, in a world-readable directory (the uid-1000 scenario runs it too)."""
    with tempfile.TemporaryDirectory(prefix="gpuzombie-pyz-") as tmp:
        os.chmod(tmp, 0o755)
        yield build(Path(tmp) / "prestop.pyz")


def test_archive_holds_only_the_hook_and_its_project_modules(pyz):
    names = set(zipfile.ZipFile(pyz).namelist())
    assert "__main__.py" in names and "gpuzombie/prestop/hook.py" in names and "gpuzombie/prestop/hook.pyc" in names
    assert "gpuzombie/__init__.py" in names and "gpuzombie/proc/procfs.py" in names
    for absent in ("gpuzombie/cli/main.py", "gpuzombie/lab/runner.py", "gpuzombie/k8s/cri.py", "gpuzombie/exporter"):
        assert not any(n.startswith(absent) for n in names), absent
    assert set(hook_modules()) >= {"gpuzombie.prestop.hook", "gpuzombie.gpu.nvml"}


LOADED = """
import json, sys, sysconfig
sys.path.insert(0, sys.argv[1])
import gpuzombie.prestop.hook, gpuzombie.prestop.run
stdlib = sysconfig.get_paths()["stdlib"]
origins = {n: getattr(getattr(m, "__spec__", None), "origin", None) for n, m in list(sys.modules.items())}
print(json.dumps({n: o for n, o in origins.items() if o not in ("built-in", "frozen", None)
                  and not o.startswith(stdlib) and not o.startswith(sys.argv[1])}))
"""


def test_it_starts_under_isolated_python_with_the_standard_library_only(pyz):
    """``-S -I``: no site-packages, no PYTHONPATH; every module it loads is the stdlib's or its own."""
    done = subprocess.run([sys.executable, "-S", "-I", str(pyz), "--help"], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    assert "--nvml {always,undecided,never}" in done.stdout and "(default undecided)" in done.stdout
    loaded = subprocess.run(
        [sys.executable, "-S", "-I", "-c", LOADED, str(pyz)], capture_output=True, text=True, timeout=30, check=True
    )
    assert json.loads(loaded.stdout) == {}  # nothing from site-packages or the checkout


def test_builder_refuses_a_module_outside_the_standard_library(tmp_path, monkeypatch):
    pkg = tmp_path / "gpuzombie_probe"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "hook.py").write_text("import click\nfrom gpuzombie.errors import GpuzombieError\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(ZipappError, match=r"click \(in gpuzombie_probe.hook\)"):
        hook_modules("gpuzombie_probe.hook")


@needs_root
def test_the_zipapp_stops_workers_and_orphans_without_asking_nvml(tmp_path, pyz, monkeypatch):
    """The e2e pod of test_prestop.py with the zipapp as the hook: same outcomes; every process was
    read, so NVML was never asked."""
    monkeypatch.setenv("GPUZOMBIE_TEST_HOOK", str(pyz))
    res = run_pod("e2e", tmp_path)
    assert res["rc"] == 0, res["stderr"]
    report, pids = res["report"], res["pids"]
    outcomes = {r["target"]["pid"]: r["outcome"] for r in report["results"]}
    assert outcomes == {
        pids["handle"]: "exited_after_sigterm",
        pids["sleep"]: "exited_after_sigterm",
        pids["ignore"]: "exited_after_sigkill",
    }
    assert res["alive"]["nested"] and res["alive"]["bystander"] and not res["alive"]["ignore"]
    assert report["gpu_available"] is False and report["gpu_reason"] == NVML_NOT_ASKED.reason
    assert "gpuzombie prestop:" in res["pid1_log"]


@needs_root
def test_the_zipapp_asks_nvml_when_the_fd_scan_cannot_decide(tmp_path, pyz, monkeypatch):
    """As uid 1000 beside a root-owned orphan it cannot read: NVML is asked (here it has no GPU,
    so the reason is NVML's own), and the unreadable process is still never signalled."""
    if not _runs_as_uid_1000():
        pytest.skip("uid 1000 cannot run this interpreter")
    monkeypatch.setenv("GPUZOMBIE_TEST_HOOK", str(pyz))
    res = run_pod("unread-nvml-undecided", tmp_path)
    report = res["report"]
    assert res["rc"] == 1, res["stderr"]
    assert report["results"] == [] and res["alive"] == {"sleep": True}
    assert report["gpu_reason"] != NVML_NOT_ASKED.reason


PYENV = Path("/root/.pyenv/versions")


def other_pythons() -> list[Path]:
    """Other CPython versions installed here (pyenv), to run the archive built by this one."""
    found = sorted(PYENV.glob("3.*/bin/python3")) if PYENV.is_dir() else []
    return [p for p in found if p.resolve() != Path(sys.executable).resolve()]


@pytest.mark.skipif(not other_pythons(), reason="no other Python installed (pyenv) to run the archive with")
def test_other_pythons_run_its_sources_and_an_old_one_is_refused_in_one_line(pyz):
    """A training image's python3 is not ours: 3.10+ run the sources beside the bytecode; an older
    one gets one line and exit 2, never a traceback."""
    for python in other_pythons():
        version = tuple(int(x) for x in python.parts[-3].split(".")[:2])
        done = subprocess.run(
            [
                "unshare",
                "--pid",
                "--fork",
                "--mount-proc",
                str(python),
                "-S",
                "-I",
                str(pyz),
                "--dry-run",
                "--no-pid1-log",
            ],
            capture_output=True,
            text=True,
            timeout=60,
        )
        if version >= (3, 10):
            assert done.returncode == 0 and "DRY RUN" in done.stdout, (python, done.stderr)
        else:
            assert done.returncode == 2 and "Traceback" not in done.stderr, (python, done.stderr)
            assert done.stderr.strip().splitlines() == [done.stderr.strip()]
            assert "needs Python >= 3.10" in done.stderr
