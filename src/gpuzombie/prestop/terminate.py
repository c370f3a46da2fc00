"""The kubelet's sequence, done early by the preStop hook: SIGTERM, wait, SIGKILL, confirm.

While it waits it re-scans the namespace, so a child re-parented when its parent died (a new
orphan) is stopped too. After the timeout it SIGKILLs in rounds: kill every target, wait for the
exits, re-scan; a process forked between a scan and its parent's SIGKILL is found by the next
round (a killed process forks no more, and its children are visible once its exit is). The last
word is a scan taken after the last SIGKILL's wait: a round that finds nothing in scope ends it;
else, at the kill wait's end, every target that scan finds is a survivor.

Every scan comes with its pidfds (``PinnedPids``, opened before the
processes were read): a target is signalled only through the pidfd of the very process the scan
read, so a pid recycled at any moment is never signalled. Time is injected (``clock``) so reports
are exact and tests are fast.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum

from gpuzombie.prestop.targets import PrestopPlan, Target
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
    WOULD_SIGNAL = "would_signal (dry run)"
    DENIED = "permission_denied"


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


@dataclass
class _Tracked:
    target: Target
    handle: ProcessHandle | None
    rescan: bool
    signals: list[str] = field(default_factory=list)
    outcome: Outcome | None = None
    exited_after: float | None = None


def execute_plan(
    plan: PrestopPlan,
    pins: PinnedPids,
    *,
    procfs_root: str,
    timeout: float,
    kill_wait: float,
    dry_run: bool = False,
    rescan: Callable[[], tuple[PrestopPlan, PinnedPids]] | None = None,
    on_event: Callable[[PrestopEvent], None] = lambda e: None,
    clock: Callable[[], float] = time.monotonic,
) -> tuple[TargetResult, ...]:
    """Stop every target of ``plan`` through ``pins`` (closed here, as is every re-scan's);
    returns one result a target, in the order they were found."""
    start = clock()

    def now() -> float:
        return round(clock() - start, 3)

    def emit(kind: str, pid: int | None, message: str) -> None:
        on_event(PrestopEvent(now(), kind, pid, message))

    tracked: dict[tuple[int, int], _Tracked] = {}

    def adopt(target: Target, scan_pins: PinnedPids, found_by_rescan: bool, sig: int, final: bool = False) -> None:
        key = (target.pid, target.start_ticks)
        if key in tracked:
            return
        what = f"pid {target.pid} ({target.comm}): {'; '.join(target.reasons)}"
        unpinned = scan_pins.unpinned.get(target.pid)
        if unpinned is None and target.pid not in scan_pins and not dry_run:
            # Not pinned before this scan read it (it took a pid freed after the pins were opened):
            # the next scan pins it; the final scan has no next one, so there it is a survivor.
            if final:
                tracked[key] = _Tracked(target, None, True, outcome=Outcome.SURVIVED)
                emit("survivor", target.pid, f"in scope after the last SIGKILL round, not signalled: {what}")
            return
        item = _Tracked(target, None, found_by_rescan)
        tracked[key] = item
        if dry_run:
            item.outcome = Outcome.WOULD_SIGNAL
            emit("plan", target.pid, f"would send {signal.Signals(sig).name} to {what}")
            return
        if unpinned is not None:
            item.outcome = Outcome.UNPINNED
            emit("skip", target.pid, f"not signalled: {unpinned} ({what})")
            return
        handle, state = scan_pins.take(target.identity, procfs_root)
        if handle is None:
            item.outcome = Outcome.PID_REUSED if state is Liveness.REUSED else Outcome.GONE_BEFORE_SIGNAL
            emit("skip", target.pid, f"not signalled: {item.outcome.value} ({what})")
            return
        item.handle = handle
        send(item, sig)

    def send(item: _Tracked, sig: int) -> None:
        assert item.handle is not None
        name = signal.Signals(sig).name
        try:
            state = item.handle.send(sig)
        except PermissionError:
            item.outcome = Outcome.DENIED
            item.handle.close()
            emit("error", item.target.pid, f"{name} refused: permission denied")
            return
        if state is Liveness.ALIVE:
            item.signals.append(f"{name}@{now():.3f}")
            emit(
                "signal",
                item.target.pid,
                f"{name} -> pid {item.target.pid} ({item.target.comm}): " + "; ".join(item.target.reasons),
            )
        else:
            finish(item, _exit_outcome(item))

    def finish(item: _Tracked, outcome: Outcome) -> None:
        item.outcome = outcome
        item.exited_after = now()
        if item.handle is not None:
            item.handle.close()
        emit(
            "exit",
            item.target.pid,
            f"pid {item.target.pid} ({item.target.comm}) gone after {item.exited_after:.3f} s ({outcome.value})",
        )

    def live() -> list[_Tracked]:
        """Signalled and not yet seen to exit (every one has an open handle)."""
        return [t for t in tracked.values() if t.outcome is None and t.handle is not None]

    def handles() -> list[ProcessHandle]:
        return [t.handle for t in live() if t.handle is not None]

    def reap_exits() -> None:
        for item in live():
            assert item.handle is not None
            if item.handle.liveness() is not Liveness.ALIVE:
                finish(item, _exit_outcome(item))

    def sweep(sig: int, final: bool = False) -> int:
        """Re-scan and adopt what is new with ``sig``; how many of the scan's targets are still to be
        dealt with (new, or signalled and alive): 0 means none is left that waiting could change."""
        if rescan is None:
            return 0
        new_plan, new_pins = rescan()
        with new_pins:
            for target in new_plan.targets:
                adopt(target, new_pins, True, sig, final)
        keys = ((t.pid, t.start_ticks) for t in new_plan.targets)
        return sum(1 for key in keys if key not in tracked or tracked[key].outcome is None)

    def kill_live() -> None:
        for item in live():
            if not any(s.startswith("SIGKILL") for s in item.signals):
                send(item, signal.SIGKILL)

    with pins:
        for target in plan.targets:
            adopt(target, pins, False, signal.SIGTERM)
    if dry_run:
        return _results(tracked)

    deadline = start + timeout
    next_rescan = clock() + RESCAN_INTERVAL
    while clock() < deadline:
        reap_exits()
        # Re-scan on a tick, and at once when the last target is gone: its children were
        # re-parented before its exit became visible, so the scan finds them if there are any.
        if not live() or clock() >= next_rescan:
            pending = sweep(signal.SIGTERM)
            next_rescan = clock() + RESCAN_INTERVAL
            if not live() and not pending:
                return _results(tracked)  # everything exited, and a scan after the last exit found nothing
        wait_any_exit(handles(), max(0.0, min(deadline, next_rescan) - clock()))

    # SIGKILL rounds: each scan is taken after the previous round's exits were seen.
    kill_deadline = clock() + kill_wait
    while True:
        reap_exits()
        pending = sweep(signal.SIGKILL)
        kill_live()
        if not live() and not pending:
            return _results(tracked)  # the last word: a scan after the last SIGKILL's wait found nothing
        if clock() >= kill_deadline:
            break
        wait_any_exit(handles(), min(kill_deadline - clock(), RESCAN_INTERVAL))
    reap_exits()
    sweep(signal.SIGKILL, final=True)  # the last word: what it finds, new or left, is a survivor
    for item in live():
        item.outcome = Outcome.SURVIVED
        emit(
            "survivor",
            item.target.pid,
            f"pid {item.target.pid} ({item.target.comm}) still alive {kill_wait:.1f} s after SIGKILL "
            "(D state in the driver?), or found by the final scan",
        )
        if item.handle is not None:
            item.handle.close()
    return _results(tracked)


def _exit_outcome(item: _Tracked) -> Outcome:
    if any(s.startswith("SIGKILL") for s in item.signals):
        return Outcome.EXITED_AFTER_SIGKILL
    if item.signals:
        return Outcome.EXITED_AFTER_SIGTERM
    return Outcome.GONE_BEFORE_SIGNAL


def _results(tracked: dict[tuple[int, int], _Tracked]) -> tuple[TargetResult, ...]:
    return tuple(
        TargetResult(
            target=t.target,
            outcome=t.outcome or Outcome.SURVIVED,
            signals=tuple(t.signals),
            exited_after_s=t.exited_after,
            found_by_rescan=t.rescan,
        )
        for t in tracked.values()
    )
