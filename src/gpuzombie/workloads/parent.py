"""The original experiment's ``parent.py``: spawn N workers and exit without ``wait()``, leaving them orphans.

    python3 -m gpuzombie.workloads.parent [--workers N] [--size-mib M] [--device ...]
        [--backend ...] [--fixed] [--uid U]

It waits until every worker has printed its ``ready`` line (so the memory is held when it
exits), repeats those lines, prints ``parent exiting pid=...`` and leaves with ``os._exit`` so no
child is waited for. ``--uid`` runs the workers as that user (the original experiment's non-root UID 1000 case).
"""

from __future__ import annotations

import argparse
import os
import select
import subprocess
import sys
import time

from gpuzombie.workloads.memory import BACKENDS, DEVICES
from gpuzombie.workloads.worker import DEFAULT_SIZE_MIB

READY_TIMEOUT_S = 180.0


def worker_command(args: argparse.Namespace) -> list[str]:
    module = "gpuzombie.workloads.worker_fixed" if args.fixed else "gpuzombie.workloads.worker"
    return [
        sys.executable,
        "-m",
        module,
        "--size-mib",
        str(args.size_mib),
        "--device",
        args.device,
        "--backend",
        args.backend,
        "--gpu-index",
        str(args.gpu_index),
    ]


def ready_line(child: subprocess.Popen[str], deadline: float) -> str:
    """The worker's ``ready`` line once it holds its memory, or an ``error`` line when it exits
    first or is not ready by ``deadline`` (a blocking readline alone would wait forever)."""
    assert child.stdout is not None
    if not select.select([child.stdout], [], [], max(0.0, deadline - time.monotonic()))[0]:
        return f"error pid={child.pid} not ready after {READY_TIMEOUT_S:g} s"
    return child.stdout.readline().strip() or f"error pid={child.pid} exited before ready"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gpuzombie.workloads.parent", description=__doc__.split("\n")[0])
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--size-mib", type=int, default=DEFAULT_SIZE_MIB)
    parser.add_argument("--device", choices=DEVICES, default="auto")
    parser.add_argument("--backend", choices=BACKENDS, default="auto")
    parser.add_argument("--gpu-index", type=int, default=0)
    parser.add_argument("--fixed", action="store_true", help="spawn worker_fixed (SIGTERM handler)")
    parser.add_argument("--uid", type=int, default=None, help="run the workers as this uid")
    args = parser.parse_args(argv)

    children = []
    for _ in range(args.workers):
        try:
            children.append(
                subprocess.Popen(worker_command(args), stdout=subprocess.PIPE, text=True, user=args.uid, close_fds=True)
            )
        except OSError as exc:  # e.g. --uid 1000 cannot read this Python or its PYTHONPATH
            who = f" as uid {args.uid}" if args.uid is not None else ""
            print(f"error pid={os.getpid()} cannot start a worker{who}: {exc}", flush=True)
            os._exit(2)
    print(
        f"parent pid={os.getpid()} spawned {len(children)} worker(s): " + " ".join(str(c.pid) for c in children),
        flush=True,
    )
    deadline = time.monotonic() + READY_TIMEOUT_S
    status = 0
    for child in children:
        line = ready_line(child, deadline)
        print(line, flush=True)
        if not line.startswith("ready"):
            status = 1
    print(f"parent exiting pid={os.getpid()} without wait()", flush=True)
    os._exit(status)  # the bug: no wait(), the workers become orphans


if __name__ == "__main__":
    sys.exit(main())
