#!/usr/bin/env bash
# `gpuzombie trace` against real CUDA processes in PID namespaces, run from the host (budget ~60 s).
#
# Two "pods", each a PID namespace whose PID 1 is `sleep` (the seed's scenario 1), placed in cgroup v2
# paths shaped exactly as kubelet + containerd (systemd driver) make them, and named by a stand-in
# CRI runtime (tests/cri_standin.py: a grpcio server on a unix socket; needs gpuzombie[node]):
#   pod A gpu-zombie-test/gpu-zombie-nofix (BestEffort): parent.py starts a 2 GiB worker and exits
#         without wait() -> a zombie parent and an orphaned worker;
#   pod B gpu-zombie-test/gpu-zombie-guaranteed (Guaranteed): one 2 GiB worker.
# Then: trace (table + JSON), kill -9 pod A's worker, trace again. On >= 2 GPUs also the NCCL case:
# two ranks, rank 0 SIGKILLed, trace shows rank 1's peer context on GPU 0 as ghost memory.
#
# Run from the repo root on the GPU machine:  bash scripts/device/trace_gpu.sh   (writes under $OUT)
set -u
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/trace-gpu-out}
mkdir -p "$OUT"
for f in .debs/*.deb; do [ -e "$f" ] && dpkg -x "$f" /tmp/debs; done
export PATH=/tmp/debs/usr/bin:$PATH
export PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
LOG=$OUT/log.txt
: >"$LOG"
say() { echo "[$(date +%T)] $*" | tee -a "$LOG"; }
T0=$(date +%s.%N)
elapsed() { python3 -c "import time; print(f'{time.time() - $T0:.1f}')"; }

TMP=$(mktemp -d /tmp/trace-gpu.XXXXXX)
CG=/sys/fs/cgroup
UID_A=aaaaaaaa-0000-4000-8000-00000000000a
UID_B=bbbbbbbb-0000-4000-8000-00000000000b
CID_A=$(printf 'a%.0s' $(seq 64))
CID_B=$(printf 'b%.0s' $(seq 64))
CG_A=$CG/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod${UID_A//-/_}.slice/cri-containerd-$CID_A.scope
CG_B=$CG/kubepods.slice/kubepods-pod${UID_B//-/_}.slice/cri-containerd-$CID_B.scope
PIDS=()

cleanup() {
  for p in "${PIDS[@]}"; do kill -9 "$p" 2>/dev/null; done
  sleep 0.5
  for d in "$CG_A" "$CG_B"; do
    for _ in 1 2 3 4 5 6; do rmdir "$d" 2>/dev/null && break; sleep 0.5; done
    rmdir "$(dirname "$d")" 2>/dev/null
  done
  rmdir "$CG/kubepods.slice/kubepods-besteffort.slice" "$CG/kubepods.slice" 2>/dev/null
  rm -rf "$TMP"
}
trap cleanup EXIT

# --- a stand-in CRI runtime that names the two containers (no cluster here) -------------------
cat >"$TMP/recorded.json" <<EOF
{"listed": {"$CID_A": ["worker", "gpu-zombie-nofix", "gpu-zombie-test", "$UID_A"],
            "$CID_B": ["worker", "gpu-zombie-guaranteed", "gpu-zombie-test", "$UID_B"]}}
EOF
python3 tests/cri_standin.py "$TMP/cri.sock" "$TMP/recorded.json" >>"$LOG" 2>&1 &
PIDS+=($!)
disown $!

# Without nvidia-smi (a CPU dev box) the same steps run with CPU stand-in workers: a dry run.
if command -v nvidia-smi >/dev/null; then DEVICE=cuda; else DEVICE=cpu; fi
if python3 -c "import gpuzombie.workloads.worker" 2>/dev/null; then
  PARENT="python3 -m gpuzombie.workloads.parent --workers 1 --size-mib 2048 --device $DEVICE"
  WORKER="python3 -m gpuzombie.workloads.worker --size-mib 2048 --device $DEVICE"
else
  WORKER="python3 -c 'import torch,time,signal; signal.signal(signal.SIGTERM, signal.SIG_IGN); x=torch.ones(512*1024**2, device=\"cuda\"); torch.cuda.synchronize(); print(\"ready\", flush=True); time.sleep(3600)'"
  PARENT="$WORKER"
fi

# start_pod CGROUP_DIR COMMAND: a PID namespace with sleep as PID 1, inside the cgroup from the start.
start_pod() {
  local cg=$1 cmd=$2
  if ! { [ "$(stat -fc %T $CG)" = cgroup2fs ] && mkdir -p "$cg" && [ -w "$cg/cgroup.procs" ]; }; then
    say "cannot create $cg: this pod stays in the host's cgroup (rows will show (host))"
    cg=""
  fi
  sh -c '[ -n "$1" ] && echo $$ > "$1/cgroup.procs"; exec unshare --pid --fork --mount-proc --kill-child sh -c "$2 & exec sleep infinity"' \
    _ "$cg" "$cmd" >>"$LOG" 2>&1 &
  PIDS+=($!)
  disown $!  # no "Killed" job notices at cleanup
}

nvml_count() {
  if [ "$DEVICE" = cpu ]; then pgrep -fc "gpuzombie.workloads.worker"; return; fi
  nvidia-smi --query-compute-apps=pid --format=csv,noheader 2>/dev/null | grep -c .
}
wait_for() {  # wait_for N SECONDS: until NVML lists N processes
  local n=$1 deadline=$(( $(date +%s) + $2 ))
  while [ "$(nvml_count)" -lt "$n" ] && [ "$(date +%s)" -lt "$deadline" ]; do sleep 0.3; done
  [ "$(nvml_count)" -ge "$n" ]
}
run_trace() {  # run_trace NAME: table and JSON, timed
  local name=$1 t
  t=$(date +%s.%N)
  python3 -m gpuzombie trace --cri-socket "$TMP/cri.sock" >"$OUT/$name.txt" 2>&1
  echo "exit=$? seconds=$(python3 -c "import time; print(f'{time.time() - $t:.3f}')")" >>"$OUT/$name.txt"
  python3 -m gpuzombie trace --json --cri-socket "$TMP/cri.sock" >"$OUT/$name.json" 2>>"$LOG"
}

say "GPU: $(nvidia-smi --query-gpu=index,name,memory.used,memory.total --format=csv,noheader 2>&1 | tr '\n' ';')"
say "cgroup: $(stat -fc %T $CG) at $CG"
start_pod "$CG_A" "$PARENT"
start_pod "$CG_B" "$WORKER"
if wait_for 2 45; then say "2 workers listed by NVML after $(elapsed) s"; else say "workers not ready after 45 s: $(nvml_count) listed"; fi
sleep 1  # pod A's parent exits after its worker's ready line
run_trace trace
say "trace done at $(elapsed) s"

VICTIM=$(python3 -c "
import json; d = json.load(open('$OUT/trace.json'))
listed = [r for r in d['rows'] if r['nsmi'] and r['state'] != '-']
print(next((r['pid'] for r in listed if r['pod_uid'] == '$UID_A'), listed[0]['pid'] if listed else ''))" 2>>"$LOG")
if [ -n "$VICTIM" ]; then
  kill -9 "$VICTIM"
  for _ in $(seq 30); do nvidia-smi --query-compute-apps=pid --format=csv,noheader | grep -qw "$VICTIM" || break; sleep 0.1; done
  say "killed pod A's worker (host pid $VICTIM)"
fi
run_trace trace-after-kill
nvidia-smi >"$OUT/nvidia-smi.txt" 2>&1
for p in "${PIDS[@]}"; do kill -9 "$p" 2>/dev/null; done

GPUS=$(nvidia-smi --query-gpu=index --format=csv,noheader 2>/dev/null | grep -c .)
if [ "$GPUS" -ge 2 ]; then
  wait_for_gone() { for _ in $(seq 50); do [ "$(nvml_count)" -eq 0 ] && break; sleep 0.2; done; }
  wait_for_gone
  say "NCCL: two ranks on GPU 0 and 1"
  cat >"$TMP/rank.py" <<'EOF'
import os, sys, time, torch, torch.distributed as dist
rank = int(sys.argv[1]); torch.cuda.set_device(rank)
dist.init_process_group("nccl", init_method="tcp://127.0.0.1:29533", rank=rank, world_size=2)
x = torch.ones(512 * 1024**2, device="cuda")
dist.all_reduce(x); torch.cuda.synchronize(); print("ready", rank, flush=True)
while True:
    dist.all_reduce(x); torch.cuda.synchronize(); time.sleep(0.05)
EOF
  python3 "$TMP/rank.py" 0 >>"$LOG" 2>&1 & R0=$!; PIDS+=($R0); disown $R0
  python3 "$TMP/rank.py" 1 >>"$LOG" 2>&1 & R1=$!; PIDS+=($R1); disown $R1
  if wait_for 2 40; then
    sleep 2
    kill -9 "$R0"; sleep 3
    say "rank 0 (pid $R0) SIGKILLed; rank 1 (pid $R1) hangs"
    run_trace trace-nccl
  else
    say "NCCL ranks not ready"
  fi
  kill -9 "$R1" 2>/dev/null
fi

say "done at $(elapsed) s"
python3 - "$OUT" <<'EOF'
import json, os, sys
out = sys.argv[1]
print(f"{'phase':<18} {'rows':>4} {'gpu':>4} {'zomb':>4} {'fd-only':>7} {'GPU':>3} {'used':>7} {'base':>6} {'procs':>7} {'ghost':>6} {'verdict':<8} {'trace s':>7}")
for name in ("trace", "trace-after-kill", "trace-nccl"):
    path = os.path.join(out, name + ".json")
    if not os.path.exists(path) or not os.path.getsize(path):
        continue
    d = json.load(open(path)); s = d["summary"]
    secs = open(os.path.join(out, name + ".txt")).read().rsplit("seconds=", 1)[-1].strip()
    for g in d["gpus"] or [None]:
        mib = lambda k: "-" if g is None else f"{g[k + '_mib']:.0f}"
        print(f"{name:<18} {s['rows']:>4} {s['gpu_processes']:>4} {s['zombies']:>4} {s['fd_only']:>7} "
              f"{'-' if g is None else g['index']:>3} {mib('used'):>7} {mib('baseline'):>6} {mib('process_memory'):>7} "
              f"{mib('unexplained'):>6} {'-' if g is None else g['verdict']:<8} {secs:>7}")
print()
print(open(os.path.join(out, "trace.txt")).read())
EOF
