"""What the handover gate adds to a GPU pod's start on a clean GPU, beside the obvious shell
alternative, ``nvidia-smi`` asking the same questions (memory used and reserved, and the processes).

    python3 benchmarks/bench_preflight.py [--repeat 15] [--out DIR]

Each command is run as a fresh process (as an init container runs it), alternating, ``--repeat``
times after one untimed warm-up of each: the gate as the webhook injects it (``python3 -S -I
preflight.pyz --wait 0``, built here), the same with ``site`` (``python3 -I``: every .pth file of
the image run, as the zipapp did before it looked up site-packages itself), the gate through the
full CLI (``python3 -m gpuzombie preflight``), and ``nvidia-smi --query-gpu=memory.used,memory.reserved`` plus ``nvidia-smi
--query-compute-apps=pid,used_memory``. Prints each one's median and spread (min-max, and the
quartiles) and the ratio of the gate's median to nvidia-smi's; the goal on the H200 is ≤ 0.3 s.
Writes OUT/bench-preflight.json. The gate must say clean (exit 0) at every run: a dirty or
unreadable GPU stops the benchmark (it would time the wrong path).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))

from gpuzombie.prestop.zipapp import build

GOAL_S = 0.3
SMI_GPU = ["nvidia-smi", "--query-gpu=memory.used,memory.reserved", "--format=csv,noheader"]
SMI_APPS = ["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader"]


def timed(argv: list[str], env: dict[str, str]) -> tuple[float, subprocess.CompletedProcess[str]]:
    start = time.perf_counter()
    done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=120, check=False)
    return time.perf_counter() - start, done


def summary(values: list[float]) -> dict[str, float]:
    q = statistics.quantiles(values, n=4) if len(values) > 1 else [values[0]] * 3
    return {
        "n": len(values),
        "median_s": round(statistics.median(values), 4),
        "min_s": round(min(values), 4),
        "max_s": round(max(values), 4),
        "q1_s": round(q[0], 4),
        "q3_s": round(q[2], 4),
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeat", type=int, default=15)
    ap.add_argument("--out", type=Path, default=Path(tempfile.gettempdir()) / "bench-preflight")
    args = ap.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    archive = build(args.out / "preflight.pyz", app="preflight")
    src = str(Path(__file__).resolve().parent.parent / "src")
    env = {**os.environ, "PYTHONPATH": src + os.pathsep + os.environ.get("PYTHONPATH", "")}
    gate = ["--wait", "0", "--termination-log", ""]
    commands = {
        "preflight.pyz (python3 -S -I)": [[sys.executable, "-S", "-I", str(archive), *gate]],
        "preflight.pyz with site (python3 -I)": [[sys.executable, "-I", str(archive), *gate]],
        "gpuzombie preflight (full CLI)": [[sys.executable, "-m", "gpuzombie", "preflight", *gate]],
        "nvidia-smi (memory + processes)": [SMI_GPU, SMI_APPS],
    }
    times: dict[str, list[float]] = {name: [] for name in commands}
    outputs: dict[str, str] = {}
    for attempt in range(args.repeat + 1):  # the first round warms the page cache and the driver
        for name, argvs in commands.items():
            total = 0.0
            for command in argvs:
                seconds, done = timed(command, env)
                total += seconds
                if done.returncode != 0:
                    print(f"{name}: exit {done.returncode}: {(done.stdout + done.stderr).strip()[-400:]}")
                    return 1
                outputs[name] = (done.stdout + done.stderr).strip()[-400:]
            if attempt:
                times[name].append(total)
    result = {name: summary(values) for name, values in times.items()}
    fast, smi = result["preflight.pyz (python3 -S -I)"], result["nvidia-smi (memory + processes)"]
    ratio = fast["median_s"] / smi["median_s"]
    doc = {"command": " ".join(sys.argv), "results": result, "ratio_gate_to_smi": round(ratio, 3), "outputs": outputs}
    (args.out / "bench-preflight.json").write_text(json.dumps(doc, indent=1))
    for name, s in result.items():
        print(
            f"{name:34s} median {s['median_s']:.3f} s  (min {s['min_s']:.3f}, q1 {s['q1_s']:.3f}, "
            f"q3 {s['q3_s']:.3f}, max {s['max_s']:.3f}; n={s['n']})"
        )
    print(f"gate / nvidia-smi: {ratio:.2f}x; goal ≤ {GOAL_S} s: {'met' if fast['median_s'] <= GOAL_S else 'NOT met'}")
    print("last output of each:", json.dumps(outputs, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
