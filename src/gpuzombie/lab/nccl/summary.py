"""The NCCL comparison's result (results.json's summary, and the lab results' ``nccl``), typed.

``to_json`` is the summary as ``nccl/results.json`` and the lab's results.json hold it (the fields
in their order); ``from_json`` reads it back, as ``lab report`` does.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gpuzombie.jsonout import to_jsonable
from gpuzombie.lab.nccl.sampling import GpuPoint


@dataclass(frozen=True)
class Survivor:
    """One surviving rank after rank 0's SIGKILL: seconds after the kill (None: not seen)."""

    rank: int
    pid: int
    gpu: int | None
    held_mib_at_kill: float
    exit_s: float | None
    exit_code: int | None
    memory_free_s: float | None
    still_running_at_s: float | None
    """How long after the kill it was still running when the window closed (None: it exited)."""


@dataclass(frozen=True)
class NcclCase:
    """One way of surviving the kill (a case of ``cases.case_specs``) and what its survivors did."""

    case: str
    name: str
    description: str
    env: Mapping[str, str]
    collective_timeout_s: float | None
    launcher: str
    error: str | None
    killed_at_s: float | None
    survivors: tuple[Survivor, ...]
    all_free_s: float | None
    goal_met: bool
    dead_rank_gpu: int | None
    ghost_mib: float | None
    """Unexplained MiB on the dead rank's GPU that vanished when the last survivor exited."""

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> NcclCase:
        return cls(**{**data, "survivors": tuple(Survivor(**s) for s in data["survivors"])})


@dataclass(frozen=True)
class NcclSummary:
    """Every case of one NCCL comparison, on GPUs (NCCL) or on the stand-in (gloo)."""

    schema: str
    device: str
    backend: str
    stand_in: bool
    label: str
    ranks: int
    size_mib: int
    observe_seconds: float
    goal_s: float
    torch: str | None
    cases: tuple[NcclCase, ...]
    gpu_end: tuple[GpuPoint, ...]
    """Each GPU's used and unexplained memory when the window closed."""
    table_md: str = ""
    """The comparison as markdown (comparison.md)."""

    def to_json(self) -> dict[str, Any]:
        return to_jsonable(self)

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> NcclSummary:
        return cls(
            **{
                **data,
                "cases": tuple(NcclCase.from_json(c) for c in data["cases"]),
                "gpu_end": tuple(GpuPoint(**g) for g in data["gpu_end"]),
            }
        )
