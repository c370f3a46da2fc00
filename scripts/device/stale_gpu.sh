#!/usr/bin/env bash
# The stale-holder path on a real GPU, from the repository root, as root (about 1 minute):
#   bash scripts/device/stale_gpu.sh
# Needs what scripts/device/lab_runtimes.sh prepare leaves here (.debs: containerd, runc, catatonit;
# .whl: the CRI stubs), carried to the device. A private containerd runs a pod and a pod whose
# cgroup two torch workers join (SIZE_MIB each, default 2048; one ignores SIGTERM, one frees and
# exits on it); the pod is removed through the CRI; trace must call both STALE, exporter --once give
# gpuzombie_dirty_gpu_holders{kind="stale"}, and `reap --yes` end them (SIGTERM, REAP_TIMEOUT=5 s,
# SIGKILL), the GPU memory freed. Writes under $OUT: summary.json (the numbers), trace-*.json,
# trace-stale.txt, exporter.prom, reap-dry.json, reap.json, the workers' logs, stale-gpu.log.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/stale-gpu-out}
mkdir -p "$OUT"
# shellcheck source=scripts/device/lab_runtimes.sh
source scripts/device/lab_runtimes.sh  # its unpack: the carried containerd, runc, catatonit, CRI stubs
unpack || exit 2
{
  date -u +"run at %Y-%m-%dT%H:%M:%SZ"
  git rev-parse HEAD 2>/dev/null | sed 's/^/commit /'
  nvidia-smi --query-gpu=index,name,driver_version,memory.used,memory.total --format=csv 2>&1
  python3 -c 'import sys, torch; print("python", sys.version.split()[0], "torch", torch.__version__)' 2>&1
  uname -r
  containerd --version
} | tee "$OUT/machine.txt"
PYTHONUNBUFFERED=1 timeout -s TERM -k 20 170 python3 scripts/device/stale_gpu.py "$OUT" 2>&1 | tee "$OUT/stale-gpu.log"
rc=${PIPESTATUS[0]}
{ echo "== after"; leftovers; } 2>&1 | tee -a "$OUT/stale-gpu.log"
echo "stale_gpu: exit $rc; logs under $OUT"
exit "$rc"
