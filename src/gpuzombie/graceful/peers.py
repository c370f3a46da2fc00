"""Notice a dead peer rank in about a second, instead of NCCL's 10-minute collective timeout.

Two side channels, both off the training thread:

* local peers (same node, same PID namespace): each rank's pid is pinned with a pidfd, which
  becomes readable the instant the process exits;
* any peer: a heartbeat counter per rank in the job's key-value store (``store.add(key, 1)``,
  read with ``add(key, 0)``, which never blocks). A counter that stops moving for ``timeout_s``,
  or a store that stops answering (it lives in rank 0 with ``init_method=tcp://``), means lost.
"""

from __future__ import annotations

import os
import select
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

from gpuzombie.proc.procfs import Procfs

PREFIX = "gpuzombie/graceful"


def _pid_identity(pid: int) -> str:
    """host|boot|pid-namespace|pid|start ticks: equal strings only for the very same process; ""
    when any part is unreadable (a restricted /proc)."""
    procfs = Procfs()
    boot, pidns, stat = procfs.boot_id(), procfs.pidns(pid), procfs.stat(pid)
    if boot is None or pidns is None or stat is None:
        return ""
    return f"{socket.gethostname()}|{boot}|{pidns}|{pid}|{stat.start_ticks}"


class PeerMonitor:
    """Calls ``on_lost(reason)`` once, from its own thread, when a watched peer is gone."""

    def __init__(
        self,
        on_lost: Callable[[str], None],
        *,
        interval_s: float = 0.2,
        timeout_s: float = 3.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.on_lost = on_lost
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        self.clock = clock
        self._pidfds: dict[int, tuple[int, str]] = {}  # fd -> (pid, label)
        self._store: Any = None
        self._rank = 0
        self._world = 0
        self._seen: dict[int, tuple[int, float]] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._fired = False

    def watch_pid(self, pid: int, label: str | None = None, *, identity: str | None = None) -> bool:
        """Watch a local process; False when it cannot be pinned (already gone, no pidfds) or, with
        ``identity`` (a peer's ``_pid_identity``), when the pid now belongs to another process.
        The identity is checked after the pidfd is open, so the pidfd holds the process checked."""
        try:
            fd = os.pidfd_open(pid)
        except (OSError, AttributeError):
            return False
        if identity is not None and _pid_identity(pid) != identity:
            os.close(fd)
            return False
        self._pidfds[fd] = (pid, label or f"pid {pid}")
        return True

    def watch_store(self, store: Any, rank: int, world_size: int, *, exchange_pids: bool = True) -> None:
        """Heartbeat through ``store``; also pin peers that run in this PID namespace."""
        self._store, self._rank, self._world = store, rank, world_size
        store.add(f"{PREFIX}/hb/{rank}", 1)
        if not exchange_pids:
            return
        me = _pid_identity(os.getpid())
        store.set(f"{PREFIX}/pid/{rank}", me)  # published even when "": the peers wait for the key
        if not me:
            return  # our own identity is unreadable: the heartbeat alone watches the peers
        local = me.rsplit("|", 2)[0]  # host|boot|pid namespace: its pids are our pids
        for peer in range(world_size):
            if peer == rank:
                continue
            ident = store.get(f"{PREFIX}/pid/{peer}").decode()
            if ident and ident.rsplit("|", 2)[0] == local:
                pid = int(ident.split("|")[3])
                self.watch_pid(pid, f"rank {peer} (pid {pid})", identity=ident)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="gpuzombie-peer-monitor", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _fire(self, reason: str) -> None:
        if not self._fired:
            self._fired = True
            self.on_lost(reason)

    def _run(self) -> None:
        try:
            self._watch()
        finally:  # stopped or fired: the pidfds are of no more use
            for fd in self._pidfds:
                os.close(fd)
            self._pidfds.clear()

    def _watch(self) -> None:
        poller = select.poll()
        for fd in self._pidfds:
            poller.register(fd, select.POLLIN)
        while not self._stop.is_set() and not self._fired:
            for fd, _ in poller.poll(int(self.interval_s * 1000)) if self._pidfds else ():
                self._fire(f"peer {self._pidfds[fd][1]} exited")
                return
            if not self._pidfds:
                self._stop.wait(self.interval_s)
            if self._store is not None:
                reason = self._beat()
                if reason:
                    self._fire(reason)
                    return

    def _beat(self) -> str | None:
        now = self.clock()
        try:
            self._store.add(f"{PREFIX}/hb/{self._rank}", 1)
            for peer in range(self._world):
                if peer == self._rank:
                    continue
                count = int(self._store.add(f"{PREFIX}/hb/{peer}", 0))
                last = self._seen.get(peer)
                if last is None or count != last[0]:
                    self._seen[peer] = (count, now)
                elif now - last[1] > self.timeout_s:
                    return f"rank {peer}'s heartbeat stopped {now - last[1]:.1f} s ago"
        except Exception as exc:  # the store's host (rank 0 or the agent) is gone
            return f"the job's store stopped answering ({type(exc).__name__}: {exc})"
        return None
