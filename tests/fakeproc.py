"""Fake procfs trees in a temp dir: /proc/<pid>/{stat,status,cmdline,cgroup,ns/pid,fd/*} as the kernel
writes them, for parser and report tests that need exact, impossible-to-stage situations."""

from __future__ import annotations

import os
from pathlib import Path

BOOT_TIME = 1700000000


def make_fake_root(root: Path, *, btime: int = BOOT_TIME) -> Path:
    """The tree's /proc/stat (only btime is read)."""
    (root / "stat").write_text(f"cpu 0 0 0\nbtime {btime}\n")
    return root


TREE_PIDNS = 4026532000


def make_fake_proc(
    root,
    pid,
    *,
    ppid,
    state="S",
    comm="python3",
    cmdline=b"python3\0",
    nspid=None,
    fds=(),
    starttime=1000,
    pgid=None,
    sid=None,
    uid=0,
    pidns=None,
):
    """One process directory; ``starttime`` in clock ticks since boot, ``fds`` are link targets.

    As in a real tree, a process with a longer NSpid chain sits in another PID namespace than the
    tree's (``TREE_PIDNS``); its files are owned by ``uid`` (the kernel's effective uid).
    """
    d = Path(root) / str(pid)
    (d / "fd").mkdir(parents=True)
    (d / "ns").mkdir()
    pgid = pid if pgid is None else pgid
    sid = pid if sid is None else sid
    (d / "stat").write_text(
        f"{pid} ({comm}) {state} {ppid} {pgid} {sid} 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 {starttime} 0 10 0"
    )
    nspid = nspid or (pid,)
    if pidns is None:
        pidns = TREE_PIDNS if len(nspid) == 1 else TREE_PIDNS + 1 + len(nspid)
    (d / "status").write_text(
        f"Name:\t{comm}\nUid:\t{uid}\t{uid}\t{uid}\t{uid}\nNSpid:\t" + "\t".join(map(str, nspid)) + "\n"
    )
    (d / "cmdline").write_bytes(cmdline)
    (d / "cgroup").write_text("0::/kubepods.slice/x\n")
    os.symlink(f"pid:[{pidns}]", d / "ns" / "pid")
    for i, target in enumerate(fds):
        os.symlink(target, d / "fd" / str(i + 3))
    if uid and os.geteuid() == 0:
        for name in ("stat", "status", "cmdline", "cgroup"):
            os.chown(d / name, uid, uid)
    return d
