#!/usr/bin/env bash
# observe on a real GPU (issue #2), from the repo root: PYTHONPATH=src, results under $OUT.
#   1. namespace A: PID 1 = sleep, the seed's parent.py starts 1 CUDA worker (2 GiB) and exits
#      without wait() -> observe --json inside A (nsenter, like kubectl exec) and from the host;
#   2. namespace B: the same with 2 workers -> observe inside B and from the host (A still runs,
#      so inside B, A's worker is memory of another namespace: must not be called a ghost);
#   3. SIGKILL A's worker -> observe from the host: a zombie under sleep, memory freed, no
#      orphaned context;
#   4. the GPU-marked tests (pytest -m gpu).
# Prints a table: each worker's local pid, host pid, memory, verdict; ghost memory per GPU.
# CPU check here: OUT=/tmp/x DEVICE=cpu bash scripts/device/observe_gpu.sh   (budget on the GPU: 90 s)
set -uo pipefail
OUT=${OUT:-/tmp/observe-gpu}
DEVICE=${DEVICE:-cuda}
mkdir -p "$OUT"
for f in .debs/*.deb; do [ -e "$f" ] && dpkg -x "$f" /tmp/debs; done
export PATH=/tmp/debs/usr/bin:$PATH
export PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH}
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
PY=${PY:-python3}
START=$(date +%s)
UNSHARES=()
cleanup() { for u in "${UNSHARES[@]}"; do { kill -9 "$u"; wait "$u"; } 2>/dev/null; done; }
trap cleanup EXIT
# live_children PID: host pids of PID's children that are not zombies (psutil: no procps needed)
live_children() {
  $PY -c 'import psutil, sys
for c in psutil.Process(int(sys.argv[1])).children():
    if c.status() != psutil.STATUS_ZOMBIE: print(c.pid)' "$1" 2>/dev/null
}

# start_ns NAME WORKERS: a PID namespace with sleep as PID 1 and the seed's parent; sets P1_<NAME>.
start_ns() {
  local name=$1 workers=$2 log=/tmp/gz-observe-$1.log
  rm -f "$log"
  unshare --pid --fork --mount-proc --kill-child sh -c \
    "$PY -m gpuzombie.workloads.parent --workers $workers --size-mib 2048 --device $DEVICE > $log 2>&1 & exec sleep infinity" &
  local u=$! p1=""
  UNSHARES+=("$u")
  for _ in $(seq 100); do p1=$(live_children "$u" | head -1); [ -n "$p1" ] && break; sleep 0.05; done
  for _ in $(seq 600); do grep -q "parent exiting" "$log" 2>/dev/null && break; sleep 0.1; done
  echo "namespace $name: unshare $u, PID 1 host pid $p1; parent log: $(tr '\n' '|' < "$log")"
  printf -v "P1_$name" '%s' "$p1"
}

inside() { nsenter --target "$1" --pid --mount "$PY" -m gpuzombie observe "${@:2}"; }

start_ns A 1
inside "$P1_A" --json > "$OUT/observe_inside_A.json"; echo "inside A: exit $?"
$PY -m gpuzombie observe --json > "$OUT/observe_host_A.json"; echo "host (A): exit $?"

start_ns B 2
inside "$P1_B" --json > "$OUT/observe_inside_B.json"; echo "inside B: exit $?"
inside "$P1_B" > "$OUT/observe_inside_B.txt"
$PY -m gpuzombie observe --json > "$OUT/observe_host_AB.json"; echo "host (A+B): exit $?"

WORKER_A=$(live_children "$P1_A" | head -1)
echo "SIGKILL A's worker (host pid $WORKER_A)"
[ -n "$WORKER_A" ] && kill -9 "$WORKER_A"
sleep 1
$PY -m gpuzombie observe --json > "$OUT/observe_host_after_kill.json"; echo "host (after kill): exit $?"
cleanup; UNSHARES=()

timeout 40 $PY -m pytest -m gpu -q -p no:cacheprovider tests > "$OUT/pytest_gpu.log" 2>&1
echo "pytest -m gpu: exit $? ($(tail -1 "$OUT/pytest_gpu.log"))"

P1_A=$P1_A P1_B=$P1_B WORKER_A=${WORKER_A:-0} $PY - "$OUT" <<'PYEOF' | tee "$OUT/summary.txt"
import json, os, sys
out = sys.argv[1]
load = lambda name: json.load(open(os.path.join(out, name)))
ins = {"A": load("observe_inside_A.json"), "B": load("observe_inside_B.json")}
host, after = load("observe_host_AB.json"), load("observe_host_after_kill.json")
p1 = {"A": int(os.environ["P1_A"] or 0), "B": int(os.environ["P1_B"] or 0)}
hostprocs = {p["pid"]: p for p in host["processes"]}
print(f"\n{'ns':3} {'local':>5} {'host':>7} {'MiB in':>7} {'MiB host':>8} {'inside':9} {'host':9} orphan(inside)")
for ns in ("A", "B"):
    workers = [p for p in host["processes"] if p["ppid"] == p1[ns] and p["state"] != "Z"]
    for w in workers:
        local = w["nspid"][-1]
        gi = next((g for g in ins[ns]["gpu_processes"] if g["local_pid"] == local), {})
        gh = next((g for g in host["gpu_processes"] if g["host_pid"] == w["pid"]), {})
        orph = next((o["verdict"] for o in ins[ns]["orphans"] if o["pid"] == local), "-")
        print(f"{ns:3} {local:>5} {w['pid']:>7} {gi.get('used_memory_mib', '-')!s:>7} "
              f"{gh.get('used_memory_mib', '-')!s:>8} {gi.get('verdict', '-'):9} {gh.get('verdict', '-'):9} {orph}")
for name, rep in (("inside A", ins["A"]), ("inside B", ins["B"]), ("host", host), ("host after kill", after)):
    ghosts = "; ".join(f"GPU{g['gpu_index']} used {g['used_mib']} - base {g['baseline_mib']} - procs "
                       f"{g['process_memory_mib']} = {g['unexplained_mib']} MiB {g['verdict']}"
                       for g in rep["ghosts"]) or f"no GPU ({rep['gpu']['reason']})"
    s = rep["summary"]
    print(f"{name:16} zombies {s['zombies']} orphans {s['orphans']} orphaned_contexts "
          f"{s['orphaned_contexts']} gpu_procs {s['gpu_processes']} | {ghosts}")
killed = int(os.environ["WORKER_A"])
print(f"killed worker {killed}: state after 1 s = "
      f"{next((p['state'] for p in after['processes'] if p['pid'] == killed), 'gone')}, "
      f"still listed by NVML: {any(g['host_pid'] == killed for g in after['gpu_processes'])}")
PYEOF
echo "elapsed: $(( $(date +%s) - START )) s"
