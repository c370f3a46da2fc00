#!/usr/bin/env bash
# The lab on both runtimes, repeated: PID namespaces made by the lab, and real CRI pods on a private
# containerd (Debian's containerd, runc, catatonit, tini and containernetworking-plugins, carried as .debs and unpacked with
# dpkg -x: nothing can be installed on the GPU machine). From the repository root, as root.
#
#   here, once:   scripts/device/lab_runtimes.sh prepare
#                 fills the gitignored .debs/ (apt-get download), .whl/ (the CRI stubs' wheel) and
#                 .lab-images/ (pause = catatonit -P, busybox: `gpuzombie lab images`), ~33 MB.
#   GPU machine:  scripts/device/lab_runtimes.sh run namespaces|containerd|both
#                 all five scenarios (S1-S4, S5 shareProcessNamespace), REPEAT=3 times, GRACE=30 s,
#                 on cuda, into $OUT: lab-runtimes-<runtime>.tgz (unpack as a results folder),
#                 comparison-<runtime>.md, results-<runtime>.json, timeline-<runtime>.png, the log.
#
# Time: the committed H200 run (namespaces, torch, 30 s grace) took 35.5 s for S1, 6.2 s for S2,
# 25.8 s for S3 and 5.8 s for S4, pod start to last observation; with S5 (~6 s) about 80 s a pass,
# so one runtime × 3 passes is about 4.5-5 minutes with the report, and `both` about 9.5-10: one
# runtime per call keeps each call well within 9 minutes. The lab is stopped (SIGTERM, which removes
# its pods and containerd and keeps the finished runs) at BUDGET_S. Merge the two calls here:
#   gpuzombie lab merge results/runtimes <dir of the namespaces call> <dir of the containerd call>
# Dry run without a GPU: DEVICE=cpu GRACE=2 SIZE_MIB=64 REPEAT=1 scripts/device/lab_runtimes.sh run both
set -uo pipefail
ACTION=${1:-}
RUNTIME=${2:-both}
OUT=${OUT:-/tmp/lab-runtimes-out}
REPEAT=${REPEAT:-3}
GRACE=${GRACE:-30}
DEVICE=${DEVICE:-cuda}
SIZE_MIB=${SIZE_MIB:-2048}
BUDGET_S=${BUDGET_S:-520}
WORK=${WORK:-/tmp/gpuzombie-lab-runtimes}
UNPACKED=/tmp/gz-ctr
SITE=/tmp/gz-site
DEBS=(containerd runc catatonit tini containernetworking-plugins)
CRI_WHEEL=container-runtime-interface-api==2.0.1

prepare() {
  local python=${PYTHON:-$([ -x .venv/bin/python ] && echo .venv/bin/python || echo python3)}
  mkdir -p .debs .whl
  (cd .debs && apt-get download "${DEBS[@]}") || return 2
  "$python" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 -d .whl "$CRI_WHEEL" || return 2
  PYTHONPATH="$PWD/src" "$python" -m gpuzombie lab images .lab-images || return 2
  du -shc .debs .whl .lab-images
}

log() { echo "== $(date -u +%H:%M:%S) $*"; }

unpack() {
  rm -rf "$UNPACKED" && mkdir -p "$UNPACKED"
  for name in "${DEBS[@]}"; do
    local deb
    deb=$(ls .debs/"${name}"_*.deb 2>/dev/null | head -n 1)
    [ -n "$deb" ] || { echo "missing .debs/${name}_*.deb: run '$0 prepare' here first" >&2; return 2; }
    dpkg -x "$deb" "$UNPACKED"
  done
  export PATH="$UNPACKED/usr/bin:$UNPACKED/usr/sbin:$PATH"
  if ! python3 -c 'import cri_api' 2>/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" .whl/container_runtime_interface_api-*.whl || return 2
  fi
  export PYTHONPATH="$PWD/src:$SITE${PYTHONPATH:+:$PYTHONPATH}"
}

leftovers() {  # what a run must not leave: containerd, shims, runc mounts, pod cgroups, workloads
  echo "containerd/shim processes: $(pgrep -fc 'containerd( |-shim)' || true)"
  pgrep -fa 'containerd( |-shim)' | sed 's/^/  /' | cut -c1-200  # which: a leftover, or another's
  echo "workload processes: $(pgrep -fc 'gpuzombie.workloads' || true)"
  echo "mounts of a lab containerd: $(grep -c /run/gpuzombie-lab/ /proc/self/mounts || true)"
  echo "pod cgroups: $(find /sys/fs/cgroup -maxdepth 4 -type d -path '*kubepods*' -name 'pod*' 2>/dev/null | wc -l)"
}

run() {
  case $RUNTIME in namespaces | containerd | both) ;; *) echo "runtime: namespaces, containerd or both" >&2; return 2 ;; esac
  mkdir -p "$OUT" "$WORK"
  local logfile="$OUT/lab-runtimes-$RUNTIME.log" results="$WORK/lab-runtimes-$RUNTIME"
  rm -rf "$results"
  unpack || return 2
  {
    log "machine"
    nvidia-smi --query-gpu=name,driver_version,memory.used,memory.total --format=csv 2>&1
    python3 -c 'import torch; print("torch", torch.__version__, torch.cuda.is_available())' 2>&1
    uname -r
    containerd --version; runc --version | head -n 1; tini --version; catatonit --version 2>&1 | head -n 1
    log "before"; leftovers
  } 2>&1 | tee "$logfile"
  log "gpuzombie lab run --runtime $RUNTIME --repeat $REPEAT --grace $GRACE (stopped at ${BUDGET_S} s)" | tee -a "$logfile"
  local t0=$SECONDS
  PYTHONUNBUFFERED=1 timeout -s TERM -k 60 "$BUDGET_S" python3 -m gpuzombie lab run --scenario all \
    --runtime "$RUNTIME" --repeat "$REPEAT" --grace "$GRACE" --device "$DEVICE" --size-mib "$SIZE_MIB" \
    --image-archives .lab-images --out "$results" 2>&1 | tee -a "$logfile" | grep -v '^ ' | tail -n 60
  local rc=${PIPESTATUS[0]}
  log "rc=$rc took=$((SECONDS - t0))s" | tee -a "$logfile"
  { log "after"; leftovers; } 2>&1 | tee -a "$logfile"
  if [ -d "$results" ]; then
    tar -C "$WORK" -czf "$OUT/lab-runtimes-$RUNTIME.tgz" "lab-runtimes-$RUNTIME"
    cp "$results/comparison.md" "$OUT/comparison-$RUNTIME.md" 2>/dev/null
    cp "$results/results.json" "$OUT/results-$RUNTIME.json" 2>/dev/null
    cp "$results/memory-timeline.png" "$OUT/timeline-$RUNTIME.png" 2>/dev/null
    sed -n '/^## Runtimes and spread/,/^Plots:/p' "$results/comparison.md"
  fi
  return "$rc"
}

# Sourced (scripts/device/stale_gpu.sh uses its unpack), it defines the functions and does nothing.
if [ "${BASH_SOURCE[0]}" = "$0" ]; then
  case $ACTION in
    prepare) prepare ;;
    run) run ;;
    *) echo "usage: $0 prepare | run namespaces|containerd|both" >&2; exit 2 ;;
  esac
fi
