"""The original experiment's ``gpu_worker.py``: hold memory and ignore SIGTERM (the bug scenarios 1-3 reproduce).

    python3 -m gpuzombie.workloads.worker [--size-mib M] [--device auto|cuda|cpu] [--backend ...]

Prints one line ``ready pid=... backend=... bytes=... label=...`` once the memory is held, then
sleeps until killed. SIGTERM is set to SIG_IGN, so only SIGKILL ends it.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys

from gpuzombie.workloads.memory import (
    BACKENDS,
    DEVICES,
    Holding,
    MemoryBackendError,
    hold,
)

DEFAULT_SIZE_MIB = 2048


def build_parser(prog: str, description: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=prog, description=description)
    parser.add_argument("--size-mib", type=int, default=DEFAULT_SIZE_MIB, help="memory to hold")
    parser.add_argument("--device", choices=DEVICES, default="auto")
    parser.add_argument("--backend", choices=BACKENDS, default="auto")
    parser.add_argument("--gpu-index", type=int, default=0)
    return parser


def start_holding(argv: list[str] | None, prog: str, description: str) -> Holding:
    """Parse the common options, hold the memory, and print the one ``ready`` line."""
    args = build_parser(prog, description).parse_args(argv)
    try:
        holding = hold(args.size_mib, device=args.device, backend=args.backend, gpu_index=args.gpu_index)
    except MemoryBackendError as exc:
        print(f"error pid={os.getpid()} {exc}", flush=True)
        raise SystemExit(2) from exc
    say(
        f"ready pid={os.getpid()} backend={holding.backend} device={holding.device} "
        f"bytes={holding.size_bytes} label={holding.label!r}"
    )
    return holding


def say(line: str) -> None:
    """Print one line; the reader (the parent) may be gone by then, which is not an error."""
    try:
        print(line, flush=True)
    except OSError:  # BrokenPipeError among them
        pass


def main(argv: list[str] | None = None) -> int:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # the bug: SIGTERM does nothing
    holding = start_holding(argv, "gpuzombie.workloads.worker", "Hold memory; ignore SIGTERM.")
    while not holding.released:
        signal.pause()
    return 0


if __name__ == "__main__":
    sys.exit(main())
