"""The one answer to "which pod and container own this process" (``k8s.owner``), on the cases where
trace, top and the exporter used to disagree: the sandbox's name, a zombie placed by its PID
namespace or its parent, the name fallback, an unread cgroup, and reap's cgroup-only rule."""

from __future__ import annotations

from gpuzombie.gpu.attribution import ReaderView
from gpuzombie.gpu.nvml import GpuSnapshot
from gpuzombie.k8s.names import ContainerNames, CriNames, PodNames
from gpuzombie.k8s.owner import UNREAD_CGROUP, FoundBy, in_cgroup, locate, name, resolve
from gpuzombie.k8s.podresources import PodResources
from gpuzombie.proc.procfs import ProcessInfo, ProcessTable
from gpuzombie.proc.read import Reason, Unreadable
from gpuzombie.trace.model import build_trace

NODE_NS, POD_NS = 4026531836, 4026533001
UID = "11111111-2222-3333-4444-555555555555"
CID, SANDBOX = "a" * 64, "5" * 64


def line(cid: str, uid: str = UID) -> str:
    return f"0::/kubepods.slice/kubepods-pod{uid.replace('-', '_')}.slice/cri-containerd-{cid}.scope"


def proc(pid: int, *, ppid: int = 1, nspid=(), pidns=NODE_NS, cgroup=(), state="S", unread=()) -> ProcessInfo:
    return ProcessInfo(
        pid=pid,
        ppid=ppid,
        state=state,
        comm=f"p{pid}",
        cmdline=(),
        uid=0,
        start_ticks=pid,
        start_time=0.0,
        pgid=pid,
        sid=pid,
        nspid=nspid or (pid,),
        pidns=pidns,
        cgroup=tuple(cgroup),
        nvidia_fds=(),
        rss_bytes=0,
        incomplete=tuple(Unreadable(f, Reason.ACCESS_DENIED) for f in unread),
    )


def table(*procs: ProcessInfo) -> ProcessTable:
    return ProcessTable({p.pid: p for p in procs}, boot_time=0.0, taken_at=0.0, tree_pidns=NODE_NS)


NAMES = CriNames(
    source="/run/containerd/containerd.sock",
    containers={
        CID: ContainerNames(CID, "trainer", "train-0", "ml", UID, "CONTAINER_RUNNING"),
        SANDBOX: ContainerNames(SANDBOX, "POD", "train-0", "ml", UID, "SANDBOX_READY"),
    },
    pods={UID: PodNames(UID, "train-0", "ml")},
)


def test_the_sandbox_is_no_container():
    """Trace rows used to say container POD; the exporter's namespace labels and top said "" (one rule: "")."""
    owners = resolve(table(proc(10, cgroup=[line(SANDBOX)])), lambda ids: NAMES, ask=[10])
    owner = owners.of(10)
    assert (owner.namespace, owner.pod, owner.pod_uid, owner.sandbox) == ("ml", "train-0", UID, True)
    assert owner.container is None and owner.labels.container == ""


def test_a_zombie_whose_cgroup_reads_empty_is_placed_by_its_pid_namespace():
    """Only top used to fall back to the PID namespace: trace and the exporter called it a host process."""
    t = table(
        proc(100, nspid=(100, 1), pidns=POD_NS, cgroup=[line(CID)]),
        proc(104, ppid=100, nspid=(104, 4), pidns=POD_NS, state="Z"),
    )
    where = locate(t)[104]
    assert where.found_by is FoundBy.PID_NAMESPACE and where.ref is not None and where.ref.pod_uid == UID
    owner = resolve(t, lambda ids: NAMES, ask=[104]).of(104)
    assert owner.labels.pod == "train-0" and owner.in_pod_cgroup is None  # never a reap target by its namespace


def test_a_zombie_whose_namespace_link_is_gone_is_placed_by_its_parent():
    t = table(
        proc(100, nspid=(100, 1), pidns=POD_NS, cgroup=[line(CID)]),
        proc(104, ppid=100, nspid=(104, 4), pidns=None, state="Z"),
    )
    assert locate(t)[104].found_by is FoundBy.PARENT
    assert locate(table(proc(104, ppid=100, nspid=(104,), pidns=None, state="Z")))[104].ref is None


def test_names_fall_back_from_the_container_to_the_pod_and_to_the_short_id():
    gone = "c" * 64  # a container the runtime no longer lists, in a pod it still does
    owner = name(in_cgroup(proc(20, cgroup=[line(gone)])), NAMES)
    assert (owner.namespace, owner.pod, owner.pod_uid, owner.container) == ("ml", "train-0", UID, None)
    assert owner.labels.container == gone[:13]
    nameless = name(in_cgroup(proc(21, cgroup=[line(gone)])), CriNames(source=None))
    assert nameless.labels == nameless.labels.__class__("", "", UID, gone[:13])


def test_an_unread_cgroup_is_unknown_never_the_host():
    owner = name(in_cgroup(proc(30, unread=["cgroup"])), NAMES)
    assert owner.labels.container == UNREAD_CGROUP and owner.pod_uid is None
    assert name(in_cgroup(proc(31)), NAMES).labels.container == ""  # read, and in no container: the host


def test_reap_reads_the_cgroup_rule_alone():
    t = table(proc(100, nspid=(100, 1), pidns=POD_NS, cgroup=[line(CID)]), proc(101, nspid=(101, 2), pidns=POD_NS))
    owners = resolve(t, lambda ids: NAMES, ask=[100, 101])
    assert owners.of(100).in_pod_cgroup == UID
    assert owners.of(101).pod_uid == UID and owners.of(101).in_pod_cgroup is None


def test_trace_rows_are_named_by_the_owner():
    """A pod's zombie with an empty cgroup: trace's row now names its pod, as top always did."""
    t = table(
        proc(100, nspid=(100, 1), pidns=POD_NS, cgroup=[line(CID)]),
        proc(104, ppid=100, nspid=(104, 4), pidns=POD_NS, state="Z"),
    )
    asked = []

    def names(ids):
        asked.append(list(ids))
        return NAMES

    report, owners = build_trace(
        t,
        GpuSnapshot(available=False, reason="no GPU"),
        view=ReaderView(in_root_pidns=True),
        names=names,
        resources=PodResources(source=None),
        now=0.0,
    )
    (row,) = report.rows
    assert (row.pid, row.namespace, row.pod, row.container, row.pod_uid) == (104, "ml", "train-0", "trainer", UID)
    assert asked == [[CID]] and owners.of(104).labels == owners.of(100).labels
    assert report.summary.unmapped == 0
