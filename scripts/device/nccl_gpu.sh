#!/usr/bin/env bash
# The NCCL comparison on real GPUs (issue 5; issue 7 with RANKS=3 or 4 on nvidia-h200-x4).
# Run from the repo root on nvidia-h200-x2:   bash scripts/device/nccl_gpu.sh
# Budget: 9.5 min in all. Every case (a defaults, b seed fix, c best knobs, d torchrun,
# e gpuzombie.graceful) runs at once on every GPU, rank 0 SIGKILLed in each; the window after the
# first kill is as long as the budget allows (the defaults case: "still running at T s").
# Writes ONE file, $OUT/nccl.tgz (comparison.md, results.json, memory.png, logs/, nvidia-smi before/after),
# and prints the table. On a machine without 2 GPUs it runs the gloo stand-in instead (labelled).
set -uo pipefail
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONPATH="src${PYTHONPATH:+:$PYTHONPATH}"
OUT="${OUT:-/tmp/gz-nccl-out}"
BUDGET="${BUDGET:-570}"            # seconds for the whole script
RANKS="${RANKS:-}"                 # default: every GPU
CASES="${CASES:-abcde}"
start=$(date +%s)
work="$(mktemp -d /tmp/gz-nccl.XXXXXX)"
mkdir -p "$OUT" "$work/nccl"
{
  date -u +"run at %Y-%m-%dT%H:%M:%SZ"; git rev-parse HEAD 2>/dev/null | sed 's/^/commit /'
  python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "gpus", torch.cuda.device_count())'
  nvidia-smi --query-gpu=index,name,driver_version,memory.used,memory.total --format=csv
} > "$work/nccl/provenance.txt" 2>&1
nvidia-smi > "$work/nccl/nvidia-smi-before.log" 2>&1
# The Python run gets the budget less what was spent so far and a margin for tar.
left=$(( BUDGET - ($(date +%s) - start) - 20 ))
# The one CLI (`gpuzombie lab run --scenario nccl`): progress on stderr, the table on stdout.
COLUMNS=160 timeout --kill-after=5 "$left" python3 -m gpuzombie lab run --scenario nccl ${RANKS:+--ranks "$RANKS"} \
  --cases "$CASES" --budget-seconds "$(( left - 10 ))" --out "$work" > "$work/nccl/run.log" 2>&1
rc=$?
grep 'nccl:' "$work/nccl/run.log" | tail -n 20
nvidia-smi > "$work/nccl/nvidia-smi-after.log" 2>&1
[ "$rc" -ne 0 ] && tail -n 20 "$work/nccl/run.log"
tar czf "$OUT/nccl.tgz" -C "$work" nccl
echo "exit=$rc elapsed=$(( $(date +%s) - start ))s wrote $OUT/nccl.tgz"
[ -f "$work/nccl/comparison.md" ] && cat "$work/nccl/comparison.md"
exit "$rc"
