"""What ``gpuzombie top --allow-actions`` may do, through the same pidfd-only paths as prestop and
reap: a process is pinned by (pid, start time) through ``proc.pidfd.ProcessHandle`` and signalled
through its pidfd, never by a bare pid; a stale pod is ended by ``reap.run_reap`` limited to its UID
(which re-checks with the runtime that it is stale). Each returns one line for the status bar."""

from __future__ import annotations

import os
import signal
from collections.abc import Callable

from gpuzombie.errors import GpuzombieError
from gpuzombie.escape import escape
from gpuzombie.gpu.nvml import NvmlBackend
from gpuzombie.k8s.owner import NamesLookup
from gpuzombie.proc.pidfd import Liveness, ProcessHandle, ProcessIdentity
from gpuzombie.proc.pidns import own_pid_in
from gpuzombie.proc.procfs import Procfs
from gpuzombie.reap import run_reap, summary_line
from gpuzombie.top.model import PodLine, ProcessLine
from gpuzombie.trace.model import PodsLookup

READ_ONLY = "read-only: start top with --allow-actions to signal processes or reap stale pods"


def cannot_signal(procfs_root: str) -> str | None:
    """Why this procfs's pids are not ours to signal (pidfd_open takes this PID namespace's pids):
    a debug pod reading /host/proc without hostPID sees other pids than it could signal."""
    try:
        me = own_pid_in(procfs_root)
    except (GpuzombieError, OSError) as exc:
        return f"cannot signal from here: {exc}"
    if me != os.getpid():
        return f"cannot signal from here: {procfs_root} is not this PID namespace's procfs (run top with hostPID)"
    return None


def describe_signal(proc: ProcessLine, pod: PodLine, sig: signal.Signals) -> str:
    """The confirmation's question: what exactly would be signalled."""
    where = pod.label + (f" container {proc.container}" if proc.container else "")
    return (
        f"Send {sig.name} to pid {proc.pid} (nspid {proc.nspid}, {proc.comm}, state {proc.state}) in {where}?\n"
        f"{proc.command}\nThrough a pidfd pinned to this process (pid {proc.pid} started at tick "
        f"{proc.start_ticks}): a recycled pid is never signalled."
    )


def signal_process(procfs_root: str, proc: ProcessLine, sig: signal.Signals) -> str:
    why = cannot_signal(procfs_root)
    if why is not None:
        return why
    handle, state = ProcessHandle.open(ProcessIdentity(proc.pid, proc.start_ticks), procfs_root)
    if handle is None:
        return f"pid {proc.pid} not signalled: {'its pid now names another process' if state is Liveness.REUSED else 'it has exited'}"
    try:
        sent = handle.send(sig)
    except PermissionError as exc:
        return f"pid {proc.pid}: the kernel refused {sig.name}: {exc.strerror}"
    finally:
        handle.close()
    if sent is not Liveness.ALIVE:
        return f"pid {proc.pid} not signalled: it has exited"
    return f"sent {sig.name} to pid {proc.pid} ({proc.comm}) through its pidfd"


def describe_reap(pod: PodLine) -> str:
    return (
        f"Reap stale pod {pod.label} ({pod.key})?\nEvery process in its cgroup gets SIGTERM, then SIGKILL "
        f"after the reap timeout, through pidfds ({len(pod.processes)} now); reap asks the runtime again first."
    )


def reap_pod(
    pod: PodLine,
    *,
    procfs: Procfs,
    pods: PodsLookup,
    names: NamesLookup,
    nvml: NvmlBackend | None,
    on_line: Callable[[str], None] = lambda line: None,
) -> str:
    if pod.dirty != "stale":
        return f"{pod.label} is not stale: only a stale pod is reaped"
    try:
        report = run_reap(
            procfs=procfs,
            pods=pods,
            names=names,
            nvml=nvml,
            only=frozenset({pod.key}),
            dry_run=False,
            on_event=lambda e: on_line(escape(e.message, 300)),
        )
    except GpuzombieError as exc:
        return f"not reaped: {escape(str(exc), 300)}"
    return summary_line(report)
