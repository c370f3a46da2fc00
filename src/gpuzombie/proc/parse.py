"""Pure parsers of procfs file contents, tested on fixture strings (and on hypothesis's).

Each raises ValueError, and only ValueError, on content it cannot parse: the reader turns that into
one process marked incomplete, never a failed scan.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass

PF_KTHREAD = 0x00200000  # include/linux/sched.h: the task is a kernel thread
DEAD_STATES = frozenset("Xx")
"""Dead (``X``; ``x`` on kernels before 4.14): exiting past the zombie state, so gone."""
SIGTERM_BIT = 1 << (15 - 1)  # bit N-1 of the SigBlk/SigIgn/SigCgt masks in /proc/<pid>/status
STATES = frozenset("RSDZTtWXxKPI")
"""Every state letter a kernel prints (fs/proc/array.c, since 2.6; W, K and x only before 4.14).
Anything else, a lower-case ``z`` included, is no state: the stat is malformed."""


@dataclass(frozen=True)
class StatFields:
    """The fields of /proc/<pid>/stat that gpuzombie uses."""

    comm: str
    state: str
    ppid: int
    pid: int
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
class SigtermDisposition:
    """What a process does with SIGTERM, from /proc/<pid>/status and wchan; None where unreadable."""

    blocked: bool | None
    ignored: bool | None
    caught: bool | None
    sigwaiting: bool = False
    """Asleep in sigtimedwait/sigwait (wchan ``do_sigtimedwait``). There the kernel shows the waited-for
    signals as unblocked although they are queued to it (tini, dumb-init: measured SigBlk 0 for tini)."""

    @property
    def received_as_init(self) -> bool | None:
        """Does a namespace's PID 1 get the kubelet's SIGTERM? The kernel drops a signal sent to a
        namespace init unless the init catches it, blocks it or waits for it."""
        if self.sigwaiting:
            return True
        if self.blocked is None or self.caught is None:
            return None
        return self.blocked or (self.caught and not self.ignored)


UNKNOWN_DISPOSITION = SigtermDisposition(None, None, None)


def _int(text: str, what: str) -> int:
    """A decimal integer (optionally negative, as the kernel prints -1); ValueError naming the field."""
    digits = text[1:] if text.startswith("-") else text
    if not (digits.isascii() and digits.isdigit()) or len(digits) > 20:  # the kernel's are 64-bit
        raise ValueError(f"{what} is not a 64-bit number: {text[:40]!r}")
    return int(text)


def _uint(text: str, what: str) -> int:
    """A field the kernel prints unsigned (``%u``): a minus sign means the text is not the kernel's."""
    if text.startswith("-"):
        raise ValueError(f"{what} is negative, the kernel prints it unsigned: {text[:40]!r}")
    return _int(text, what)


_NUMBER = "(-?[0-9]{1,20})"
_STAT_TAIL = re.compile(
    rf"([{''.join(sorted(STATES))}]) {_NUMBER} {_NUMBER} {_NUMBER} [^ ]* [^ ]* ([0-9]{{1,20}})(?: [^ ]*){{12}} "
    rf"{_NUMBER} [^ ]* {_NUMBER}(?: |\n*\Z)"
)
"""Fields 3 to 24 of a well-formed stat, after ``(comm) ``, in one match: state, ppid, pgrp,
session, flags, starttime, rss, exactly as the field-by-field checks below accept them. A node
scan parses thousands of stats per refresh; whatever this does not match takes the checks."""


def parse_stat(text: str) -> StatFields:
    """Parse /proc/<pid>/stat. The comm may contain spaces and parentheses: split at the last ')'.

    Strict where a wrong value changes a verdict: the state must be one of the kernel's letters
    (``STATES``) and the flags unsigned (``-1`` would set PF_KTHREAD and hide a GPU holder as a
    kernel thread)."""
    open_paren = text.find("(")
    close_paren = text.rfind(")")
    if open_paren < 0 or close_paren < open_paren:
        raise ValueError("no (comm) in stat")
    comm = text[open_paren + 1 : close_paren]
    fast = _STAT_TAIL.match(text, close_paren + 2)
    if fast is None:
        return _parse_stat_checked(text)
    state, ppid, pgid, sid, flags, start, rss = fast.groups()
    pid = _uint(text[:open_paren].strip(), "pid")
    return StatFields(comm, state, int(ppid), pid, int(pgid), int(sid), int(start), int(rss), int(flags))


def _parse_stat_checked(text: str) -> StatFields:
    """``parse_stat`` field by field: what a stat ``_STAT_TAIL`` does not match gets, to say why it
    is malformed (and the one the tests hold the fast match to)."""
    open_paren = text.find("(")
    close_paren = text.rfind(")")
    if open_paren < 0 or close_paren < open_paren:
        raise ValueError("no (comm) in stat")
    comm = text[open_paren + 1 : close_paren]
    # rest[0] is field 3 (state); field N is rest[N - 3]. Fields past 24 (rss) are never used:
    # leave them unsplit (half the cost of splitting all ~50). One space between fields, as the
    # kernel writes them: "P  1" is no state P (an empty field follows), not a lenient read.
    rest = text[close_paren + 2 :].rstrip("\n").split(" ", 22)
    if len(rest) < 22:
        raise ValueError(f"stat has {len(rest) + 2} fields, fewer than 24")
    state = rest[0]
    if state not in STATES:
        raise ValueError(f"stat state is not a kernel state letter: {state[:40]!r}")
    return StatFields(
        comm=comm,
        state=state,
        pid=_uint(text[:open_paren].strip(), "pid"),
        ppid=_int(rest[1], "ppid"),
        pgid=_int(rest[2], "pgrp"),
        sid=_int(rest[3], "session"),
        start_ticks=_int(rest[19], "starttime"),
        rss_pages=_int(rest[21], "rss"),
        flags=_uint(rest[6], "flags"),
    )


_UID_LINE = re.compile(r"^Uid:[ \t]*([^\n]*)", re.MULTILINE)
_NSPID_LINE = re.compile(r"^NSpid:([^\n]*)", re.MULTILINE)


def parse_status(text: str) -> StatusFields:
    """Parse the Uid (real uid) and NSpid lines of /proc/<pid>/status.

    Two anchored searches instead of a loop over ~55 lines: this runs once per process, and a
    node has thousands.
    """
    uid_match = _UID_LINE.search(text)
    nspid_match = _NSPID_LINE.search(text)
    uid = None
    if uid_match:
        fields = uid_match.group(1).split()
        if not fields:
            raise ValueError("empty Uid line")
        uid = _int(fields[0], "Uid")
    nspid = tuple(_int(p, "NSpid") for p in nspid_match.group(1).split()) if nspid_match else ()
    if any(p <= 0 for p in nspid):
        raise ValueError(f"NSpid holds a pid below 1: {nspid_match.group(1)[:40]!r}" if nspid_match else "NSpid")
    return StatusFields(uid=uid, nspid=nspid)


def parse_cmdline(raw: bytes) -> tuple[str, ...]:
    """NUL-separated argv; empty for zombies and kernel threads."""
    return tuple(filter(None, raw.decode(errors="replace").split("\0")))


def parse_cgroup(text: str) -> tuple[str, ...]:
    """The lines of /proc/<pid>/cgroup, as they are (``hierarchy-id:controllers:path``)."""
    return tuple(line for line in text.splitlines() if line)


def parse_cpu_model(cpuinfo_text: str) -> str | None:
    """The first ``model name`` of /proc/cpuinfo; None when there is none."""
    for line in cpuinfo_text.splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return None


def parse_mem_available(meminfo_text: str) -> int | None:
    """``MemAvailable`` of /proc/meminfo in bytes (the kernel's estimate of what can be allocated
    without swapping); None when there is no such line or it does not parse."""
    for line in meminfo_text.splitlines():
        if line.startswith("MemAvailable:"):
            fields = line.split()
            if len(fields) == 3 and fields[1].isascii() and fields[1].isdigit() and fields[2] == "kB":
                return int(fields[1]) * 1024
            return None
    return None


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
            fields = line.split()
            if len(fields) < 2:
                raise ValueError("the btime line of /proc/stat has no number")
            return float(_int(fields[1], "btime"))
    raise ValueError("no btime line in /proc/stat")


def parse_sigterm(status_text: str, wchan: str | None = None) -> SigtermDisposition:
    """SIGTERM's bit in the SigBlk/SigIgn/SigCgt masks; a mask that does not parse is unknown."""
    masks: dict[str, bool] = {}
    for line in status_text.splitlines():
        key, _, value = line.partition(":")
        if key in ("SigBlk", "SigIgn", "SigCgt"):
            try:
                masks[key] = bool(int(value.strip(), 16) & SIGTERM_BIT)
            except ValueError:
                continue
    return SigtermDisposition(
        masks.get("SigBlk"),
        masks.get("SigIgn"),
        masks.get("SigCgt"),
        sigwaiting=bool(wchan and wchan.startswith("do_sigtimedwait")),
    )


def _unescape_mount_field(field: str) -> str:
    """mountinfo writes space, tab, newline and backslash in a path as octal escapes (``\\040``)."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


def parse_mount_points(mountinfo: str) -> list[str]:
    """The mount point (field 5) of each line of /proc/<pid>/mountinfo, in the kernel's order."""
    points = []
    for line in mountinfo.splitlines():
        fields = line.split(" ")
        if len(fields) >= 5:
            points.append(_unescape_mount_field(fields[4]))
    return points
