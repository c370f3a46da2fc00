"""prestop vs the seed's prestop.sh loop: time from the hook's start until every worker is gone.

    python3 benchmarks/bench_prestop.py [--workers 10] [--runs 3]

Runs as PID 1 of a fresh PID namespace (it re-executes itself under ``unshare``; root needed), with
a reaper thread as tini would have. Each run, a parent spawns N orphaned workers that exit on
SIGTERM (scenario 4's handler: 0.1 s of cleanup), then:

* ours: ``gpuzombie.prestop.run_prestop(timeout=20)`` — SIGTERM through pidfds, then woken by the
  pidfds the moment the last worker exits;
* seed: ``prestop.sh``'s shape — ``kill -TERM``, then check once a second for up to 20 s
  (``kill -0`` + state), then ``kill -KILL``.

Prints the median of R runs: ours, the seed's, and the ratio.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import threading
import time

WORKER = (
    "import os, signal, time\n"
    "def stop(*_):\n    time.sleep(0.1)\n    os._exit(0)\n"
    "signal.signal(signal.SIGTERM, stop)\nprint('ready', flush=True)\n"
    "while True:\n    time.sleep(1)\n"
)
PARENT = (
    "import json, subprocess, sys\n"
    "ps = [subprocess.Popen([sys.executable, '-c', sys.argv[1]], stdout=subprocess.PIPE) "
    "for _ in range(int(sys.argv[2]))]\n"
    "[p.stdout.readline() for p in ps]\nprint(json.dumps([p.pid for p in ps]), flush=True)\n"
)
SEED_LOOP = """
kill -TERM $PIDS 2>/dev/null
for i in $(seq 20); do
  alive=""
  for p in $PIDS; do
    if kill -0 "$p" 2>/dev/null && [ "$(cut -d' ' -f3 /proc/$p/stat 2>/dev/null)" != Z ]; then alive="$alive $p"; fi
  done
  [ -z "$alive" ] && break
  sleep 1
done
[ -n "$alive" ] && kill -KILL $alive 2>/dev/null
exit 0
"""


def spawn_orphans(n: int) -> list[int]:
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT, WORKER, str(n)], stdout=subprocess.PIPE, start_new_session=True
    )
    pids = json.loads(parent.stdout.readline())  # type: ignore[union-attr]
    parent.wait()
    return pids


def reaper() -> None:
    """PID 1's duty (tini's): reap every orphan that exits."""
    while True:
        try:
            os.waitpid(-1, 0)
        except ChildProcessError:
            time.sleep(0.01)


def inside(workers: int, runs: int) -> None:
    from gpuzombie.prestop import run_prestop
    from gpuzombie.proc import Procfs

    threading.Thread(target=reaper, daemon=True).start()
    ours, seed = [], []
    for _ in range(runs):
        spawn_orphans(workers)
        t0 = time.monotonic()
        report = run_prestop(procfs=Procfs("/proc"), timeout=20)
        ours.append(time.monotonic() - t0)
        assert report.survivors == 0 and len(report.results) == workers, report
        pids = spawn_orphans(workers)
        t0 = time.monotonic()
        subprocess.run(["sh", "-c", SEED_LOOP], env={**os.environ, "PIDS": " ".join(map(str, pids))}, check=True)
        seed.append(time.monotonic() - t0)
    o, s = statistics.median(ours), statistics.median(seed)
    print(f"{'what':<52}{'ours (s)':>10}{'seed (s)':>10}{'ratio':>8}")
    print(f"{f'stop {workers} SIGTERM-handling workers (median of {runs})':<52}{o:>10.3f}{s:>10.3f}{s / o:>7.1f}x")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--workers", type=int, default=10)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--inside", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.inside:
        inside(args.workers, args.runs)
        return 0
    src = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "src")
    env = {**os.environ, "PYTHONPATH": src + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return subprocess.run(
        [
            "unshare",
            "--pid",
            "--fork",
            "--mount-proc",
            "--kill-child",
            sys.executable,
            os.path.abspath(__file__),
            "--inside",
            "--workers",
            str(args.workers),
            "--runs",
            str(args.runs),
        ],
        env=env,
    ).returncode


if __name__ == "__main__":
    sys.exit(main())
