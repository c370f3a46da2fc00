"""The stop flag, the signal side channel and the deadline watchdog.

Signal handlers do no work: a signal only sets a flag the training loop polls at a safe point
(``should_stop()``). But a main thread stuck inside a collective never polls, and CPython runs
Python-level handlers only in the main thread, between bytecodes. So the C-level handler's
wakeup fd (``signal.set_wakeup_fd``) is read by a helper thread, which starts the deadline clock
at once; if the process has not exited by the deadline, the watchdog aborts the process group and
calls ``os._exit`` — no hang can keep the GPU memory past it. A C call that holds the GIL starves
that thread too: then a kernel timer of our own SIGKILLs the process ``BACKSTOP_GRACE_S`` later
(``gpuzombie.graceful.backstop``), whatever the application does with its signals and timers.
"""

from __future__ import annotations

import os
import signal
import socket
import sys
import threading
import time
import traceback
from collections.abc import Callable, Iterable
from typing import Any

from gpuzombie.graceful import torchdist
from gpuzombie.graceful.backstop import KernelBackstop
from gpuzombie.graceful.peers import PeerMonitor

EXIT_PEER_LOST = 75
"""A peer rank died: this rank stopped so its GPU is freed (EX_TEMPFAIL: restart the job)."""
EXIT_DEADLINE = 124
"""Cleanup did not finish within the deadline: the watchdog exited hard."""
BACKSTOP_GRACE_S = 1.0
"""How long after the deadline the kernel's SIGKILL ends a process whose watchdog could not run."""


class Guard:
    """One per process. ``install()`` makes one; ``should_stop()`` is the loop's check."""

    def __init__(
        self,
        *,
        deadline_s: float = 10.0,
        peer_exit_s: float = 2.0,
        signals: Iterable[int] = (signal.SIGTERM, signal.SIGINT),
        log: Callable[[str], None] | None = None,
    ) -> None:
        self.deadline_s = deadline_s
        self.peer_exit_s = peer_exit_s
        self.signals = tuple(signals)
        self.log = log or _stderr
        self.reason: str | None = None
        self.exit_code = 0
        self.stop_requested_at: float | None = None
        self._deadline_at = float("inf")
        self._peer_gone = False
        self._stop = threading.Event()
        self._held: list[Any] = []
        self._callbacks: list[Callable[[], None]] = []
        self._lock = threading.Lock()
        self._requested = False
        self._cleaned = threading.Event()
        self._previous: dict[int, Any] = {}
        self._wake_r: socket.socket | None = None
        self._wake_w: socket.socket | None = None
        self._old_wakeup_fd = -1
        self._backstop = KernelBackstop()
        self.peers: PeerMonitor | None = None

    # -- the training script's side ---------------------------------------------------------
    def should_stop(self) -> bool:
        """True once a stop was requested: leave the loop at the next safe point."""
        return self._stop.is_set()

    @property
    def stop_event(self) -> threading.Event:
        """The flag as an Event, for threads (a data loader) that wait on it instead of polling."""
        return self._stop

    def hold(self, *objects: Any) -> None:
        """Keep references to big objects (tensors, models, optimizers) to drop at shutdown."""
        self._held.extend(objects)

    def on_stop(self, fn: Callable[[], None]) -> None:
        """Run ``fn`` during shutdown, before the CUDA memory is freed (e.g. a quick checkpoint)."""
        self._callbacks.append(fn)

    def request_stop(self, reason: str, exit_code: int, *, within_s: float | None = None) -> None:
        """Ask for a stop (signals and the peer monitor call this; so may the script).

        The first request sets the reason and exit code; a later one can only bring the deadline
        closer (``within_s``), e.g. a peer dying while this rank is already stopping."""
        now = time.monotonic()
        limit = self.deadline_s if within_s is None else min(self.deadline_s, within_s)
        with self._lock:
            first = not self._requested
            if not first and now + limit >= self._deadline_at:
                return
            self._requested = True
            self._deadline_at = now + limit
            if first:
                self.reason, self.exit_code = reason, exit_code
                self.stop_requested_at = now
        # Backstop and watchdog before the flag: a main thread that sees the flag may enter a
        # cleanup that holds the GIL for good, and then no other thread gets to arm anything.
        self._arm_kernel_backstop()
        if first:
            threading.Thread(target=self._watchdog, name="gpuzombie-deadline", daemon=True).start()
            self._stop.set()
        self.log(
            f"gpuzombie.graceful: {'stop requested' if first else 'also'}: {reason}; "
            f"exiting within {self._deadline_at - now:.3g} s"
        )

    def shutdown(self, *, exit: bool = True) -> None:
        """Clean up (callbacks, drop held objects, abort the process group, empty the CUDA cache)
        and, when a stop was requested and ``exit`` is set, exit at once with the stop's code.

        Once a stop was requested the watchdog still ends the process at the deadline, even with
        ``exit=False``: the deadline is a promise to the kubelet, not to this script."""
        if not self._cleaned.is_set():
            for fn in self._callbacks:
                try:
                    fn()
                except BaseException as exc:  # SystemExit and KeyboardInterrupt too: the cleanup goes on
                    self.log(f"gpuzombie.graceful: on_stop callback failed: {exc!r} (the cleanup goes on)")
            self._held.clear()
            # Stopping early: peers may be dead or mid-collective, so abort. Done normally: the
            # peers are finishing too, and the polite destroy does not wait on anyone dead.
            what = torchdist.abort_process_group() if self._stop.is_set() else torchdist.destroy_process_group()
            # With a dead peer, cudaFree's implicit sync could wait on a stuck NCCL kernel; the
            # exit that follows frees everything anyway.
            freed = "cache left to the exit (peer lost)" if self._peer_gone else torchdist.free_cuda_memory()
            self._cleaned.set()
            self.log(f"gpuzombie.graceful: cleaned up ({what}; {freed})")
        if exit and self._stop.is_set():
            # os._exit, not sys.exit: interpreter teardown can hang in a communication library's
            # destructors, and once it starts no Python thread (our watchdog) runs again. What
            # must happen before exit belongs in on_stop(); atexit handlers are skipped.
            _flush()
            os._exit(self.exit_code)

    def __enter__(self) -> Guard:
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: object) -> None:
        if exc is not None and not isinstance(exc, SystemExit) and not self._stop.is_set():
            # An error escaping the loop (a collective that failed) takes the same way out, with the
            # deadline: a plain exit could hang in the communication library's teardown. A failed
            # collective usually means a dead peer: give the monitor a moment to say so (exit 75).
            traceback.print_exception(exc)
            if self.peers is not None:
                self._stop.wait(min(0.5, self.peer_exit_s))
            self.request_stop(f"{type(exc).__name__}: {exc}", 1)
        self.shutdown(exit=True)

    # -- machinery ---------------------------------------------------------------------------
    def install(self) -> Guard:
        """Take over the stop signals; main thread only (CPython allows ``signal.signal`` nowhere else)."""
        if threading.current_thread() is not threading.main_thread():
            raise RuntimeError("gpuzombie.graceful.install() must be called from the main thread")
        self._wake_r, self._wake_w = socket.socketpair()
        self._wake_w.setblocking(False)
        self._old_wakeup_fd = signal.set_wakeup_fd(self._wake_w.fileno(), warn_on_full_buffer=False)
        for sig in self.signals:
            self._previous[sig] = signal.signal(sig, self._on_signal_in_main)
        threading.Thread(target=self._signal_reader, name="gpuzombie-signals", daemon=True).start()
        return self

    def uninstall(self) -> None:
        for sig, old in self._previous.items():
            signal.signal(sig, old)
        signal.set_wakeup_fd(self._old_wakeup_fd)
        self._backstop.disarm()
        if self.peers:
            self.peers.stop()

    def _on_signal_in_main(self, signum: int, frame: Any) -> None:
        # Runs only when the main thread gets back to Python; the reader thread usually got there first.
        self._signalled(signum)

    def _signal_reader(self) -> None:
        assert self._wake_r is not None
        while True:
            try:
                data = self._wake_r.recv(64)
            except OSError:
                return
            if not data:
                return
            for signum in data:
                if signum in self.signals:
                    self._signalled(signum)

    def _signalled(self, signum: int) -> None:
        # Both the reader thread and the main thread's handler see each signal: request_stop is
        # idempotent, and the first stop's reason and code stand.
        self.request_stop(signal.Signals(signum).name, 128 + signum)

    def watch_process_group(self, *, timeout_s: float = 3.0, interval_s: float = 0.2) -> PeerMonitor | None:
        """Start watching the other ranks of the initialised default process group."""
        if not torchdist.dist_initialized():
            return None
        import torch.distributed as dist  # torch is imported already: dist_initialized() said so

        store = None
        host, port = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT")
        if host and port:
            # Heartbeats never block (add); the longer timeout only covers the start-up exchange.
            store = torchdist.dedicated_store_client(host, int(port), max(timeout_s, 30.0))
        store = store or torchdist.default_store()
        monitor = PeerMonitor(self.peer_lost, interval_s=interval_s, timeout_s=timeout_s)
        if store is not None:
            monitor.watch_store(store, dist.get_rank(), dist.get_world_size())
        monitor.start()
        self.peers = monitor
        return monitor

    def watch_pids(self, pids: Iterable[int], *, interval_s: float = 0.2) -> PeerMonitor:
        """Treat these local processes as peers (no torch needed): one exiting stops this one."""
        monitor = PeerMonitor(self.peer_lost, interval_s=interval_s)
        for pid in pids:
            monitor.watch_pid(pid)
        monitor.start()
        self.peers = monitor
        return monitor

    def peer_lost(self, reason: str) -> None:
        # Set before the stop is visible: a main thread that sees it and runs shutdown() must
        # already know not to touch CUDA (its implicit sync could wait on a stuck NCCL kernel).
        self._peer_gone = True
        self.request_stop(f"peer lost: {reason}", EXIT_PEER_LOST, within_s=self.peer_exit_s)
        # The main thread is most likely blocked in a collective with the dead rank: unblock it.
        self.log(f"gpuzombie.graceful: {torchdist.abort_process_group()}")

    def _arm_kernel_backstop(self) -> None:
        """If even the watchdog cannot run (a C call holding the GIL), the kernel ends us: a timer of
        our own delivers SIGKILL ``BACKSTOP_GRACE_S`` after the deadline. Not SIGALRM, which the
        application may handle or re-arm."""
        if not self._backstop.arm(self._deadline_at - time.monotonic() + BACKSTOP_GRACE_S):
            self.log(f"gpuzombie.graceful: no kernel backstop ({self._backstop.why_not}): the watchdog thread only")

    def _watchdog(self) -> None:
        # Re-reads the deadline: a peer dying meanwhile brings it closer.
        while not self._cleaned.is_set() and time.monotonic() < self._deadline_at:
            self._cleaned.wait(min(0.05, max(0.0, self._deadline_at - time.monotonic())))
        if self._cleaned.is_set():
            # Cleanup finished; the interpreter's own exit gets what is left of the deadline.
            while time.monotonic() < self._deadline_at:
                time.sleep(min(0.05, max(0.0, self._deadline_at - time.monotonic())))
            code = self.exit_code
        else:
            code = EXIT_PEER_LOST if self._peer_gone else EXIT_DEADLINE
        self.log(f"gpuzombie.graceful: deadline reached ({self.reason}): exiting hard with {code}")
        _flush()
        os._exit(code)


def _stderr(line: str) -> None:
    try:
        sys.stderr.write(line + "\n")
        sys.stderr.flush()
    except Exception:
        pass


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass
