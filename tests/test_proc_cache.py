"""``ProcessCache``: what a long-lived caller (top) keeps across snapshots to read less. Real
processes on the real /proc (the fd table's size is the kernel's count of open fds on Linux 6.2+;
a file under the test's temp dir stands in for /dev/nvidia0) and, for what a container could do
to a tree, a fake one: a cached snapshot reads what a whole read reads, sees an fd opened, a
program exec'd, a pid reused and a zombie at once, an fd swapped within the sweep, and never
vouches for a file that fails."""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from fakeproc import TREE_PIDNS, make_fake_proc, make_fake_root
from gpuzombie.gpu.attribution import ReaderView
from gpuzombie.k8s.podresources import PodResources
from gpuzombie.proc.procfs import ProcessCache, ProcessInfo, Procfs
from gpuzombie.trace.scan import scan_node
from topnode import build_fake_node

CHILD = r"""
import os, sys
spare = os.open("/dev/null", os.O_RDONLY)
print("ready", flush=True)
for line in sys.stdin:
    command, _, arg = line.strip().partition(" ")
    if command == "open":
        held = os.open(arg, os.O_RDONLY)
    elif command == "close":
        os.close(held)
    elif command == "swap":  # one fd closed and one opened: the fd table's size stays the same
        os.close(spare)
        spare = os.open(arg, os.O_RDONLY)
    elif command == "exec":
        os.execvp("sleep", ["sleep", "300"])
    print("done", flush=True)
"""


class Child:
    """A real process that opens files or execs when told (and says when it has)."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        assert self.proc.stdout is not None and self.proc.stdout.readline() == "ready\n"
        self.pid = self.proc.pid

    def do(self, line: str) -> None:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()
        if not line.startswith("exec"):
            assert self.proc.stdout.readline() == "done\n"

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait()


@pytest.fixture
def children():
    made: list[Child] = []
    yield lambda n: [made.append(Child()) or made[-1] for _ in range(n)]
    for child in made:
        child.stop()


@pytest.fixture
def device(tmp_path) -> tuple[Procfs, str]:
    """The real /proc, with a file of the test's temp dir standing in for /dev/nvidia0."""
    prefix = str(tmp_path / "nvidia")
    Path(prefix + "0").write_bytes(b"")
    return Procfs("/proc", device_prefix=prefix), prefix + "0"


def fd_count_is_the_size() -> bool:
    return os.stat("/proc/self/fd").st_size > 0


def test_a_cached_snapshot_reads_what_a_whole_read_reads(children, device):
    procfs, _ = device
    pids = [c.pid for c in children(3)]
    cache = ProcessCache(sweep=1000)
    first = procfs.snapshot(pids, now=time.time(), cache=cache)
    for _ in range(50):  # until all three wait on their stdin (state S) through the three reads
        first = procfs.snapshot(pids, now=time.time(), cache=cache)
        again = procfs.snapshot(pids, now=time.time(), cache=cache)
        whole = procfs.snapshot(pids, now=time.time())
        if all(p.state == "S" for t in (first, again, whole) for p in t):
            break
        time.sleep(0.1)
    assert cache.last_reused == 3
    assert again.processes == whole.processes == first.processes
    assert all(p.cmdline and p.cgroup and p.nspid == (p.pid,) for p in again)


def test_an_fd_opened_since_is_seen_at_once(children, device):
    """The fd table grew: its fds are listed again in the very next snapshot."""
    if not fd_count_is_the_size():
        pytest.skip("this kernel does not count open fds in /proc/<pid>/fd's size (Linux 6.2+ does)")
    procfs, node = device
    (child,) = children(1)
    cache = ProcessCache(sweep=1000)
    assert procfs.snapshot([child.pid], now=time.time(), cache=cache).processes[child.pid].nvidia_fds == ()
    child.do(f"open {node}")
    assert procfs.snapshot([child.pid], now=time.time(), cache=cache).processes[child.pid].nvidia_fds == (node,)


def test_a_device_closed_is_seen_at_once(children, device):
    """A holder's fds are listed every snapshot: it let go of the GPU, it is no holder."""
    procfs, node = device
    (child,) = children(1)
    child.do(f"open {node}")
    cache = ProcessCache(sweep=1000)
    assert procfs.snapshot([child.pid], now=time.time(), cache=cache).processes[child.pid].nvidia_fds == (node,)
    assert procfs.snapshot([child.pid], now=time.time(), cache=cache).processes[child.pid].nvidia_fds == (node,)
    assert cache.last_reused == 1
    child.do("close")
    assert procfs.snapshot([child.pid], now=time.time(), cache=cache).processes[child.pid].nvidia_fds == ()


def test_an_fd_swapped_for_a_device_is_seen_within_the_sweep(children, device):
    """One fd closed and the device opened: the size cannot tell, the sweep reads it whole in time."""
    procfs, node = device
    (child,) = children(1)
    cache = ProcessCache(sweep=4)
    procfs.snapshot([child.pid], now=time.time(), cache=cache)
    child.do(f"swap {node}")
    seen = [
        procfs.snapshot([child.pid], now=time.time(), cache=cache).processes[child.pid].nvidia_fds for _ in range(4)
    ]
    assert (node,) in seen


def test_a_program_exec_d_under_the_same_pid_is_named_anew(children, device):
    procfs, _ = device
    (child,) = children(1)
    cache = ProcessCache(sweep=1000)
    assert procfs.snapshot([child.pid], now=time.time(), cache=cache).processes[child.pid].comm.startswith("python")
    child.do("exec")
    for _ in range(200):  # until the exec is done (comm changes with it)
        proc = procfs.snapshot([child.pid], now=time.time(), cache=cache).processes[child.pid]
        if proc.comm == "sleep":
            break
        time.sleep(0.05)
    assert proc.comm == "sleep" and proc.cmdline == ("sleep", "300")


def test_a_process_turned_zombie_is_seen_at_once(device):
    procfs, _ = device
    child = subprocess.Popen(["sleep", "300"])
    try:
        cache = ProcessCache(sweep=1000)
        assert procfs.snapshot([child.pid], now=time.time(), cache=cache).processes[child.pid].state in ("R", "S")
        child.kill()
        for _ in range(200):
            if procfs.stat(child.pid) is not None and procfs.stat(child.pid).state == "Z":  # type: ignore[union-attr]
                break
            time.sleep(0.05)
        assert procfs.snapshot([child.pid], now=time.time(), cache=cache).processes[child.pid].state == "Z"
    finally:
        child.kill()
        child.wait()


def fake_tree(root: Path) -> Path:
    make_fake_root(root)
    make_fake_proc(root, 1, ppid=0, comm="systemd", pidns=TREE_PIDNS)
    d = make_fake_proc(root, 40, ppid=1, comm="worker", cmdline=b"worker\0", pidns=TREE_PIDNS + 1, nspid=(40, 1))
    (d / "cgroup").write_text("0::/kubepods/pod-a/cri-containerd-aaaa.scope\n")
    return d


def test_a_file_that_fails_later_is_named_never_vouched_for(tmp_path):
    """A known process whose fd directory became a symlink (a hostile tree) is read whole: the fd
    failure is in ``incomplete``, as without a cache."""
    d = fake_tree(tmp_path)
    procfs, cache = Procfs(str(tmp_path)), ProcessCache(sweep=1000)
    assert procfs.snapshot(now=time.time(), cache=cache).processes[40].incomplete == ()
    os.rmdir(d / "fd")
    os.symlink("/proc/self/fd", d / "fd")
    proc = procfs.snapshot(now=time.time(), cache=cache).processes[40]
    assert [u.file for u in proc.incomplete] == ["fd"] and proc.could_hide_finding
    assert proc == procfs.snapshot(now=time.time()).processes[40]


def test_a_stat_that_changed_is_parsed_again_and_one_that_did_not_is_the_same_process(tmp_path):
    """The same stat bytes make the same ProcessInfo (kept, not parsed again); any change to them
    (here S to D, a new parent) is read at once."""
    d = fake_tree(tmp_path)
    procfs, cache = Procfs(str(tmp_path)), ProcessCache(sweep=1000)
    first = procfs.snapshot(now=time.time(), cache=cache).processes[40]
    assert procfs.snapshot(now=time.time(), cache=cache).processes[40] is first
    stat = d / "stat"
    stat.write_text(stat.read_text().replace(" S 1 ", " D 7 ", 1))
    again = procfs.snapshot(now=time.time(), cache=cache).processes[40]
    assert (again.state, again.ppid, cache.last_reused) == ("D", 7, 2)
    assert again == procfs.snapshot(now=time.time()).processes[40]


def test_a_pid_reused_by_another_process_is_read_whole(tmp_path):
    fake_tree(tmp_path)
    procfs, cache = Procfs(str(tmp_path)), ProcessCache(sweep=1000)
    procfs.snapshot(now=time.time(), cache=cache)
    shutil.rmtree(tmp_path / "40")
    d = make_fake_proc(tmp_path, 40, ppid=1, comm="worker", pidns=TREE_PIDNS + 2, nspid=(40, 7), starttime=5000)
    (d / "cgroup").write_text("0::/kubepods/pod-b/cri-containerd-bbbb.scope\n")
    proc = procfs.snapshot(now=time.time(), cache=cache).processes[40]
    assert (proc.pidns, proc.nspid, proc.cgroup) == (
        TREE_PIDNS + 2,
        (40, 7),
        ("0::/kubepods/pod-b/cri-containerd-bbbb.scope",),
    )


def test_a_node_scan_with_a_cache_is_the_scan_without(tmp_path):
    """trace, the namespace survey and the table of a cached scan are those of an uncached one."""
    node = build_fake_node(tmp_path, pods=6, per_pod=4, host=10, gpus=2)
    cache = ProcessCache(sweep=1000)

    def scan(cache):
        return scan_node(
            procfs=Procfs(str(node.proc)),
            nvml=node.nvml(),
            view=ReaderView(in_root_pidns=True),
            names=node.names,
            resources=lambda: PodResources(source=None),
            now=1_000_000.0,
            cache=cache,
        )

    scan(cache)
    cached, whole = scan(cache), scan(None)
    assert cache.last_reused > 0
    assert cached.trace == whole.trace
    assert cached.namespaces == whole.namespaces
    assert cached.table.processes == whole.table.processes


def test_relocated_is_replace_with_the_namespaces_ids():
    proc = ProcessInfo(
        pid=4000,
        ppid=3999,
        state="S",
        comm="c",
        cmdline=("a",),
        uid=7,
        start_ticks=9,
        start_time=10.0,
        pgid=3998,
        sid=3997,
        nspid=(4000, 12),
        pidns=11,
        cgroup=("0::/x",),
        nvidia_fds=("/dev/nvidia0",),
        rss_bytes=13,
    )
    assert proc.relocated(pid=12, ppid=1, pgid=2, sid=3) == dataclasses.replace(
        proc, pid=12, ppid=1, pgid=2, sid=3, nspid=(12,)
    )
