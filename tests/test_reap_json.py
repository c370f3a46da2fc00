"""`reap --json` when it refuses (issue 35 (8)): before, stdout was empty and only stderr had the
line, so a script reading the JSON got nothing to parse. Now the refusal is a JSON document too, with
no `stale_pods`, so it is never read as "nothing stale"; the one line on stderr and exit 2 stay."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest

from docs import REPO

REFUSAL_KEYS = {"schema", "refused", "exit_status", "dry_run"}


def reap(*args: str, prefix: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*prefix, sys.executable, "-m", "gpuzombie", "reap", *args],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=REPO,
        env={"PYTHONPATH": str(REPO / "src"), "PATH": "/usr/bin:/bin"},
    )


def _refused(done: subprocess.CompletedProcess[str], why: str) -> dict:
    assert done.returncode == 2, done
    (line,) = done.stderr.strip().splitlines()
    assert why in line and "Traceback" not in done.stderr
    doc = json.loads(done.stdout)
    assert set(doc) == REFUSAL_KEYS and doc["schema"] == "gpuzombie.reap/1" and doc["exit_status"] == 2
    assert doc["refused"] == line.removeprefix("gpuzombie: error: ")
    return doc


def test_no_runtime_is_refused_as_json():
    doc = _refused(reap("--json", "--cri-socket", "/nonexistent.sock", "--no-nvml"), "refusing to reap")
    assert doc["dry_run"] is True
    assert (
        _refused(reap("--json", "--yes", "--cri-socket", "/nonexistent.sock"), "refusing to reap")["dry_run"] is False
    )


def test_a_procfs_that_is_not_one_is_refused_as_json(tmp_path):
    _refused(reap("--json", "--procfs", str(tmp_path / "absent")), "is not a directory")
    _refused(reap("--json", "--procfs", str(tmp_path)), str(tmp_path))


@pytest.mark.skipif(shutil.which("unshare") is None, reason="no unshare")
def test_outside_the_host_pid_namespace_is_refused_as_json():
    done = reap(
        "--json", "--no-nvml", "--trust-runtime-without-kubelet", prefix=("unshare", "--pid", "--fork", "--mount-proc")
    )
    if "Operation not permitted" in done.stderr:
        pytest.skip("no PID namespaces here (root needed)")
    _refused(done, "reap runs in the host's PID namespace")


def test_text_mode_still_prints_the_line_alone():
    done = reap("--cri-socket", "/nonexistent.sock")
    assert done.returncode == 2 and done.stdout == "" and "refusing to reap" in done.stderr
