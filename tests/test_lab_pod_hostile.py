"""`gpuzombie lab pod` runs a manifest it was handed as root, on a real private containerd: what
such a manifest must not reach (issue 29, items 11-14). A hostPath is refused unless
--allow-host-path names it, and read-only unless :rw; each pod has its own network namespace with
only lo, seccomp RuntimeDefault and no NET_RAW; names that would be paths are refused before
anything is made; and a SIGKILLed run leaves nothing once `gpuzombie lab clean` ran."""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("yaml", reason="PyYAML is in the 'labpod' extra")

from containerd_fixture import needs_containerd
from gpuzombie.cli.main import main
from gpuzombie.proc.procfs import Procfs
from pidns import wait_until

pytestmark = [needs_containerd]
CAP_NET_RAW = 13


def manifest(name: str, script: str, *, volumes: str = "", mounts: str = "", namespace: str = "lab-hostile") -> str:
    return f"""
apiVersion: v1
kind: Pod
metadata: {{name: {json.dumps(name)}, namespace: {json.dumps(namespace)}}}
spec:
  terminationGracePeriodSeconds: 2
  volumes: [{volumes}]
  containers:
  - name: main
    image: any
    command: [sh, -c, {json.dumps(script + "; exec sleep 3600")}]
    volumeMounts: [{mounts}]
"""


def lab_pod(tmp_path: Path, text: str, *extra: str) -> tuple[int, Path]:
    """``gpuzombie lab pod FILE`` with ``text`` in FILE: its exit code and its output folder."""
    out, path = tmp_path / "out", tmp_path / "pod.yaml"
    path.write_text(text)
    return main(["lab", "pod", str(path), "--grace", "2", "--device", "cpu", "--out", str(out), *extra]), out


def pod_log(out: Path) -> str:
    ((key, _),) = json.loads((out / "results.json").read_text())["scenarios"].items()
    return (out / key / "pod.log").read_text()


def test_a_host_path_is_refused_unless_allowed(tmp_path, capsys):
    """A hostPath of / let the container write on the host (241ae16): now refused, exit 2, one
    line, before any containerd starts."""
    marker = f"labpod-hostpath-{secrets.token_hex(4)}"
    text = manifest(
        "hostroot",
        f"echo owned > /host/tmp/{marker}",
        volumes="{name: root, hostPath: {path: /}}",
        mounts="{name: root, mountPath: /host}",
    )
    try:
        rc, out = lab_pod(tmp_path, text)
        written = os.path.exists(f"/tmp/{marker}")
    finally:
        Path(f"/tmp/{marker}").unlink(missing_ok=True)
    err = capsys.readouterr().err.strip().splitlines()
    assert not written and rc == 2 and not out.exists()
    assert len(err) == 1 and "hostPath / is not allowed" in err[0] and "--allow-host-path" in err[0], err


@pytest.mark.parametrize(("grant", "writes"), [("", False), (":rw", True)])
@pytest.mark.slow
def test_an_allowed_host_path_is_read_only_unless_rw(tmp_path, grant, writes):
    shared = tmp_path / "shared"
    shared.mkdir()
    text = manifest(
        "hostdir",
        "if echo x > /out/file 2>/dev/null; then echo WROTE; else echo REFUSED; fi; ls /out",
        volumes=f"{{name: out, hostPath: {{path: {shared}, type: Directory}}}}",
        mounts="{name: out, mountPath: /out}",
    )
    _rc, out = lab_pod(tmp_path, text, "--allow-host-path", f"{shared}{grant}")
    log = pod_log(out)
    assert (shared / "file").exists() is writes
    assert ("WROTE" if writes else "REFUSED") in log, log


@pytest.mark.slow
def test_a_host_paths_name_is_escaped_and_never_markup_in_the_notes(tmp_path, capsys):
    """The notes name an allowed hostPath as the manifest writes it. Before (issue 36, item 12): raw
    through rich markup (``\\x1b[2J`` cleared the terminal; ``[/]`` was a markup tag)."""
    shared = tmp_path / "shared"
    (shared / "x\x1b[2J[/]\u202e").mkdir(parents=True)
    hostile = shared / "x\x1b[2J[/]\u202e"
    text = manifest(
        "hostname",
        "ls /out",
        volumes=f"{{name: out, hostPath: {{path: {json.dumps(str(hostile))}, type: Directory}}}}",
        mounts="{name: out, mountPath: /out}",
    )
    lab_pod(tmp_path, text, "--allow-host-path", str(shared))
    err = capsys.readouterr().err
    assert "\x1b" not in err and "\u202e" not in err, err
    joined = "".join(err.splitlines())  # rich folds a long path across lines
    assert "shared/x\\x1b[2J[/]\\u202e" in joined and "is bound read-only" in joined, err


@pytest.mark.slow
def test_the_pod_has_its_own_network_lo_only_seccomp_and_no_net_raw(tmp_path):
    """241ae16: the host's network and UTS namespaces (every host interface, the host's name), no
    seccomp filter, NET_RAW in the effective set."""
    script = (
        "echo IFACES $(tail -n +3 /proc/net/dev | cut -d: -f1); echo HOSTNAME $(hostname); "
        "grep -E '^(CapEff|Seccomp):' /proc/self/status"
    )
    _rc, out = lab_pod(tmp_path, manifest("netcheck", script))
    fields = dict(line.split(None, 1) for line in pod_log(out).splitlines() if line.split(None, 1)[1:])
    assert fields["IFACES"].split() == ["lo"], fields
    assert fields["HOSTNAME"].startswith("netcheck-"), fields
    assert fields["Seccomp:"].strip() == "2", fields  # SECCOMP_MODE_FILTER
    assert not int(fields["CapEff:"], 16) & (1 << CAP_NET_RAW), fields


ESCAPE = "../" * 12 + "tmp/"


@pytest.mark.parametrize("where", ["emptyDir", "namespace"])
def test_names_that_would_be_paths_are_refused_before_anything_is_made(tmp_path, capsys, where):
    """241ae16: an emptyDir named ../../x was a 0777 directory outside the work dir, a namespace with
    ../ put the pod's log directory where the manifest chose; both outlived the run."""
    target = f"labpod-escape-{secrets.token_hex(4)}"
    if where == "emptyDir":
        text = manifest("escape", "true", volumes=f"{{name: {ESCAPE + target}, emptyDir: {{}}}}")
        escaped = [Path(tempfile.gettempdir(), target)]
    else:
        text = manifest("escape", "echo hi", namespace=ESCAPE + target)
        escaped = list(Path("/tmp").glob(f"{target}*"))
    try:
        rc, _out = lab_pod(tmp_path, text)
        escaped = [p for p in [*escaped, *Path("/tmp").glob(f"{target}*")] if p.exists()]
    finally:
        for p in Path("/tmp").glob(f"{target}*"):
            subprocess.run(["rm", "-rf", str(p)], check=False)
    err = capsys.readouterr().err.strip().splitlines()
    assert escaped == [] and rc == 2
    assert len(err) == 1 and "is not a DNS-1123 label" in err[0], err


SLEEP = "3583"
"""The SIGKILLed run's container sleeps this long: tells its process from any other."""


def _leftovers(run: Path, pod_cgroups: list[str]) -> dict[str, list[str]]:
    from gpuzombie.lab.runtime.rundirs import cgroup_roots, mounts_under, shim_sockets

    table = Procfs().snapshot(now=time.time(), with_cgroup=False)
    named = [p for p in table if any(str(run) in a for a in p.cmdline)]  # containerd, its shim
    return {
        "processes": sorted({p.command for p in [*named, *(c for p in named for c in table.children(p.pid))]}),
        "mounts": mounts_under(run) if run.exists() else [],
        "cgroups": [c for c in pod_cgroups if any(os.path.isdir(root + c) for root in cgroup_roots())],
        "shim_sockets": shim_sockets(run),
        "dirs": [str(run)] if run.exists() else [],
    }


@contextlib.contextmanager
def sigkilled_run(tmp_path: Path) -> Iterator[tuple[Path, list[str], dict[str, list[str]]]]:
    """A `lab pod` SIGKILLed while it waits out its pod's grace: its run directory, its pod cgroups
    and what it left; whatever the test does, nothing of it is left afterwards."""
    from gpuzombie.lab.runtime.rundirs import LAB_STATE_ROOT, recorded_cgroups, remove_run

    (tmp_path / "pod.yaml").write_text(
        manifest(
            "killed",
            "true",
            volumes="{name: scratch, emptyDir: {medium: Memory, sizeLimit: 4Mi}}",
            mounts="{name: scratch, mountPath: /scratch}",
        ).replace("exec sleep 3600", f"exec sleep {SLEEP}")
    )
    argv = [sys.executable, "-m", "gpuzombie", "lab", "pod", str(tmp_path / "pod.yaml"), "--device", "cpu"]
    lab = subprocess.Popen(
        [*argv, "--grace", "120", "--out", str(tmp_path / "out")], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    run = None
    try:
        run = wait_until(lambda: next(LAB_STATE_ROOT.glob(f"{lab.pid}.*"), None), timeout=60)
        wait_until(lambda: any(p.cmdline[-1:] == (SLEEP,) for p in Procfs().snapshot(now=time.time())), timeout=120)
        time.sleep(3)  # into the deletion: the grace is being waited out
        lab.send_signal(signal.SIGKILL)
        lab.wait(10)
        pods = [c for c in recorded_cgroups(run) if os.path.basename(c).startswith("pod")]
        left = _leftovers(run, pods)
        assert len(left["processes"]) == 4, left  # containerd, its shim, the pause, the container's sleep
        assert left["mounts"] and left["cgroups"] and left["shim_sockets"] and left["dirs"], left
        yield run, pods, left
    finally:
        if lab.poll() is None:
            lab.kill()
            lab.wait(10)
        if run is not None and run.exists():
            remove_run(run)  # a failed test must not leave its containerd either


NOTHING = {"processes": [], "mounts": [], "cgroups": [], "shim_sockets": [], "dirs": []}


@pytest.mark.slow
def test_a_sigkilled_lab_pod_leaves_nothing_after_lab_clean(tmp_path):
    """241ae16: the SIGKILLed run's containerd, shim, pause and container, mounts, pod cgroup, shim
    socket and directories stay, and no command removes them. `gpuzombie lab clean` removes each."""
    with sigkilled_run(tmp_path) as (run, pods, before):
        cleaned = subprocess.run(
            [sys.executable, "-m", "gpuzombie", "lab", "clean", "--json"], capture_output=True, text=True, timeout=120
        )
        after = _leftovers(run, pods)
    assert cleaned.returncode == 0, cleaned.stderr
    report = json.loads(cleaned.stdout)
    (mine,) = [r for r in report["runs"] if r["path"] == str(run)]
    assert mine["removed"] and not mine["owner_alive"] and len(mine["processes"]) == len(before["processes"])
    assert after == NOTHING, after


@pytest.mark.slow
def test_the_next_lab_pod_removes_what_a_sigkilled_one_left(tmp_path):
    with sigkilled_run(tmp_path) as (run, pods, _before):
        (tmp_path / "next").mkdir()
        rc, _out = lab_pod(tmp_path / "next", manifest("next", "true"))
        after = _leftovers(run, pods)
    assert rc in (0, 1) and after == NOTHING, after
