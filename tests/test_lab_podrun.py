"""`gpuzombie lab pod` on a real, private containerd (CPU stand-in): deploy/pod-nofix.yaml waits
the whole grace; the webhook's two patch shapes (tini from an init container, and
shareProcessNamespace) free like S2; the injected fast hook runs from the emptyDir it was copied to.

The patched manifests are hand-made copies of what ``gpuzombie webhook --patch`` produces
(tests/fixtures/labpod/*.webhook-patched.handmade.yaml). Each run's worker holds 64 MiB instead of
the manifest's 2048 (the only change made to them here) and the grace is 5 s: the bounds are the
grace against well under it, wide enough beside ``stress-ng --cpu 2``.
"""

from __future__ import annotations

import io
import json
import os
import sys
from pathlib import Path

import pytest

from containerd_fixture import needs_containerd
from gpuzombie.cli.main import main

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = Path(__file__).with_name("fixtures") / "labpod"
GRACE = 5
pytestmark = [
    needs_containerd,
    pytest.mark.skipif(not os.path.isfile("/usr/bin/tini-static"), reason="needs Debian's tini (tini-static)"),
]


def small(path: Path, **replace: str) -> str:
    text = path.read_text().replace("--size-mib 2048", "--size-mib 64")
    for old, new in replace.items():
        assert old in text
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
    before = next(o for o in e["observations"] if o["point"] == "after-spawn")
    assert before["zombies"] == 1 and before["orphans"] == 1  # the parent, never reaped by sleep; its worker
    for name in ("notes.md", "memory.png", "pod.log", "observe-after-spawn.log", "observe-after-delete.log"):
        assert (folder / name).is_file(), name
    assert folder.name == "pod-gpu-zombie-nofix-containerd"
    assert "## Pods (gpuzombie lab pod)" in (folder.parent / "comparison.md").read_text()
    err = capsys.readouterr().err
    assert "every image runs as the lab's" in err and "ENTRYPOINT is taken as empty" in err
    assert "accepted without effect on a lab node: metadata.labels, spec.imagePullSecrets" in " ".join(err.split())


@pytest.mark.parametrize(
    ("fixture", "pid1"),
    [
        ("pod-nofix.webhook-patched.handmade.yaml", "catatonit"),
        ("pod-nofix-command.webhook-patched.handmade.yaml", "tini-static"),
    ],
)
def test_the_webhooks_patch_frees_like_s2(tmp_path, monkeypatch, fixture, pid1):
    rc, e, _folder = lab_pod(tmp_path, small(FIXTURES / fixture), monkeypatch)
    m, d = e["metrics"], e["deletion"]
    assert rc == 0, e["events"]
    assert e["init"] == pid1 and not m["waited_whole_grace"] and d["sigkill_at"] is None
    assert m["release_latency_s"] is not None and m["release_latency_s"] < GRACE / 2
    assert d["leftovers"] == []
    if pid1 == "tini-static":  # the init container copied tini into the memory-backed emptyDir first
        assert at(e, "init-exit") < at(e, "container-start")
        assert "gpuzombie-install: exit 0" in next(ev["detail"] for ev in e["events"] if ev["name"] == "init-exit")


def test_the_injected_fast_hook_runs_from_the_copied_zipapp(tmp_path, monkeypatch):
    """tini + the injected preStop (its --timeout cut to 1 s: pod-nofix's workers ignore SIGTERM, so
    the hook SIGKILLs them after it): the memory is free before StopContainer."""
    fixture = FIXTURES / "pod-nofix-command-prestop.webhook-patched.handmade.yaml"
    rc, e, folder = lab_pod(
        tmp_path, small(fixture, **{"- --timeout\n          - '20'": "- --timeout\n          - '1'"}), monkeypatch
    )
    m, d = e["metrics"], e["deletion"]
    assert rc == 0 and d["prestop_rc"] == 0, (folder / "prestop.log").read_text()
    hook_log = (folder / "prestop.log").read_text()
    assert "exited_after_sigkill" in hook_log and "not asked: the /proc fd scan read every process" in hook_log
    assert m["released_at_s"] < at(e, "sigterm") + 0.5 and m["release_latency_s"] < GRACE - 1
    assert d["leftovers"] == []


def test_volumes_env_uid_and_a_prestop_sleep(tmp_path, monkeypatch):
    """hostPath (written through), an emptyDir of medium Memory (a tmpfs), env, runAsUser, and a
    preStop sleep the kubelet waits for before StopContainer gets the seconds left (sh as PID 1
    ignores SIGTERM, so they run out: SIGKILL)."""
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
  containers:
  - name: main
    image: registry.example/any:1
    command: [sh, -c]
    args: ["echo $GREETING > /out/greeting; id -u > /out/uid; grep ' /scratch ' /proc/mounts > /out/scratch; exec sleep 3600"]
    env: [{{name: GREETING, value: hello}}]
    securityContext: {{runAsUser: 1000}}
    volumeMounts: [{{name: host, mountPath: /out}}, {{name: scratch, mountPath: /scratch}}]
    lifecycle: {{preStop: {{sleep: {{seconds: 1}}}}}}
"""
    rc, e, _ = lab_pod(tmp_path, text, monkeypatch, "--grace", "4")
    assert (shared / "greeting").read_text() == "hello\n" and (shared / "uid").read_text() == "1000\n"
    assert "tmpfs" in (shared / "scratch").read_text() and "size=8192k" in (shared / "scratch").read_text()
    d = e["deletion"]
    assert at(e, "prestop-end") - at(e, "prestop-start") >= 0.9
    stop = next(ev["detail"] for ev in e["events"] if ev["name"] == "sigterm")
    assert stop == "main: StopContainer(timeout=3)"  # 4 s grace, 1 s slept (whole seconds, as the kubelet)
    assert rc == 1 and d["sigkill_at"] is not None and d["leftovers"] == []


def test_repeat_runs_the_pod_again_and_json_is_one_line_per_run(tmp_path, monkeypatch, capsys):
    text = small(FIXTURES / "pod-nofix.webhook-patched.handmade.yaml")
    monkeypatch.setattr(sys, "stdin", io.StringIO(text))
    argv = ["lab", "pod", "-", "--grace", str(GRACE), "--device", "cpu", "--repeat", "2", "--json"]
    assert main([*argv, "--out", str(tmp_path)]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    runs = [json.loads(line) for line in lines]
    key = "pod-gpu-zombie-nofix-shareprocessnamespace-containerd"
    assert [r["run"] for r in runs] == [key, f"{key}-run2"]
    assert all(r["schema"] == "gpuzombie.labpod/1" and r["deletion"]["leftovers"] == [] for r in runs)
    data = json.loads((tmp_path / "results.json").read_text())
    assert set(data["scenarios"]) == {key, f"{key}-run2"}
    command = data["provenance"]["command"]  # as run, the flag without a value
    assert "lab pod --grace 5 --device cpu --repeat 2 --json --out" in command and command.endswith(" -"), command
