"""Will the CPU stand-in's workers fit in this machine's memory? Checked before the first pod.

On the stand-in every worker holds ``--size-mib`` of host memory, and ``--workers`` + 1 of them
(the kill -9 victim) hold it at once: the default run needs 2 × 2 GiB. A machine with less would
swap or meet the OOM killer in the middle of a scenario, so the lab scales the size down when it
was not given, and refuses in one line when it was.
"""

from __future__ import annotations

from dataclasses import replace

from gpuzombie.errors import GpuzombieError
from gpuzombie.lab.labrun import LabConfig
from gpuzombie.units import MIB

MARGIN_MIB = 512
"""Beside the workers' memory: the Pythons (parent, workers, preStop, observe: ~15-30 MiB each),
a private containerd and its shims, and room the rest of the machine keeps using."""
STEP_MIB = 64
"""A scaled size is a multiple of this (and at least this)."""


def needed_mib(config: LabConfig) -> int:
    """Host memory a scenario holds at its peak: every worker alive before the kill -9, the margin."""
    return (config.workers + 1) * config.size_mib + MARGIN_MIB


def fit_to_memory(config: LabConfig, available: int | None, *, scale: bool) -> tuple[LabConfig, str | None]:
    """``config`` as it can run with ``available`` bytes (MemAvailable), and a line saying what changed
    (or why nothing was checked). ``scale``: the size was not given, so it may be lowered.

    Raises GpuzombieError (exit 2) when even the smallest size, or the given one, does not fit."""
    if available is None:
        return config, "MemAvailable unreadable: the workers' memory was not checked against it"
    have_mib = available // MIB
    need = needed_mib(config)
    if need <= have_mib:
        return config, None
    holders = config.workers + 1
    fits = (have_mib - MARGIN_MIB) // holders // STEP_MIB * STEP_MIB
    asked = f"{holders} workers × {config.size_mib} MiB + {MARGIN_MIB} MiB = {need} MiB"
    if fits < STEP_MIB:
        raise GpuzombieError(
            f"not enough memory for the CPU stand-in: MemAvailable is {have_mib} MiB, and even "
            f"{holders} workers × {STEP_MIB} MiB + {MARGIN_MIB} MiB do not fit (fewer --workers?)"
        )
    if not scale:
        raise GpuzombieError(
            f"--size-mib {config.size_mib}: the CPU stand-in needs {asked} of host memory, MemAvailable is "
            f"{have_mib} MiB: use --size-mib {fits} or less"
        )
    return (
        replace(config, size_mib=fits),
        f"MemAvailable is {have_mib} MiB, less than {asked}: each worker holds {fits} MiB (give --size-mib to choose)",
    )
