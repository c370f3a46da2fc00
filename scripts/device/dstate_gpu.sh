#!/usr/bin/env bash
# A real torch process holding GPU memory, put in state D, found by trace and timed by the exporter
# (issue 20, item 3). Run from the repo root as root on nvidia-h200:   bash scripts/device/dstate_gpu.sh
# About 1 minute. The worker allocates 1 GiB on cuda:0, then calls posix_spawn with a child that
# blocks opening a FIFO before its exec (tests/dstate.py): glibc clones that child with CLONE_VFORK,
# so the worker waits in the kernel, state D (wchan kernel_clone), still holding its CUDA context.
# This D is a killable one (TASK_KILLABLE); a D stuck in the driver is not, and the exporter cannot
# tell them apart, which is the point: it reports the state and how long, not the cause.
# Writes $OUT/dstate/: provenance.txt, trace.txt, trace.json, metrics-1.txt, metrics-2.txt (10 s
# later), metrics-3.txt (after the release), summary.txt; prints summary.txt.
set -uo pipefail
export PYTHONPATH="src:tests${PYTHONPATH:+:$PYTHONPATH}"
OUT="${OUT:-/tmp/gz-dstate-out}"
dir="$OUT/dstate"
work="$(mktemp -d /tmp/gz-dstate.XXXXXX)"
fifo="$work/dstate.fifo"
port=19844
mkdir -p "$dir"
mkfifo "$fifo"
worker=""
exporter=""
cleanup() {
  python3 -c 'import sys, dstate; dstate.release(sys.argv[1])' "$fifo" 2>/dev/null
  for pid in $exporter $worker; do kill "$pid" 2>/dev/null; done
  for pid in $exporter $worker; do wait "$pid" 2>/dev/null; done
  rm -rf "$work"
}
trap cleanup EXIT
{
  date -u +"run at %Y-%m-%dT%H:%M:%SZ"; git rev-parse HEAD 2>/dev/null | sed 's/^/commit /'; uname -r
  python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)'
  nvidia-smi --query-gpu=index,name,driver_version,memory.used,memory.total --format=csv
} > "$dir/provenance.txt" 2>&1

python3 - "$fifo" > "$work/worker.log" 2>&1 <<'PY' &
import sys, torch, dstate
held = torch.ones(256 * 1024 * 1024, device="cuda:0")  # 1 GiB
torch.cuda.synchronize()
print("allocated", held.numel() * 4 >> 20, "MiB", flush=True)
dstate.enter_d_state(sys.argv[1])  # state D until the FIFO is opened for writing
print("left D", flush=True)
import time; time.sleep(60)  # still holding its memory, out of D: the D series must go
PY
worker=$!
state() { python3 -c 'import sys, dstate; print(dstate.state_of(int(sys.argv[1])))' "$worker"; }
for _ in $(seq 1 600); do [ "$(state)" = D ] && break; sleep 0.1; done
echo "worker $worker state $(state) wchan $(cat /proc/$worker/wchan 2>/dev/null)" | tee "$dir/summary.txt"

python3 -m gpuzombie trace --pod-resources-socket /nonexistent > "$dir/trace.txt" 2>&1
python3 -m gpuzombie trace --json --pod-resources-socket /nonexistent > "$dir/trace.json" 2>>"$dir/trace.txt"
python3 -m gpuzombie exporter --listen "127.0.0.1:$port" --min-interval 0 --pod-resources-socket /nonexistent \
  > "$work/exporter.log" 2>&1 &
exporter=$!
scrape() {
  python3 - "$port" "$1" <<'PY'
import sys, time, urllib.request
for _ in range(100):
    try:
        text = urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[1]}/metrics", timeout=10).read().decode()
        break
    except OSError:
        time.sleep(0.1)
open(sys.argv[2], "w").write(text)
PY
}
scrape "$dir/metrics-1.txt"
sleep 10
scrape "$dir/metrics-2.txt"
python3 -c 'import sys, dstate; dstate.release(sys.argv[1])' "$fifo"
for _ in $(seq 1 100); do [ "$(state)" != D ] && break; sleep 0.1; done
scrape "$dir/metrics-3.txt"
{
  echo "worker after the release: state $(state) ($(tr '\n' ' ' < "$work/worker.log"))"
  echo "--- trace: the worker's row and its D-state line"
  grep -E "^(PID|$worker ) |^D state|^summary" "$dir/trace.txt"
  echo "--- trace --json d_state"
  python3 -c 'import json, sys; d = json.load(open(sys.argv[1])); print(d["d_state"], d["summary"]["d_state"])' "$dir/trace.json"
  for n in 1 2 3; do
    echo "--- scrape $n"
    grep '^gpuzombie_dstate' "$dir/metrics-$n.txt" || echo "(no gpuzombie_dstate sample)"
  done
} >> "$dir/summary.txt" 2>&1
cat "$dir/summary.txt"
# Expect: state D; trace's row for the worker with STATE D and its memory, a "D state: pid ..." line,
# d_state [that pid]; scrape 1 gpuzombie_dstate_seconds{pid=...} 0, scrape 2 about 10, and
# gpuzombie_dstate_gpu_memory_bytes about 1.5 GiB (1 GiB + the CUDA context); after the release the
# worker is S (still holding its memory) and scrape 3 has no gpuzombie_dstate sample. The spawn's
# child (S, blocked on the FIFO) holds copies of the worker's /dev/nvidia* fds: an NSMI=N row, not D.
grep -q "^gpuzombie_dstate_seconds.*pid=\"$worker\"" "$dir/metrics-2.txt"
