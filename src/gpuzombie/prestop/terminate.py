"""The kubelet's sequence, done early: SIGTERM, wait, SIGKILL, confirm (the preStop hook and reap).

``Terminator`` takes the targets of one scan, the pidfds pinned before that scan read them and a
re-scan. Its TERM phase signals every target and waits; while it waits it re-scans, so a child
re-parented when its parent died (a new orphan) is stopped too. After the timeout its KILL rounds
kill every target, wait for the exits, re-scan; a process forked between a scan and its parent's
SIGKILL is found by the next round (a killed process forks no more, and its children are visible
once its exit is). The last word is a scan taken after the last SIGKILL's wait: a round that finds
nothing in scope ends it; else, at the kill wait's end, every target that scan finds is a survivor.

Every scan comes with its pidfds (``PinnedPids``, opened before the processes were read): a target
is signalled only through the pidfd of the very process the scan read, so a pid recycled at any
moment is never signalled. Time is injected (``clock``) so reports are exact and tests are fast.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, TypeVar

from gpuzombie.prestop.targets import Target
from gpuzombie.proc.pidfd import Liveness, PinnedPids, ProcessHandle, wait_any_exit

RESCAN_INTERVAL = 0.25


class Outcome(str, Enum):
    EXITED_AFTER_SIGTERM = "exited_after_sigterm"
    EXITED_AFTER_SIGKILL = "exited_after_sigkill"
    GONE_BEFORE_SIGNAL = "gone_before_signal"
    PID_REUSED = "pid_reused_not_signalled"
    UNPINNED = "not_signalled_no_pidfd"
    """No pidfd could be opened for it (e.g. too many open files): never signalled by pid."""
    SURVIVED = "survived"
    NOT_KILLABLE = "not_killable_d_state"
    """Survived, in state D: stuck in the driver (only a drain or reboot helps). Said by reap, which
    reads the state after the run; the terminator itself says SURVIVED."""
    WOULD_SIGNAL = "would_signal (dry run)"
    DENIED = "permission_denied"

    @property
    def left_alive(self) -> bool:
        """A target still alive: survived SIGKILL, the signal refused, or no pidfd to signal through."""
        return self in _LEFT_ALIVE


_LEFT_ALIVE = frozenset({Outcome.SURVIVED, Outcome.NOT_KILLABLE, Outcome.DENIED, Outcome.UNPINNED})


def count_left_alive(outcomes: Iterable[Outcome]) -> int:
    """A report's ``survivors``: the one count prestop and reap both give."""
    return sum(outcome.left_alive for outcome in outcomes)


_Run = TypeVar("_Run", bound="TerminationRun")


@dataclass(frozen=True)
class TerminationRun:
    """What a report of the SIGTERM/SIGKILL sequence begins with (prestop's and reap's JSON)."""

    schema: str
    started_at: float
    duration_s: float
    dry_run: bool
    timeout_s: float
    kill_wait_s: float

    @classmethod
    def of_run(
        cls: type[_Run],
        schema: str,
        started: float,
        elapsed: float,
        *,
        dry_run: bool,
        timeout: float,
        kill_wait: float,
        **own: Any,
    ) -> _Run:
        """A report whose beginning is the run's: its start (wall clock), ``elapsed`` seconds (to the
        millisecond) and its settings; ``own``, the report's other fields."""
        return cls(
            schema=schema,
            started_at=started,
            duration_s=round(elapsed, 3),
            dry_run=dry_run,
            timeout_s=timeout,
            kill_wait_s=kill_wait,
            **own,
        )


@dataclass(frozen=True)
class TargetResult:
    target: Target
    outcome: Outcome
    signals: tuple[str, ...]
    """Signals sent, as ``NAME@seconds`` after the start."""
    exited_after_s: float | None
    found_by_rescan: bool = False


@dataclass(frozen=True)
class PrestopEvent:
    """One thing that happened, for a live log (a hook killed half-way still leaves a trace)."""

    at_s: float
    kind: str
    pid: int | None
    message: str


Rescan = Callable[[], tuple[Sequence[Target], PinnedPids]]
"""A fresh scan of the scope: its targets and the pidfds opened before it read them."""


@dataclass
class _Tracked:
    """One target from when a scan found it: its handle while it is signalled and alive."""

    target: Target
    handle: ProcessHandle | None
    found_by_rescan: bool
    signals: list[str] = field(default_factory=list)
    outcome: Outcome | None = None
    exited_after: float | None = None

    @property
    def describe(self) -> str:
        return f"pid {self.target.pid} ({self.target.comm}): {'; '.join(self.target.reasons)}"

    @property
    def killed(self) -> bool:
        return any(s.startswith("SIGKILL") for s in self.signals)

    def exit_outcome(self) -> Outcome:
        if self.killed:
            return Outcome.EXITED_AFTER_SIGKILL
        return Outcome.EXITED_AFTER_SIGTERM if self.signals else Outcome.GONE_BEFORE_SIGNAL

    def result(self) -> TargetResult:
        return TargetResult(
            target=self.target,
            outcome=self.outcome or Outcome.SURVIVED,
            signals=tuple(self.signals),
            exited_after_s=self.exited_after,
            found_by_rescan=self.found_by_rescan,
        )


@dataclass(eq=False, kw_only=True)
class Terminator:
    """Stops one scope's targets through pidfds: ``run`` is the TERM phase, then the KILL rounds.

    One use per instance: it keeps every target any scan found, by (pid, start time), and reports
    each once, in the order found. Pins (the first scan's and every re-scan's) are closed here."""

    procfs_root: str
    rescan: Rescan | None = None
    dry_run: bool = False
    on_event: Callable[[PrestopEvent], None] = lambda e: None
    clock: Callable[[], float] = time.monotonic
    _tracked: dict[tuple[int, int], _Tracked] = field(default_factory=dict, init=False)

    def __post_init__(self) -> None:
        self._start = self.clock()

    def run(
        self, targets: Sequence[Target], pins: PinnedPids, *, timeout: float, kill_wait: float
    ) -> tuple[TargetResult, ...]:
        """SIGTERM ``targets`` (through ``pins``), wait up to ``timeout`` s, SIGKILL in rounds for up
        to ``kill_wait`` s; one result a target any scan found. A dry run signals nothing."""
        self._start = self.clock()
        with pins:
            for target in targets:
                self._adopt(target, pins, signal.SIGTERM, found_by_rescan=False)
        if not self.dry_run and not self.term_phase(timeout):
            self.kill_rounds(kill_wait)
        return tuple(t.result() for t in self._tracked.values())

    def term_phase(self, timeout: float) -> bool:
        """Wait for the SIGTERMed targets, SIGTERMing what re-scans find; True when all are gone
        and a scan after the last exit found nothing new."""
        deadline = self._start + timeout
        next_rescan = self.clock() + RESCAN_INTERVAL
        while self.clock() < deadline:
            self._reap_exits()
            # Re-scan on a tick, and at once when the last target is gone: its children were
            # re-parented before its exit became visible, so the scan finds them if there are any.
            if not self._live() or self.clock() >= next_rescan:
                pending = self._sweep(signal.SIGTERM)
                next_rescan = self.clock() + RESCAN_INTERVAL
                if not self._live() and not pending:
                    return True
            wait_any_exit(self._handles(), max(0.0, min(deadline, next_rescan) - self.clock()))
        return False

    def kill_rounds(self, kill_wait: float) -> None:
        """SIGKILL every live target and what each re-scan finds, until a scan after the last
        SIGKILL's wait finds nothing; at ``kill_wait``'s end, what a final scan finds survives."""
        kill_deadline = self.clock() + kill_wait
        while True:
            self._reap_exits()
            pending = self._sweep(signal.SIGKILL)
            for item in self._live():
                if not item.killed:
                    self._send(item, signal.SIGKILL)
            if not self._live() and not pending:
                return  # the last word: a scan after the last SIGKILL's wait found nothing
            if self.clock() >= kill_deadline:
                break
            wait_any_exit(self._handles(), min(kill_deadline - self.clock(), RESCAN_INTERVAL))
        self._reap_exits()
        self._sweep(signal.SIGKILL, final=True)  # the last word: what it finds, new or left, is a survivor
        for item in self._live():
            item.outcome = Outcome.SURVIVED
            self._emit(
                "survivor",
                item.target.pid,
                f"pid {item.target.pid} ({item.target.comm}) still alive {kill_wait:.1f} s after SIGKILL "
                "(D state in the driver?), or found by the final scan",
            )
            if item.handle is not None:
                item.handle.close()

    def _now(self) -> float:
        return round(self.clock() - self._start, 3)

    def _emit(self, kind: str, pid: int | None, message: str) -> None:
        self.on_event(PrestopEvent(self._now(), kind, pid, message))

    def _adopt(self, target: Target, pins: PinnedPids, sig: int, *, found_by_rescan: bool, final: bool = False) -> None:
        """Track a target found by a scan and signal it through the pidfd that scan pinned."""
        key = (target.pid, target.start_ticks)
        if key in self._tracked:
            return
        unpinned = pins.unpinned.get(target.pid)
        if unpinned is None and target.pid not in pins and not self.dry_run:
            # Not pinned before this scan read it (it took a pid freed after the pins were opened):
            # the next scan pins it; the final scan has no next one, so there it is a survivor.
            if final:
                item = self._tracked[key] = _Tracked(target, None, True, outcome=Outcome.SURVIVED)
                self._emit(
                    "survivor", target.pid, f"in scope after the last SIGKILL round, not signalled: {item.describe}"
                )
            return
        item = self._tracked[key] = _Tracked(target, None, found_by_rescan)
        if self.dry_run:
            item.outcome = Outcome.WOULD_SIGNAL
            self._emit("plan", target.pid, f"would send {signal.Signals(sig).name} to {item.describe}")
            return
        if unpinned is not None:
            item.outcome = Outcome.UNPINNED
            self._emit("skip", target.pid, f"not signalled: {unpinned} ({item.describe})")
            return
        handle, state = pins.take(target.identity, self.procfs_root)
        if handle is None:
            item.outcome = Outcome.PID_REUSED if state is Liveness.REUSED else Outcome.GONE_BEFORE_SIGNAL
            self._emit("skip", target.pid, f"not signalled: {item.outcome.value} ({item.describe})")
            return
        item.handle = handle
        self._send(item, sig)

    def _send(self, item: _Tracked, sig: int) -> None:
        assert item.handle is not None
        name = signal.Signals(sig).name
        try:
            state = item.handle.send(sig)
        except PermissionError:
            item.outcome = Outcome.DENIED
            item.handle.close()
            self._emit("error", item.target.pid, f"{name} refused: permission denied")
            return
        if state is Liveness.ALIVE:
            item.signals.append(f"{name}@{self._now():.3f}")
            self._emit("signal", item.target.pid, f"{name} -> {item.describe}")
        else:
            self._finish(item)

    def _finish(self, item: _Tracked) -> None:
        item.outcome = item.exit_outcome()
        item.exited_after = self._now()
        if item.handle is not None:
            item.handle.close()
        self._emit(
            "exit",
            item.target.pid,
            f"pid {item.target.pid} ({item.target.comm}) gone after {item.exited_after:.3f} s ({item.outcome.value})",
        )

    def _live(self) -> list[_Tracked]:
        """Signalled and not yet seen to exit (every one has an open handle)."""
        return [t for t in self._tracked.values() if t.outcome is None and t.handle is not None]

    def _handles(self) -> list[ProcessHandle]:
        return [t.handle for t in self._live() if t.handle is not None]

    def _reap_exits(self) -> None:
        for item in self._live():
            assert item.handle is not None
            if item.handle.liveness() is not Liveness.ALIVE:
                self._finish(item)

    def _sweep(self, sig: int, *, final: bool = False) -> int:
        """Re-scan and adopt what is new with ``sig``; how many of the scan's targets are still to be
        dealt with (new, or signalled and alive): 0 means none is left that waiting could change."""
        if self.rescan is None:
            return 0
        targets, pins = self.rescan()
        with pins:
            for target in targets:
                self._adopt(target, pins, sig, found_by_rescan=True, final=final)
        keys = ((t.pid, t.start_ticks) for t in targets)
        return sum(1 for key in keys if key not in self._tracked or self._tracked[key].outcome is None)
