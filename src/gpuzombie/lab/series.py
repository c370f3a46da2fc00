"""Two questions every memory-over-time series is asked, for any sample type with a time ``t``.

The lab's samples (bytes held by a pod) and the NCCL scenario's (MiB per pid and per GPU) differ
in shape, not in these questions: "from when on did a condition hold for good?" and "what was
the value at time t?". Both scans assume the samples are in time order, as the samplers append them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Protocol, TypeVar


class Timed(Protocol):
    @property
    def t(self) -> float: ...


S = TypeVar("S", bound=Timed)
V = TypeVar("V")


def settled_from(samples: Iterable[S], after: float, ok: Callable[[S], bool]) -> float | None:
    """The first time at or after ``after`` from which ``ok`` holds in every later sample."""
    found: float | None = None
    for s in samples:
        if s.t < after:
            continue
        if ok(s):
            if found is None:
                found = s.t
        else:
            found = None
    return found


def value_at(samples: Iterable[S], t: float, value: Callable[[S], V | None], default: V) -> V:
    """The last value (None: the sample has none) at or before ``t``; ``default`` before any."""
    found = default
    for s in samples:
        if s.t > t:
            break
        v = value(s)
        if v is not None:
            found = v
    return found
