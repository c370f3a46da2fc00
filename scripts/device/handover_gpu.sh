#!/usr/bin/env bash
# The handover gate on the GPU machine (issue 25), from the repository root, as root:
#   here, once:   scripts/device/lab_runtimes.sh prepare     (.debs, .whl, .lab-images: carry them)
#   GPU machine:  bash scripts/device/handover_gpu.sh          (carry: .debs .whl .lab-images)
# 1. the gate's GPU tests (tests/gpu/test_preflight_gpu.py): an idle GPU and one a context has left
#    are clean, a live idle context is a holder, an NVML that does not load fails closed;
# 2. benchmarks/bench_preflight.py: the gate (zipapp, and the full CLI) beside nvidia-smi, REPEAT_BENCH (15) each;
# 3. gpuzombie lab handover: pod A's stale torch holder, pod B without the gate (beside it) and
#    with it (waits; reap --yes; B starts), REPEAT (3) runs of SIZE_MIB (2048), reap after REAP_AFTER_S (8),
#    none started after BUDGET_S (330).
# Writes under $OUT (8 files): machine.txt, gpu-tests.log, bench-preflight.log, bench-preflight.json,
# handover.log, handover.json, gate-logs.tgz (each run's gate log and events, pod A's worker logs),
# evidence.tgz. Dry run without a GPU: DEVICE=cpu SIZE_MIB=64 REPEAT=1 bash scripts/device/handover_gpu.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/handover-gpu-out}
DEVICE=${DEVICE:-cuda}
REPEAT_BENCH=${REPEAT_BENCH:-15}
WORK=/tmp/gpuzombie-handover
mkdir -p "$OUT" "$WORK/evidence"
# shellcheck source=scripts/device/lab_runtimes.sh
source scripts/device/lab_runtimes.sh  # its unpack: the carried containerd, runc, catatonit, CNI plugins, CRI stubs
unpack || exit 2
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
{
  date -u +"run at %Y-%m-%dT%H:%M:%SZ"
  # COMMIT: written where the tree was exported (git archive) rather than checked out
  { cat COMMIT 2>/dev/null || git rev-parse HEAD 2>/dev/null; } | sed 's/^/commit /'
  nvidia-smi --query-gpu=index,name,driver_version,memory.used,memory.reserved,memory.total --format=csv 2>&1
  python3 -c 'import sys, torch, pynvml; print("python", sys.version.split()[0], sys.executable, "torch", torch.__version__)' 2>&1
  python3 -m pip show nvidia-ml-py 2>/dev/null | grep -i '^version' | sed 's/^/nvidia-ml-py /'
  uname -r; nproc
  ls -l /dev/nvidia* 2>&1 | head -8
  containerd --version; runc --version | head -n 1
} 2>&1 | tee "$OUT/machine.txt"
rc=0
if [ "$DEVICE" = cuda ]; then
  echo "== 1 GPU tests"
  GPUZOMBIE_EVIDENCE=$WORK/evidence PYTHONUNBUFFERED=1 timeout -k 10 150 python3 -m pytest -m gpu -rA -p no:cacheprovider \
    tests/gpu/test_preflight_gpu.py 2>&1 | tee "$OUT/gpu-tests.log" | tail -n 15
  [ "${PIPESTATUS[0]}" = 0 ] || rc=1
  echo "== 2 bench_preflight"
  timeout -k 10 150 python3 benchmarks/bench_preflight.py --repeat "$REPEAT_BENCH" --out "$WORK/bench" 2>&1 | tee "$OUT/bench-preflight.log"
  [ "${PIPESTATUS[0]}" = 0 ] || rc=1
  cp "$WORK/bench/bench-preflight.json" "$OUT/" 2>/dev/null
fi
echo "== 3 handover"
archives=(); [ -d .lab-images ] && archives=(--image-archives .lab-images)
PYTHONUNBUFFERED=1 timeout -s TERM -k 30 "${HANDOVER_TIMEOUT:-360}" python3 -m gpuzombie lab handover --out "$WORK/handover" \
  --device "$DEVICE" ${SIZE_MIB:+--size-mib "$SIZE_MIB"} --repeat "${REPEAT:-3}" --reap-after "${REAP_AFTER_S:-8}" \
  --budget-seconds "${BUDGET_S:-330}" "${archives[@]}" 2>&1 | tee "$OUT/handover.log"
[ "${PIPESTATUS[0]}" = 0 ] || rc=1
cp "$WORK/handover/handover.json" "$OUT/" 2>/dev/null
tar -C "$WORK/handover" -czf "$OUT/gate-logs.tgz" . 2>/dev/null
tar -C "$WORK" -czf "$OUT/evidence.tgz" evidence 2>/dev/null
{ echo "== after"; leftovers; } 2>&1 | tee -a "$OUT/handover.log"
echo "handover_gpu: exit $rc; logs under $OUT"
exit "$rc"
