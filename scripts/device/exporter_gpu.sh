#!/usr/bin/env bash
# The exporter on a GPU machine (nvidia-h200), from the repository root, as root. Budget: 2 minutes.
# Three "pods" as PID namespaces, each holding GPU memory through torch:
#   s1   sleep as PID 1, the parent exits without wait: a zombie, an orphaned worker, PID 1 drops SIGTERM
#   s2m  tini as PID 1, its child is the SIGTERM-ignoring worker: tini forwards, the worker ignores
#   s4   tini as PID 1, its child is the worker with a SIGTERM handler: no grace risk
# then `gpuzombie exporter --once` and a served exporter scraped over HTTP and stopped with SIGTERM.
# Writes $OUT/exposition.txt, $OUT/served.txt, $OUT/exporter-gpu.log; prints a table at the end.
set -uo pipefail
OUT=${OUT:-/tmp/exporter-gpu-out}
DEVICE=${DEVICE:-cuda}      # DEVICE=cpu SIZE_MIB=64: a dry run without a GPU
SIZE_MIB=${SIZE_MIB:-1024}
mkdir -p "$OUT"
if ! command -v tini >/dev/null; then
  for f in .debs/*.deb; do dpkg -x "$f" /tmp/debs; done
  export PATH=/tmp/debs/usr/bin:$PATH
fi
if ! python3 -c 'import prometheus_client' 2>/dev/null; then  # carried wheel: nothing installs there
  python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/prometheus_client-*.whl
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
LOG=$OUT/exporter-gpu.log
log() { echo "== $(date -u +%H:%M:%S) $*" | tee -a "$LOG"; }
W="--size-mib $SIZE_MIB --device $DEVICE"
pod() { unshare --pid --fork --mount-proc --kill-child "$@" >>"$LOG" 2>&1 & PODS+=($!); }
PODS=()
trap 'kill -9 "${PODS[@]}" 2>/dev/null; wait 2>/dev/null' EXIT

log "machine"; nvidia-smi --query-gpu=name,driver_version,memory.used --format=csv 2>&1 | tee -a "$LOG"
pod sh -c "python3 -m gpuzombie.workloads.parent $W & exec sleep infinity"
pod tini -- python3 -m gpuzombie.workloads.worker $W
pod tini -- python3 -m gpuzombie.workloads.worker_fixed $W
log "waiting for three GPU processes"
python3 - "$DEVICE" <<'PY' 2>&1 | tee -a "$LOG"
import sys, time
from gpuzombie.gpu.nvml import default_backend
nv, deadline = default_backend(), time.monotonic() + 90
while time.monotonic() < deadline:
    snap = nv.read()
    n = sum(len(d.processes) for d in snap.devices)
    if n >= 3 or (sys.argv[1] == "cpu" and time.monotonic() > deadline - 80):
        break
    time.sleep(0.5)
print(f"NVML: available={snap.available} processes={n} ({snap.reason or snap.driver_version})")
PY
sleep 1

log "exporter --once"
t0=$(date +%s%N)
python3 -m gpuzombie exporter --once >"$OUT/exposition.txt" 2>>"$LOG"
echo "rc=$? took=$(( ($(date +%s%N) - t0) / 1000000 )) ms (interpreter start included)" | tee -a "$LOG"

log "exporter served on 127.0.0.1:0, two scrapes, SIGTERM"
python3 -m gpuzombie exporter --listen 127.0.0.1:0 --min-interval 5 2>"$OUT/served.err" & EXP=$!
python3 - "$OUT/served.err" "$OUT/served.txt" <<'PY' 2>&1 | tee -a "$LOG"
import re, sys, time, urllib.request
deadline = time.monotonic() + 30
while not (m := re.search(r"http://(\S+)/metrics", open(sys.argv[1]).read())) and time.monotonic() < deadline:
    time.sleep(0.1)
url = f"http://{m.group(1)}/metrics"
for i in range(2):
    t0 = time.perf_counter(); body = urllib.request.urlopen(url, timeout=10).read().decode()
    print(f"scrape {i + 1}: {len(body)} bytes in {time.perf_counter() - t0:.3f} s")
open(sys.argv[2], "w").write(body)
PY
kill -TERM $EXP; wait $EXP; echo "exporter exit after SIGTERM: rc=$?" | tee -a "$LOG"; cat "$OUT/served.err" >>"$LOG"

log "table"
grep -E '^gpuzombie_(zombies|zombies_by_parent|orphans|pid1_info|gpu_process_memory_bytes|grace_risk_gpu_memory_bytes|gpu_memory_used_bytes|gpu_baseline_bytes|gpu_unexplained_memory_bytes|gpu_memory_verdict|nvml_available|scan_duration_seconds|scans_total|fd_only_holders)[{ ]' \
  "$OUT/served.txt" | grep -v ' 0\.0$' | tee -a "$LOG"
