"""Kept for lab/, which imports the process handle from here: it lives in ``gpuzombie.proc.pidfd``."""

from gpuzombie.proc.pidfd import Liveness, ProcessHandle, ProcessIdentity, read_start_and_state

__all__ = ["Liveness", "ProcessHandle", "ProcessIdentity", "read_start_and_state"]
