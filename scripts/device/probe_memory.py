"""Device probe: how NVML used/reserved/free relate to per-process memory (0, 1, 2 torch workers)."""

import json
import subprocess
import sys
import time

import pynvml

pynvml.nvmlInit()
h = pynvml.nvmlDeviceGetHandleByIndex(0)
WORKER = "import torch,time,sys; x=torch.empty(2*1024**3,dtype=torch.uint8,device='cuda'); x.fill_(1); torch.cuda.synchronize(); print('ready',flush=True); time.sleep(600)"


def snap(label):
    v1 = pynvml.nvmlDeviceGetMemoryInfo(h)
    v2 = pynvml.nvmlDeviceGetMemoryInfo(h, version=pynvml.nvmlMemory_v2)
    procs = [(p.pid, p.usedGpuMemory) for p in pynvml.nvmlDeviceGetComputeRunningProcesses(h)]
    row = {
        "label": label,
        "v1_used": v1.used >> 20,
        "v1_free": v1.free >> 20,
        "v1_total": v1.total >> 20,
        "v2_used": v2.used >> 20,
        "v2_free": v2.free >> 20,
        "v2_total": v2.total >> 20,
        "v2_reserved": v2.reserved >> 20,
        "procs": [(pid, (m or 0) >> 20) for pid, m in procs],
    }
    print(json.dumps(row), flush=True)


snap("idle")
ws = []
for n in (1, 2):
    w = subprocess.Popen([sys.executable, "-c", WORKER], stdout=subprocess.PIPE, text=True)
    w.stdout.readline()
    ws.append(w)
    time.sleep(0.5)
    snap(f"{n} workers")
for w in ws:
    w.kill()
    w.wait()
time.sleep(1)
snap("after kill")
