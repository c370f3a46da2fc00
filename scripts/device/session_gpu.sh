#!/usr/bin/env bash
# Several device scripts in one call (device time is billed from the machine's start, so one call
# beats four), from the repository root, as root:
#   bash scripts/device/session_gpu.sh tests dstate stale admission
# Each part runs with its own OUT (tests = run_gpu_tests.sh, dstate = dstate_gpu.sh, stale =
# stale_gpu.sh, admission = admission_gpu.sh run, webhook = bench_webhook.sh) and comes back as $OUT/<part>.tgz plus its console
# log $OUT/<part>.log: the device tool brings back at most 8 files, two folders deep. GPU_TESTS
# names the pytest paths of the tests part (default: tests).
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/session-gpu-out}
work=$(mktemp -d /tmp/gz-session.XXXXXX)
declare -A SCRIPT=([tests]=run_gpu_tests.sh [dstate]=dstate_gpu.sh [stale]=stale_gpu.sh [admission]=admission_gpu.sh
  [webhook]=bench_webhook.sh)
status=0
for part in "$@"; do
  script=${SCRIPT[$part]:-}
  [ -n "$script" ] || { echo "unknown part $part (tests, dstate, stale, admission, webhook)" >&2; exit 2; }
  mkdir -p "$work/$part"
  start=$(date +%s)
  args=()
  [ "$part" = tests ] && read -r -a args <<<"${GPU_TESTS:-tests}"  # pytest paths for run_gpu_tests.sh
  [ "$part" = admission ] && args=(run)
  OUT="$work/$part" bash "scripts/device/$script" "${args[@]}" >"$OUT/$part.log" 2>&1
  rc=$?
  echo "== $part: exit $rc in $(( $(date +%s) - start )) s" | tee -a "$OUT/$part.log"
  tail -n 25 "$OUT/$part.log"
  tar czf "$OUT/$part.tgz" -C "$work" "$part"
  [ "$rc" -eq 0 ] || status=1
done
rm -rf "$work"
exit "$status"
