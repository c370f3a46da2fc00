"""``gpuzombie preflight``: the handover gate, run in a GPU pod before its workload starts.

It reads the GPUs (or MIG instances) NVML shows this container, judges each with
``handover.verdict.judge``, and polls until every one is clean or ``--wait`` has passed. Dirty or
unreadable at the end: exit 1 with a one-line termination message (the kubelet's
terminationMessagePath) naming the GPU, the MiB held, the likely cause and the fix; the kubelet's
init-container restart back-off then keeps the pod waiting, fail-closed, with nothing else running.

Standard library and ``gpuzombie.gpu.nvml`` only (nvidia-ml-py loaded lazily): the webhook's init
container runs it as ``python3 -S -I /opt/gpuzombie/preflight.pyz`` (``prestop.zipapp --app
preflight``), ``gpuzombie preflight`` calls the same ``main``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TextIO

from gpuzombie.escape import escape
from gpuzombie.exitcodes import ExitStatus
from gpuzombie.gpu.nvml import FakeNvml, GpuDevice, GpuSnapshot, NvmlBackend, read_gpus
from gpuzombie.handover.files import read_bounded, write_message
from gpuzombie.handover.verdict import DEFAULT_TOLERANCE_BYTES, MIB, GpuReading, Verdict, judge
from gpuzombie.usage import OneLineParser, UsageError

SCHEMA = "gpuzombie.preflight/1"
DEFAULT_WAIT_S = 60.0
DEFAULT_INTERVAL_S = 2.0
TERMINATION_LOG = "/dev/termination-log"
"""The kubelet's default terminationMessagePath: what it shows as the container's last state message."""
MESSAGE_LIMIT = 1024
"""The kubelet keeps 4096 bytes of a termination message (and less per container when a pod has many):
one bounded line."""
NODE_ENV = "NODE_NAME"
"""The node's name, from the downward API (spec.nodeName) in the injected container: the fix names it."""
ALERTS = "GpuzombieStaleGpuHolder, GpuzombieForeignGpuHolder, GpuzombieDStateGpuHolder, GpuzombieGhostGpuMemory"
"""The node agent's alerts (charts/gpuzombie/files/gpuzombie-alerts.yaml) that name what holds a GPU."""
CLEAN, DIRTY, UNREADABLE = "clean", "dirty", "unreadable"
PASSED_OPEN = "passed-open"
NO_GPU = (
    "NVML shows this container no GPU (was it given the pod's GPU resources? the webhook's injected "
    "container asks for the same ones)"
)


@dataclass(frozen=True)
class GpuCheck:
    """One GPU or MIG instance as this poll saw it (``uuid`` None: no GPU could be read at all)."""

    index: int | None
    uuid: str | None
    instance: str | None
    """``MIG 1g.18gb GI 3`` for a MIG instance; None for a whole GPU."""
    used_bytes: int
    reserved_bytes: int | None
    processes: int
    verdict: Verdict
    state: str
    """``clean``, ``dirty`` (a process listed, or memory held past the tolerance) or ``unreadable``."""

    @property
    def label(self) -> str:
        if self.uuid is None:
            return "GPU ?"
        where = f"GPU {self.index}" + (f" {self.instance}" if self.instance else "")
        return f"{where} ({self.uuid})"


def checks_of(
    snapshot: GpuSnapshot, tolerance_bytes: int = DEFAULT_TOLERANCE_BYTES, baseline_bytes: int = 0
) -> tuple[GpuCheck, ...]:
    """Each device of ``snapshot`` judged; an unreadable snapshot, or one without a GPU, is one
    unreadable check (never clean)."""
    if not snapshot.available or not snapshot.devices:
        error = snapshot.reason or "NVML unavailable" if not snapshot.available else NO_GPU
        return (GpuCheck(None, None, None, 0, None, 0, judge(None, error=error), UNREADABLE),)
    return tuple(_check(d, tolerance_bytes, baseline_bytes) for d in snapshot.devices)


def _check(device: GpuDevice, tolerance_bytes: int, baseline_bytes: int) -> GpuCheck:
    reading = GpuReading(
        used_bytes=device.memory_used,
        reserved_bytes=device.memory_reserved,
        listed_processes=len(device.processes),
        processes_read=device.processes_read,
    )
    instance = None
    uuid = device.uuid
    if device.mig is not None:
        instance = f"MIG {device.mig.profile} GI {device.mig.gpu_instance_id}"
        uuid = device.mig.uuids[0] if device.mig.uuids else uuid
    verdict = judge(reading, tolerance_bytes=tolerance_bytes, baseline_bytes=baseline_bytes)
    if verdict.clean:
        state = CLEAN
    elif device.processes or verdict.held_bytes > tolerance_bytes:
        state = DIRTY
    else:
        state = UNREADABLE
    return GpuCheck(
        device.index, uuid, instance, device.memory_used, device.memory_reserved, len(device.processes), verdict, state
    )


@dataclass(frozen=True)
class Options:
    wait_s: float = DEFAULT_WAIT_S
    interval_s: float = DEFAULT_INTERVAL_S
    tolerance_bytes: int = DEFAULT_TOLERANCE_BYTES
    fail_open: bool = False
    node: str | None = None
    baseline_bytes: int = 0
    """Subtracted where NVML reports no reservation (no v2 memory info): an idle GPU's measured use."""


@dataclass(frozen=True)
class Outcome:
    status: str
    """``clean``, ``dirty``, ``unreadable``, or ``passed-open`` (unreadable, let through by --fail-open)."""
    exit_status: int
    polls: int
    waited_s: float
    checks: tuple[GpuCheck, ...]
    """The last poll's."""
    message: str | None
    """The termination message (None when clean)."""


def poll_line(elapsed_s: float, checks: Sequence[GpuCheck]) -> str:
    """What one poll saw, one line."""
    parts = [f"{c.label}: {c.state}, {c.verdict.reason}" for c in checks]
    return f"preflight: {elapsed_s:.1f} s: " + "; ".join(parts)


def run_preflight(
    read: Callable[[], GpuSnapshot],
    options: Options,
    *,
    progress: Callable[[str], None],
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
) -> Outcome:
    """Poll until every GPU is clean or ``options.wait_s`` has passed (one poll at least)."""
    start = clock()
    polls = 0
    while True:
        checks = checks_of(read(), options.tolerance_bytes, options.baseline_bytes)
        polls += 1
        elapsed = clock() - start
        progress(poll_line(elapsed, checks))
        if all(c.verdict.clean for c in checks):
            return Outcome(CLEAN, ExitStatus.OK, polls, round(elapsed, 3), checks, None)
        next_at = polls * options.interval_s  # on a fixed grid: a slow read does not cost a poll
        if next_at > options.wait_s:
            break
        sleep(max(0.0, start + next_at - clock()))
    status = DIRTY if any(c.state == DIRTY for c in checks) else UNREADABLE
    if status == UNREADABLE and options.fail_open:
        message = failure_message(checks, elapsed, options, passed_open=True)
        return Outcome(PASSED_OPEN, ExitStatus.OK, polls, round(elapsed, 3), checks, message)
    message = failure_message(checks, elapsed, options)
    return Outcome(status, ExitStatus.FINDINGS, polls, round(elapsed, 3), checks, message)


def failure_message(
    checks: Sequence[GpuCheck], elapsed_s: float, options: Options, *, passed_open: bool = False
) -> str:
    """One line for ``kubectl describe``: which GPU, how much is held, the likely cause, the fix."""
    bad = [c for c in checks if c.state != CLEAN]
    worst = max(bad, key=lambda c: (c.state == DIRTY, c.verdict.held_bytes))
    node = options.node or "this pod's node"
    more = f" (+{len(bad) - 1} more not clean)" if len(bad) > 1 else ""
    if passed_open:
        head = f"gpuzombie preflight: PASSED OPEN (--fail-open): {worst.label}: {worst.verdict.reason}"
        return escape(head + more, MESSAGE_LIMIT)
    held = f"{worst.label}: {worst.verdict.reason}, after {elapsed_s:.0f} s"
    if worst.state == UNREADABLE:
        cause = "the gate fails closed on a GPU it cannot read"
        fix = f"check the NVIDIA driver and device plugin on {node} (alert GpuzombieNvmlUnavailable)"
    elif worst.processes:
        cause = "a process this container can see holds it (from a pod: one of the pod's own, started before the gate)"
        fix = f"look at this pod's init containers and sidecars; `gpuzombie trace` on {node} names the holder"
    else:
        cause = "likely a stale holder of a deleted pod (or a foreign or D-state process) on the node"
        fix = f"run `gpuzombie reap` on {node} (alerts {ALERTS})"
    return escape(f"gpuzombie preflight: {held}{more}; {cause}; fix: {fix}", MESSAGE_LIMIT)


def write_termination_message(path: str, message: str) -> str | None:
    """Write ``message`` where the kubelet reads it (``files.write_message``: no link followed, no FIFO
    waited on, nothing truncated that is not the gate's own); why not, or None when written."""
    try:
        write_message(path, message + "\n")
    except OSError as exc:
        return f"{path}: {exc.strerror or exc}"
    return None


def outcome_json(outcome: Outcome, termination_log: str | None) -> str:
    gpus = [
        {
            "index": c.index,
            "uuid": c.uuid,
            "instance": c.instance,
            "state": c.state,
            "held_mib": round(c.verdict.held_bytes / MIB, 1),
            "used_mib": round(c.used_bytes / MIB, 1),
            "reserved_mib": None if c.reserved_bytes is None else round(c.reserved_bytes / MIB, 1),
            "processes": c.processes,
            "reason": c.verdict.reason,
        }
        for c in outcome.checks
    ]
    return json.dumps(
        {
            "schema": SCHEMA,
            "outcome": outcome.status,
            "exit_status": int(outcome.exit_status),
            "polls": outcome.polls,
            "waited_s": outcome.waited_s,
            "gpus": gpus,
            "message": outcome.message,
            "termination_log": termination_log,
        },
        indent=1,
    )


class SnapshotFile:
    """A STAND-IN for NVML (the lab on CPU, tests): a recorded GpuSnapshot as JSON, read afresh at
    every poll, so a test's stand-in driver can change what the GPU shows. Never used unless
    ``--nvml-standin`` names the file."""

    def __init__(self, path: str) -> None:
        self.path = path

    def read(self) -> GpuSnapshot:
        """The snapshot in the file (``files.read_bounded``: a regular file, at most 1 MiB, never
        blocking), or an unavailable one saying why not."""
        try:
            return FakeNvml.from_dict(json.loads(read_bounded(self.path))).read()
        except (OSError, ValueError, TypeError, KeyError, AttributeError, RecursionError) as exc:
            why = f"NVML stand-in {self.path}: {type(exc).__name__}: {exc}"
            return GpuSnapshot(available=False, reason=why[:400])


def site_packages() -> list[str]:
    """The image's site-packages (its venv's when ``python3`` is one), as ``site`` would find them,
    without running their .pth files: a training image's (torch's, setuptools') are most of what
    ``site`` costs, and nvidia-ml-py (one module, ``pynvml.py``) needs none of them."""
    import site

    bin_dir = os.path.dirname(os.path.abspath(sys.executable))
    venvs = [d for d in (bin_dir, os.path.dirname(bin_dir)) if os.path.isfile(os.path.join(d, "pyvenv.cfg"))]
    version = f"python{sys.version_info[0]}.{sys.version_info[1]}"
    found = [os.path.join(v, lib, version, "site-packages") for v in venvs[:1] for lib in ("lib", "lib64")]
    real = {os.path.realpath(p): p for p in reversed([*found, *site.getsitepackages()]) if os.path.isdir(p)}
    return list(reversed(real.values()))


def nvml_backend() -> NvmlBackend:
    """NVML through nvidia-ml-py; under ``python3 -S`` (the zipapp) the image's own site-packages are
    appended, the one place outside the standard library it looks."""
    if sys.flags.no_site and "pynvml" not in sys.modules:
        sys.path.extend(p for p in site_packages() if p not in sys.path)
    from gpuzombie.gpu.nvml import default_backend

    return default_backend()


def _seconds(text: str) -> float:
    value = float(text)
    if not 0 <= value <= 86400:
        raise ValueError(text)
    return value


def _mib(text: str) -> int:
    value = int(text)
    if not 0 <= value <= 1 << 20:
        raise ValueError(text)
    return value * MIB


def build_parser(prog: str) -> argparse.ArgumentParser:
    ap = OneLineParser(
        prog=prog,
        description="Before a GPU workload starts: wait until every GPU (or MIG instance) NVML shows this "
        "container is clean (nothing held beyond the driver's reservation, no process listed). Exit 0 clean "
        "(or unreadable with --fail-open), 1 dirty or unreadable after --wait (a one-line message in "
        "--termination-log), 2 usage error, 130 interrupted.",
    )
    ap.add_argument(
        "--wait", type=_seconds, default=DEFAULT_WAIT_S, metavar="S", help="poll up to S seconds (default 60)"
    )
    ap.add_argument(
        "--interval", type=_seconds, default=DEFAULT_INTERVAL_S, metavar="S", help="between polls (default 2)"
    )
    ap.add_argument(
        "--tolerance-mib",
        type=_mib,
        default=DEFAULT_TOLERANCE_BYTES,
        metavar="MIB",
        help=f"memory held beyond the driver's reservation that is still clean (default {DEFAULT_TOLERANCE_BYTES // MIB})",
    )
    ap.add_argument(
        "--baseline-mib",
        type=_mib,
        default=0,
        metavar="MIB",
        help="where the driver reports no reservation (no NVML v2 memory info): what an idle GPU shows "
        "used, subtracted (default 0: such an idle GPU is dirty, fail-closed)",
    )
    ap.add_argument(
        "--fail-open",
        action="store_true",
        help="let an UNREADABLE GPU (NVML error, no GPU visible) pass with a warning; a GPU read as dirty "
        "still fails (default: fail closed)",
    )
    ap.add_argument(
        "--termination-log",
        default=TERMINATION_LOG,
        metavar="PATH",
        help=f"where the one-line failure message goes (default {TERMINATION_LOG}; '' for none)",
    )
    ap.add_argument("--json", action="store_true", help="the result as JSON on stdout (the polls on stderr)")
    ap.add_argument(
        "--nvml-standin",
        metavar="FILE",
        help="lab and tests only: a recorded GPU snapshot (JSON), re-read at each poll, instead of NVML",
    )
    return ap


def main(argv: Sequence[str] | None = None, *, prog: str = "gpuzombie preflight", out: TextIO | None = None) -> int:
    out = out or sys.stdout
    err = sys.stderr
    try:
        args = build_parser(prog).parse_args(argv)
    except UsageError as exc:
        print(f"gpuzombie: usage error: {exc} (see '{prog} --help')", file=err)
        return ExitStatus.ERROR
    if args.interval <= 0:
        print(f"gpuzombie: usage error: --interval must be above 0 (see '{prog} --help')", file=err)
        return ExitStatus.ERROR
    options = Options(
        args.wait,
        args.interval,
        args.tolerance_mib,
        args.fail_open,
        os.environ.get(NODE_ENV) or None,
        args.baseline_mib,
    )
    backend: NvmlBackend = SnapshotFile(args.nvml_standin) if args.nvml_standin else nvml_backend()
    progress_to = err if args.json else out

    def progress(line: str) -> None:
        print(line, file=progress_to, flush=True)

    try:
        outcome = run_preflight(lambda: read_gpus(backend), options, progress=progress)
    except KeyboardInterrupt:
        print("gpuzombie: interrupted", file=err)
        return ExitStatus.INTERRUPTED
    written = None
    if outcome.message is not None and args.termination_log:
        why_not = write_termination_message(args.termination_log, outcome.message)
        written = None if why_not else args.termination_log
        if why_not:
            print(f"preflight: termination message not written: {why_not}", file=err)
    if args.json:
        print(outcome_json(outcome, written), file=out, flush=True)
    elif outcome.message is not None:
        print(outcome.message, file=out, flush=True)
    else:
        print(f"preflight: clean after {outcome.polls} poll(s), {outcome.waited_s:.2f} s", file=out, flush=True)
    return outcome.exit_status


if __name__ == "__main__":
    sys.exit(main())
