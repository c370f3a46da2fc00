"""Stale and foreign GPU holders against a real containerd through its CRI socket, and a real gRPC
PodResources server on a unix socket (the kubelet's API; no kubelet runs here, so it is a stand-in
serving the pods and assignments a test gives it: ``kubelet``, found by the commands through
``GPUZOMBIE_POD_RESOURCES_SOCKET``, which 241ae16 did not read).

A *survivor*: a process holding a stand-in /dev/nvidia0 (a file on a private /dev, as the prestop
tests make it) that joined a real pod's cgroup from outside the pod's containers, so stopping and
removing the pod through the CRI leaves it running, as a process stuck in the driver outlives its
pod on a real node. Beside it, a pod the runtime runs whose container holds /dev/nvidia0 too.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator

import pytest

pytest.importorskip("cri_api", reason="container-runtime-interface-api is in the 'node' extra")


from containerd_fixture import needs_containerd
from cri_standin import standin_kubelet
from gpufakes import gpu_device, gpu_process, gpu_snapshot
from gpuzombie.cli.main import main
from gpuzombie.k8s.cri import BindMount, ContainerSpec, RunningPod, SandboxSpec
from gpuzombie.lab.runtime.containerd import BUSYBOX_IMAGE, Containerd
from gpuzombie.lab.runtime.rundirs import cgroup_roots
from gpuzombie.units import MIB
from pidns import wait_until

pytestmark = needs_containerd

HOLDER = ("/bin/sh", "-c", "exec 3</dev/nvidia0; exec sleep 300")
# Joins each cgroup named in argv, opens the private /dev's nvidia0 and becomes sleep with it open.
SURVIVOR = (
    "import os, signal, sys\n"
    "if os.environ.get('IGNORE_TERM'):\n"
    "    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # kept across exec: sleep ignores it too\n"
    "for path in sys.argv[1:]:\n"
    "    with open(os.path.join(path, 'cgroup.procs'), 'w') as f:\n"
    "        f.write(str(os.getpid()))\n"
    "fd = os.open('/dev/nvidia0', os.O_RDONLY)\n"
    "os.set_inheritable(fd, True)\n"
    "os.execvp('sleep', ['sleep', '300'])\n"
)
PRIVATE_DEV = "mount -t tmpfs -o mode=755 stale-dev /dev && touch /dev/nvidia0"


def pod_cgroups(pod: SandboxSpec) -> list[str]:
    """Where a survivor of ``pod`` joins: the pod's own cgroup in every hierarchy that has it (the
    runtime made them with its sandbox); on cgroup v2 only, a leaf below it, as no process may sit
    beside child cgroups with controllers (removed with the pod's cgroup at the end)."""
    roots = cgroup_roots()
    groups = [root + pod.cgroup_parent for root in roots if os.path.isdir(root + pod.cgroup_parent)]
    if roots == ["/sys/fs/cgroup"] and groups:
        leaf = groups[0] + "/survivors"
        os.makedirs(leaf, exist_ok=True)
        return [leaf]
    return groups


def holds_nvidia0(pid: int) -> bool:
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
        links = {os.readlink(f"/proc/{pid}/fd/{fd}") for fd in fds}
        with open(f"/proc/{pid}/comm") as f:
            comm = f.read().strip()
    except OSError:
        return False
    return comm == "sleep" and "/dev/nvidia0" in links


def start_survivor(
    pod: SandboxSpec, *, ignore_term: bool = False, groups: list[str] | None = None
) -> subprocess.Popen[bytes]:
    """A host process in ``pod``'s cgroup (no container's) holding /dev/nvidia0, ready when returned."""
    groups = groups or pod_cgroups(pod)
    assert groups, f"no cgroup of pod {pod.uid}"
    script = f'{PRIVATE_DEV} && exec "$0" -c "$@"'
    env = {**os.environ, "IGNORE_TERM": "1" if ignore_term else ""}
    proc = subprocess.Popen(["unshare", "--mount", "sh", "-c", script, sys.executable, SURVIVOR, *groups], env=env)
    wait_until(lambda: holds_nvidia0(proc.pid))
    return proc


@pytest.fixture
def kubelet(tmp_path, monkeypatch) -> Iterator[dict]:
    """The stand-in kubelet's pods, (namespace, name) → container → GPU ids: add a pod when it is
    made, delete it when the kubelet would have (before its sandbox is stopped)."""
    served: dict = {}
    socket = str(tmp_path / "kubelet.sock")
    with standin_kubelet(socket, served):
        monkeypatch.setenv("GPUZOMBIE_POD_RESOURCES_SOCKET", socket)
        yield served


@pytest.fixture
def pods(containerd: Containerd, kube_pods, kubelet, tmp_path) -> Iterator[dict]:
    """A running pod whose container holds /dev/nvidia0, and the survivor of a second pod (still running)."""
    device = tmp_path / "nvidia0"
    device.write_text("")
    running = kube_pods(SandboxSpec(name="trainer-0", namespace="ml"))
    mount = (BindMount(str(device), "/dev/nvidia0", readonly=True),)
    holder_cid = running.start(ContainerSpec(name="cuda", image=BUSYBOX_IMAGE, command=HOLDER, mounts=mount))
    holder_pid = containerd.client.container_pid(holder_cid)
    wait_until(lambda: holds_nvidia0(holder_pid))
    doomed = containerd.start_pod(SandboxSpec(name="gone-0", namespace="ml"))
    kubelet.update({("ml", "trainer-0"): {"cuda": ("GPU-0000",)}, ("ml", "gone-0"): {}})
    survivors: list[subprocess.Popen[bytes]] = []
    try:
        survivors.append(start_survivor(doomed.spec))
        yield {"running": running, "holder": holder_pid, "doomed": doomed, "survivor": survivors[0], "more": survivors}
    finally:
        for survivor in survivors:
            survivor.kill()
            survivor.wait()
        if doomed.sandbox_id in {s.id for s in containerd.client.list_pod_sandboxes()}:
            containerd.stop_pod(doomed)


def trace_json(socket: str, *extra: str, capsys) -> tuple[int, dict]:
    code = main(["trace", "--json", "--cri-socket", socket, *extra])
    return code, json.loads(capsys.readouterr().out)


def rows_of(doc: dict, pid: int) -> list[dict]:
    return [r for r in doc["rows"] if r["pid"] == pid]


def test_a_holder_that_outlived_its_pod_is_stale_and_one_of_a_running_pod_is_not(containerd, pods, kubelet, capsys):
    doomed: RunningPod = pods["doomed"]
    survivor, holder = pods["survivor"].pid, pods["holder"]
    _, doc = trace_json(containerd.socket, capsys=capsys)
    (row,) = rows_of(doc, survivor)
    assert row["pod_uid"] == doomed.spec.uid and row["dirty"] is None  # its pod still runs
    (held,) = rows_of(doc, holder)
    assert (held["pod"], held["dirty"]) == ("trainer-0", None)

    containerd.client.stop_pod_sandbox(doomed.sandbox_id)  # stopped, but the kubelet still runs it
    _, doc = trace_json(containerd.socket, capsys=capsys)
    assert rows_of(doc, survivor)[0]["dirty"] is None and doc["checks"]["stale"] is True

    del kubelet["ml", "gone-0"]  # the kubelet's deletion: gone from it, its sandbox stopped
    code, doc = trace_json(containerd.socket, capsys=capsys)
    (row,) = rows_of(doc, survivor)
    assert row["dirty"] == "stale" and "sandbox is stopped" in row["dirty_reason"], row
    assert "containerd at " in row["dirty_reason"]
    assert code == 1 and doc["summary"]["stale"] >= 1 and doc["checks"]["stale"] is True

    containerd.client.remove_pod_sandbox(doomed.sandbox_id)  # ... then removed
    _, doc = trace_json(containerd.socket, capsys=capsys)
    (row,) = rows_of(doc, survivor)
    assert row["dirty"] == "stale" and f"pod {doomed.spec.uid} is gone from containerd" in row["dirty_reason"]
    (held,) = rows_of(doc, holder)
    assert held["dirty"] is None  # the running pod's holder, next to it

    main(["trace", "--cri-socket", containerd.socket])
    text = capsys.readouterr().out
    assert text.splitlines()[0].split()[-1] == "HOLDER"
    assert any(line.startswith(f"stale: pid {survivor} (sleep) holds GPU 0") for line in text.splitlines())
    assert "stale" in text.splitlines()[-1]

    # No runtime to ask: never stale, "unknown" with a warning, and not called healthy.
    code, doc = trace_json("/nonexistent.sock", capsys=capsys)
    (row,) = rows_of(doc, survivor)
    assert row["dirty"] == "unknown" and doc["checks"]["stale"] is False and code == 1
    assert any("not judged stale or not" in w for w in doc["warnings"])

    # No kubelet to ask: the same, unless the runtime alone is trusted.
    code, doc = trace_json(containerd.socket, "--pod-resources-socket", "/nonexistent", capsys=capsys)
    (row,) = rows_of(doc, survivor)
    assert row["dirty"] == "unknown" and "no PodResources socket at /nonexistent" in row["dirty_reason"]
    assert doc["checks"]["stale"] is False and code == 1
    argv = ("--pod-resources-socket", "/nonexistent", "--trust-runtime-without-kubelet")
    _, doc = trace_json(containerd.socket, *argv, capsys=capsys)
    assert rows_of(doc, survivor)[0]["dirty"] == "stale" and doc["checks"]["stale"] is True


def test_exporter_names_the_stale_holder(containerd, pods, kubelet, capsys):
    doomed: RunningPod = pods["doomed"]
    del kubelet["ml", "gone-0"]
    containerd.stop_pod(doomed)
    argv = ["exporter", "--once", "--cri-socket", containerd.socket]
    assert main(argv) == 0
    text = capsys.readouterr().out
    mine = [
        line
        for line in text.splitlines()
        if line.startswith("gpuzombie_dirty_gpu_holders{") and f'pod_uid="{doomed.spec.uid}"' in line
    ]
    assert len(mine) == 1 and 'kind="stale"' in mine[0] and 'gpu="0"' in mine[0] and mine[0].endswith(" 1.0")
    assert 'gpuzombie_dirty_gpu_check{kind="stale"} 1.0' in text
    assert 'gpuzombie_dirty_gpu_check{kind="foreign"} 1.0' in text
    assert not any('pod="trainer-0"' in line for line in text.splitlines() if line.startswith("gpuzombie_dirty"))


def test_podresources_over_grpc_tells_a_foreign_holder(containerd, kube_pods, tmp_path, capsys):
    """Two pods' processes on GPU 0 (NVML, replayed: no GPU here); the kubelet gave GPU 0 to trainer-0
    (as time-slicing's replica id ``GPU-…::0``): the other pod's holder is foreign."""
    device = tmp_path / "nvidia0"
    device.write_text("")
    mount = (BindMount(str(device), "/dev/nvidia0", readonly=True),)
    pids = {}
    for name in ("trainer-0", "intruder-0"):
        pod = kube_pods(SandboxSpec(name=name, namespace="ml"))
        cid = pod.start(ContainerSpec(name="cuda", image=BUSYBOX_IMAGE, command=HOLDER, mounts=mount))
        pids[name] = containerd.client.container_pid(cid)
        wait_until(lambda pid=pids[name]: holds_nvidia0(pid))
    processes = [gpu_process(pid, mib=1024, name="sleep") for pid in pids.values()]
    gpus = gpu_snapshot(gpu_device(0, uuid="GPU-0000", processes=processes))
    replay = tmp_path / "nvml.json"
    replay.write_text(json.dumps(dataclasses.asdict(gpus)))
    kubelet = tmp_path / "kubelet.sock"
    with standin_kubelet(str(kubelet), {("ml", "trainer-0"): {"cuda": ("GPU-0000::0",)}}):
        argv = ["--cri-socket", containerd.socket, "--pod-resources-socket", str(kubelet), "--nvml-replay", str(replay)]
        assert main(["trace", "--json", *argv]) == 1
        doc = json.loads(capsys.readouterr().out)
        assert main(["exporter", "--once", *argv]) == 0
        text = capsys.readouterr().out
    (intruder,) = rows_of(doc, pids["intruder-0"])
    assert (
        intruder["dirty"] == "foreign" and intruder["dirty_reason"] == "the kubelet assigned GPU-0000 to ml/trainer-0"
    )
    (trainer,) = rows_of(doc, pids["trainer-0"])
    assert trainer["dirty"] is None and doc["checks"]["foreign"] is True
    (series,) = [
        line
        for line in text.splitlines()
        if line.startswith("gpuzombie_dirty_gpu_memory_bytes{") and 'pod="intruder-0"' in line
    ]
    assert 'kind="foreign"' in series and 'UUID="GPU-0000"' in series and float(series.split()[-1]) == 1024 * MIB


def reap(socket: str, *args: str, capsys) -> tuple[int, dict]:
    code = main(["reap", "--json", "--cri-socket", socket, "--no-nvml", *args])
    return code, json.loads(capsys.readouterr().out)


def state_of(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        return None


def alive(pid: int) -> bool:
    return state_of(pid) not in (None, "Z", "X")


def test_reap_ends_a_stale_pods_processes_and_never_a_running_pods(containerd, pods, kubelet, capsys):
    """Two survivors of a removed pod (one ignores SIGTERM), a running pod's holder beside them. Other
    pods on this machine (other runtimes') may look stale to this containerd: --pod-uid keeps to ours."""
    doomed: RunningPod = pods["doomed"]
    pods["more"].append(start_survivor(doomed.spec, ignore_term=True))
    calm, stubborn = (p.pid for p in pods["more"])
    del kubelet["ml", "gone-0"]
    containerd.stop_pod(doomed)
    uid = ("--pod-uid", doomed.spec.uid)

    code, dry = reap(containerd.socket, *uid, capsys=capsys)
    assert code == 1 and dry["dry_run"] and dry["schema"] == "gpuzombie.reap/1"
    ((stale,),) = [[p for p in dry["stale_pods"] if p["pod_uid"] == doomed.spec.uid]]
    assert sorted(stale["holders"]) == sorted([calm, stubborn]) and "is gone from containerd" in stale["reason"]
    assert {r["target"]["pid"]: r["outcome"] for r in dry["results"]} == {
        calm: "would_signal (dry run)",
        stubborn: "would_signal (dry run)",
    }
    assert alive(calm) and alive(stubborn)

    code, done = reap(containerd.socket, *uid, "--yes", "--timeout", "1", "--kill-wait", "2", capsys=capsys)
    outcomes = {r["target"]["pid"]: r["outcome"] for r in done["results"]}
    assert outcomes == {calm: "exited_after_sigterm", stubborn: "exited_after_sigkill"}, done
    assert code == 0 and done["survivors"] == 0
    assert not alive(calm) and not alive(stubborn)
    assert alive(pods["holder"])  # the running pod's holder, untouched
    code, after = reap(containerd.socket, *uid, capsys=capsys)
    assert code == 0 and after["stale_pods"] == []


def test_reap_never_touches_a_running_pod_even_when_named(containerd, pods, capsys):
    running: RunningPod = pods["running"]
    code, doc = reap(
        containerd.socket, "--yes", "--pod-uid", running.spec.uid, "--pod-uid", pods["doomed"].spec.uid, capsys=capsys
    )
    assert code == 0 and doc["results"] == [] and doc["stale_pods"] == []
    assert alive(pods["holder"]) and alive(pods["survivor"].pid)  # its pod still runs


def test_reap_refuses_without_a_runtime(pods, capsys):
    assert main(["reap", "--yes", "--cri-socket", "/nonexistent.sock"]) == 2
    err = capsys.readouterr().err.strip()
    assert "refusing to reap" in err and len(err.splitlines()) == 1
    assert alive(pods["survivor"].pid)


FREEZER = "/sys/fs/cgroup/freezer"


@pytest.mark.skipif(not os.path.isdir(FREEZER), reason="needs the cgroup v1 freezer (a frozen task is in state D)")
def test_reap_reports_a_process_in_d_state_as_not_killable_and_does_not_wait_for_it(containerd, pods, kubelet, capsys):
    """A frozen task (cgroup v1 freezer) sits in state D and cannot die, SIGKILL pending, until
    thawed: the stand-in for a process stuck in the driver."""
    doomed: RunningPod = pods["doomed"]
    frozen = f"{FREEZER}{doomed.spec.cgroup_parent}/frozen"
    os.makedirs(frozen)
    try:
        others = [g for g in pod_cgroups(doomed.spec) if not g.startswith(FREEZER)]
        stuck = start_survivor(doomed.spec, groups=[*others, frozen])
        pods["more"].append(stuck)
        with open(f"{frozen}/freezer.state", "w") as f:
            f.write("FROZEN")
        wait_until(lambda: state_of(stuck.pid) == "D")
        del kubelet["ml", "gone-0"]
        containerd.stop_pod(doomed)
        args = ("--pod-uid", doomed.spec.uid, "--yes", "--timeout", "0.5", "--kill-wait", "1")
        started = time.monotonic()
        code, doc = reap(containerd.socket, *args, capsys=capsys)
        took = time.monotonic() - started
        results = {r["target"]["pid"]: r for r in doc["results"]}
        assert results[stuck.pid]["outcome"] == "not_killable_d_state" and results[stuck.pid]["state_after"] == "D"
        assert results[pods["survivor"].pid]["outcome"] == "exited_after_sigterm"
        assert code == 1 and doc["survivors"] == 1
        assert took < 30  # 0.5 s + 1 s of waits, plus two scans; never the hang itself
    finally:
        with open(f"{frozen}/freezer.state", "w") as f:
            f.write("THAWED")
        for p in pods["more"]:
            p.kill()
            p.wait()
        pods["more"].clear()
        os.rmdir(frozen)


def comm_of(pid: int) -> str | None:
    try:
        with open(f"/proc/{pid}/comm") as f:
            return f.read().strip()
    except OSError:
        return None


def pod_pids(uid: str) -> list[int]:
    """Every live process in the cgroup of pod ``uid`` (its pause and its containers' processes)."""
    found = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/cgroup") as f:
                if f"pod{uid}" in f.read() and alive(int(name)):
                    found.append(int(name))
        except OSError:
            continue
    return sorted(found)


def test_a_second_runtime_makes_no_pod_stale_and_reap_kills_nothing(containerd, pods, capsys):
    """Issue 29 item 1: asked a second containerd with one unrelated pod of its own, 241ae16 called
    the live GPU pod "gone from containerd" and ``--yes`` killed its workload and its pause. The
    kubelet (stand-in) runs pods that runtime has no sandbox of: nothing is judged."""
    from gpuzombie.lab.runtime.containerd import private_containerd

    uid, holder = pods["running"].spec.uid, pods["holder"]
    victims = pod_pids(uid)
    assert holder in victims and "catatonit" in {comm_of(p) for p in victims}, victims
    with private_containerd() as other, other.pod(SandboxSpec(name="other-0", namespace="default")) as unrelated:
        unrelated.start(ContainerSpec(name="app", image=BUSYBOX_IMAGE, command=("sleep", "300")))
        code = main(["reap", "--yes", "--no-nvml", "--cri-socket", other.socket, "--pod-uid", uid])
        err = capsys.readouterr().err.strip()
        assert code == 2 and len(err.splitlines()) == 1, err
        assert "refusing to reap" in err and "the kubelet runs 2 pod(s)" in err and "has no sandbox of" in err
        assert all(alive(p) for p in victims)

        code, doc = trace_json(other.socket, capsys=capsys)
        (row,) = rows_of(doc, holder)
        assert row["dirty"] == "unknown" and "has no sandbox of (e.g. ml/" in row["dirty_reason"]
        assert doc["summary"]["stale"] == 0 and doc["checks"]["stale"] is False and code == 1

        assert main(["exporter", "--once", "--cri-socket", other.socket]) == 0
        text = capsys.readouterr().out
        assert 'gpuzombie_dirty_gpu_check{kind="stale"} 0.0' in text
        assert not [line for line in text.splitlines() if 'kind="stale"' in line and f'pod_uid="{uid}"' in line]

        # Without the kubelet: refused as well, with the flag that restores 241ae16's judgment named.
        argv = ["reap", "--yes", "--no-nvml", "--cri-socket", other.socket, "--pod-uid", uid]
        assert main([*argv, "--pod-resources-socket", "/nonexistent"]) == 2
        err = capsys.readouterr().err.strip()
        assert "no PodResources socket at /nonexistent" in err and "--trust-runtime-without-kubelet" in err
        assert len(err.splitlines()) == 1 and all(alive(p) for p in victims)


def test_a_pod_whose_pause_died_is_not_stale_while_its_container_runs(containerd, pods, capsys):
    """Issue 29 item 4: the pause died (sandbox NOTREADY), the workload runs: 241ae16 called the pod
    stale and ``--yes`` killed the workload."""
    running: RunningPod = pods["running"]
    uid, holder = running.spec.uid, pods["holder"]
    (pause,) = [p for p in pod_pids(uid) if comm_of(p) == "catatonit"]
    os.kill(pause, 9)

    def sandbox_state() -> int:
        (sandbox,) = [s for s in containerd.client.list_pod_sandboxes() if s.id == running.sandbox_id]
        return sandbox.state

    from cri_api.v1 import api_pb2 as pb

    wait_until(lambda: sandbox_state() == pb.SANDBOX_NOTREADY)
    code, doc = reap(containerd.socket, "--pod-uid", uid, "--yes", "--timeout", "1", capsys=capsys)
    assert code == 0 and doc["stale_pods"] == [] and doc["results"] == [], doc
    assert alive(holder)
    # The runtime alone (no kubelet): its running container keeps the pod alive.
    alone = ("--pod-resources-socket", "/nonexistent", "--trust-runtime-without-kubelet")
    code, doc = reap(containerd.socket, "--pod-uid", uid, "--yes", "--timeout", "1", *alone, capsys=capsys)
    assert code == 0 and doc["stale_pods"] == [] and alive(holder)
    _, doc = trace_json(containerd.socket, *alone, capsys=capsys)
    assert rows_of(doc, holder)[0]["dirty"] is None


def test_reap_ends_a_stale_static_pod_named_by_its_32_hex_uid(containerd, kubelet, capsys):
    """Issue 29 item 4: a static pod's UID is the kubelet's hash of its manifest (32 hex digits):
    reap listed such a stale pod, but 241ae16's --pod-uid refused its UID."""
    spec = SandboxSpec(name="static-gpu-node1", namespace="kube-system", uid=uuid.uuid4().hex)
    doomed = containerd.start_pod(spec)
    survivor = start_survivor(spec)
    try:
        containerd.stop_pod(doomed)  # its manifest removed: the kubelet runs it no more
        code, doc = reap(containerd.socket, "--pod-uid", spec.uid, "--yes", "--timeout", "1", capsys=capsys)
        assert [p["pod_uid"] for p in doc["stale_pods"]] == [spec.uid]
        assert code == 0 and {r["target"]["pid"]: r["outcome"] for r in doc["results"]} == {
            survivor.pid: "exited_after_sigterm"
        }
    finally:
        survivor.kill()
        survivor.wait()


def make_cgroup(path: str) -> list[str]:
    """mkdir each missing level of ``path`` (a v1 cpuset level gets its parent's cpus and mems: an
    empty cpuset takes no task, ENOSPC); the levels made, outermost first."""
    made = []
    parts = path.split("/")
    for end in range(2, len(parts) + 1):
        level = "/".join(parts[:end])
        if os.path.isdir(level):
            continue
        os.mkdir(level)
        made.append(level)
        for name in ("cpuset.cpus", "cpuset.mems"):
            if os.path.exists(f"{level}/{name}"):
                with open(f"{os.path.dirname(level)}/{name}") as src, open(f"{level}/{name}", "w") as dst:
                    dst.write(src.read())
    return made


@contextlib.contextmanager
def nested_survivor(driver: str, pod: SandboxSpec, holder: int) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    """A process holding /dev/nvidia0 in a kubepods tree (kind's or k3s's, ``driver`` layout) below
    the container of ``holder`` in running ``pod``; yields (the inner pod's UID, the process).
    cgroupfs: below the container's real cgroup; systemd: a systemd-driver path of the same pod
    and container made beside it in every hierarchy (the private containerd runs cgroupfs)."""
    with open(f"/proc/{holder}/cgroup") as f:
        container = next(line.split(":", 2)[2].strip() for line in f if f"pod{pod.uid}" in line)
    inner = str(uuid.uuid4())
    if driver == "cgroupfs":
        nested = f"{container}/kubepods/besteffort/pod{inner}/{'c' * 64}"
        roots = [root for root in cgroup_roots() if os.path.isdir(root + container)]
    else:
        outer = f"kubepods-besteffort-pod{pod.uid.replace('-', '_')}.slice"
        kind = f"kubelet-kubepods-besteffort-pod{inner.replace('-', '_')}.slice"
        nested = (
            f"/kubepods.slice/kubepods-besteffort.slice/{outer}/cri-containerd-{container.rsplit('/', 1)[1]}.scope/"
            f"kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-besteffort.slice/{kind}/cri-containerd-{'c' * 64}.scope"
        )
        roots = cgroup_roots()
    made: list[str] = []
    survivor = None
    try:
        for root in roots:
            made += make_cgroup(root + nested)
        survivor = start_survivor(pod, groups=[root + nested for root in roots])
        yield inner, survivor
    finally:
        if survivor is not None:
            survivor.kill()
            survivor.wait()
        for level in reversed(made):
            os.rmdir(level)


@pytest.mark.parametrize("driver", ["cgroupfs", "systemd"])
def test_a_process_in_a_nested_kubepods_tree_of_a_running_pod_is_never_stale(driver, containerd, pods, capsys):
    """Issue 29 item 2: kind or k3s inside a running GPU pod puts a kubepods tree below its container;
    241ae16 named the process after the inner pod (no runtime lists it: stale) and --yes killed it."""
    running: RunningPod = pods["running"]
    with nested_survivor(driver, running.spec, pods["holder"]) as (inner, survivor):
        code, doc = reap(containerd.socket, "--pod-uid", inner, "--yes", "--timeout", "1", capsys=capsys)
        assert code == 0 and doc["stale_pods"] == [] and doc["results"] == [], doc
        assert alive(survivor.pid)
        _, doc = trace_json(containerd.socket, capsys=capsys)
        (row,) = rows_of(doc, survivor.pid)
        assert (row["pod_uid"], row["pod"], row["dirty"]) == (running.spec.uid, "trainer-0", None)
