"""The original experiment's numbers from a scenario's samples and events: release latency, grace waste, ...

Pure functions over ``Sample``s (seconds on the events' clock, bytes held), so they are tested on
hand-made series. "Released" means held memory back at the baseline within a tolerance (5 % of one
worker's size, at least 32 MiB) from that sample on; a worker's ``kill -9`` counts as freed when
held memory fell by 90 % of its size.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from itertools import pairwise
from typing import Any, Self

from gpuzombie.lab.sampler import Sample, Sampler
from gpuzombie.lab.series import settled_from, value_at
from gpuzombie.units import MIB

GIB = 1024**3


def release_tolerance(worker_bytes: int) -> int:
    """Held memory at or below this counts as back at the baseline."""
    return max(32 * MIB, worker_bytes // 20)


def kill_drop(worker_bytes: int) -> int:
    """How far held memory must fall for one killed worker's memory to count as freed."""
    return worker_bytes * 9 // 10


def released_at(samples: Sequence[Sample], after: float, threshold: int) -> float | None:
    """The first time at or after ``after`` from which held memory stays ≤ ``threshold``."""
    return settled_from(samples, after, lambda s: s.held_bytes <= threshold)


def held_at(samples: Sequence[Sample], t: float) -> int:
    """Held memory of the last sample at or before ``t`` (0 before the first)."""
    return value_at(samples, t, lambda s: s.held_bytes, 0)


def dropped_at(samples: Sequence[Sample], after: float, amount: int) -> float | None:
    """The first time after ``after`` when held memory is ``amount`` below its level at ``after``."""
    level = held_at(samples, after)
    return next((s.t for s in samples if s.t >= after and s.held_bytes <= level - amount), None)


def integral_gib_s(samples: Sequence[Sample], start: float, end: float) -> float:
    """∫ held dt from ``start`` to ``end`` in GiB·s (trapezoids, clipped to the window)."""
    if end <= start:
        return 0.0
    total = 0.0
    points = [(s.t, float(s.held_bytes)) for s in samples]
    for (t0, h0), (t1, h1) in pairwise(points):
        lo, hi = max(t0, start), min(t1, end)
        if hi <= lo or t1 == t0:
            continue
        slope = (h1 - h0) / (t1 - t0)
        total += (h0 + slope * (lo - t0) + h0 + slope * (hi - t0)) / 2 * (hi - lo)
    return total / GIB


class _FromJson:
    """Read back from results.json: the fields by name (one missing, as in older files, is None)."""

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Self:
        return cls(**{f.name: data.get(f.name) for f in fields(cls)})  # type: ignore[arg-type]


@dataclass(frozen=True)
class RunMetrics(_FromJson):
    """A run's numbers (results.json's ``metrics``, in this order): seconds on the events' clock."""

    held_at_delete_mib: float
    release_latency_s: float | None
    """Deletion → memory back at the baseline (None: still held at the end)."""
    released_at_s: float | None
    grace_s: float
    waited_whole_grace: bool
    """SIGKILL at the grace's end was needed."""
    pod_exit_after_delete_s: float | None
    sigkill_to_free_s: float | None
    grace_waste_gib_s: float
    """∫ memory held dt from the deletion until it was free."""
    kill9_to_free_s: float | None

    @property
    def release_over_kill9(self) -> float | None:
        """Deletion → free over kill -9 → free: how far a deletion is from the floor (1× is the floor).
        A number, not a pass/fail: S4's preStop hook costs its Python start-up and is still the fix."""
        if self.release_latency_s is None or self.kill9_to_free_s is None:
            return None
        return self.release_latency_s / max(self.kill9_to_free_s, 0.01)


@dataclass(frozen=True)
class SamplerStats(_FromJson):
    """What sampling cost and how regular it was (results.json's ``sampler``)."""

    cpu_seconds: float
    cpu_percent_of_one_core: float
    count: int
    mean_interval_ms: float
    max_interval_ms: float

    @classmethod
    def of(cls, sampler: Sampler) -> SamplerStats:
        return cls(
            cpu_seconds=round(sampler.cpu_seconds, 4),
            cpu_percent_of_one_core=round(sampler.cpu_percent, 2),
            **sampling_stats(sampler.samples),
        )


def sampling_stats(samples: Sequence[Sample]) -> dict[str, Any]:
    """How regular the sampling was: count, mean and max interval (ms)."""
    gaps = [b.t - a.t for a, b in pairwise(samples)]
    return {
        "count": len(samples),
        "mean_interval_ms": round(1000 * sum(gaps) / len(gaps), 2) if gaps else 0.0,
        "max_interval_ms": round(1000 * max(gaps), 2) if gaps else 0.0,
    }


def scenario_metrics(
    *, samples: Sequence[Sample], marks: dict[str, float | None], grace: float, worker_bytes: int
) -> RunMetrics:
    """Release latency, grace waste and the kill -9 comparison, from the samples and event times.

    ``marks`` holds the event times: delete, sigkill (None when PID 1 exited within the grace),
    pod_exit and kill9.
    """
    threshold = release_tolerance(worker_bytes)
    delete, sigkill, pod_exit, kill9 = (marks.get(k) for k in ("delete", "sigkill", "pod_exit", "kill9"))
    assert delete is not None
    free = released_at(samples, delete, threshold)
    end = free if free is not None else (samples[-1].t if samples else delete)
    kill9_free = dropped_at(samples, kill9, kill_drop(worker_bytes)) if kill9 is not None else None
    latency = None if free is None else free - delete
    kill9_latency = None if kill9_free is None or kill9 is None else kill9_free - kill9
    return RunMetrics(
        held_at_delete_mib=round(held_at(samples, delete) / 1024**2, 1),
        release_latency_s=None if latency is None else round(latency, 3),
        released_at_s=None if free is None else round(free, 3),
        grace_s=grace,
        waited_whole_grace=sigkill is not None,
        pod_exit_after_delete_s=None if pod_exit is None else round(pod_exit - delete, 3),
        sigkill_to_free_s=None if sigkill is None or free is None or free < sigkill else round(free - sigkill, 3),
        grace_waste_gib_s=round(integral_gib_s(samples, delete, end), 3),
        kill9_to_free_s=None if kill9_latency is None else round(kill9_latency, 3),
    )
