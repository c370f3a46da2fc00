"""Graceful shutdown for GPU training scripts, in two lines, with no torch import of its own.

    from gpuzombie import graceful
    stop = graceful.install(deadline_s=10)      # after init_process_group: also watches the peers
    for batch in loader:
        if stop.should_stop(): break            # a safe point
        ...
    stop.shutdown()                              # frees CUDA memory, aborts the process group, exits

On SIGTERM/SIGINT the loop leaves at its next safe point; ``shutdown()`` runs the ``on_stop``
callbacks, drops ``hold()``-ed objects, aborts the process group (``destroy_process_group()``
would wait for a dead peer), empties the CUDA cache and exits with 128 + the signal number. A
watchdog exits hard (``os._exit``) at the deadline whatever the main thread is doing, and a kernel
timer of its own SIGKILLs the process 1 s later if even the watchdog cannot run. A dead peer
rank (pidfd for local ranks, a store heartbeat for all) aborts the process group at once and exits
with 75 within ``peer_exit_s``. Standard library only; torch is used when the script imported it.
"""

from __future__ import annotations

import signal
from collections.abc import Iterable

from gpuzombie.graceful.guard import EXIT_DEADLINE, EXIT_PEER_LOST, Guard
from gpuzombie.graceful.peers import PeerMonitor
from gpuzombie.graceful.torchdist import dist_initialized

_current: Guard | None = None


def install(
    *,
    deadline_s: float = 10.0,
    watch_peers: bool = True,
    peer_timeout_s: float = 3.0,
    peer_exit_s: float = 2.0,
    signals: Iterable[int] = (signal.SIGTERM, signal.SIGINT),
) -> Guard:
    """Install the handlers and watchdog (main thread only); one Guard per process."""
    global _current
    if _current is not None:
        return _current
    guard = Guard(deadline_s=deadline_s, peer_exit_s=peer_exit_s, signals=signals).install()
    if watch_peers and dist_initialized():
        try:
            guard.watch_process_group(timeout_s=peer_timeout_s)
        except Exception as exc:  # never let the safety net break the job it protects
            guard.log(f"gpuzombie.graceful: not watching peers: {type(exc).__name__}: {exc}")
    _current = guard
    return guard


def should_stop() -> bool:
    """The loop's check, for code that has no handle on the Guard."""
    return _current is not None and _current.should_stop()


__all__ = ["EXIT_DEADLINE", "EXIT_PEER_LOST", "Guard", "PeerMonitor", "install", "should_stop"]
