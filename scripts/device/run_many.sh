#!/usr/bin/env bash
# Run several device scripts in one call: each writes under its own folder, and comes back as ONE
# tarball in $OUT (the device tool returns at most 8 files). Usage: run_many.sh NAME:SECONDS ...
set -u
cd "$(dirname "$0")/../.."
work=/tmp/device-runs
mkdir -p "$work"
for spec in "$@"; do
  name=${spec%%:*} limit=${spec#*:}
  echo "=== $name (limit ${limit}s) $(date -u +%H:%M:%S)"
  start=$SECONDS
  OUT="$work/$name" timeout -k 5 "$limit" bash "scripts/device/${name}_gpu.sh" >"$work/$name.log" 2>&1
  echo "rc=$? took=$((SECONDS - start))s"
  tail -n 25 "$work/$name.log"
  tar czf "$OUT/$name.tgz" -C "$work" "$name" "$name.log" 2>/dev/null
done
