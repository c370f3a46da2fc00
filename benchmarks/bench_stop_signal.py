"""How long after SIGTERM `gpuzombie exporter` and `gpuzombie webhook` stop (the kubelet's grace period
is counting): real processes, started, served once, then signalled, repeated.

    python3 benchmarks/bench_stop_signal.py [--runs 10] [--src DIR] [--json]

Two ways the signal arrives: ``process`` (``kill``: the kernel picks a thread, usually the main one)
and ``thread`` (``tgkill`` to a server thread, as happens on a busy node: then CPython's C handler
only notes it, and a main thread asleep in a timed wait runs the Python handler at its timeout). Each
run is timed from the signal to the process's exit (interpreter shutdown included). Last,
``Server.stop()`` alone, in this process, at a random moment after its start. ``--src`` runs
another checkout's sources (the before figures).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import random
import re
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "tests")]

from fakeproc import make_fake_proc, make_fake_root
from pki import make_pki

SYS_TGKILL = {"x86_64": 234, "aarch64": 131}[os.uname().machine]
GIVE_UP_S = 40.0
"""Past the webhook's 30 s tick: a stop that waits for it still counts, one that never comes does not."""


def tgkill(pid: int, tid: int, signum: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.syscall(SYS_TGKILL, pid, tid, signum) != 0:
        raise OSError(ctypes.get_errno(), f"tgkill {pid} {tid}")


def _commands(work: Path) -> dict[str, tuple[list[str], str]]:
    """argv and the URL pattern of its first 'serving' line, per server."""
    root = work / "proc"
    if not root.exists():
        root.mkdir()
        make_fake_root(root)
        make_fake_proc(root, 1, ppid=0, comm="sleep")
        make_pki(work)
    gz = [sys.executable, "-m", "gpuzombie"]
    exporter = ["exporter", "--listen", "127.0.0.1:0", "--min-interval", "0", "--procfs", str(root)]
    webhook = ["webhook", "--listen", "127.0.0.1:0", "--tls-cert", str(work / "server.pem")]
    return {
        "exporter": ([*gz, *exporter, "--cri-socket", str(work / "none.sock")], r"http://127\.0\.0\.1:(\d+)/metrics"),
        "webhook": ([*gz, *webhook, "--tls-key", str(work / "server.key")], r"https://127\.0\.0\.1:(\d+)/mutate"),
    }


def one_stop(argv: list[str], pattern: str, src: str, how: str, log: Path) -> float | None:
    """Seconds from the signal to the exit; None past GIVE_UP_S."""
    with open(log, "w") as err:
        proc = subprocess.Popen(argv, env={**os.environ, "PYTHONPATH": src}, stderr=err, stdin=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while (found := re.search(pattern, log.read_text())) is None:
            if time.monotonic() > deadline or proc.poll() is not None:
                raise RuntimeError(log.read_text())
            time.sleep(0.05)
        if "exporter" in argv:  # served once: its threads exist and the main thread is in its wait
            urllib.request.urlopen(f"http://127.0.0.1:{found[1]}/healthz", timeout=30).close()
        time.sleep(random.uniform(0.3, 1.3))  # any phase of the server's loop, as a real SIGTERM finds it
        threads = sorted(int(t) for t in os.listdir(f"/proc/{proc.pid}/task") if int(t) != proc.pid)
        start = time.monotonic()
        if how == "thread":
            tgkill(proc.pid, threads[0], signal.SIGTERM)
        else:
            proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=GIVE_UP_S)
        except subprocess.TimeoutExpired:
            return None
        return time.monotonic() - start
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def server_stop_seconds(src: str, runs: int) -> list[float]:
    """In this process: ``Server.stop()`` alone (no interpreter exit), at a random moment after start."""
    sys.path.insert(0, src)
    from gpuzombie.serving import Server, parse_listen

    times = []
    for _ in range(runs):
        server = Server({}, listen=parse_listen("127.0.0.1:0"))
        server.start()
        time.sleep(random.uniform(0.1, 0.6))
        start = time.monotonic()
        server.stop()
        times.append(time.monotonic() - start)
    return times


def _row(runs: int, times: list[float | None]) -> dict[str, object]:
    done = [t for t in times if t is not None]
    return {
        "runs": runs,
        "gave_up": runs - len(done),
        "min_s": round(min(done), 3) if done else None,
        "median_s": round(statistics.median(done), 3) if done else None,
        "max_s": round(max(done), 3) if done else None,
    }


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", type=int, default=10)
    ap.add_argument("--thread-runs", type=int, default=3, help="runs of the tgkill case (a 30 s tick each, before)")
    ap.add_argument("--src", default=str(REPO / "src"))
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    out: dict[str, dict[str, object]] = {}
    with tempfile.TemporaryDirectory(prefix="bench-stop-") as tmp:
        work = Path(tmp)
        for name, (argv, pattern) in _commands(work).items():
            for how, runs in (("process", args.runs), ("thread", args.thread_runs)):
                times = [one_stop(argv, pattern, args.src, how, work / "log") for _ in range(runs)]
                row = _row(runs, times)
                out[f"{name}/{how}"] = row
                if not args.json:
                    print(f"{name:8} SIGTERM to {how:7}: {row}", flush=True)
    out["Server.stop"] = _row(args.runs, list(server_stop_seconds(args.src, args.runs)))
    if not args.json:
        print(f"Server.stop() in-process: {out['Server.stop']}")
    if args.json:
        print(json.dumps(out, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
