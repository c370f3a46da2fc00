"""Which capabilities the node agent needs, measured: two kubelet-style pods on a real containerd,
one running as uid 1000 and one as root, each with a stand-in /dev/nvidia0 held open by its PID 1,
a zombie and an orphan; ``exporter --once`` and ``trace --json`` run from the host as the DaemonSet
runs them (uid 0, host PID namespace) under each capability bounding set, the chart's among them.

Run with ``-s`` to print the measured table (docs/cluster.md carries it)."""

from __future__ import annotations

import functools
import itertools
import json
import os
import re
import shutil
import stat
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

pytest.importorskip("prometheus_client", reason="prometheus-client is in the 'exporter' extra")
pytest.importorskip("cri_api", reason="container-runtime-interface-api is in the 'node' extra")

from prometheus_client.parser import text_string_to_metric_families

from containerd_fixture import needs_containerd
from gpuzombie.k8s.cri import BindMount, ContainerSpec, SandboxSpec
from gpuzombie.lab.runtime.containerd import BUSYBOX_IMAGE, Containerd
from markers import needs_root
from pidns import wait_until

pytestmark = [
    needs_root,
    pytest.mark.skipif(not shutil.which("setpriv"), reason="needs setpriv (util-linux)"),
]

REPO = Path(__file__).resolve().parent.parent
CHART_DAEMONSET = REPO / "charts" / "gpuzombie" / "templates" / "daemonset.yaml"

# An orphan (a job's sleep re-parented to PID 1), then PID 1 opens the device, leaves a zombie
# (sleep 0, never reaped) and becomes sleep: the holder, with the zombie and the orphan its children.
WORKLOAD = ("/bin/sh", "-c", "setsid sh -c 'sleep 301 &'; exec 3</dev/nvidia0; sleep 0 & exec sleep 300")
TENANT_UID = 1000
PODS = {"uid1000": TENANT_UID, "root": 0}


def chart_capabilities(*, reaping: bool = False) -> tuple[str, ...]:
    """The capabilities the chart's DaemonSet adds after dropping ALL, lower case as setpriv takes them;
    ``reaping``: with ``exporter.reapStaleAfter`` set (the template's one conditional capability)."""
    (added,) = re.findall(r"^\s*add: \[(.*)\]$", CHART_DAEMONSET.read_text(), re.MULTILINE)
    added = re.sub(r"\{\{ if [^}]*\}\}(.*?)\{\{ end \}\}", r"\1" if reaping else "", added)
    return tuple(sorted(json.loads(f"[{added}]")))


@dataclass(frozen=True)
class Seen:
    """What one run of the agent saw of one pod."""

    holder: bool
    zombie_rows: int
    """Zombies among trace's rows (and gpuzombie_zombies): read from the node's stat files."""
    zombies: int
    """Zombies, orphans and PID 1 of the pod's PID namespace (the per-namespace view)."""
    orphans: int
    pid1: bool
    named: bool


@dataclass(frozen=True)
class Measurement:
    effective_caps: str
    pods: dict[str, Seen]
    access_denied: float
    """gpuzombie_unreadable_processes{reason="access_denied"}: the node's processes, not only ours."""
    trace_access_denied: int


def _agent(caps: tuple[str, ...] | None, *argv: str) -> subprocess.CompletedProcess[str]:
    """``argv`` as uid 0 with only ``caps`` in the bounding set (so in the permitted and effective
    sets of root's exec) and none inheritable: a container's ``drop: [ALL]`` plus ``add: caps``;
    None: with every capability of this session, for reference."""
    bounding = ",".join(["-all", *(f"+{c}" for c in caps or ())])
    confine = [] if caps is None else ["setpriv", f"--bounding-set={bounding}", "--inh-caps=-all", "--"]
    return subprocess.run(
        [*confine, *argv],
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def _pod_values(exposition: str, metric: str) -> dict[str, list[dict[str, str]]]:
    """The samples of ``metric`` by pod label, the value under the key 'value'."""
    out: dict[str, list[dict[str, str]]] = {}
    for family in text_string_to_metric_families(exposition):
        for s in family.samples:
            if s.name == metric:
                out.setdefault(s.labels.get("pod", ""), []).append({**s.labels, "value": str(s.value)})
    return out


def measure(caps: tuple[str, ...] | None, socket: str, containers: dict[str, str]) -> Measurement:
    """Run the agent's exporter and trace under ``caps``; what it saw of each of our pods."""
    status = _agent(caps, "grep", "^CapEff", "/proc/self/status").stdout.split()[-1]
    sources = ("--cri-socket", socket, "--pod-resources-socket", "/nonexistent")
    exporter = _agent(caps, sys.executable, "-m", "gpuzombie", "exporter", "--once", *sources)
    assert exporter.returncode == 0, exporter.stderr
    trace = _agent(caps, sys.executable, "-m", "gpuzombie", "trace", "--json", *sources)
    report = json.loads(trace.stdout)
    rows = report["rows"]

    def metric(name: str) -> dict[str, list[dict[str, str]]]:
        return _pod_values(exporter.stdout, name)

    holders, by_parent, orphans, pid1 = (
        metric(m)
        for m in (
            "gpuzombie_fd_only_holders",
            "gpuzombie_zombies_by_parent",
            "gpuzombie_orphans",
            "gpuzombie_pid1_info",
        )
    )
    pods = {}
    for pod, cid in containers.items():
        ours = [r for r in rows if r["container_id"] == cid]
        pods[pod] = Seen(
            holder=any(r["verdict"] == "fd-only" for r in ours)
            and sum(float(s["value"]) for s in holders.get(pod, [])) == 1,
            zombie_rows=sum(r["state"] == "Z" for r in ours),
            zombies=int(sum(float(s["value"]) for s in by_parent.get(pod, []))),
            orphans=int(sum(float(s["value"]) for s in orphans.get(pod, []) if s["verdict"] == "orphan")),
            pid1=any(s["program"] == "sleep" for s in pid1.get(pod, [])),
            named=bool(ours) and all(r["pod"] == pod and r["container"] == "cuda" for r in ours),
        )
    unreadable = {
        s["reason"]: float(s["value"]) for s in _pod_values(exporter.stdout, "gpuzombie_unreadable_processes")[""]
    }
    return Measurement(status, pods, unreadable["access_denied"], report["summary"]["access_denied"])


@pytest.fixture
def tenants(containerd: Containerd, kube_pods, tmp_path) -> dict[str, str]:
    """One pod per entry of PODS, its container running WORKLOAD as that uid; their container ids."""
    device = tmp_path / "nvidia0"  # a stand-in: no GPU here, and the agent judges only the fd's path
    device.write_text("")
    device.chmod(0o644)
    containers = {}
    for pod, uid in PODS.items():
        running = kube_pods(SandboxSpec(name=pod, namespace="gpu"))
        mount = BindMount(str(device), "/dev/nvidia0", readonly=True)
        spec = ContainerSpec(name="cuda", image=BUSYBOX_IMAGE, command=WORKLOAD, mounts=(mount,), run_as_user=uid)
        containers[pod] = running.start(spec)
        assert containerd.client.exec_sync(containers[pod], ["id", "-u"]).stdout.decode().strip() == str(uid)

    def settled(cid: str) -> bool:
        """The zombie is there, and the orphan's parent job has exited."""
        ps = containerd.client.exec_sync(cid, ["ps", "-o", "stat,args"]).stdout.decode()
        return bool(re.search(r"^Z", ps, re.MULTILINE)) and "sleep 301" in ps and "setsid" not in ps

    for cid in containers.values():
        wait_until(functools.partial(settled, cid))
    return containers


def _table(results: dict[tuple[str, ...] | None, Measurement]) -> str:
    lines = [
        "| capabilities | CapEff | uid-1000 holder | root holder | zombie rows | namespace view: zombies, orphans, "
        "PID 1 (uid-1000 / root) "
        "| pod names (CRI) | access_denied (exporter / trace) |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for caps, m in results.items():
        u, r = m.pods["uid1000"], m.pods["root"]
        ns = f"{u.zombies}, {u.orphans}, {'yes' if u.pid1 else 'no'} / {r.zombies}, {r.orphans}, {'yes' if r.pid1 else 'no'}"
        names = f"{'yes' if u.named else 'no'} / {'yes' if r.named else 'no'}"
        label = "all (reference)" if caps is None else " + ".join(c.upper() for c in caps) or "none"
        lines.append(
            f"| {label} | {m.effective_caps} | {'yes' if u.holder else 'no'} | {'yes' if r.holder else 'no'} "
            f"| {u.zombie_rows} / {r.zombie_rows} | {ns} "
            f"| {names} | {m.access_denied:g} / {m.trace_access_denied} |"
        )
    return "\n".join(lines)


@needs_containerd
@pytest.mark.slow
def test_the_chart_keeps_exactly_the_capabilities_the_agent_needs(containerd, tenants):
    socket = os.stat(containerd.socket)
    kept = chart_capabilities()
    sets: list[tuple[str, ...] | None] = [c for n in range(len(kept) + 1) for c in itertools.combinations(kept, n)]
    results = {caps: measure(caps, containerd.socket, tenants) for caps in [*sets, None]}
    table = _table(results)
    print(f"\nCRI socket: uid {socket.st_uid}, mode {stat.S_IMODE(socket.st_mode):04o}\n{table}")
    full = Seen(holder=True, zombie_rows=1, zombies=1, orphans=1, pid1=True, named=True)
    assert results[None].pods == {"uid1000": full, "root": full}, table
    # The chart's set sees all that root with every capability sees, and is denied nothing more
    # (a process that denies even that root, such as a hardened init, is counted by both).
    assert results[kept].pods == results[None].pods, table
    assert results[kept].access_denied == results[None].access_denied, table
    for caps in sets[:-1]:  # each smaller set loses something, and says so
        m = results[caps]
        assert m.pods != results[kept].pods, f"{caps} is enough:\n{table}"
        assert m.access_denied > results[None].access_denied, table
        assert m.trace_access_denied > results[None].trace_access_denied, table
    assert all(m.pods[pod].named for m in results.values() for pod in PODS), "the CRI socket needs a capability"


HOLDER_FDS = """
import json, sys
from gpuzombie.proc.procfs import Procfs
procfs = Procfs(device_prefix=sys.argv[1])
info = procfs.read_process(int(sys.argv[2]), procfs.boot_time())
print(json.dumps([info.nvidia_fds, [[u.file, u.reason.value] for u in info.incomplete]]))
"""


@pytest.mark.parametrize(
    ("caps", "fds", "incomplete"),
    [((), [], [["fd", "access_denied"]]), (("sys_ptrace",), ["nvidia0"], [])],
)
def test_a_root_holder_the_agent_may_not_trace_is_unreadable_not_absent(tmp_path, caps, fds, incomplete):
    """Without SYS_PTRACE root lists the fd/ of a root process with more capabilities, but reads
    none of its links: that process is incomplete (fd: access_denied), not one without fds."""
    device = tmp_path / "nvidia0"
    device.write_text("")
    with open(device) as held, subprocess.Popen(["sleep", "300"], stdin=held) as holder:
        try:
            done = _agent(caps, sys.executable, "-c", HOLDER_FDS, str(tmp_path / "nvidia"), str(holder.pid))
        finally:
            holder.kill()
    assert done.returncode == 0, done.stderr
    got_fds, got_incomplete = json.loads(done.stdout)
    assert [os.path.basename(f) for f in got_fds] == fds
    assert [u for u in got_incomplete if u[0] != "ns/pid"] == incomplete
