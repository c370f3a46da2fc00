#!/usr/bin/env bash
# The GPU-marked tests on a device machine, from the repository root, as root:
#   bash scripts/device/run_gpu_tests.sh [pytest args...]        (default: tests)
# Uses the machine's python3 (with torch) and PYTHONPATH=src; nothing is pip-installed there. Carried
# .debs/*.deb (tini) and .whl/*.whl (prometheus-client) are unpacked when present.
# Writes under $OUT: pytest-gpu.log (the tests' printed tables too, -rA), junit.xml, machine.txt, and
# evidence.tgz (evidence/<test>/: the JSON and text each test saw).
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-/tmp/gpu-tests-out}
mkdir -p "$OUT/evidence"
for deb in .debs/*.deb; do [ -e "$deb" ] && dpkg -x "$deb" /tmp/debs; done
export PATH=/tmp/debs/usr/bin:$PATH
# A pure-Python wheel is a zip: extracting it is all its install would do (no pip, no index there).
for wheel in .whl/*.whl; do [ -e "$wheel" ] && python3 -m zipfile -e "$wheel" /tmp/wheels; done
# Absolute: commands entered into a pod's mount namespace (nsenter --mount) start in its /.
export PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH}:/tmp/wheels
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export GPUZOMBIE_EVIDENCE=$OUT/evidence
{
  date -u +"run at %Y-%m-%dT%H:%M:%SZ"
  git rev-parse HEAD 2>/dev/null | sed 's/^/commit /'
  git status --short 2>/dev/null | head -20 | sed 's/^/changed /'
  nvidia-smi --query-gpu=index,name,driver_version,memory.used,memory.total --format=csv 2>&1
  python3 -c 'import sys, torch; print("python", sys.version.split()[0], "torch", torch.__version__)' 2>&1
  uname -r
} >"$OUT/machine.txt"
cat "$OUT/machine.txt"
python3 -m pytest -m gpu -rA -p no:cacheprovider --junitxml="$OUT/junit.xml" "${@:-tests}" 2>&1 | tee "$OUT/pytest-gpu.log"
rc=${PIPESTATUS[0]}
# One archive: the device tool does not bring back folders nested this deep.
tar czf "$OUT/evidence.tgz" -C "$OUT" evidence && rm -rf "$OUT/evidence"
echo "pytest -m gpu: exit $rc; logs under $OUT (evidence.tgz: what each test saw)"
exit "$rc"
