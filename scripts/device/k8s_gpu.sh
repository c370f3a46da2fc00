#!/usr/bin/env bash
# The node DaemonSet's privileges against real CUDA processes (budget ~60 s, 1 GPU).
#
# The chart runs `gpuzombie trace` as root with every capability dropped but DAC_READ_SEARCH and
# SYS_PTRACE. This checks that claim on the GPU: a torch worker as UID 1000 (the seed's non-root
# variant) and one as root hold GPU memory; trace then runs under five capability bounding sets and
# we record, per worker, whether NVML lists it, with how much memory, and whether its /dev/nvidia*
# fds were seen. Without a GPU a stand-in (a UID-1000 `sleep` holding /dev/nvidia-gzk8s open)
# exercises the fd side only.
#
# Run from the repo root on the GPU machine:  bash scripts/device/k8s_gpu.sh   (writes under $OUT)
for f in .debs/*.deb; do [ -e "$f" ] && dpkg -x "$f" /tmp/debs; done; export PATH=/tmp/debs/usr/bin:$PATH
set -u
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/k8s-gpu-out}
mkdir -p "$OUT/trace"
export PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH}
SIZE_MIB=${SIZE_MIB:-1024}
PIDS=()
cleanup() { for p in "${PIDS[@]}"; do kill -KILL "$p" 2>/dev/null; done; rm -f /dev/nvidia-gzk8s; }
trap cleanup EXIT

start_worker() {  # start_worker UID LOGFILE -> echo pid once "ready" (bounded wait)
  local uid=$1 log=$2
  setpriv --reuid "$uid" --regid "$uid" --clear-groups env HOME=/tmp PYTHONPATH="$PYTHONPATH" \
    python3 -m gpuzombie.workloads.worker --size-mib "$SIZE_MIB" --device cuda --backend torch \
    >"$log" 2>&1 &
  local pid=$!
  PIDS+=("$pid")
  for _ in $(seq 600); do grep -q '^ready' "$log" && break; kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  echo "$pid"
}

if [ -e /dev/nvidiactl ]; then
  MODE=gpu
  W1000=$(start_worker 1000 "$OUT/worker-uid1000.log")
  W0=$(start_worker 0 "$OUT/worker-uid0.log")
else
  MODE=cpu-standin
  touch /dev/nvidia-gzk8s && chmod 644 /dev/nvidia-gzk8s
  setpriv --reuid 1000 --regid 1000 --clear-groups sleep 120 </dev/nvidia-gzk8s & W1000=$!; PIDS+=("$W1000")
  sleep 120 </dev/nvidia-gzk8s & W0=$!; PIDS+=("$W0")
  sleep 0.3
fi
echo "mode=$MODE worker uid1000=$W1000 uid0=$W0" | tee "$OUT/summary.txt"

CASES=("full-root:" "daemonset:-all,+dac_read_search,+sys_ptrace" "sys_ptrace-only:-all,+sys_ptrace"
       "dac_read_search-only:-all,+dac_read_search" "none:-all")
printf '\n%-22s %-8s %-6s %-10s %-6s %s\n' "capabilities" "worker" "nvml" "gpu_mib" "fds" "trace rc / s" | tee -a "$OUT/summary.txt"
for case in "${CASES[@]}"; do
  name=${case%%:*} bset=${case#*:}
  prefix=()
  [ -n "$bset" ] && prefix=(setpriv --bounding-set "$bset" --inh-caps -all --)
  start=$(date +%s.%N)
  GPUZOMBIE_PROCFS=/proc "${prefix[@]}" python3 -m gpuzombie trace --json >"$OUT/trace/$name.json" 2>"$OUT/trace/$name.err"
  rc=$?
  took=$(python3 -c "import time,sys; print(f'{time.time() - float(sys.argv[1]):.2f}')" "$start")
  python3 - "$OUT/trace/$name.json" "$name" "$W1000" "$W0" "$rc" "$took" <<'EOF' | tee -a "$OUT/summary.txt"
import json, sys
path, name, w1000, w0, rc, took = sys.argv[1:]
try:
    rows = json.load(open(path))["rows"]
except (OSError, ValueError, KeyError) as exc:
    rows, name = [], f"{name} (no JSON: {type(exc).__name__})"
for label, pid in (("uid1000", int(w1000)), ("uid0", int(w0))):
    row = next((r for r in rows if r.get("pid") == pid), None)
    nvml = "yes" if row and row.get("nsmi") else "no"
    mib = f"{row['gpu_memory_mib']:.0f}" if row and row.get("gpu_memory_mib") else "-"
    fds = "yes" if row and row.get("devices") else "no"
    print(f"{name:<22} {label:<8} {nvml:<6} {mib:<10} {fds:<6} {rc} / {took}")
EOF
done
echo "files: $OUT"
