"""Read processes from a procfs tree: the real /proc, a node agent's /host/proc, or a test's fake tree.

Parsing is done by pure functions on file contents (``parse_stat``, ``parse_status``, ...), so they
are tested on fixture strings; ``Procfs`` is the one place that touches the filesystem. A process
that vanishes mid-read is skipped; one whose files deny access is kept with what could be read.
"""

from __future__ import annotations

import errno
import functools
import os
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field

NVIDIA_DEVICE_PREFIX = "/dev/nvidia"
PF_KTHREAD = 0x00200000  # include/linux/sched.h: the task is a kernel thread


@dataclass(frozen=True)
class StatFields:
    """The fields of /proc/<pid>/stat that gpuzombie uses."""

    comm: str
    state: str
    ppid: int
    pgid: int
    sid: int
    start_ticks: int
    rss_pages: int
    flags: int = 0

    @property
    def is_kernel_thread(self) -> bool:
        return bool(self.flags & PF_KTHREAD)


@dataclass(frozen=True)
class StatusFields:
    """The fields of /proc/<pid>/status that gpuzombie uses."""

    uid: int | None
    nspid: tuple[int, ...]


@dataclass(frozen=True)
class ProcessInfo:
    """One process as seen through one procfs tree.

    ``pid`` is the pid in the reader's namespace. ``nspid`` is the kernel's NSpid chain, outermost
    (visible namespace) first and the process's own innermost pid last. ``(pid, start_ticks)``
    identifies a process across pid reuse.
    """

    pid: int
    ppid: int
    state: str
    comm: str
    cmdline: tuple[str, ...]
    uid: int | None
    """Effective uid, as the owner of /proc/<pid> (like ``ps -o user``; 0 for non-dumpable
    processes such as setuid programs)."""
    start_ticks: int
    start_time: float
    pgid: int
    sid: int
    nspid: tuple[int, ...]
    pidns: int | None
    cgroup: tuple[str, ...]
    nvidia_fds: tuple[str, ...]
    rss_bytes: int
    access_denied: bool = False

    @property
    def is_zombie(self) -> bool:
        return self.state == "Z"

    @property
    def innermost_pid(self) -> int:
        """The pid the process has inside its own (innermost) PID namespace."""
        return self.nspid[-1] if self.nspid else self.pid

    @property
    def command(self) -> str:
        """The command line, or ``[comm]`` when there is none (zombies, kernel threads)."""
        return " ".join(self.cmdline) if self.cmdline else f"[{self.comm}]"

    @property
    def identity(self) -> tuple[int, int]:
        """(pid, start time in ticks): what tells a process from a later one with the same pid."""
        return (self.pid, self.start_ticks)


@dataclass(frozen=True)
class ProcessTable:
    """A snapshot of every readable process, keyed by pid."""

    processes: Mapping[int, ProcessInfo]
    boot_time: float
    taken_at: float
    procfs_root: str = "/proc"
    children_of: Mapping[int, tuple[int, ...]] = field(default_factory=dict)

    def __iter__(self) -> Iterator[ProcessInfo]:
        return iter(self.processes.values())

    def __len__(self) -> int:
        return len(self.processes)

    def get(self, pid: int) -> ProcessInfo | None:
        return self.processes.get(pid)

    def children(self, pid: int) -> list[ProcessInfo]:
        return [self.processes[c] for c in self.children_of.get(pid, ())]


def parse_stat(text: str) -> StatFields:
    """Parse /proc/<pid>/stat. The comm may contain spaces and parentheses: split at the last ')'."""
    open_paren = text.index("(")
    close_paren = text.rindex(")")
    comm = text[open_paren + 1 : close_paren]
    # rest[0] is field 3 (state); field N is rest[N - 3]. Fields past 24 (rss) are never used:
    # leave them unsplit (half the cost of splitting all ~50).
    rest = text[close_paren + 2 :].split(None, 22)
    return StatFields(
        comm=comm,
        state=rest[0],
        ppid=int(rest[1]),
        pgid=int(rest[2]),
        sid=int(rest[3]),
        start_ticks=int(rest[19]),
        rss_pages=int(rest[21]),
        flags=int(rest[6]),
    )


_UID_LINE = re.compile(r"^Uid:\s*(\d+)", re.MULTILINE)
_NSPID_LINE = re.compile(r"^NSpid:([^\n]*)", re.MULTILINE)


def parse_status(text: str) -> StatusFields:
    """Parse the Uid (real uid) and NSpid lines of /proc/<pid>/status.

    Two anchored searches instead of a loop over ~55 lines: this runs once per process, and a
    node has thousands.
    """
    uid_match = _UID_LINE.search(text)
    nspid_match = _NSPID_LINE.search(text)
    return StatusFields(
        uid=int(uid_match.group(1)) if uid_match else None,
        nspid=tuple(int(p) for p in nspid_match.group(1).split()) if nspid_match else (),
    )


def parse_cmdline(raw: bytes) -> tuple[str, ...]:
    """NUL-separated argv; empty for zombies and kernel threads."""
    return tuple(filter(None, raw.decode(errors="replace").split("\0")))


def parse_cgroup(text: str) -> tuple[str, ...]:
    """The lines of /proc/<pid>/cgroup, as they are (``hierarchy-id:controllers:path``)."""
    return tuple(line for line in text.splitlines() if line)


@functools.lru_cache(maxsize=1024)
def parse_ns_link(target: str) -> int | None:
    """``pid:[4026531836]`` -> 4026531836. Cached: a node's thousands of processes share a few
    namespaces, so the same few link texts come back. None for any other text (a recorded or fake
    tree may hold any link): one odd process must not fail the whole snapshot."""
    if "[" in target and target.endswith("]"):
        inode = target[target.index("[") + 1 : -1]
        return int(inode) if inode.isascii() and inode.isdigit() else None
    return None


def parse_boot_time(stat_text: str) -> float:
    """The ``btime`` line of /proc/stat: boot time in seconds since the epoch."""
    for line in stat_text.splitlines():
        if line.startswith("btime "):
            return float(line.split()[1])
    raise ValueError("no btime line in /proc/stat")


# errno values meaning "the process is gone" (ESRCH comes from reads of a task that just exited).
_GONE = (errno.ENOENT, errno.ESRCH, errno.ENOTDIR)


_READ_SIZE = 65536


def _read_fd(fd: int) -> bytes:
    data = os.read(fd, _READ_SIZE)
    if len(data) < _READ_SIZE:  # procfs hands a small file over in one read: skip the EOF read
        return data
    chunks = [data]
    while chunk := os.read(fd, _READ_SIZE):
        chunks.append(chunk)
    return b"".join(chunks)


def _read_bytes(path: str) -> bytes:
    """One open/read/close through the os layer: a third of the cost of ``open().read()``."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        return _read_fd(fd)
    finally:
        os.close(fd)


def _read_owned(path: str) -> tuple[bytes, int]:
    """The file's bytes and its owner's uid (for /proc/<pid>/* the process's effective uid)."""
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        return _read_fd(fd), os.fstat(fd).st_uid
    finally:
        os.close(fd)


def fd_targets(fd_dir: str) -> list[str]:
    """The link targets in a /proc/<pid>/fd directory; raises OSError when it cannot be opened.

    The directory is opened once and each link read relative to it: the kernel then resolves one
    name per fd instead of the whole /proc/<pid>/fd/<n> path (most of a node's syscalls). An fd
    closed between the listing and its readlink is skipped. A list, not a generator: resuming a
    generator per fd cost more than the early stop a caller could gain.
    """
    dir_fd = os.open(fd_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        targets = []
        for name in os.listdir(dir_fd):
            try:
                targets.append(os.readlink(name, dir_fd=dir_fd))
            except OSError:
                continue
        return targets
    finally:
        os.close(dir_fd)


class Procfs:
    """The filesystem edge: reads a procfs tree rooted at ``root``."""

    def __init__(self, root: str = "/proc", *, device_prefix: str = NVIDIA_DEVICE_PREFIX) -> None:
        self.root = root.rstrip("/") or "/"
        self.device_prefix = device_prefix  # a stand-in path on machines without /dev/nvidia*
        self.clock_ticks = os.sysconf("SC_CLK_TCK")
        self.page_size = os.sysconf("SC_PAGE_SIZE")

    def path(self, *parts: str | int) -> str:
        return os.path.join(self.root, *(str(p) for p in parts))

    def pids(self) -> list[int]:
        """Numeric entries of the tree; raises OSError when the root cannot be listed."""
        return sorted(int(name) for name in os.listdir(self.root) if name.isdigit())

    def boot_time(self) -> float:
        return parse_boot_time(_read_bytes(self.path("stat")).decode())

    def _nvidia_fds(self, fd_dir: str) -> tuple[str, ...]:
        """Targets of the fds in ``fd_dir`` that point at the device prefix (/dev/nvidia*), sorted;
        raises OSError when the directory cannot be listed (``read_process`` tells denied from gone)."""
        prefix = self.device_prefix
        found = {target for target in fd_targets(fd_dir) if target.startswith(prefix)}
        return tuple(sorted(found)) if found else ()

    def tree_pidns(self, pids: Iterable[int] = (), *, tries: int = 16) -> int | None:
        """The PID namespace this tree shows: that of a process whose NSpid has one level.

        PID 1's link is the first try, but it may deny access even to root (a hardened init), so
        a few more of the lowest pids follow; None when none can tell (then every status is read).
        """
        for pid in list(dict.fromkeys((1, *pids)))[:tries]:
            base = f"{self.root}/{pid}"
            try:
                pidns = parse_ns_link(os.readlink(f"{base}/ns/pid"))
                nspid = parse_status(_read_bytes(f"{base}/status").decode(errors="replace")).nspid
            except OSError:
                continue
            if pidns is not None and len(nspid) == 1:
                return pidns
        return None

    def read_process(
        self, pid: int, boot_time: float, *, with_cgroup: bool = True, tree_pidns: int | None = None
    ) -> ProcessInfo | None:
        """Read one process; None when it has vanished (or never was).

        A file that denies access (another user's fds without root) leaves its fields empty and
        sets ``access_denied``; a process that exits mid-read is dropped as a whole. A process in
        ``tree_pidns`` (the tree's own namespace) has the NSpid chain ``(pid,)``: its status file,
        the costliest file the kernel generates here, is not read.
        """
        base = f"{self.root}/{pid}"
        try:
            raw_stat, owner = _read_owned(f"{base}/stat")
            stat = parse_stat(raw_stat.decode(errors="replace"))
        except (OSError, ValueError, IndexError):
            return None
        if stat.is_kernel_thread:  # no argv, no fds, never in a container: nothing more to read
            return self._process(
                pid, stat, owner, boot_time, cmdline=(), nspid=(pid,), pidns=tree_pidns, cgroup=(), fds=(), denied=False
            )
        # Each read below: denied -> leave the field empty and say so; gone -> drop the process.
        denied = False
        cmdline: tuple[str, ...] = ()
        status = StatusFields(uid=None, nspid=())
        cgroup: tuple[str, ...] = ()
        pidns: int | None = None
        fds: tuple[str, ...] = ()
        try:
            try:
                cmdline = parse_cmdline(_read_bytes(f"{base}/cmdline"))
            except PermissionError:
                denied = True
            try:
                pidns = parse_ns_link(os.readlink(f"{base}/ns/pid"))
            except PermissionError:
                denied = True
            if pidns is None or pidns != tree_pidns:
                try:
                    status = parse_status(_read_bytes(f"{base}/status").decode(errors="replace"))
                except PermissionError:
                    denied = True
            if with_cgroup:
                try:
                    cgroup = parse_cgroup(_read_bytes(f"{base}/cgroup").decode(errors="replace"))
                except PermissionError:
                    denied = True
            try:
                fds = self._nvidia_fds(f"{base}/fd")
            except PermissionError:
                denied = True
        except OSError as exc:
            if exc.errno in _GONE:
                return None  # exited mid-read: drop it rather than report half a process
            denied = True
        return self._process(
            pid,
            stat,
            owner,
            boot_time,
            cmdline=cmdline,
            nspid=status.nspid or (pid,),
            pidns=pidns,
            cgroup=cgroup,
            fds=fds,
            denied=denied,
        )

    def _process(
        self,
        pid: int,
        stat: StatFields,
        uid: int,
        boot_time: float,
        *,
        cmdline: tuple[str, ...],
        nspid: tuple[int, ...],
        pidns: int | None,
        cgroup: tuple[str, ...],
        fds: tuple[str, ...],
        denied: bool,
    ) -> ProcessInfo:
        return ProcessInfo(
            pid=pid,
            ppid=stat.ppid,
            state=stat.state,
            comm=stat.comm,
            cmdline=cmdline,
            uid=uid,
            start_ticks=stat.start_ticks,
            start_time=boot_time + stat.start_ticks / self.clock_ticks,
            pgid=stat.pgid,
            sid=stat.sid,
            nspid=nspid,
            pidns=pidns,
            cgroup=cgroup,
            nvidia_fds=fds,
            rss_bytes=stat.rss_pages * self.page_size,
            access_denied=denied,
        )

    def snapshot(self, pids: Iterable[int] | None = None, *, now: float, with_cgroup: bool = True) -> ProcessTable:
        """Read every process (or the given pids) into a ProcessTable.

        ``with_cgroup=False`` skips /proc/<pid>/cgroup for callers that do not map containers
        (observe): one read in five, on a node with thousands of processes.
        """
        boot = self.boot_time()
        wanted = self.pids() if pids is None else list(pids)
        tree_pidns = self.tree_pidns(wanted)
        processes: dict[int, ProcessInfo] = {}
        for pid in wanted:
            proc = self.read_process(pid, boot, with_cgroup=with_cgroup, tree_pidns=tree_pidns)
            if proc is not None:
                processes[pid] = proc
        children: dict[int, list[int]] = {}
        for proc in processes.values():
            if proc.ppid in processes and proc.ppid != proc.pid:
                children.setdefault(proc.ppid, []).append(proc.pid)
        return ProcessTable(
            processes=processes,
            boot_time=boot,
            taken_at=now,
            procfs_root=self.root,
            children_of={k: tuple(sorted(v)) for k, v in children.items()},
        )
