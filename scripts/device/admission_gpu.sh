#!/usr/bin/env bash
# `gpuzombie lab pod` before/after the admission webhook's fix, and the fast preStop hook against the
# current one, on the GPU machine. From the repository root, as root.
#
#   here, once:   scripts/device/admission_gpu.sh prepare
#                 fills the gitignored .debs/ (containerd, runc, catatonit, tini, the CNI plugins), .whl/ (the CRI
#                 stubs, PyYAML for python 3.12, jsonpatch) and .lab-images/ (pause, busybox), ~33 MB.
#   GPU machine:  scripts/device/admission_gpu.sh run        (carry: .debs .whl .lab-images)
#
# On a private containerd (Debian's .debs unpacked with dpkg -x, as lab_runtimes.sh does), with the
# GPU's devices in the GPU containers (--device cuda):
#   1. deploy/pod-nofix.yaml unpatched (its own 30 s grace): waits the whole grace;
#   2. one lab run of S4 with the current hook and with the fast one, alternating, REPEAT (3) each
#      (benchmarks/bench_prestop_startup.py: the start-to-SIGTERM ratio, and deletion -> free over
#      the kill -9 -> free floor; the goal is within 1.5x);
#   3. the webhook's fix of pod-nofix, `gpuzombie webhook --patch deploy/pod-nofix.yaml | gpuzombie
#      lab pod -` (args only, so shareProcessNamespace), and of the same pod with a command (tini from
#      the init container), LABPOD_REPEAT (2) runs each; then once with the preStop opt-in (tini +
#      the injected fast hook). Each patched pod is the real webhook's output, piped into lab pod;
#      a failing `gpuzombie webhook --patch` stops the script (exit 2), nothing stands in for it.
# Wall time about 3-3.5 min (30 s of it the unpatched pod's grace, 20 s the injected hook's timeout
# in 3c); whatever has not started by BUDGET_S (225 s) is skipped and said so.
# Writes 8 files under $OUT: admission-gpu.log, labpod.tgz and bench.tgz (the two lab output
# folders: unpack as results folders), labpod-comparison.md, labpod-results.json,
# labpod-timeline.png, bench-comparison.md, bench-prestop-startup.log.
# Dry run without a GPU: DEVICE=cpu SIZE_MIB=256 REPEAT=1 scripts/device/admission_gpu.sh run
set -uo pipefail
cd "$(dirname "$0")/../.."
ACTION=${1:-run}
OUT=${OUT:-/tmp/admission-gpu-out}
REPEAT=${REPEAT:-3}
LABPOD_REPEAT=${LABPOD_REPEAT:-2}
DEVICE=${DEVICE:-cuda}
SIZE_MIB=${SIZE_MIB:-2048}
BUDGET_S=${BUDGET_S:-225}
WORK=${WORK:-/tmp/gpuzombie-admission}
UNPACKED=/tmp/gz-ctr
SITE=/tmp/gz-site
DEBS=(containerd runc catatonit tini containernetworking-plugins)
PYYAML_WHEEL=PyYAML==6.0.2
FIXTURES=tests/fixtures/labpod
LOG=$OUT/admission-gpu.log
PATCH_IMAGE=localhost/gpu-zombie/gpuzombie-node:0.1.0  # lab pod runs the host's tini whatever is named

prepare() {
  bash scripts/device/lab_runtimes.sh prepare || return 2
  local python=${PYTHON:-$([ -x .venv/bin/python ] && echo .venv/bin/python || echo python3)}
  "$python" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl "$PYYAML_WHEEL" || return 2
  # gpuzombie webhook --patch writes its fix with ruamel.yaml's round trip and its JSON patch with
  # jsonpatch (pure Python, with jsonpointer): run's check "python3 lacks PyYAML, jsonpatch or the CRI
  # stubs" stopped a fresh prepare's run without them
  "$python" -m pip download -q --no-deps --only-binary=:all: -d .whl ruamel.yaml jsonpatch jsonpointer || return 2
  du -shc .debs .whl .lab-images
}

log() { echo "== $(date -u +%H:%M:%S) $*" | tee -a "$LOG"; }

unpack() {
  rm -rf "$UNPACKED" "$SITE" && mkdir -p "$UNPACKED" "$SITE"
  for name in "${DEBS[@]}"; do
    local deb
    deb=$(ls .debs/"${name}"_*.deb 2>/dev/null | head -n 1)
    [ -n "$deb" ] || { echo "missing .debs/${name}_*.deb: run '$0 prepare' here first" >&2; return 2; }
    dpkg -x "$deb" "$UNPACKED"
  done
  export PATH="$UNPACKED/usr/bin:$UNPACKED/usr/sbin:$PATH"
  local wheel
  for wheel in .whl/*.whl; do  # one by one: a wheel for another Python is skipped, not fatal
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$SITE" "$wheel" 2>/dev/null \
      || echo "skipped $wheel (not for this python3)"
  done
  export PYTHONPATH="$PWD/src:$SITE${PYTHONPATH:+:$PYTHONPATH}"
  python3 -c 'import yaml, jsonpatch, cri_api' \
    || { echo "python3 lacks PyYAML, jsonpatch or the CRI stubs: run '$0 prepare' here first" >&2; return 2; }
  if ! python3 -m gpuzombie webhook --patch deploy/pod-nofix.yaml 2>>"$LOG" | grep -q '^kind: Pod'; then
    log "gpuzombie webhook --patch deploy/pod-nofix.yaml fails (see $LOG): stopped"
    return 2
  fi
  # The webhook's init container copies Debian's /usr/bin/tini-static (lab pod mounts the host's
  # /usr): put the carried one there for this run, removed at the end.
  if [ ! -e /usr/bin/tini-static ]; then
    cp "$UNPACKED/usr/bin/tini-static" /usr/bin/tini-static && ADDED_TINI=1
  fi
}

left() { echo $((BUDGET_S - (SECONDS - T0))); }

lab_pod() {  # lab_pod LABEL REPEAT FILE|-  (stdin when -)
  local label=$1 repeat=$2 file=$3 limit
  limit=$(left)
  [ "$limit" -gt 25 ] || { log "$label: skipped (budget)"; return 0; }
  log "$label: gpuzombie lab pod $file --device $DEVICE --repeat $repeat"
  PYTHONUNBUFFERED=1 timeout -s TERM -k 20 "$limit" python3 -m gpuzombie lab pod "$file" --device "$DEVICE" \
    --repeat "$repeat" --image-archives .lab-images --out "$WORK/labpod" 2>&1 | tee -a "$LOG" | grep -E '^(pod-[^ ,]*: PID|gpuzombie)'
  log "$label: exit ${PIPESTATUS[0]}"
}

patched() {  # patched SOURCE: `gpuzombie webhook --patch SOURCE` (its warnings go to the log)
  python3 -m gpuzombie webhook --patch "$1" --image "$PATCH_IMAGE" 2>>"$LOG" || log "gpuzombie webhook --patch $1: exit $?" >&2
}

run() {
  mkdir -p "$OUT" && : >"$LOG"
  rm -rf "$WORK" && mkdir -p "$WORK"
  unpack || return 2
  T0=$SECONDS
  {
    echo "== machine"
    nvidia-smi --query-gpu=name,driver_version,memory.used,memory.total --format=csv 2>&1
    python3 -c 'import sys, torch; print("python", sys.version.split()[0], sys.executable, "torch", torch.__version__)' 2>&1
    uname -r; git rev-parse HEAD 2>/dev/null | sed 's/^/commit /'
    containerd --version; runc --version | head -n 1; tini --version
  } 2>&1 | tee -a "$LOG"

  lab_pod "1 unpatched" 1 deploy/pod-nofix.yaml

  local limit
  limit=$(left)
  if [ "$limit" -gt 40 ]; then
    log "2 S4, current vs fast hook: bench_prestop_startup.py --repeat $REPEAT (stopped at ${limit} s)"
    PYTHONUNBUFFERED=1 timeout -s TERM -k 20 "$limit" python3 benchmarks/bench_prestop_startup.py --repeat "$REPEAT" \
      --device "$DEVICE" --size-mib "$SIZE_MIB" --out "$WORK/bench" 2>>"$LOG" | tee "$OUT/bench-prestop-startup.log" | tee -a "$LOG"
    log "2: exit ${PIPESTATUS[0]}"
  else
    log "2: skipped (budget)"
  fi

  patched deploy/pod-nofix.yaml | lab_pod "3a patched (shareProcessNamespace)" "$LABPOD_REPEAT" -
  patched "$FIXTURES/pod-nofix-command.yaml" | lab_pod "3b patched (tini from the init container)" "$LABPOD_REPEAT" -
  patched "$FIXTURES/pod-nofix-command-prestop.yaml" | lab_pod "3c patched (tini + the injected fast preStop hook)" 1 -
  log "after: containerd/shim $(pgrep -fc 'containerd( |-shim)' || true), workloads $(pgrep -fc 'gpuzombie.workloads' || true), lab mounts $(grep -c gpuzombie /proc/self/mounts || true)"
  [ "${ADDED_TINI:-0}" = 1 ] && rm -f /usr/bin/tini-static
  for name in labpod bench; do
    [ -d "$WORK/$name" ] && tar -C "$WORK" -czf "$OUT/$name.tgz" "$name"
  done
  cp "$WORK/labpod/comparison.md" "$OUT/labpod-comparison.md" 2>/dev/null
  cp "$WORK/labpod/results.json" "$OUT/labpod-results.json" 2>/dev/null
  cp "$WORK/labpod/memory-timeline.png" "$OUT/labpod-timeline.png" 2>/dev/null
  cp "$WORK/bench/comparison.md" "$OUT/bench-comparison.md" 2>/dev/null
  sed -n '/^## Pods/,/^$/p;/^| pod-/p' "$OUT/labpod-comparison.md" 2>/dev/null | tee -a "$LOG"
  log "took $((SECONDS - T0)) s"
}

case $ACTION in
  prepare) prepare ;;
  run) run ;;
  *) echo "usage: $0 prepare | run" >&2; exit 2 ;;
esac
