#!/usr/bin/env bash
# `gpuzombie top --once` on a real GPU with the lab's GPU pods running, from the repository root, as
# root (about 1 minute):   bash scripts/device/top_gpu.sh
# Needs what scripts/device/lab_runtimes.sh prepares (.debs: containerd, runc, catatonit; .whl: the
# CRI stubs), carried to the device. A private containerd runs keeper-0, trainer-0 (a torch worker
# in its cgroup, SIZE_MIB, default 2048) and orphans-0 (PID 1 sleep, two orphaned torch workers);
# top's frame is captured running and after trainer-0's removal (its worker STALE). With nvitop's
# wheel in .whl (pip download nvitop; its needs, nvidia-ml-py and psutil, are on the device), also
# benchmarks/bench_top.py beside nvitop, pinned to 2 cores (BENCH_CPUS=0,1; the issue's goal is for
# 2 cores; BENCH_CPUS= uses all), the fake node three times.
# Under $OUT: top-running.txt, top-stale.txt, bench-top-real.log (both tools on this node's /proc and
# NVML, the pods up), machine.txt, top-gpu.log, bench-top.log (the fake node of 110 pods), and
# top-json-and-workers.tgz (top-running.json, top-stale.json, summary.json, the workers' logs). DEVICE=cpu: a dry run without a GPU (stand-in /dev/nvidia0 holders).
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/top-gpu-out}
mkdir -p "$OUT"
# shellcheck source=scripts/device/lab_runtimes.sh
source scripts/device/lab_runtimes.sh  # its unpack: the carried containerd, runc, catatonit, CRI stubs
unpack || exit 2
if ls .whl/nvitop-*.whl >/dev/null 2>&1 && ! python3 -c 'import nvitop' 2>/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/nvitop-site .whl/nvitop-*.whl
  export PYTHONPATH="/tmp/nvitop-site${PYTHONPATH:+:$PYTHONPATH}"
fi
export PYTHONPATH="$PWD/src:$PWD/tests${PYTHONPATH:+:$PYTHONPATH}"
{
  date -u +"run at %Y-%m-%dT%H:%M:%SZ"
  git rev-parse HEAD 2>/dev/null | sed 's/^/commit /'
  nvidia-smi --query-gpu=index,name,driver_version,memory.used,memory.total --format=csv 2>&1
  python3 -c 'import sys, torch; print("python", sys.version.split()[0], "torch", torch.__version__)' 2>&1
  uname -r; nproc; uptime
  containerd --version
} | tee "$OUT/machine.txt"
PYTHONUNBUFFERED=1 timeout -s TERM -k 20 300 python3 scripts/device/top_gpu.py "$OUT" 2>&1 | tee "$OUT/top-gpu.log"
rc=${PIPESTATUS[0]}
{ echo "== after"; leftovers; } 2>&1 | tee -a "$OUT/top-gpu.log"
if [ "${BENCH:-1}" = 1 ]; then
  # The issue's goal is for 2 cores: the benchmarks run pinned to BENCH_CPUS (default 0,1; empty: all),
  # three times over the fake node for the spread between runs.
  export BENCH_CPUS=${BENCH_CPUS-0,1}
  pin=(); [ -n "$BENCH_CPUS" ] && pin=(taskset -c "$BENCH_CPUS")
  : > "$OUT/bench-top.log"
  for run in 1 2 3; do
    echo "== run $run: ${pin[*]} python3 benchmarks/bench_top.py --repeat 20" | tee -a "$OUT/bench-top.log"
    timeout 400 "${pin[@]}" python3 benchmarks/bench_top.py --repeat 20 2>&1 | tee -a "$OUT/bench-top.log"
  done
fi
# The device tool brings back at most 8 files: the frames' JSON and the workers' logs go in one archive.
(cd "$OUT" && tar czf top-json-and-workers.tgz --remove-files ./*.json ./*-worker.log ./*-parent.log 2>/dev/null)
echo "top_gpu: exit $rc; logs under $OUT"
exit "$rc"
