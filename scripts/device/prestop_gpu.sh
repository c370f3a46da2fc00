#!/usr/bin/env bash
# `gpuzombie prestop` against real CUDA workers in a PID namespace (issue 5), on nvidia-h200.
# Run from the repo root:   bash scripts/device/prestop_gpu.sh        (budget: 60 s)
# A "pod" (unshare PID + mount namespace, tini as PID 1) runs the seed's parent.py twice: one
# worker that ignores SIGTERM (S1-S3) and one with the SIGTERM handler (S4), 2 GiB each. Then
# prestop runs INSIDE the pod (nsenter --pid --mount), as a preStop hook would
# (python3 -m gpuzombie.prestop --timeout 5).
# Measured from the host with NVML every 10 ms: seconds from prestop's start until each worker's
# memory is free (its pid gone from NVML) and until the GPU is back at its baseline.
# Writes $OUT/prestop_gpu.json and prints a table. Without a GPU: DEVICE=cpu (RSS stand-in).
set -uo pipefail
for f in .debs/*.deb; do [ -e "$f" ] && dpkg -x "$f" /tmp/debs; done
export PATH="/tmp/debs/usr/bin:$PATH"
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}"
OUT="${OUT:-/tmp/gz-prestop-out}"
mkdir -p "$OUT"
timeout --kill-after=3 55 python3 - "$OUT" "${DEVICE:-auto}" "${TIMEOUT:-5}" <<'PY'
import json, os, shutil, signal, subprocess, sys, threading, time

from gpuzombie.gpu.nvml import MIB, PynvmlBackend

out, device, prestop_timeout = sys.argv[1], sys.argv[2], sys.argv[3]
nvml = PynvmlBackend()
snap = nvml.read()
gpu = snap.available and bool(snap.devices)
if device == "auto":
    device = "cuda" if gpu else "cpu"
baseline = snap.devices[0].memory_used if gpu else 0
init = ["tini", "-s", "--"] if shutil.which("tini") else []
mod = "python3 -m gpuzombie.workloads.parent --workers 1 --size-mib 2048 --device " + device
pod = subprocess.Popen(
    ["unshare", "--pid", "--fork", "--mount-proc", "--kill-child", *init, "sh", "-c",
     f"{mod}; {mod} --fixed; exec sleep infinity"],
    stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
def give_up(*_):
    """`timeout` ended us: take the pod (and its GPU memory) down too; --kill-child does the rest."""
    try:
        os.killpg(pod.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    os._exit(124)
signal.signal(signal.SIGTERM, give_up)
pod_lines = []
def read_pod():
    for line in pod.stdout:
        pod_lines.append((time.monotonic(), line.rstrip()))
threading.Thread(target=read_pod, daemon=True).start()

def wait_for(cond, limit):
    end = time.monotonic() + limit
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(0.05)
    return False

ok = wait_for(lambda: sum("parent exiting" in l for _, l in pod_lines) >= 2, 40)
kids = open(f"/proc/{pod.pid}/task/{pod.pid}/children").read().split()
pid1 = int(kids[0])
def host_workers():
    found = {}
    for p in os.listdir("/proc"):
        if not p.isdigit():
            continue
        try:
            cmd = open(f"/proc/{p}/cmdline", "rb").read().replace(b"\0", b" ").decode()
            ns = os.readlink(f"/proc/{p}/ns/pid")
        except OSError:
            continue
        if "gpuzombie.workloads.worker" in cmd and ns == os.readlink(f"/proc/{pid1}/ns/pid"):
            found[int(p)] = "handling (worker_fixed)" if "worker_fixed" in cmd else "ignoring (worker)"
    return found
workers = host_workers()
samples = []
stop = threading.Event()
def sample():
    while not stop.is_set():
        t = time.monotonic()
        if gpu:
            s = nvml.read()
            d = s.devices[0]
            samples.append((t, d.memory_used, {p.pid for p in d.processes}))
        else:
            samples.append((t, 0, {p for p in workers if os.path.exists(f"/proc/{p}")
                                   and open(f"/proc/{p}/stat").read().rsplit(")", 1)[1].split()[0] != "Z"}))
        time.sleep(0.01)
threading.Thread(target=sample, daemon=True).start()
time.sleep(0.3)
t0 = time.monotonic()
# The hook as a pod spec would run it: the stdlib entry point (no click/rich imports).
done = subprocess.run(["nsenter", "--target", str(pid1), "--pid", "--mount", "python3", "-m",
                       "gpuzombie.prestop", "--timeout", prestop_timeout, "--json"],
                      capture_output=True, text=True)
t_prestop = time.monotonic() - t0
wait_for(lambda: samples and all(w not in samples[-1][2] for w in workers)
         and (not gpu or samples[-1][1] <= baseline + 64 * MIB), 10)
time.sleep(0.2)
stop.set()
os.killpg(pod.pid, signal.SIGKILL)
pod.wait()

def free_after(pid):
    for t, _, pids in samples:
        if t >= t0 and pid not in pids:
            return round(t - t0, 3)
    return None
baseline_back = next((round(t - t0, 3) for t, used, _ in samples if t >= t0 and used <= baseline + 64 * MIB), None) if gpu else None
report = json.loads(done.stdout) if done.stdout.strip().startswith("{") else None
outcomes = {}
for r in (report or {}).get("results", []):
    outcomes[r["target"]["comm"] + ":" + str(r["target"]["pid"])] = r
result = {
    "device": device, "gpu": snap.devices[0].name if gpu else None, "driver": snap.driver_version,
    "init": "tini" if init else "sh/sleep", "prestop_timeout_s": float(prestop_timeout),
    "prestop_rc": done.returncode, "prestop_wall_s": round(t_prestop, 3),
    "baseline_mib": round(baseline / MIB), "peak_mib": round(max((u for _, u, _ in samples), default=0) / MIB),
    "gpu_back_to_baseline_s": baseline_back,
    "workers": [{"host_pid": p, "kind": k, "memory_free_s": free_after(p)} for p, k in sorted(workers.items())],
    "prestop_report": report, "prestop_stderr": done.stderr[-2000:],
    "pod_log": [l for _, l in pod_lines][-40:], "pods_ready": ok,
}
open(os.path.join(out, "prestop_gpu.json"), "w").write(json.dumps(result, indent=1))
print(f"prestop inside the pod (PID 1: {result['init']}), --timeout {prestop_timeout}: exit {done.returncode}, "
      f"ran {t_prestop:.2f} s; device {device} {result['gpu'] or ''}")
print(f"{'worker':<26}{'memory free after prestop start (s)':>38}")
for w in result["workers"]:
    print(f"{w['kind']:<26}{str(w['memory_free_s']):>38}")
if gpu:
    print(f"GPU0 back to baseline ({result['baseline_mib']} MiB) after {baseline_back} s (peak {result['peak_mib']} MiB)")
print("prestop log lines in PID 1's stdout:", sum("gpuzombie prestop:" in l for _, l in pod_lines))
PY
echo "exit=$? wrote $OUT/prestop_gpu.json"
