#!/usr/bin/env bash
# The lab on a GPU machine (nvidia-h200), from the repository root, as root. Budget: 8 minutes.
#   1. the four scenarios with the real 30 s grace, GPU memory through torch
#   2. the same four through the CUDA driver API (ctypes backend), 30 s grace (GRACE_CTYPES)
#   3. scenario 1 with 10 workers alive at deletion (the seed's 740 GB·s case)
#   4. scenario 2 with the workload as the container's main process (--main worker): when the seed's
#      "tini only" expectation of a whole wasted grace holds
#   5. scenario 1 with the workers as uid 1000 (the seed's non-root case), short grace
# Everything goes to one results tree, tarred as $OUT/results.tgz (the lead unpacks it as results/);
# comparison.md and results.json are also copied to $OUT, and the table is printed at the end.
set -uo pipefail
OUT=${OUT:-/tmp/lab-gpu-out}
GRACE=${GRACE:-30}
GRACE_CTYPES=${GRACE_CTYPES:-30}
WORK=${WORK:-/tmp/gpuzombie-lab}
DEVICE=${DEVICE:-cuda}   # DEVICE=cpu GRACE=2 GRACE_CTYPES=2 SIZE_MIB=64: a dry run without a GPU
SIZE_MIB=${SIZE_MIB:-2048}
mkdir -p "$OUT" "$WORK"
rm -rf "$WORK/results"

# tini is not installed on the GPU machine: unpack the carried .deb.
if ! command -v tini >/dev/null; then
  for f in .debs/*.deb; do dpkg -x "$f" /tmp/debs; done
  export PATH=/tmp/debs/usr/bin:$PATH
fi
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
gz() { python3 -m gpuzombie "$@"; }
log() { echo "== $(date -u +%H:%M:%S) $*"; }

{
  log "machine"; nvidia-smi --query-gpu=name,driver_version,memory.used,memory.total --format=csv
  python3 -c "import torch; print('torch', torch.__version__, torch.cuda.is_available())"
  uname -r; date -u
  command -v tini unshare nsenter setpriv
} 2>&1 | tee "$OUT/lab-gpu.log"

run() {  # run <label> <args...>; a failure is logged and the next run goes on
  local label=$1; shift
  log "$label: gpuzombie lab run $*" | tee -a "$OUT/lab-gpu.log"
  local t0=$SECONDS
  gz lab run --out "$WORK/results" --size-mib "$SIZE_MIB" "$@" 2>&1 | tail -n 40 | tee -a "$OUT/lab-gpu.log"
  echo "rc=${PIPESTATUS[0]} took=$((SECONDS - t0))s" | tee -a "$OUT/lab-gpu.log"
}

run "torch, grace $GRACE" --scenario all --grace "$GRACE" --device "$DEVICE" --backend torch
run "ctypes, grace $GRACE_CTYPES" --scenario all --grace "$GRACE_CTYPES" --device "$DEVICE" --backend ctypes
run "S1 with 10 workers" --scenario s1-nofix --workers 10 --grace "$GRACE" --device "$DEVICE" --backend torch
run "S2 with the worker as main process" --scenario s2-tini --main worker --grace "$GRACE" --device "$DEVICE" --backend torch
# uid 1000 must be able to read the package: run it from a world-readable copy of src/.
rm -rf /tmp/gz-src && cp -r src /tmp/gz-src && chmod -R a+rX /tmp/gz-src
PYTHONPATH=/tmp/gz-src run "S1 as uid 1000" --scenario s1-nofix --uid 1000 --grace "${GRACE_UID:-10}" --device "$DEVICE" --backend torch

# The GPU tests of the workloads (torch and ctypes hold real memory).
log "pytest -m gpu (workloads)" | tee -a "$OUT/lab-gpu.log"
python3 -m pytest -q -m gpu tests/test_workloads.py -p no:cacheprovider 2>&1 | tail -n 5 | tee -a "$OUT/lab-gpu.log"

tar -C "$WORK" -czf "$OUT/results.tgz" results
cp "$WORK/results/comparison.md" "$WORK/results/results.json" "$OUT/" 2>/dev/null
cp "$WORK/results/memory-timeline.png" "$OUT/" 2>/dev/null
log "comparison (unpack with: tar -xzf results.tgz)"
sed '/^## NCCL/,$d' "$WORK/results/comparison.md"
