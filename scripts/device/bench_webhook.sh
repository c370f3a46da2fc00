#!/usr/bin/env bash
# The webhook's latency on an idle machine: the webhook pinned to 2 CPUs (issue 19's "2 cores"), the
# client on the others; 3 runs of 60 s at 50 AdmissionReviews/s (+ 50 /healthz/s). From the repo root:
#   bash scripts/device/bench_webhook.sh
# Needs python3 with click (the device has it) and openssl; nothing is installed. ~3.5 min.
# Writes $OUT/bench-webhook.log; it should show "errors 0" and mutate p99 <= 20 ms in each run.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/bench-webhook-out}
mkdir -p "$OUT"
export PYTHONPATH=$PWD/src
{
  date -u +"# run at %Y-%m-%dT%H:%M:%SZ"
  git rev-parse HEAD 2>/dev/null | sed 's/^/# commit /'
  echo "# $(nproc) CPUs, $(python3 -V 2>&1), load $(cut -d' ' -f1-3 /proc/loadavg)"
  for i in 1 2 3; do
    echo "# run $i, load $(cut -d' ' -f1-3 /proc/loadavg)"
    python3 benchmarks/bench_webhook.py --seconds 60 --rate 50 --server-cpus 0,1
  done
} 2>&1 | tee "$OUT/bench-webhook.log"
