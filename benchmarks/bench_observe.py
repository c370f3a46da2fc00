"""observe over thousands of live processes vs the seed's observe.sh, and the CLI's start-up.

    python3 benchmarks/bench_observe.py [--processes 5000] [--runs 3] [--startup-only]

Spawns N sleeping processes (posix_spawn of /bin/sleep, a few holding stand-in GPU device files
open), then times, median of R runs taken in turns, side by side:

* ours: ``gpuzombie.observe.observe()`` — a full snapshot of every process (stat, status, cmdline,
  pid namespace, every fd's target) and the whole judgement, plus its JSON form; without NVML, and
  with the real NVML where there is one; and the CLI end to end (``python3 -m gpuzombie observe
  --json``, interpreter start and NVML included);
* the seed's shell, two ways: ``ps`` + ``fuser`` only (its process side), and its complete
  observe.sh, eight checks with their two ``nvidia-smi`` queries. The complete script needs
  nvidia-smi: without it (a CPU machine) that row is skipped and says so; run it on a GPU machine.

Then the start-up of every CLI command: the interpreter alone, the import of each command's module
(a timer in a fresh interpreter, and which heavy libraries it pulled in), and ``--help`` end to end.

Without /dev/nvidia* (no GPU here) both sides look for stand-in files in a temp dir instead (fuser on
a glob that matches nothing would return at once and prove nothing). Every spawned pid is killed
and reaped by pid at the end.
"""

from __future__ import annotations

import argparse
import glob
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

from gpuzombie.cli.main import COMMAND_MODULES
from gpuzombie.gpu.nvml import NO_GPU, FakeNvml, PynvmlBackend
from gpuzombie.observe import ObserveReport, observe
from gpuzombie.proc.procfs import NVIDIA_DEVICE_PREFIX, Procfs

SLEEP = "/bin/sleep"
MARK = "==fuser=="
# The seed's observe.sh: its eight checks in the order its README lists them, with the tools it names
# (the seed's text names the checks and tools, not the script body). Each tool runs once and checks
# that need the same output share it, so this is the cheapest faithful version.
SEED_OBSERVE_SH = r"""
echo "[1] PID 1"; tr '\0' ' ' < /proc/1/cmdline; echo
echo "[2] process tree"; ps auxf
PS=$(ps -eo pid,ppid,stat,user,cmd)
echo "[3] zombies (STAT=Z)"; echo "$PS" | awk '$3 ~ /^Z/'
echo "[4] orphans (PPID=1)"; echo "$PS" | awk '$2 == 1'
echo "[5] GPU memory"; nvidia-smi --query-gpu=index,name,memory.used,memory.total --format=csv
echo "[6] GPU processes"
APPS=$(nvidia-smi --query-compute-apps=pid,process_name,used_memory --format=csv,noheader); echo "$APPS"
echo "[7] /dev/nvidia* holders"; HOLDERS=$(fuser -v PREFIX* 2>&1); echo "$HOLDERS"
echo "[8] orphaned GPU contexts (nvidia-smi, fuser, /proc)"
for pid in $(echo "$APPS" | cut -d, -f1); do
  [ -d "/proc/$pid" ] || echo "ORPHANED $pid: listed by nvidia-smi, not in /proc"
  echo "$HOLDERS" | grep -qw "$pid" || echo "$pid: listed by nvidia-smi, holds no /dev/nvidia* fd here"
done
"""
HEAVY = ("rich", "matplotlib", "prometheus_client", "torch", "numpy", "grpc", "yaml")
IMPORT_PROBE = (
    "import sys, time; t = time.perf_counter(); import {module}; t = time.perf_counter() - t; "
    "print(t, *[m for m in {heavy!r} if m in sys.modules])"
)


def device_files() -> tuple[str, list[str]]:
    """The real /dev/nvidia* nodes, or stand-in files in a temp dir when there are none."""
    real = sorted(glob.glob(NVIDIA_DEVICE_PREFIX + "*"))
    if real:
        return NVIDIA_DEVICE_PREFIX, real
    folder = tempfile.mkdtemp(prefix="gz-bench-dev-")
    paths = [os.path.join(folder, name) for name in ("nvidia0", "nvidiactl", "nvidia-uvm")]
    for path in paths:
        open(path, "w").close()
    return os.path.join(folder, "nvidia"), paths


def spawn_sleepers(count: int, holders: int, devices: list[str]) -> list[int]:
    """``count`` sleeping processes; the first ``holders`` keep the device files open (fd 3+)."""
    pids = []
    for i in range(count):
        actions = (
            [(os.POSIX_SPAWN_OPEN, 3 + j, path, os.O_RDONLY, 0) for j, path in enumerate(devices)]
            if i < holders
            else []
        )
        pids.append(os.posix_spawn(SLEEP, ["sleep", "3600"], os.environ, file_actions=actions))
    return pids


def reap(pids: list[int]) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    for pid in pids:
        try:
            os.waitpid(pid, 0)
        except ChildProcessError:
            pass


def interleaved_medians(fns: list, runs: int) -> list[tuple[float, object]]:
    """Run the contenders in turns (a, b, c, a, b, c, ...) so that load from other work on the
    machine falls on all of them alike; the median time of each, and its last result."""
    times: list[list[float]] = [[] for _ in fns]
    results: list[object] = [None] * len(fns)
    for _ in range(runs):
        for i, fn in enumerate(fns):
            start = time.perf_counter()
            results[i] = fn()
            times[i].append(time.perf_counter() - start)
    return [(statistics.median(t), r) for t, r in zip(times, results, strict=True)]


def ratio(seed_s: float, ours_s: float) -> str:
    return f"{seed_s / ours_s:.2f}x faster" if ours_s < seed_s else f"{ours_s / seed_s:.2f}x slower"


def import_time(module: str, runs: int) -> tuple[float, list[str]]:
    """Median seconds to import ``module`` in a fresh interpreter, and the heavy libraries it loaded."""
    times, heavy = [], []
    for _ in range(runs):
        probe = IMPORT_PROBE.format(module=module, heavy=HEAVY)
        out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout.split()
        times.append(float(out[0]))
        heavy = out[1:]
    return statistics.median(times), heavy


def wall_time(argv: list[str], runs: int) -> float:
    """Median wall seconds of a fresh process (its output discarded)."""
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        subprocess.run(argv, capture_output=True, check=False)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def print_startup(runs: int) -> None:
    """The interpreter, each command's import and its ``--help`` end to end, in fresh processes."""
    python = [sys.executable]
    print(f"\n## CLI start-up (fresh processes, median of {runs})\n")
    print(f"interpreter alone (`python3 -c pass`): {wall_time([*python, '-c', 'pass'], runs) * 1000:.0f} ms")
    main_s, main_heavy = import_time("gpuzombie.cli.main", runs)
    print(f"`import gpuzombie.cli.main` (click, the group): {main_s * 1000:.0f} ms {' '.join(main_heavy)}\n")
    print("| command | import of its module (ms) | heavy libraries imported | `--help` end to end (ms) |")
    print("|---|---:|---|---:|")
    for name in COMMAND_MODULES:
        seconds, heavy = import_time(f"gpuzombie.cli.{name}", runs)
        help_s = wall_time([*python, "-m", "gpuzombie", name, "--help"], runs)
        print(f"| `gpuzombie {name}` | {seconds * 1000:.0f} | {', '.join(heavy) or 'none'} | {help_s * 1000:.0f} |")
    seconds, heavy = import_time("gpuzombie.prestop", runs)
    help_s = wall_time([*python, "-m", "gpuzombie.prestop", "--help"], runs)
    print(
        f"| `python3 -m gpuzombie.prestop` (the hook) | {seconds * 1000:.0f} | {', '.join(heavy) or 'none'} | {help_s * 1000:.0f} |"
    )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--processes", type=int, default=5000)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--holders", type=int, default=4, help="sleepers that hold the device files")
    ap.add_argument("--startup-runs", type=int, default=5, help="runs of each start-up measurement")
    ap.add_argument("--startup-only", action="store_true", help="only the CLI start-up part")
    args = ap.parse_args()

    print(
        f"# machine: {platform.node()} {platform.machine()}, {os.cpu_count()} cores, Python "
        f"{platform.python_version()}, load average {os.getloadavg()[0]:.1f} (other work on the machine), "
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}"
    )
    if not args.startup_only:
        bench_observe(args)
    print_startup(args.startup_runs)


def bench_observe(args: argparse.Namespace) -> None:
    """observe (library and CLI) against the seed's shell, over ``args.processes`` live sleepers."""
    nvml_here = PynvmlBackend().read().available
    smi = shutil.which("nvidia-smi")
    prefix, devices = device_files()
    stand_in = prefix != NVIDIA_DEVICE_PREFIX
    t0 = time.perf_counter()
    pids = spawn_sleepers(args.processes, args.holders, devices)
    spawn_s = time.perf_counter() - t0
    try:
        procfs = Procfs("/proc", device_prefix=prefix)

        def ours():
            report = observe(procfs, FakeNvml(NO_GPU))
            report.to_dict()
            return report

        def ours_nvml():  # a fresh backend each run: nvmlInit included, as in the CLI and nvidia-smi
            report = observe(procfs, PynvmlBackend())
            report.to_dict()
            return report

        def cli():
            return subprocess.run(
                [sys.executable, "-m", "gpuzombie", "observe", "--json"], capture_output=True
            ).returncode

        shell_cmd = f"ps -eo pid,ppid,stat,user,cmd; echo {MARK}; fuser -v {prefix}*"
        full_script = SEED_OBSERVE_SH.replace("PREFIX", prefix)

        def seed():
            return subprocess.run(["sh", "-c", shell_cmd], capture_output=True, text=True)

        def seed_full():
            return subprocess.run(["sh", "-c", full_script], capture_output=True, text=True)

        contenders = [ours, seed, cli] + ([ours_nvml] if nvml_here else []) + ([seed_full] if smi else [])
        timed = interleaved_medians(contenders, args.runs)
        (ours_s, report), (seed_s, shell), (cli_s, _) = timed[:3]
        rest = dict(zip(contenders[3:], timed[3:]))
        assert isinstance(report, ObserveReport) and isinstance(shell, subprocess.CompletedProcess)
    finally:
        reap(pids)
        if stand_in:  # the temp dir of stand-in device files, left behind by every run before
            shutil.rmtree(os.path.dirname(prefix), ignore_errors=True)

    # fuser -v writes the table to stderr and, when stdout is a pipe, the pids to stdout
    fuser_holders = len(set(shell.stdout.split(f"\n{MARK}\n", 1)[-1].split()))
    ours_holders = len(report.attribution.fd_holders)
    print(
        f"# bench_observe: {args.processes} sleeping processes (spawned in {spawn_s:.1f} s), "
        f"{report.view.processes_seen} processes seen in total, median of {args.runs} interleaved runs"
    )
    if stand_in:
        print(f"# no /dev/nvidia* here: both sides look for stand-in files {prefix}*")
    print(f"# /dev/nvidia* holders found: ours {ours_holders}, fuser {fuser_holders} (expected {args.holders})")
    print()
    print("| what | time (s) | vs seed's ps + fuser |")
    print("|---|---:|---:|")
    print(
        f"| ours: observe() library, no NVML, full snapshot incl. fds + JSON | {ours_s:.3f} | {ratio(seed_s, ours_s)} |"
    )
    if ours_nvml in rest:
        nvml_s = rest[ours_nvml][0]
        print(f"| ours: observe() library with NVML (nvmlInit each run) | {nvml_s:.3f} | {ratio(seed_s, nvml_s)} |")
    else:
        print("| ours: observe() library with NVML | skipped: no NVML here | |")
    print(f"| seed: `{shell_cmd.replace(f'echo {MARK}; ', '')}` (its process side only) | {seed_s:.3f} | 1.0x |")
    print(
        f"| ours: `python3 -m gpuzombie observe --json` (CLI: interpreter start, NVML incl.) | {cli_s:.3f} | "
        f"{ratio(seed_s, cli_s)} |"
    )
    if seed_full in rest:
        full_s = rest[seed_full][0]
        print(
            f"| seed: complete observe.sh, 8 checks incl. 2 nvidia-smi queries | {full_s:.3f} | {ratio(seed_s, full_s)} |"
        )
        print(f"\nCLI vs the complete observe.sh: {ratio(full_s, cli_s)} (goal: faster)")
    else:
        print(
            "| seed: complete observe.sh with its nvidia-smi calls | skipped: nvidia-smi not found "
            "(no GPU here); run this benchmark on the GPU machine | |"
        )
    goal = "met" if ours_s < seed_s and ours_s <= 0.5 else "NOT met"
    print(f"goal (library faster than ps + fuser and <= 0.5 s): {goal}")


if __name__ == "__main__":
    main()
