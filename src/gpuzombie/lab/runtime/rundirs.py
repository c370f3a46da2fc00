"""Where each private containerd of the lab keeps its state, and the removal of what a run that
died (SIGKILL, OOM kill, a lost session) left behind: ``gpuzombie lab clean``, also run at the start
of every ``lab pod``.

Every run gets one directory, ``/run/gpuzombie-lab/<pid>.<start ticks>.<random>``: containerd's
root, state (with the pods' network namespaces), socket, config and log, the pods' volumes and logs.
Its name is its owner (the process that made it, by pid and start time, written by the one
``mkdir``), so a run whose owner is gone is known without a file that a crash could leave half
written. What belongs to a run is found from that directory alone:

* processes: those whose command line names a path in it (its containerd: ``--config DIR/...``;
  its shims: ``-address DIR/containerd.sock``), their descendants (pause and container processes),
  and the processes in the pod cgroups it recorded in ``DIR/cgroups`` (a container whose shim is
  gone); each is signalled through a pidfd opened against the start time read with it, so a pid
  reused by an unrelated process is never signalled;
* mounts: every mount point under the directory (container rootfs, the sandbox's /dev/shm, a
  pod's network namespace, a tmpfs emptyDir), deepest first;
* cgroups: the ones the run recorded as made by it;
* the shim sockets containerd keeps under /run/containerd/s (named by a hash of the run's socket,
  namespace and container id);
* then the directory itself.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import secrets
import shutil
import signal
import subprocess
import time
from collections.abc import Iterable
from dataclasses import dataclass, replace
from pathlib import Path

from gpuzombie.k8s.cgroup import cgroup_paths
from gpuzombie.proc.pidfd import Liveness, ProcessHandle, ProcessIdentity, read_start_and_state
from gpuzombie.proc.procfs import Procfs

LAB_STATE_ROOT = Path("/run/gpuzombie-lab")
CGROUPS_FILE = "cgroups"
"""In a run's directory: the cgroups its pods made (one per line, relative to each hierarchy)."""
SHIM_SOCKET_DIR = "/run/containerd/s"
"""containerd 1.6's ``shim.SocketAddress``: ``/run/containerd/s/<sha256(address/namespace/id)>``,
whatever the instance's own state dir is."""
TASK_DIR = "state/io.containerd.runtime.v2.task"
KILL_WAIT_S = 10.0


def new_run_dir(root: Path = LAB_STATE_ROOT) -> Path:
    """A fresh run directory (mode 0700) named after this process."""
    root.mkdir(mode=0o700, parents=True, exist_ok=True)
    own = read_start_and_state("/proc", os.getpid())
    ticks = own[0] if own else 0
    path = root / f"{os.getpid()}.{ticks}.{secrets.token_hex(4)}"
    path.mkdir(mode=0o700)
    return path


def owner_of(run: Path) -> ProcessIdentity | None:
    """The process that made ``run``, from its name; None for a name the lab does not make."""
    parts = run.name.split(".")
    if len(parts) != 3 or not (parts[0].isdigit() and parts[1].isdigit()):
        return None
    return ProcessIdentity(int(parts[0]), int(parts[1]))


def owner_alive(owner: ProcessIdentity) -> bool:
    """The owner still runs: same pid, same start time, not a zombie."""
    now = read_start_and_state("/proc", owner.pid)
    return now is not None and now[0] == owner.start_ticks and now[1] not in ("Z", "X")


def record_cgroup(run: Path, relative: str) -> None:
    """Note a cgroup the run made, before it is made (a crash then still finds it)."""
    with open(run / CGROUPS_FILE, "a") as f:
        f.write(relative + "\n")


def recorded_cgroups(run: Path) -> list[str]:
    try:
        lines = (run / CGROUPS_FILE).read_text().splitlines()
    except OSError:
        return []
    return list(dict.fromkeys(line for line in lines if line.startswith("/")))


def _pod_cgroups(cgroups: Iterable[str]) -> list[str]:
    """Only a pod's own cgroup tells its processes (a shared ``/kubepods`` holds other runs' pods)."""
    return [c for c in cgroups if os.path.basename(c).startswith("pod")]


def remove_cgroup(relative: str) -> list[str]:
    """Remove the cgroup ``relative`` (e.g. a pod's ``/kubepods/besteffort/pod<uid>``) and the empty
    cgroups under it in every hierarchy; what could not be removed (only a pod's own cgroup counts:
    a shared parent may hold others' pods). Pods made on a runtime without a kubelet need it."""
    problems = []
    for root in cgroup_roots():
        path = Path(root + relative)
        if not path.is_dir():
            continue
        for child in sorted((p for p in path.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True):
            with contextlib.suppress(OSError):  # a container's cgroup runc left (killed shim)
                child.rmdir()
        try:
            path.rmdir()
        except OSError as exc:
            if os.path.basename(relative).startswith("pod"):
                problems.append(f"cannot remove cgroup {path}: {exc.strerror}")
    return problems


def cgroup_roots(base: str = "/sys/fs/cgroup") -> list[str]:
    """Every mounted cgroup hierarchy: the v2 root, or each v1 controller (and the hybrid unified one)."""
    if os.path.exists(os.path.join(base, "cgroup.controllers")):
        return [base]
    try:
        names = sorted(os.listdir(base))
    except OSError:
        return []
    return [path for n in names if not os.path.islink(path := os.path.join(base, n)) and os.path.ismount(path)]


def run_processes(run: Path, cgroups: Iterable[str], procfs: Procfs | None = None) -> list[ProcessIdentity]:
    """The processes of ``run`` alive now, descendants before their parents."""
    table = (procfs or Procfs()).snapshot(now=time.time(), with_cgroup=True)
    prefix = f"{run}/"
    pods = _pod_cgroups(cgroups)

    def in_a_pod(cgroup_lines: tuple[str, ...]) -> bool:  # "N:controller:/kubepods/.../pod<uid>[/<id>]"
        paths = list(cgroup_paths(cgroup_lines))
        return any(path == pod or path.startswith(f"{pod}/") for path in paths for pod in pods)

    roots = [
        p.pid
        for p in table
        if p.pid != os.getpid() and (any(arg.startswith(prefix) for arg in p.cmdline) or in_a_pod(p.cgroup))
    ]
    order: list[int] = []
    pending = list(roots)
    while pending:  # each process's whole tree, children first
        pid = pending.pop()
        if pid in order:
            continue
        order.insert(0, pid)
        pending.extend(c.pid for c in table.children(pid))
    by_pid = {p.pid: p for p in table}
    return [ProcessIdentity(pid, by_pid[pid].start_ticks) for pid in order if not by_pid[pid].is_zombie]


def kill_processes(
    processes: Iterable[ProcessIdentity], wait_s: float = KILL_WAIT_S
) -> tuple[int, list[tuple[int, str]]]:
    """SIGKILL each through a pidfd checked against its start time, then wait, at most ``wait_s``,
    until each is gone: exited *and* reaped (a killed child stays a zombie, its pid and process
    table slot held, until its parent, or init once the parent is killed too, waits for it). The
    number signalled, and (pid, one line saying why) for each that is not gone by then."""
    handles = []
    for identity in processes:
        handle, _state = ProcessHandle.open(identity)
        if handle is not None:
            if handle.send(signal.SIGKILL) is Liveness.ALIVE:
                handles.append(handle)
            else:
                handle.close()
    signalled = len(handles)
    deadline = time.monotonic() + wait_s
    try:
        while True:
            handles = [h for h in handles if not _reaped(h)]
            if not handles or time.monotonic() >= deadline:
                break
            time.sleep(0.02)
        return signalled, [(h.identity.pid, _not_ended(h.identity, wait_s)) for h in handles]
    finally:
        for h in handles:
            h.close()


def _reaped(handle: ProcessHandle) -> bool:
    """The process is gone from the process table: signal 0 through its pidfd finds no process (a
    zombie still takes it; a pidfd polls readable already when its process exits)."""
    if handle.pidfd is None:
        return True
    try:
        signal.pidfd_send_signal(handle.pidfd, 0)
    except ProcessLookupError:
        return True
    return False


def _not_ended(identity: ProcessIdentity, wait_s: float, procfs: Procfs | None = None) -> str:
    """One line: why a killed process is still there (its pid is still its own: its pidfd is open)."""
    procfs = procfs or Procfs()
    fields = procfs.stat(identity.pid)
    if fields is None or fields.start_ticks != identity.start_ticks:
        return f"pid {identity.pid}: killed, gone only as the wait ended"
    who = f"pid {identity.pid} ({fields.comm})"
    if fields.state in ("Z", "X"):
        parent = procfs.stat(fields.ppid)
        named = f"pid {fields.ppid} ({parent.comm})" if parent is not None else f"pid {fields.ppid}"
        return f"{who} killed, but not reaped {wait_s:g} s later: its parent {named} has not waited for it"
    frozen = [path for path in _freezer_paths(procfs.cgroup(identity.pid) or ()) if _frozen(path)]
    hint = f", frozen by the cgroup freezer {frozen[0]} (thaw it: SIGKILL waits for that)" if frozen else ""
    return f"{who} still alive {wait_s:g} s after SIGKILL (state {fields.state}{hint})"


def _freezer_paths(cgroup_lines: Iterable[str], base: str = "/sys/fs/cgroup") -> list[str]:
    """The v1 freezer cgroup directories of a process (``N:freezer:/path``)."""
    paths = []
    for line in cgroup_lines:
        _id, controllers, path = [*line.split(":", 2), "", ""][:3]
        if "freezer" in controllers.split(","):
            paths.append(os.path.join(base, "freezer", path.lstrip("/")))
    return paths


def _frozen(path: str) -> bool:
    try:
        with open(os.path.join(path, "freezer.state")) as f:
            return f.read().strip() != "THAWED"
    except OSError:
        return False


def mounts_under(path: Path) -> list[str]:
    """Mount points under ``path`` (directories and files, such as a network namespace's), deepest
    first; a mount's own tree (a container's rootfs) is not walked."""
    found: list[str] = []
    for top, dirs, files in os.walk(path):
        for name in files:
            if os.path.ismount(os.path.join(top, name)):
                found.append(os.path.join(top, name))
        for d in list(dirs):
            if os.path.ismount(os.path.join(top, d)):
                found.append(os.path.join(top, d))
                dirs.remove(d)
    return sorted(found, key=len, reverse=True)


def unmount(mountpoints: Iterable[str]) -> int:
    count = 0
    for mountpoint in mountpoints:
        subprocess.run(["umount", "--lazy", mountpoint], capture_output=True, timeout=30, check=False)
        count += 1
    return count


def shim_sockets(run: Path, namespace: str = "k8s.io") -> list[str]:
    """The shim sockets of the run's tasks (one per sandbox and container) that are still there."""
    try:
        ids = sorted(os.listdir(run / TASK_DIR / namespace))
    except OSError:
        return []
    address = str(run / "containerd.sock")
    paths = [f"{SHIM_SOCKET_DIR}/{hashlib.sha256(f'{address}/{namespace}/{i}'.encode()).hexdigest()}" for i in ids]
    return [p for p in paths if os.path.exists(p)]


@dataclass(frozen=True)
class RunLeftovers:
    """What one run left, found (``dry_run``) or removed."""

    path: str
    owner_pid: int
    owner_alive: bool
    processes: tuple[int, ...]
    mounts: tuple[str, ...]
    cgroups: tuple[str, ...]
    shim_sockets: tuple[str, ...]
    removed: bool = False
    problems: tuple[str, ...] = ()
    not_ended: tuple[int, ...] = ()
    """The processes killed but not gone (exited and reaped) by the end of the wait."""


def find(run: Path) -> RunLeftovers:
    owner = owner_of(run)
    cgroups = recorded_cgroups(run)
    return RunLeftovers(
        path=str(run),
        owner_pid=owner.pid if owner else 0,
        owner_alive=owner is not None and owner_alive(owner),
        processes=tuple(p.pid for p in run_processes(run, cgroups)),
        mounts=tuple(mounts_under(run)),
        cgroups=tuple(c for c in cgroups if any(os.path.isdir(r + c) for r in cgroup_roots())),
        shim_sockets=tuple(shim_sockets(run)),
    )


def remove_run(run: Path, kill_wait_s: float = KILL_WAIT_S) -> list[str]:
    """Kill the run's processes and wait until they are gone (``kill_wait_s`` at most per round),
    unmount, remove its cgroups, shim sockets and directory; what could not be ended or removed, one
    line each. Also the backstop of a live run's own tear-down."""
    return _remove_run(run, kill_wait_s)[0]


def _remove_run(run: Path, kill_wait_s: float) -> tuple[list[str], tuple[int, ...]]:
    """remove_run's lines, and the pids killed but not gone."""
    cgroups = recorded_cgroups(run)
    first = run_processes(run, cgroups)
    left = kill_processes(first, kill_wait_s)[1]
    again = [p for p in run_processes(run, cgroups) if p not in first]  # a shim may have started one as it died
    left += kill_processes(again, kill_wait_s)[1]
    problems = [line for _pid, line in left]
    unmount(mounts_under(run))
    for relative in sorted(cgroups, key=lambda p: p.count("/"), reverse=True):
        problems += remove_cgroup(relative)
    for socket in shim_sockets(run):
        with contextlib.suppress(OSError):
            os.unlink(socket)
    shutil.rmtree(run, ignore_errors=True)
    if run.exists():
        problems.append(f"cannot remove {run}")
    return problems, tuple(pid for pid, _line in left)


def runs(root: Path = LAB_STATE_ROOT) -> list[Path]:
    """Every run directory under ``root``, oldest first."""
    try:
        entries = sorted(root.iterdir(), key=lambda p: p.stat().st_mtime)
    except OSError:
        return []
    return [p for p in entries if p.is_dir() and owner_of(p) is not None]


def clean_dead_runs(
    root: Path = LAB_STATE_ROOT, *, dry_run: bool = False, kill_wait_s: float = KILL_WAIT_S
) -> list[RunLeftovers]:
    """What the runs whose owner is gone left, removed (unless ``dry_run``); live runs untouched.
    Returns once what it killed is gone, or ``kill_wait_s`` has passed (what is not: ``not_ended``)."""
    done = []
    for run in runs(root):
        found = find(run)
        if found.owner_alive:
            continue
        if not dry_run:
            problems, left = _remove_run(run, kill_wait_s)
            found = replace(found, removed=not run.exists(), problems=tuple(problems), not_ended=left)
        done.append(found)
    return done
