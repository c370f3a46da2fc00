"""The exit codes every gpuzombie command uses; preStop hooks and CI read them."""

from enum import IntEnum


class ExitStatus(IntEnum):
    """Documented in the README under "Exit codes"."""

    OK = 0
    """Healthy: nothing found, or the action completed."""
    FINDINGS = 1
    """Findings: zombies, orphans, ghost memory, an orphaned context, or processes left alive; or
    incomplete data: a process that could hide a finding could not be read (observe and trace then
    say INCOMPLETE instead of HEALTHY; docs/reliability.md)."""
    ERROR = 2
    """Usage or environment error: bad flag, unreadable /proc, NVML broken in a way that matters."""
    INTERRUPTED = 130
    """Stopped by Ctrl-C."""
