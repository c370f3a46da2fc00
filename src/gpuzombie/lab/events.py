"""The timeline of one scenario: what happened when, on one monotonic clock."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass


@dataclass(frozen=True)
class Event:
    t: float
    """Seconds since the scenario started (monotonic)."""
    name: str
    """spawn, parent-exit, kill-9, delete, prestop-start, prestop-end, sigterm, sigkill, pod-exit,
    memory-released, observe-..."""
    detail: str = ""


class EventLog:
    """Thread-safe list of events; ``now()`` is the clock every sample and event shares."""

    def __init__(self, clock: float | None = None) -> None:
        self.origin = time.monotonic() if clock is None else clock
        self.origin_epoch = time.time() - (time.monotonic() - self.origin)
        """Wall-clock time of t = 0: to place other programs' timestamps (preStop's) on this clock."""
        self._events: list[Event] = []
        self._lock = threading.Lock()

    def now(self) -> float:
        return time.monotonic() - self.origin

    def add(self, name: str, detail: str = "", *, at: float | None = None) -> Event:
        event = Event(t=self.now() if at is None else at, name=name, detail=detail)
        with self._lock:
            self._events.append(event)
        return event

    def first(self, name: str) -> Event | None:
        return next((e for e in self.events if e.name == name), None)

    @property
    def events(self) -> list[Event]:
        with self._lock:
            return sorted(self._events, key=lambda e: e.t)
