"""Reading processes from a procfs tree (the real /proc, /host/proc, or a test's fake tree)."""

from gpuzombie.proc.procfs import ProcessInfo, ProcessTable, Procfs

__all__ = ["ProcessInfo", "ProcessTable", "Procfs"]
