"""``gpuzombie preflight``: the handover gate, run in a GPU pod before its workload starts.

It reads the GPUs (or MIG instances) NVML shows this container, judges each with
``handover.verdict.judge``, and polls until every one is clean or the ``--wait`` deadline has
passed (the monotonic clock; a read still running then gets READ_GRACE_S more). Dirty or
unreadable at the end: exit 1 with a one-line termination message (the kubelet's
terminationMessagePath) naming the GPU, the MiB held, the likely cause and the fix; the kubelet's
init-container restart back-off then keeps the pod waiting, fail-closed, with nothing else running.
SIGTERM while it waits: exit 130 with a message saying so. Whatever NVML, a stand-in or a path
holds, it prints escaped, bounded lines, never blocks on a file and never follows a link to write.

Standard library and ``gpuzombie.gpu.nvml`` only (nvidia-ml-py loaded lazily): the webhook's init
container runs it as ``python3 -S -I /opt/gpuzombie/preflight.pyz`` (``prestop.zipapp --app
preflight``), ``gpuzombie preflight`` calls the same ``main``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from types import FrameType
from typing import Any, TextIO

from gpuzombie.escape import escape
from gpuzombie.exitcodes import ExitStatus
from gpuzombie.gpu.nvml import FakeNvml, GpuDevice, GpuSnapshot, MigInstance, NvmlBackend, read_gpus
from gpuzombie.handover.files import read_bounded, write_message
from gpuzombie.handover.verdict import (
    CLEAN,
    DEFAULT_TOLERANCE_BYTES,
    DIRTY,
    MIB,
    UNREADABLE,
    GpuReading,
    HandoverVerdict,
    byte_count,
    judge,
    shown,
)
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
PASSED_OPEN = "passed-open"
STOPPED = "stopped"
MIN_INTERVAL_S = 0.1
"""Polls are never closer than this, whatever ``--interval`` says (issue 36: ``--interval 1e-9`` spun)."""
READ_GRACE_S = 10.0
"""How long past the ``--wait`` deadline a read of the GPUs begun before it may take (NVML's first
initialisation on a node without persistence mode takes seconds); one still running then is
unreadable, and the gate ends: it returns within ``--wait`` + this whatever NVML does."""
LOG_EVERY_S = 1.0
"""A poll that saw what the last line shown said is shown again only this long after it."""
POLL_LOG_LIMIT = 1 << 20
"""The most bytes of poll lines one run prints (then one line says the rest are not shown)."""
POLL_LINE_LIMIT = 4096
"""The most characters of one poll line (escaped: nothing NVML or a stand-in names forges a line)."""
REASON_LIMIT = 400
NAME_LIMIT = 200
"""The most characters kept of a reason, and of a GPU's UUID or MIG instance name, from NVML or a stand-in."""
NO_GPU_REASON = (
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
    verdict: HandoverVerdict
    state: str
    """``verdict.state``: ``clean``, ``dirty`` (a process listed, or memory held past the tolerance) or
    ``unreadable`` (not read, or read as something no GPU shows)."""

    @property
    def label(self) -> str:
        """``GPU 0 (GPU-…)``, raw: what prints it escapes it (``poll_line``, ``failure_message``)."""
        if self.uuid is None:
            return "GPU ?"
        where = f"GPU {'?' if self.index is None else self.index}" + (f" {self.instance}" if self.instance else "")
        return f"{where} ({self.uuid})"


def checks_of(
    snapshot: GpuSnapshot, tolerance_bytes: int = DEFAULT_TOLERANCE_BYTES, baseline_bytes: int = 0
) -> tuple[GpuCheck, ...]:
    """Each device of ``snapshot`` judged; an unreadable snapshot, or one without a GPU, is one
    unreadable check (never clean). Total: whatever the snapshot holds, a check comes back."""
    if not isinstance(snapshot, GpuSnapshot) or snapshot.available is not True:
        reason = getattr(snapshot, "reason", None)
        return (_unreadable_check(reason if isinstance(reason, str) and reason else "NVML unavailable"),)
    devices = snapshot.devices
    if not isinstance(devices, tuple | list):
        return (_unreadable_check(f"impossible reading: devices {shown(devices)}"),)
    if not devices:
        return (_unreadable_check(NO_GPU_REASON),)
    return tuple(
        _check(d, tolerance_bytes, baseline_bytes)
        if isinstance(d, GpuDevice)
        else _unreadable_check(f"impossible reading: device {shown(d)}")
        for d in devices
    )


def _unreadable_check(error: str) -> GpuCheck:
    return GpuCheck(None, None, None, 0, None, 0, judge(None, error=error[:REASON_LIMIT]), UNREADABLE)


def _check(device: GpuDevice, tolerance_bytes: int, baseline_bytes: int) -> GpuCheck:
    processes = device.processes
    listed = len(processes) if isinstance(processes, tuple | list) else -1
    reading = GpuReading(
        used_bytes=device.memory_used,
        reserved_bytes=device.memory_reserved,
        listed_processes=listed,
        processes_read=device.processes_read,
    )
    verdict = judge(reading, tolerance_bytes=tolerance_bytes, baseline_bytes=baseline_bytes)
    instance, uuid = None, device.uuid
    mig = device.mig
    if isinstance(mig, MigInstance):
        instance = f"MIG {mig.profile} GI {mig.gpu_instance_id}"
        uuids = mig.uuids
        uuid = uuids[0] if isinstance(uuids, tuple | list) and uuids else uuid
    index = device.index if type(device.index) is int else None
    return GpuCheck(
        index,
        (uuid if isinstance(uuid, str) else shown(uuid))[:NAME_LIMIT],
        None if instance is None else instance[:NAME_LIMIT],
        device.memory_used,
        device.memory_reserved,
        listed,
        verdict,
        verdict.state,
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
    """``clean``, ``dirty``, ``unreadable``, ``passed-open`` (unreadable, let through by --fail-open), or
    ``stopped`` (SIGTERM or SIGINT before every GPU was clean)."""
    exit_status: int
    polls: int
    waited_s: float
    checks: tuple[GpuCheck, ...]
    """The last poll's (none when stopped before the first)."""
    message: str | None
    """The termination message (None when clean)."""


class Stopped(BaseException):
    """SIGTERM (the kubelet deleting the pod) while the gate waits (SIGINT is Python's own
    KeyboardInterrupt): a BaseException, as that one is, so that no ``except Exception`` takes it."""

    def __init__(self, signal_name: str) -> None:
        super().__init__(signal_name)
        self.signal_name = signal_name


def poll_line(elapsed_s: float, checks: Sequence[GpuCheck]) -> str:
    """What one poll saw, one line, escaped: a UUID or a reason that names a newline forges no line."""
    return escape(f"preflight: {elapsed_s:.1f} s: {_seen(checks)}", POLL_LINE_LIMIT)


def _seen(checks: Sequence[GpuCheck]) -> str:
    return "; ".join(f"{c.label}: {c.state}, {c.verdict.reason}" for c in checks)


class PollLog:
    """The poll lines, bounded: a poll that saw what the last line shown said is shown again only
    LOG_EVERY_S after it (at the default 2 s interval every poll is shown), and no more than
    POLL_LOG_LIMIT bytes of them are printed in all."""

    def __init__(self, progress: Callable[[str], None]) -> None:
        self._progress = progress
        self._last: tuple[str, float] | None = None
        self._bytes = 0
        self._cut = False

    def poll(self, elapsed_s: float, checks: Sequence[GpuCheck]) -> None:
        seen = _seen(checks)
        if self._cut or (self._last is not None and self._last[0] == seen and elapsed_s - self._last[1] < LOG_EVERY_S):
            return
        line = poll_line(elapsed_s, checks)
        if self._bytes + len(line) + 1 > POLL_LOG_LIMIT:
            self._cut = True
            self._progress(f"preflight: {elapsed_s:.1f} s: {POLL_LOG_LIMIT} bytes of polls shown, the rest are not")
            return
        self._bytes += len(line) + 1
        self._last = (seen, elapsed_s)
        self._progress(line)


def read_within(read: Callable[[], GpuSnapshot], timeout_s: float) -> GpuSnapshot:
    """``read()``, or an unavailable snapshot when it has not returned within ``timeout_s``: NVML can
    hang (a GPU falling off the bus), and the gate must still end. The read runs in a daemon thread,
    which a hung call leaves behind: the gate exits without it."""
    box: list[GpuSnapshot] = []
    done = threading.Event()

    def run() -> None:
        try:
            box.append(read())
        finally:
            done.set()

    threading.Thread(target=run, name="preflight-read", daemon=True).start()
    if not done.wait(max(timeout_s, 0.0)):
        return GpuSnapshot(available=False, reason=f"NVML did not answer within {timeout_s:.1f} s")
    return box[0] if box else GpuSnapshot(available=False, reason="NVML read ended without a snapshot")


def run_preflight(
    read: Callable[[], GpuSnapshot],
    options: Options,
    *,
    progress: Callable[[str], None],
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    within: Callable[[Callable[[], GpuSnapshot], float], GpuSnapshot] = read_within,
) -> Outcome:
    """Poll until every GPU is clean or the ``options.wait_s`` deadline (on ``clock``, monotonic) has
    passed, one poll at least; a read in flight at the deadline is given READ_GRACE_S more. Polls
    are on a grid of ``options.interval_s`` (at least MIN_INTERVAL_S) from the start: a slow read
    skips the grid points it overran instead of polling at once to catch up. SIGTERM or SIGINT
    (Stopped, KeyboardInterrupt) ends it with a ``stopped`` outcome."""
    start = clock()
    deadline = start + options.wait_s
    interval = max(options.interval_s, MIN_INTERVAL_S)
    log = PollLog(progress)
    polls, elapsed, step = 0, 0.0, 0
    checks: tuple[GpuCheck, ...] = ()
    try:
        while True:
            snapshot = within(read, max(deadline - clock(), 0.0) + READ_GRACE_S)
            checks = checks_of(snapshot, options.tolerance_bytes, options.baseline_bytes)
            polls += 1
            elapsed = clock() - start
            log.poll(elapsed, checks)
            if all(c.verdict.clean for c in checks):
                return Outcome(CLEAN, ExitStatus.OK, polls, round(elapsed, 3), checks, None)
            step = max(step + 1, int(elapsed / interval) + 1)  # the next grid point after now
            next_at = step * interval
            if next_at > options.wait_s:
                break
            sleep(max(0.0, start + next_at - clock()))
    except (Stopped, KeyboardInterrupt) as exc:
        name = exc.signal_name if isinstance(exc, Stopped) else "SIGINT"
        elapsed = clock() - start
        message = stopped_message(name, checks, elapsed)
        return Outcome(STOPPED, ExitStatus.INTERRUPTED, polls, round(elapsed, 3), checks, message)
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
    elif worst.processes > 0:
        cause = "a process this container can see holds it (from a pod: one of the pod's own, started before the gate)"
        fix = f"look at this pod's init containers and sidecars; `gpuzombie trace` on {node} names the holder"
    else:
        cause = "likely a stale holder of a deleted pod (or a foreign or D-state process) on the node"
        fix = f"run `gpuzombie reap` on {node} (alerts {ALERTS})"
    return escape(f"gpuzombie preflight: {held}{more}; {cause}; fix: {fix}", MESSAGE_LIMIT)


def stopped_message(signal_name: str, checks: Sequence[GpuCheck], elapsed_s: float | None) -> str:
    """The termination message of a gate stopped by a signal before every GPU was clean (``elapsed_s``
    None: outside its polls)."""
    bad = [c for c in checks if c.state != CLEAN]
    if elapsed_s is None:
        return escape(f"gpuzombie preflight: stopped by {signal_name}; the pod's workload did not start", MESSAGE_LIMIT)
    if not bad:
        seen = "before its first poll ended"
    else:
        worst = max(bad, key=lambda c: (c.state == DIRTY, c.verdict.held_bytes))
        more = f" (+{len(bad) - 1} more not clean)" if len(bad) > 1 else ""
        seen = f"while {worst.label} was {worst.state}: {worst.verdict.reason}{more}"
    text = f"gpuzombie preflight: stopped by {signal_name} after {elapsed_s:.0f} s, {seen}; the pod's workload did not start"
    return escape(text, MESSAGE_LIMIT)


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
            "used_mib": _mib_or_none(c.used_bytes),
            "reserved_mib": _mib_or_none(c.reserved_bytes),
            "processes": c.processes if c.processes >= 0 else None,
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
        allow_nan=False,  # JSON has no NaN: one reaching here is a bug, said as one (internal error)
    )


def _mib_or_none(value: object) -> float | None:
    """A byte count in MiB; None (JSON null) for a value that is none (a NaN, a string, -1)."""
    count = byte_count(value)
    return None if count is None else round(count / MIB, 1)


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
            return GpuSnapshot(available=False, reason=why[:REASON_LIMIT])


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
        "--termination-log), 2 usage or internal error, 130 stopped by SIGTERM or SIGINT (the message written).",
        epilog="This help is argparse's, not click's as the other commands' are: the gate runs in the init "
        "container the webhook injects as `python3 -S -I /opt/gpuzombie/preflight.pyz`, with the standard "
        "library only (no click in a user's image), and `gpuzombie preflight` is the same parser "
        "(docs/handover.md).",
    )
    ap.add_argument(
        "--wait",
        type=_seconds,
        default=DEFAULT_WAIT_S,
        metavar="S",
        help=f"poll until S seconds have passed (default 60; a read begun by then may take {READ_GRACE_S:.0f} s more)",
    )
    ap.add_argument(
        "--interval",
        type=_seconds,
        default=DEFAULT_INTERVAL_S,
        metavar="S",
        help=f"between polls (default 2; at least {MIN_INTERVAL_S})",
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
    ap.add_argument(
        "--json",
        action="store_true",
        help=f"the result as JSON on stdout, schema {SCHEMA} (docs/handover.md); the polls on stderr",
    )
    ap.add_argument(
        "--nvml-standin",
        metavar="FILE",
        help="lab and tests only: a recorded GPU snapshot (JSON), re-read at each poll, instead of NVML",
    )
    return ap


@contextmanager
def stopped_by_signals() -> Iterator[None]:
    """While the gate waits, SIGTERM raises Stopped (once: a second one is ignored while the gate
    writes why it stopped), so that it ends with its message instead of dying by the signal. Only
    in the main thread (elsewhere Python gives no signal handler); the old handler is put back."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    taken: list[int] = []

    def handler(signum: int, frame: FrameType | None) -> None:
        if not taken:
            taken.append(signum)
            raise Stopped(signal.Signals(signum).name)

    previous = signal.signal(signal.SIGTERM, handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def main(argv: Sequence[str] | None = None, *, prog: str = "gpuzombie preflight", out: TextIO | None = None) -> int:
    """The gate's entry point (the click command's and the zipapp's): an exit code and never a
    traceback; an internal error is one line (and the termination message) and exit 2, fail-closed."""
    out = out or sys.stdout
    err = sys.stderr
    try:
        args = build_parser(prog).parse_args(argv)
    except UsageError as exc:
        print(escape(f"gpuzombie: usage error: {exc} (see '{prog} --help')", MESSAGE_LIMIT), file=err)
        return ExitStatus.ERROR
    if args.interval <= 0:
        print(f"gpuzombie: usage error: --interval must be above 0 (see '{prog} --help')", file=err)
        return ExitStatus.ERROR
    with stopped_by_signals():
        try:
            return _gate(args, out, err)
        except (Stopped, KeyboardInterrupt) as exc:  # before the first poll, or while the outcome is written
            name = exc.signal_name if isinstance(exc, Stopped) else "SIGINT"
            message = stopped_message(name, (), None)
            print(message, file=out, flush=True)
            if args.termination_log:
                write_termination_message(args.termination_log, message)
            return ExitStatus.INTERRUPTED
        except Exception as exc:  # noqa: BLE001 - the last line of defence, as gpuzombie.cli.main has it
            if os.environ.get("GPUZOMBIE_DEBUG"):
                import traceback  # only here: 2 ms of the gate's start-up otherwise

                traceback.print_exc()
            what = f"{type(exc).__name__}: {exc}"
            line = f"gpuzombie: internal error: {what} (set GPUZOMBIE_DEBUG=1 for details)"
            print(escape(line, MESSAGE_LIMIT), file=err, flush=True)
            if args.termination_log:
                message = f"gpuzombie preflight: internal error ({what}); the gate fails closed"
                write_termination_message(args.termination_log, escape(message, MESSAGE_LIMIT))
            return ExitStatus.ERROR


def _gate(args: Any, out: TextIO, err: TextIO) -> int:
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

    outcome = run_preflight(lambda: read_gpus(backend), options, progress=progress)
    written = None
    if outcome.message is not None and args.termination_log:
        why_not = write_termination_message(args.termination_log, outcome.message)
        written = None if why_not else args.termination_log
        if why_not:
            print(escape(f"preflight: termination message not written: {why_not}", MESSAGE_LIMIT), file=err)
    if args.json:
        print(outcome_json(outcome, written), file=out, flush=True)
    elif outcome.message is not None:
        print(outcome.message, file=out, flush=True)
    else:
        print(f"preflight: clean after {outcome.polls} poll(s), {outcome.waited_s:.2f} s", file=out, flush=True)
    return outcome.exit_status


if __name__ == "__main__":
    sys.exit(main())
