"""Reading processes from a procfs tree (the real /proc, /host/proc, or a test's fake tree): the only
package that reads /proc."""

from gpuzombie.proc.procfs import ProcessInfo, ProcessTable, Procfs
from gpuzombie.proc.read import Reason, Unreadable

__all__ = ["ProcessInfo", "ProcessTable", "Procfs", "Reason", "Unreadable"]
