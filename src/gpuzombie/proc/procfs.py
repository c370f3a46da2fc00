"""Read processes from a procfs tree: the real /proc, a node agent's /host/proc, or a test's fake tree.

Parsing is done by pure functions on file contents (``gpuzombie.proc.parse``), so they are tested on
fixture strings; ``Procfs`` is the one place that touches the filesystem, through the hardened
reader of ``gpuzombie.proc.read``. A process is gone only when its ``stat`` is gone (or says it is
dead); any other file that is missing, denied, hostile or malformed leaves the process in the table,
marked incomplete with the file and the reason.
"""

from __future__ import annotations

import ctypes
import os
import re
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TypedDict

from gpuzombie.proc.own import PROCFS
from gpuzombie.proc.parse import (
    DEAD_STATES,
    UNKNOWN_DISPOSITION,
    SigtermDisposition,
    StatFields,
    StatusFields,
    parse_boot_time,
    parse_cgroup,
    parse_cmdline,
    parse_ns_link,
    parse_sigterm,
    parse_stat,
    parse_status,
)
from gpuzombie.proc.read import (
    GONE_ERRNOS,
    Deadline,
    Reason,
    Unreadable,
    read_capped,
    read_owned,
    read_text,
    unreadable,
)

NVIDIA_DEVICE_PREFIX = "/dev/nvidia"
NVIDIA_DEVICE_NAMES = r"(?:[0-9]{1,3}|ctl|-uvm|-uvm-tools|-modeset|-caps/nvidia-cap[0-9]{1,6})"
"""What follows the prefix in a device the driver creates: /dev/nvidia0..N, nvidiactl, nvidia-uvm,
nvidia-uvm-tools, nvidia-modeset, nvidia-caps/nvidia-capN (MIG). Any other link under the prefix
(a 4,000-character name, ``/dev/nvidia0 (deleted)``) is no GPU device: the fd is malformed."""
DECISIVE_FILES = frozenset({"stat", "fd", "ns/pid", "status"})
"""Files whose loss can hide a finding: the state and parent (stat), a /dev/nvidia* fd (fd), the
namespace and the pid inside it (ns/pid, status). cmdline and cgroup only name what was found."""
Detail = Callable[["ProcessInfo", int | None], bool]
"""Given a process read so far (stat, namespace, fds) and the tree's namespace: read its names too?"""
PROC_SUPER_MAGIC = 0x9FA0
"""statfs(2)'s f_type of a mounted proc filesystem (linux/magic.h)."""
DEFAULT_SCAN_DEADLINE_S = 8.0
"""A scan that has not read every process by then stops and reports the rest as unread (inside
Prometheus's default 10 s scrape timeout)."""


class ProcessName(TypedDict):
    """How a record made of one process names it (``ProcessInfo.named``)."""

    pid: int
    local_pid: int
    comm: str


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
    """R, S, D, Z, ... from stat; "?" when stat itself could not be used (see ``incomplete``)."""
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
    incomplete: tuple[Unreadable, ...] = ()
    """The files that could not be used, and why; empty for a fully read process."""

    @property
    def is_zombie(self) -> bool:
        return self.state == "Z"

    @property
    def access_denied(self) -> bool:
        return any(u.reason is Reason.ACCESS_DENIED for u in self.incomplete)

    @property
    def could_hide_finding(self) -> bool:
        """A file whose loss can hide a holder, a zombie or an orphan could not be used. ns/pid alone
        is no such loss when NSpid has one level: the process is in the tree's own namespace (a
        hardened init denies its link even to root)."""
        return any(
            u.file in DECISIVE_FILES and not (u.file == "ns/pid" and len(self.nspid) == 1) for u in self.incomplete
        )

    def unread(self, file: str) -> bool:
        """``file`` (stat, fd, cgroup, ...) could not be used: its fields are empty, not known empty."""
        return any(u.file == file for u in self.incomplete)

    @property
    def innermost_pid(self) -> int:
        """The pid the process has inside its own (innermost) PID namespace."""
        return self.nspid[-1] if self.nspid else self.pid

    def named(self) -> ProcessName:
        """Its pid here, its pid in its own namespace and its comm: one place for the fields every
        record of a process (orphan, zombie, fd holder, D-state holder) starts with."""
        return ProcessName(pid=self.pid, local_pid=self.innermost_pid, comm=self.comm)

    @property
    def command(self) -> str:
        """The command line, or ``[comm]`` when there is none (zombies, kernel threads)."""
        return " ".join(self.cmdline) if self.cmdline else f"[{self.comm}]"

    @property
    def identity(self) -> tuple[int, int]:
        """(pid, start time in ticks): what tells a process from a later one with the same pid."""
        return (self.pid, self.start_ticks)

    def relocated(self, *, pid: int, ppid: int, pgid: int, sid: int) -> ProcessInfo:
        """This process as its own PID namespace shows it (``proc.pidns``): its ids there and its
        innermost NSpid. ``dataclasses.replace`` by hand: a node scan makes thousands a refresh."""
        return ProcessInfo(
            pid,
            ppid,
            self.state,
            self.comm,
            self.cmdline,
            self.uid,
            self.start_ticks,
            self.start_time,
            pgid,
            sid,
            self.nspid[-1:],
            self.pidns,
            self.cgroup,
            self.nvidia_fds,
            self.rss_bytes,
            self.incomplete,
        )


@dataclass(frozen=True)
class ProcessTable:
    """A snapshot of every readable process, keyed by pid."""

    processes: Mapping[int, ProcessInfo]
    boot_time: float
    taken_at: float
    procfs_root: str = PROCFS
    children_of: Mapping[int, tuple[int, ...]] = field(default_factory=dict)
    unread: tuple[int, ...] = ()
    """Pids listed but not read: the scan's deadline passed first."""
    tree_pidns: int | None = None
    """The PID namespace the tree shows (its processes' NSpid has one level); None when unknown."""

    def __iter__(self) -> Iterator[ProcessInfo]:
        return iter(self.processes.values())

    def __len__(self) -> int:
        return len(self.processes)

    def get(self, pid: int) -> ProcessInfo | None:
        return self.processes.get(pid)

    def children(self, pid: int) -> list[ProcessInfo]:
        return [self.processes[c] for c in self.children_of.get(pid, ())]

    def parents(self, pid: int) -> tuple[ProcessInfo, ...]:
        """The ancestors of ``pid`` in this snapshot, its parent first (psutil's ``Process.parents()``).
        Ends at a parent not in the table (outside the namespace, or gone) and at a loop, which only a
        hostile or recorded tree can show."""
        found: list[ProcessInfo] = []
        seen = {pid}
        proc = self.get(pid)
        while proc is not None and proc.ppid > 0 and proc.ppid not in seen:
            seen.add(proc.ppid)
            proc = self.get(proc.ppid)
            if proc is not None:
                found.append(proc)
        return tuple(found)

    @property
    def incomplete(self) -> tuple[ProcessInfo, ...]:
        """Processes with at least one file that could not be used."""
        return tuple(p for p in self.processes.values() if p.incomplete)

    def unverified(self, shown: Iterable[int] = ()) -> tuple[ProcessInfo, ...]:
        """Incomplete processes whose missing file could hide a finding (``could_hide_finding``),
        or any incomplete process a report shows (``shown``: PID 1's kind, a row's pod)."""
        rows = set(shown)
        return tuple(p for p in self.processes.values() if p.incomplete and (p.pid in rows or p.could_hide_finding))


def describe_unreadable(table: ProcessTable, shown: Iterable[int] = ()) -> str | None:
    """One warning naming what could not be read (the first processes, file and reason), or None."""
    missing = table.unverified(shown)
    if not missing and not table.unread:
        return None
    described = "; ".join(
        f"{p.pid} ({', '.join(f'{u.file}: {u.reason.value}' for u in p.incomplete)})" for p in missing[:5]
    )
    more = f" and {len(missing) - 5} more" if len(missing) > 5 else ""
    unread = f"; {len(table.unread)} pids not read before the scan's deadline" if table.unread else ""
    return (
        f"{len(missing)} processes could not be fully read: {described}{more}{unread}; a GPU holder, zombie "
        "or orphan among them would be missing from this report, so it does not say healthy"
    )


def not_a_procfs(root: str) -> str | None:
    """Why the directory ``root`` is no procfs tree (the kernel's, a recording's or a test's), as a
    sentence for a person: it has neither a ``stat`` nor one pid directory. None otherwise, also for
    a root that is missing or no directory (the caller's own error says that) or a broken tree
    (whose failing file then says what is wrong)."""
    if not os.path.isdir(root) or os.path.lexists(os.path.join(root, "stat")):
        return None
    try:
        if Procfs(root).pids():
            return None
    except OSError:
        return None
    return (
        f"{root} is not a procfs (no stat file, no process directories): give the root of one, e.g. /proc or /host/proc"
    )


def filesystem_type(path: str) -> int:
    """statfs(2)'s ``f_type`` of the filesystem ``path`` is on: ``os.statvfs`` has no such field.
    Raises OSError (the path cannot be stat'ed, or this Python has no ctypes).

    ``f_type`` is the first member of ``struct statfs``, a C long on x86_64 and arm64; the buffer is
    larger than the whole struct on either."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
    except OSError as exc:
        raise OSError(f"cannot load the C library for statfs(2): {exc}") from exc
    buffer = ctypes.create_string_buffer(512)
    if libc.statfs(os.fsencode(path), buffer) != 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code), path)
    return ctypes.c_long.from_buffer(buffer).value


def not_mounted_proc(root: str) -> str | None:
    """Why ``root`` is no mounted proc filesystem, as a sentence; None when it is one.

    What acts on processes (reap, prestop) takes its pids from the tree: a plain directory can name
    any pid, and ``self`` whatever pid it likes, so only the kernel's procfs (statfs type
    ``PROC_SUPER_MAGIC``) is trusted there. Reading commands keep accepting recorded and test trees."""
    try:
        kind = filesystem_type(root)
    except OSError as exc:
        return f"cannot tell whether {root} is a mounted procfs: {exc.strerror or exc}"
    if kind == PROC_SUPER_MAGIC:
        return None
    return (
        f"{root} is not a mounted proc filesystem (statfs type {kind:#x}, proc is {PROC_SUPER_MAGIC:#x}): "
        "a command that signals processes acts only on the kernel's procfs"
    )


def build_table(
    processes: Mapping[int, ProcessInfo],
    *,
    boot_time: float,
    taken_at: float,
    procfs_root: str,
    unread: tuple[int, ...] = (),
    tree_pidns: int | None = None,
) -> ProcessTable:
    """A ProcessTable with its parent -> children index."""
    children: dict[int, list[int]] = {}
    for proc in processes.values():
        if proc.ppid in processes and proc.ppid != proc.pid:
            children.setdefault(proc.ppid, []).append(proc.pid)
    return ProcessTable(
        processes=processes,
        boot_time=boot_time,
        taken_at=taken_at,
        procfs_root=procfs_root,
        children_of={k: tuple(sorted(v)) for k, v in children.items()},
        unread=unread,
        tree_pidns=tree_pidns,
    )


def fd_targets(fd_dir: str) -> list[str]:
    """The link targets in a /proc/<pid>/fd directory; raises OSError when it cannot be opened or
    a link cannot be read.

    The directory is opened once and each link read relative to it: the kernel then resolves one
    name per fd instead of the whole /proc/<pid>/fd/<n> path (most of a node's syscalls). An fd
    closed between the listing and its readlink is skipped; a denied link is not (a reader without
    SYS_PTRACE lists the fds of a root process that has more capabilities, but reads none of them).
    A list, not a generator: resuming a generator per fd cost more than the early stop a caller
    could gain.
    """
    return _fd_targets_and_size(fd_dir)[0]


def _fd_targets_and_size(fd_dir: str) -> tuple[list[str], int]:
    """``fd_targets`` and the directory's ``st_size`` before the listing: the count of open fds
    on Linux 6.2+ (0 before it), what ``ProcessCache`` compares to tell an fd table that changed."""
    dir_fd = os.open(fd_dir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC | os.O_NOFOLLOW)
    try:
        size = os.fstat(dir_fd).st_size
        targets = []
        for name in os.listdir(dir_fd):
            try:
                targets.append(os.readlink(name, dir_fd=dir_fd))
            except OSError as exc:
                if exc.errno not in GONE_ERRNOS:
                    raise
        return targets, size
    finally:
        os.close(dir_fd)


DEFAULT_SWEEP = 8
"""A ``ProcessCache`` reads every process whole at least once in this many snapshots."""


@dataclass(slots=True)
class _Known:
    """What a whole read found of a live process that its stat and fd table size vouch for later:
    its PID namespace and NSpid never change while it lives; its names change with an exec (which
    changes comm) and, rarely, without one (a process rewriting its argv, moved to another cgroup):
    the sweep reads those again. The cache's own record, updated in place as it is read again."""

    start_ticks: int
    comm: str
    nspid: tuple[int, ...]
    pidns: int | None
    fd_size: int
    """The fd directory's st_size when its fds were listed: the count of open fds on Linux 6.2+."""
    names: tuple[tuple[str, ...], tuple[str, ...]] | None = None
    """(cmdline, cgroup) when both were read; None when they were not asked for."""
    fds: tuple[str, ...] = ()
    """Its NVIDIA fds when they were last listed (listed again every snapshot while it holds any)."""
    last: tuple[bytes, int, float, ProcessInfo, bool] | None = None
    """The stat bytes, owner and boot time the last ProcessInfo was made from, and whether it carries
    the names: the same bytes make the same ProcessInfo (an idle process's stat does not change),
    without parsing them again."""


class ProcessCache:
    """Kept across snapshots of one tree by a long-lived caller (top's NodeSource) to read less.

    A process it knows (same pid, start time and comm, read whole before with nothing missing, no
    zombie) is read again as its stat (state, parent, rss: what changes) and its fd directory's
    size; its fds are listed again when that size changed (an fd opened or closed), while it holds
    an NVIDIA fd, when the caller asks (the pids NVML lists), and on kernels before 6.2, where the
    size is always 0. Whatever cannot be vouched for that way is read whole, as without a cache: a
    cache never hides a file that fails. The one change a size cannot see, an fd closed and another
    opened between two snapshots, and names changed without an exec, are seen by the sweep: each
    snapshot reads one process in ``sweep`` whole, so every process is read whole at least every
    ``sweep`` snapshots."""

    def __init__(self, sweep: int = DEFAULT_SWEEP) -> None:
        if sweep < 1:
            raise ValueError("sweep must be at least 1")
        self.sweep = sweep
        self._known: dict[int, _Known] = {}
        self._round = 0
        self.last_reused = 0
        """How many processes the last snapshot read again cheaply (tests, benchmarks)."""

    def _due(self, pid: int) -> bool:
        return (pid + self._round) % self.sweep == 0


class _Reading:
    """The files of one process being read: collects what could not be used, and tells gone apart."""

    def __init__(self, base: str) -> None:
        self.base = base
        self.missing: list[Unreadable] = []
        self.gone = False

    def failed(self, file: str, exc: OSError | ValueError) -> None:
        """Record a failed file; a vanished one means the process is gone when its stat is gone too."""
        if isinstance(exc, OSError) and exc.errno in GONE_ERRNOS and not os.path.lexists(f"{self.base}/stat"):
            self.gone = True
        else:
            self.missing.append(unreadable(file, exc))


class Procfs:
    """The filesystem edge: reads a procfs tree rooted at ``root``."""

    def __init__(
        self,
        root: str = PROCFS,
        *,
        device_prefix: str = NVIDIA_DEVICE_PREFIX,
        deadline_s: float = DEFAULT_SCAN_DEADLINE_S,
    ) -> None:
        self.root = root.rstrip("/") or "/"
        self.device_prefix = device_prefix  # a stand-in path on machines without /dev/nvidia*
        self._device = re.compile(re.escape(device_prefix) + NVIDIA_DEVICE_NAMES)
        self.deadline_s = deadline_s
        self.clock_ticks = os.sysconf("SC_CLK_TCK")
        self.page_size = os.sysconf("SC_PAGE_SIZE")

    def path(self, *parts: str | int) -> str:
        return os.path.join(self.root, *(str(p) for p in parts))

    def deadline(self) -> Deadline:
        """A new scan's deadline."""
        return Deadline(self.deadline_s)

    def pids(self) -> list[int]:
        """Pid directories of the tree: numeric names that are real directories (a symlink named
        like a pid would read another process twice); raises OSError when the root cannot be listed."""
        with os.scandir(self.root) as entries:
            return sorted(
                int(e.name)
                for e in entries
                if e.name.isascii() and e.name.isdigit() and e.is_dir(follow_symlinks=False)
            )

    def boot_time(self) -> float:
        """The tree's boot time; raises OSError (unreadable, FIFO, too large) or ValueError (no btime)."""
        return parse_boot_time(read_text(self.path("stat"), "proc_stat"))

    def _nvidia_fds(self, fd_dir: str) -> tuple[tuple[str, ...], str | None, int]:
        """Targets of the fds in ``fd_dir`` that are NVIDIA devices (exactly: ``NVIDIA_DEVICE_NAMES``),
        sorted, what is wrong with a link that starts with the prefix but names no device (None
        when none does), and the directory's size; raises OSError when the directory cannot be listed."""
        prefix = self.device_prefix
        found: set[str] = set()
        odd: list[str] = []
        targets, size = _fd_targets_and_size(fd_dir)
        for target in targets:
            if target.startswith(prefix):
                if self._device.fullmatch(target):
                    found.add(target)
                else:
                    odd.append(target)
        why = f"{len(odd)} link(s) under {prefix} name no NVIDIA device, e.g. {odd[0][:80]!r}" if odd else None
        return (tuple(sorted(found)) if found else ()), why, size

    def pidns(self, pid: int) -> int | None:
        """The PID-namespace inode of ``pid``; None when gone, denied or not a namespace link."""
        try:
            return parse_ns_link(os.readlink(self.path(pid, "ns", "pid")))
        except OSError:
            return None

    def stat(self, pid: int) -> StatFields | None:
        """The parsed stat of ``pid``; None when gone, unreadable or malformed."""
        try:
            return parse_stat(read_text(self.path(pid, "stat"), "stat"))
        except (OSError, ValueError):
            return None

    def status(self, pid: int | str) -> StatusFields | None:
        """The parsed status of ``pid``; None when gone, unreadable or malformed."""
        try:
            return parse_status(read_text(self.path(pid, "status"), "status"))
        except (OSError, ValueError):
            return None

    def cmdline(self, pid: int) -> tuple[str, ...] | None:
        """The argv of ``pid``; None when gone or unreadable."""
        try:
            return parse_cmdline(read_capped(self.path(pid, "cmdline"), "cmdline"))
        except OSError:
            return None

    def cgroup(self, pid: int) -> tuple[str, ...] | None:
        """The lines of /proc/<pid>/cgroup; None when gone or unreadable."""
        try:
            return parse_cgroup(read_text(self.path(pid, "cgroup"), "cgroup"))
        except OSError:
            return None

    def boot_id(self) -> str | None:
        """This boot's random id (sys/kernel/random/boot_id); None when unreadable."""
        try:
            return read_text(self.path("sys", "kernel", "random", "boot_id"), "boot_id").strip() or None
        except OSError:
            return None

    def rss_bytes(self, pid: int) -> int | None:
        """Resident memory from /proc/<pid>/statm; None when gone or unreadable."""
        try:
            fields = read_text(self.path(pid, "statm"), "statm").split()
            return int(fields[1]) * self.page_size
        except (OSError, ValueError, IndexError):
            return None

    def children_pids(self, pid: int) -> list[int]:
        """Direct children from /proc/<pid>/task/*/children (empty when the process is gone)."""
        found: list[int] = []
        try:
            tasks = [t for t in os.listdir(self.path(pid, "task")) if t.isascii() and t.isdigit()]
        except OSError:
            return found
        for tid in tasks:
            try:
                text = read_text(self.path(pid, "task", tid, "children"), "children")
                found.extend(int(p) for p in text.split() if p.isascii() and p.isdigit())
            except OSError:
                continue
        return found

    def pids_in_pidns(self, inode: int) -> list[int]:
        """Every pid of the tree whose PID namespace is ``inode`` (zombies included)."""
        return [pid for pid in self.pids() if self.pidns(pid) == inode]

    def sigterm(self, pid: int) -> SigtermDisposition:
        """What ``pid`` does with SIGTERM (status masks and wchan); unknown when unreadable."""
        try:
            status = read_text(self.path(pid, "status"), "status")
        except OSError:
            return UNKNOWN_DISPOSITION
        try:
            wchan: str | None = read_text(self.path(pid, "wchan"), "wchan")
        except OSError:
            wchan = None
        return parse_sigterm(status, wchan)

    def tree_pidns(self, pids: Iterable[int] = (), *, tries: int = 16) -> int | None:
        """The PID namespace this tree shows: that of a process whose NSpid has one level.

        PID 1's link is the first try, but it may deny access even to root (a hardened init), so
        a few more of the lowest pids follow; None when none can tell (then every status is read).
        """
        for pid in list(dict.fromkeys((1, *pids)))[:tries]:
            pidns = self.pidns(pid)
            status = self.status(pid) if pidns is not None else None
            if status is not None and len(status.nspid) == 1:
                return pidns
        return None

    def read_process(
        self,
        pid: int,
        boot_time: float,
        *,
        with_cgroup: bool = True,
        tree_pidns: int | None = None,
        detail: Detail | None = None,
    ) -> ProcessInfo | None:
        """Read one process; None when it is gone: its stat is gone, or says it is dead (state X).

        Any other file that fails (denied, missing, hostile, malformed) leaves its fields empty and
        is named in ``incomplete``. A process in ``tree_pidns`` (the tree's own namespace) has the
        NSpid chain ``(pid,)``: its status file, the costliest file the kernel generates here, is
        not read. cmdline and cgroup, which only name a process, are read when ``detail`` (given
        the process read so far and ``tree_pidns``) says so; default always.
        """
        return self._read_whole(pid, boot_time, with_cgroup=with_cgroup, tree_pidns=tree_pidns, detail=detail)[0]

    @staticmethod
    def _pid_namespace(base: str, tree_pidns: int | None, reading: _Reading) -> tuple[StatusFields, int | None]:
        """Its PID namespace (ns/pid) and, outside the tree's own namespace, its NSpid (status)."""
        status = StatusFields(uid=None, nspid=())
        pidns: int | None = None
        ns_failure: OSError | None = None
        try:
            pidns = parse_ns_link(os.readlink(f"{base}/ns/pid"))
        except OSError as exc:
            ns_failure = exc
        if pidns is None or pidns != tree_pidns:
            try:
                status = parse_status(read_text(f"{base}/status", "status"))
            except (OSError, ValueError) as exc:
                reading.failed("status", exc)
        if ns_failure is not None:
            reading.failed("ns/pid", ns_failure)
        return status, pidns

    def _fds(self, base: str, reading: _Reading) -> tuple[tuple[str, ...], int]:
        """Its /dev/nvidia* fds and the size of its fd directory."""
        try:
            fds, odd, fd_size = self._nvidia_fds(f"{base}/fd")
        except OSError as exc:
            reading.failed("fd", exc)
            return (), 0
        if odd is not None:
            reading.failed("fd", ValueError(odd))
        return fds, fd_size

    @staticmethod
    def _names(base: str, with_cgroup: bool, reading: _Reading) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """What only names it: its cmdline and (``with_cgroup``) its cgroup lines."""
        cmdline: tuple[str, ...] = ()
        cgroup: tuple[str, ...] = ()
        try:
            cmdline = parse_cmdline(read_capped(f"{base}/cmdline", "cmdline"))
        except OSError as exc:
            reading.failed("cmdline", exc)
        if with_cgroup:
            try:
                cgroup = parse_cgroup(read_text(f"{base}/cgroup", "cgroup"))
            except OSError as exc:
                reading.failed("cgroup", exc)
        return cmdline, cgroup

    def _read_whole(
        self,
        pid: int,
        boot_time: float,
        *,
        with_cgroup: bool,
        tree_pidns: int | None,
        detail: Detail | None,
    ) -> tuple[ProcessInfo | None, _Known | None]:
        """``read_process``, and what a ``ProcessCache`` may keep of it: None unless every file was
        read whole (a process with a gap is read whole again next time) and it is no zombie or
        kernel thread."""
        base = f"{self.root}/{pid}"
        reading = _Reading(base)
        try:
            raw, owner = read_owned(f"{base}/stat", "stat")
        except OSError as exc:
            if exc.errno in GONE_ERRNOS:
                return None, None
            return self._unknown(pid, boot_time, (unreadable("stat", exc),)), None
        try:
            stat = parse_stat(raw.decode(errors="replace"))
        except ValueError as exc:
            return self._unknown(pid, boot_time, (unreadable("stat", exc),), uid=owner), None
        if stat.pid != pid:
            why = ValueError(f"stat names pid {stat.pid}: not the directory of its own process")
            return self._unknown(pid, boot_time, (unreadable("stat", why),), uid=owner), None
        if stat.state in DEAD_STATES:
            return None, None
        if stat.is_kernel_thread:  # no argv, no fds, never in a container: nothing more to read
            return self._process(pid, stat, owner, boot_time, nspid=(pid,), pidns=tree_pidns), None
        status, pidns = self._pid_namespace(base, tree_pidns, reading)
        fds, fd_size = self._fds(base, reading)
        nspid = status.nspid or (pid,)
        keep = stat.state != "Z"
        if detail is not None:
            missing = tuple(reading.missing)
            brief = self._process(pid, stat, owner, boot_time, nspid=nspid, pidns=pidns, fds=fds, incomplete=missing)
            if not detail(brief, tree_pidns):
                if reading.gone:
                    return None, None
                known = _Known(stat.start_ticks, stat.comm, nspid, pidns, fd_size, fds=fds)
                known.last = (raw, owner, boot_time, brief, False) if with_cgroup else None
                return brief, known if keep and not missing else None
        cmdline, cgroup = self._names(base, with_cgroup, reading)
        if reading.gone:
            return None, None  # exited mid-read: drop it rather than report half a process
        proc = self._process(
            pid,
            stat,
            owner,
            boot_time,
            nspid=nspid,
            pidns=pidns,
            fds=fds,
            cmdline=cmdline,
            cgroup=cgroup,
            incomplete=tuple(reading.missing),
        )
        if not keep or reading.missing:
            return proc, None
        names = (cmdline, cgroup) if with_cgroup else None
        known = _Known(stat.start_ticks, stat.comm, nspid, pidns, fd_size, names, fds)
        known.last = (raw, owner, boot_time, proc, True) if with_cgroup else None
        return proc, known

    def _read_again(
        self,
        pid: int,
        boot_time: float,
        known: _Known,
        *,
        with_cgroup: bool,
        tree_pidns: int | None,
        detail: Detail | None,
        list_fds: bool,
    ) -> tuple[ProcessInfo, _Known] | None:
        """A process a ``ProcessCache`` knows, read again cheaply: its stat, and its fds only when
        the fd table's size changed, it held an NVIDIA fd, or ``list_fds``. None whenever that
        cannot vouch for it (anything unreadable, another process or program under the pid, a
        zombie, names wanted that were not kept): the caller then reads it whole, which says what
        failed."""
        base = f"{self.root}/{pid}"
        try:
            raw, owner = read_owned(f"{base}/stat", "stat")
            fd_size = os.stat(f"{base}/fd", follow_symlinks=False).st_size
        except OSError:
            return None
        # 0: a kernel before 6.2 does not count them
        if list_fds or known.fds or fd_size == 0 or fd_size != known.fd_size:
            try:
                fds, odd, fd_size = self._nvidia_fds(f"{base}/fd")
            except OSError:
                return None
            if odd is not None:
                return None
            if (fds, fd_size) != (known.fds, known.fd_size):
                known.fds, known.fd_size, known.last = fds, fd_size, None
        last = known.last
        if last is not None and last[0] == raw and last[1] == owner and last[2] == boot_time and with_cgroup:
            proc, named = last[3], last[4]
            if (detail(proc, tree_pidns) if detail is not None else True) == named:
                return proc, known
        try:
            stat = parse_stat(raw.decode(errors="replace"))
        except ValueError:
            return None
        if (
            stat.pid != pid
            or stat.start_ticks != known.start_ticks
            or stat.comm != known.comm  # exec changes it: a new program, new names
            or stat.state in DEAD_STATES
            or stat.state == "Z"
            or stat.is_kernel_thread
        ):
            return None
        fds = known.fds
        named = False
        if known.names is None or not with_cgroup:  # names never read: do they matter now?
            proc = self._process(pid, stat, owner, boot_time, nspid=known.nspid, pidns=known.pidns, fds=fds)
            if detail is None or detail(proc, tree_pidns):
                return None
        else:
            cmdline, cgroup = known.names
            proc = self._process(
                pid,
                stat,
                owner,
                boot_time,
                nspid=known.nspid,
                pidns=known.pidns,
                fds=fds,
                cmdline=cmdline,
                cgroup=cgroup,
            )
            named = detail is None or detail(proc, tree_pidns)
            if not named:  # as uncached: names only where they matter
                proc = self._process(pid, stat, owner, boot_time, nspid=known.nspid, pidns=known.pidns, fds=fds)
        known.last = (raw, owner, boot_time, proc, named) if with_cgroup else None
        return proc, known

    def _unknown(
        self, pid: int, boot_time: float, why: tuple[Unreadable, ...], *, uid: int | None = None
    ) -> ProcessInfo:
        """A process whose stat exists but cannot be used: kept, with nothing known about it."""
        return ProcessInfo(
            pid=pid,
            ppid=0,
            state="?",
            comm="?",
            cmdline=(),
            uid=uid,
            start_ticks=0,
            start_time=boot_time,
            pgid=0,
            sid=0,
            nspid=(pid,),
            pidns=None,
            cgroup=(),
            nvidia_fds=(),
            rss_bytes=0,
            incomplete=why,
        )

    def _process(
        self,
        pid: int,
        stat: StatFields,
        uid: int,
        boot_time: float,
        *,
        nspid: tuple[int, ...],
        pidns: int | None,
        cmdline: tuple[str, ...] = (),
        cgroup: tuple[str, ...] = (),
        fds: tuple[str, ...] = (),
        incomplete: tuple[Unreadable, ...] = (),
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
            incomplete=incomplete,
        )

    def snapshot(
        self,
        pids: Iterable[int] | None = None,
        *,
        now: float,
        with_cgroup: bool = True,
        deadline: Deadline | None = None,
        detail: Detail | None = None,
        cache: ProcessCache | None = None,
        list_fds: Collection[int] = (),
    ) -> ProcessTable:
        """Read every process (or the given pids) into a ProcessTable.

        ``with_cgroup=False`` skips /proc/<pid>/cgroup for callers that do not map containers
        (observe): one read in five, on a node with thousands of processes; ``detail`` limits cmdline
        and cgroup to the processes it names (``read_process``). ``cache`` (kept by the caller across
        snapshots of this tree) reads the processes it knows again cheaply, the fds of ``list_fds``
        (e.g. the pids NVML lists) listed every time. Pids left when the deadline passes are listed
        in ``unread``. Raises OSError or ValueError only for the tree itself (its root not listable,
        its stat without a boot time).
        """
        deadline = deadline or self.deadline()
        boot = self.boot_time()
        wanted = self.pids() if pids is None else list(pids)
        tree_pidns = self.tree_pidns(wanted)
        processes: dict[int, ProcessInfo] = {}
        unread: tuple[int, ...] = ()
        known = cache._known if cache is not None else {}
        kept: dict[int, _Known] = {}
        reused = 0
        for i, pid in enumerate(wanted):
            if deadline.expired:
                unread = tuple(wanted[i:])
                break
            entry = known.get(pid)
            read: tuple[ProcessInfo | None, _Known | None] | None = None
            if entry is not None and cache is not None and not cache._due(pid):
                read = self._read_again(
                    pid,
                    boot,
                    entry,
                    with_cgroup=with_cgroup,
                    tree_pidns=tree_pidns,
                    detail=detail,
                    list_fds=pid in list_fds,
                )
                reused += read is not None
            if read is None:
                read = self._read_whole(pid, boot, with_cgroup=with_cgroup, tree_pidns=tree_pidns, detail=detail)
            proc, found = read
            if proc is not None:
                processes[pid] = proc
                if found is not None:
                    kept[pid] = found
        if cache is not None:
            cache._known, cache.last_reused = kept, reused
            cache._round += 1
        return build_table(
            processes, boot_time=boot, taken_at=now, procfs_root=self.root, unread=unread, tree_pidns=tree_pidns
        )

    def _maybe_relevant(self, pid: int, prefix: str) -> bool:
        """Holds a /dev/nvidia* fd, is a zombie, or cannot be ruled out (its fd/ or stat unreadable
        while the process exists): the full read then says what is missing."""
        try:
            targets = fd_targets(f"{self.root}/{pid}/fd")
        except OSError as exc:
            return exc.errno not in GONE_ERRNOS or os.path.lexists(f"{self.root}/{pid}/stat")
        if any(target.startswith(prefix) for target in targets):
            return True
        if targets:
            return False
        try:  # no fds: a zombie has released all its files
            state = parse_stat(read_text(f"{self.root}/{pid}/stat", "stat")).state
        except OSError as exc:
            return exc.errno not in GONE_ERRNOS
        except ValueError:
            return True
        return state == "Z"

    def relevant_pids(
        self, gpu_pids: Iterable[int], *, skip: int | None = None, deadline: Deadline | None = None
    ) -> tuple[list[int], tuple[int, ...]]:
        """Pids of zombies, /dev/nvidia* holders, processes that cannot be ruled out and ``gpu_pids``
        present in the tree, ascending; and the pids the deadline left unexamined."""
        wanted = set(gpu_pids)
        prefix = self.device_prefix
        deadline = deadline or self.deadline()
        all_pids = self.pids()
        found: list[int] = []
        for i, pid in enumerate(all_pids):
            if deadline.expired:
                return found, tuple(all_pids[i:])
            if pid != skip and (pid in wanted or self._maybe_relevant(pid, prefix)):
                found.append(pid)
        return found, ()
