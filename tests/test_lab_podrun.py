"""`gpuzombie lab pod` on a real, private containerd (CPU stand-in): deploy/pod-nofix.yaml waits
the whole grace; the webhook's two patch shapes (tini from an init container, and
shareProcessNamespace) free like S2; the injected fast hook runs from the emptyDir it was copied to;
and the literal pipe ``gpuzombie webhook --patch pod-nofix.yaml | gpuzombie lab pod -``.

The patched manifests are the real webhook's output (``gpuzombie webhook --patch``, run here), run
unchanged. Each run's worker holds 64 MiB instead of the manifest's 2048 (changed in the unpatched
pod, before the webhook sees it) and the grace is 5 s: the bounds are the grace against well under
it, wide enough beside ``stress-ng --cpu 2``.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("yaml", reason="PyYAML is in the 'labpod' extra")


import yaml

from containerd_fixture import needs_containerd
from gpuzombie.cli.main import main
from webhook_output import ROOT, UNPATCHED, webhook_patch

GRACE = 5
pytestmark = [
    pytest.mark.slow,
    needs_containerd,
    pytest.mark.skipif(not os.path.isfile("/usr/bin/tini-static"), reason="needs Debian's tini (tini-static)"),
]


def small(path: Path, *replace: tuple[str, str]) -> str:
    """The manifest at ``path`` with its worker holding 64 MiB, and each (old, new) replaced."""
    text = path.read_text()
    for old, new in (("--size-mib 2048", "--size-mib 64"), *replace):
        assert old in text, old
        text = text.replace(old, new)
    return text


def lab_pod(tmp_path: Path, text: str, monkeypatch: pytest.MonkeyPatch, *extra: str) -> tuple[int, dict, Path]:
    """``gpuzombie lab pod -`` with ``text`` on stdin; its exit code, its results entry, its folder."""
    out = tmp_path / "out"
    monkeypatch.setattr(sys, "stdin", io.StringIO(text))
    rc = main(["lab", "pod", "-", "--grace", str(GRACE), "--device", "cpu", "--out", str(out), *extra])
    data = json.loads((out / "results.json").read_text())
    ((key, entry),) = data["scenarios"].items()
    return rc, entry, out / key


def at(e: dict, name: str) -> float:
    return next(ev["t"] for ev in e["events"] if ev["name"] == name)


def test_pod_nofix_waits_the_whole_grace(tmp_path, monkeypatch, capsys):
    rc, e, folder = lab_pod(tmp_path, small(ROOT / "deploy/pod-nofix.yaml"), monkeypatch)
    m, d = e["metrics"], e["deletion"]
    assert rc == 1  # a finding: the whole grace was waited
    assert e["init"] == "sleep" and m["waited_whole_grace"] and d["sigkill_at"] is not None
    assert GRACE - 0.2 <= m["release_latency_s"] <= GRACE + 3
    assert d["leftovers"] == [] and e["pod_manifest"]["grace_s"] == GRACE
    assert "scenario" not in e and "victim_reaped" not in e  # no made-up scenario for a manifest's pod
    before = next(o for o in e["observations"] if o["point"] == "after-spawn")
    assert before["zombies"] == 1 and before["orphans"] == 1  # the parent, never reaped by sleep; its worker
    for name in ("notes.md", "memory.png", "pod.log", "observe-after-spawn.log", "observe-after-delete.log"):
        assert (folder / name).is_file(), name
    assert folder.name == "pod-gpu-zombie-nofix-containerd"
    assert "## Pods (gpuzombie lab pod)" in (folder.parent / "comparison.md").read_text()
    err = capsys.readouterr().err
    assert "every image runs as the lab's" in err and "ENTRYPOINT is taken as empty" in err
    assert "accepted without effect on a lab node: metadata.labels, spec.imagePullSecrets" in " ".join(err.split())


@pytest.mark.parametrize(("source", "pid1"), [("pod-nofix", "catatonit"), ("pod-nofix-command", "tini-static")])
def test_the_webhooks_patch_frees_like_s2(tmp_path, monkeypatch, source, pid1):
    rc, e, _folder = lab_pod(tmp_path, webhook_patch(small(UNPATCHED[source])), monkeypatch)
    m, d = e["metrics"], e["deletion"]
    assert rc == 0, e["events"]
    assert e["init"] == pid1 and not m["waited_whole_grace"] and d["sigkill_at"] is None
    assert m["release_latency_s"] is not None and m["release_latency_s"] < GRACE / 2
    assert d["leftovers"] == []
    if pid1 == "tini-static":  # the init container copied tini into the memory-backed emptyDir first
        assert at(e, "init-exit") < at(e, "container-start")
        assert "gpuzombie-install: exit 0" in next(ev["detail"] for ev in e["events"] if ev["name"] == "init-exit")


def test_the_injected_fast_hook_runs_from_the_copied_zipapp(tmp_path, monkeypatch):
    """tini + the injected preStop, run from the emptyDir the webhook's init container (read-only
    root, uid 65532, no capabilities, seccomp RuntimeDefault) copied it to. The pod's own grace is
    2 s, so the webhook gives the hook --timeout 1 (pod-nofix's workers ignore SIGTERM: the hook
    SIGKILLs them after it); lab pod's --grace 5 leaves room. The memory is free before StopContainer."""
    grace_2s = ("terminationGracePeriodSeconds: 30", "terminationGracePeriodSeconds: 2")
    patched = webhook_patch(small(UNPATCHED["pod-nofix-command-prestop"], grace_2s))
    spec = yaml.safe_load(patched)["spec"]
    assert spec["containers"][0]["lifecycle"]["preStop"]["exec"]["command"][-2:] == ["--timeout", "1"]
    assert spec["initContainers"][0]["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    rc, e, folder = lab_pod(tmp_path, patched, monkeypatch)
    m, d = e["metrics"], e["deletion"]
    assert rc == 0 and d["prestop_rc"] == 0, (folder / "prestop.log").read_text()
    hook_log = (folder / "prestop.log").read_text()
    assert "exited_after_sigkill" in hook_log and "not asked: the /proc fd scan read every process" in hook_log
    assert m["released_at_s"] < at(e, "sigterm") + 0.5 and m["release_latency_s"] < GRACE - 1
    assert d["leftovers"] == []


def test_volumes_env_uid_and_a_prestop_sleep(tmp_path, monkeypatch):
    """hostPath (written through), an emptyDir of medium Memory (a tmpfs), env, runAsUser, the pod's
    seccompProfile RuntimeDefault (a filter, as the runtime's default profile is) and an init
    container's Unconfined over it, and a preStop sleep the kubelet waits for before StopContainer
    gets the seconds left (sh as PID 1 ignores SIGTERM, so they run out: SIGKILL)."""
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o777)
    text = f"""
apiVersion: v1
kind: Pod
metadata: {{name: generic, namespace: lab-test}}
spec:
  terminationGracePeriodSeconds: 30
  volumes:
  - {{name: host, hostPath: {{path: {shared}, type: Directory}}}}
  - {{name: scratch, emptyDir: {{medium: Memory, sizeLimit: 8Mi}}}}
  securityContext: {{seccompProfile: {{type: RuntimeDefault}}}}
  initContainers:
  - name: unconfined
    image: registry.example/any:1
    command: [sh, -c, "grep '^Seccomp:' /proc/self/status > /out/init-seccomp"]
    securityContext: {{seccompProfile: {{type: Unconfined}}}}
    volumeMounts: [{{name: host, mountPath: /out}}]
  containers:
  - name: main
    image: registry.example/any:1
    command: [sh, -c]
    args: ["echo $GREETING > /out/greeting; id -u > /out/uid; grep ' /scratch ' /proc/mounts > /out/scratch; grep '^Seccomp:' /proc/self/status > /out/seccomp; exec sleep 3600"]
    env: [{{name: GREETING, value: hello}}]
    securityContext: {{runAsUser: 1000}}
    volumeMounts: [{{name: host, mountPath: /out}}, {{name: scratch, mountPath: /scratch}}]
    lifecycle: {{preStop: {{sleep: {{seconds: 1}}}}}}
"""
    rc, e, _ = lab_pod(tmp_path, text, monkeypatch, "--grace", "4", "--allow-host-path", f"{shared}:rw")
    assert (shared / "greeting").read_text() == "hello\n" and (shared / "uid").read_text() == "1000\n"
    assert "tmpfs" in (shared / "scratch").read_text() and "size=8192k" in (shared / "scratch").read_text()
    assert (shared / "seccomp").read_text().split() == ["Seccomp:", "2"]  # SECCOMP_MODE_FILTER
    assert (shared / "init-seccomp").read_text().split() == ["Seccomp:", "0"]
    d = e["deletion"]
    assert at(e, "prestop-end") - at(e, "prestop-start") >= 0.9
    stop = next(ev["detail"] for ev in e["events"] if ev["name"] == "sigterm")
    assert stop == "main: StopContainer(timeout=3)"  # 4 s grace, 1 s slept (whole seconds, as the kubelet)
    assert rc == 1 and d["sigkill_at"] is not None and d["leftovers"] == []


def test_repeat_runs_the_pod_again_and_json_is_one_line_per_run(tmp_path, monkeypatch, capsys):
    text = webhook_patch(small(UNPATCHED["pod-nofix"]))
    monkeypatch.setattr(sys, "stdin", io.StringIO(text))
    argv = ["lab", "pod", "-", "--grace", str(GRACE), "--device", "cpu", "--repeat", "2", "--json"]
    assert main([*argv, "--out", str(tmp_path)]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    runs = [json.loads(line) for line in lines]
    key = "pod-gpu-zombie-nofix-shareprocessnamespace-containerd"
    assert [r["run"] for r in runs] == [key, f"{key}-run2"]
    assert all(r["schema"] == "gpuzombie.labpod/2" and r["deletion"]["leftovers"] == [] for r in runs)
    data = json.loads((tmp_path / "results.json").read_text())
    assert set(data["scenarios"]) == {key, f"{key}-run2"}
    command = data["provenance"]["command"]  # as run, the flag without a value
    assert "lab pod --grace 5 --device cpu --repeat 2 --json --out" in command and command.endswith(" -"), command


def gpuzombie_argv(*args: str) -> list[str]:
    return [sys.executable, "-m", "gpuzombie", *args]


def test_the_literal_pipe_frees_like_s2_and_the_unpatched_pod_waits_the_whole_grace(tmp_path):
    """``gpuzombie webhook --patch pod-nofix.yaml | gpuzombie lab pod - --grace 5 --device cpu
    --json``, two real processes joined by a pipe (deploy/pod-nofix.yaml with a 64 MiB worker), then
    ``gpuzombie lab pod pod-nofix.yaml`` alone: exit 0 and free well within the grace, against exit
    1 after the whole grace."""
    manifest = tmp_path / "pod-nofix.yaml"
    manifest.write_text(small(UNPATCHED["pod-nofix"]))
    lab = ["--grace", str(GRACE), "--device", "cpu", "--json"]
    webhook = subprocess.Popen(gpuzombie_argv("webhook", "--patch", str(manifest)), stdout=subprocess.PIPE)
    assert webhook.stdout is not None
    with subprocess.Popen(
        gpuzombie_argv("lab", "pod", "-", *lab, "--out", str(tmp_path / "patched")),
        stdin=webhook.stdout,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    ) as pod:
        webhook.stdout.close()  # lab pod holds the pipe's only reader
        out, err = pod.communicate(timeout=120)
    assert webhook.wait(timeout=10) == 0
    assert pod.returncode == 0, err
    (patched,) = [json.loads(line) for line in out.splitlines()]
    assert patched["schema"] == "gpuzombie.labpod/2" and patched["init"] == "catatonit"
    assert patched["pod_manifest"]["annotations"]["gpuzombie.dev/injected"] == "shareProcessNamespace"
    m = patched["metrics"]
    assert not m["waited_whole_grace"] and m["release_latency_s"] < GRACE / 2
    assert patched["deletion"]["sigkill_at"] is None and patched["deletion"]["leftovers"] == []

    alone = subprocess.run(
        gpuzombie_argv("lab", "pod", str(manifest), *lab, "--out", str(tmp_path / "unpatched")),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert alone.returncode == 1, alone.stderr  # a finding: the whole grace was waited
    (unpatched,) = [json.loads(line) for line in alone.stdout.splitlines()]
    assert unpatched["init"] == "sleep" and unpatched["metrics"]["waited_whole_grace"]
    assert GRACE - 0.2 <= unpatched["metrics"]["release_latency_s"] <= GRACE + 3
    assert unpatched["deletion"]["leftovers"] == []
