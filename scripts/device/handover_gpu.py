"""The handover gate on a real GPU (run by scripts/device/handover_gpu.sh, as root, PYTHONPATH=src).

On a private containerd (the lab's, GPU devices in GPU containers), REPEAT times: pod A's torch
worker holds SIZE_MIB in A's cgroup and outlives A (``lab.handover.stale_holder``); pod B as written
starts beside it (both holders read from NVML); pod B as the webhook patches it with --preflight
(its real mutation: the gate first, with the pod's GPU) waits, its gate reporting the holder, until
``gpuzombie reap --yes`` ends the holder; then B's workload starts. Measured: reap → the holder gone
from NVML, free → B's workload container running, free → NVML lists B's worker. Writes OUT/handover.json
(every run) and OUT/gate-<n>.log (the gate's polls, as ``kubectl logs`` shows them).

DEVICE=cpu: the same on the CPU stand-in (the GPU is ``lab.handover.StandinNvml``), a dry run.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import statistics
import sys
import time
from pathlib import Path

from gpuzombie.gpu.nvml import default_backend, read_gpus
from gpuzombie.lab.handover import StandinNvml, gated, pod_b, run_b, stale_holder, with_standin
from gpuzombie.lab.runtime.cri import cri_runtime
from gpuzombie.lab.runtime.manifestpod import HostPathGrant
from gpuzombie.units import MIB

OUT = Path(sys.argv[1])
SIZE_MIB = int(os.environ.get("SIZE_MIB", "2048"))
REPEAT = int(os.environ.get("REPEAT", "3"))
REAP_AFTER_S = float(os.environ.get("REAP_AFTER_S", "8"))
BUDGET_S = float(os.environ.get("BUDGET_S", "330"))
DEVICE = os.environ.get("DEVICE", "cuda")
ARCHIVES = Path(os.environ.get("ARCHIVES", ".lab-images"))


def say(line: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} {line}", flush=True)


def spread(values: list[float]) -> dict[str, float] | None:
    if not values:
        return None
    return {"n": len(values), "median": statistics.median(values), "min": min(values), "max": max(values)}


def main() -> int:
    OUT.mkdir(parents=True, exist_ok=True)
    nvml = default_backend() if DEVICE == "cuda" else None
    gpu = read_gpus(nvml) if nvml else None
    summary: dict = {"device": DEVICE, "size_mib": SIZE_MIB, "reap_after_s": REAP_AFTER_S, "runs": []}
    if gpu is not None:
        summary["gpu"] = {
            "driver": gpu.driver_version,
            "devices": [(d.name, d.memory_total // MIB) for d in gpu.devices],
        }
    started = time.monotonic()
    standin_dir = Path("/tmp/gpuzombie-handover-standin")
    standin_dir.mkdir(mode=0o755, exist_ok=True)
    with cri_runtime(socket=None, gpu=DEVICE == "cuda", archives=ARCHIVES if ARCHIVES.is_dir() else None) as cri:
        for n in range(1, REPEAT + 1):
            if time.monotonic() - started > BUDGET_S:
                say(f"run {n}: skipped (budget {BUDGET_S:g} s)")
                break
            say(f"run {n}/{REPEAT}: pod A leaves a stale holder of {SIZE_MIB} MiB")
            plain_doc = pod_b("handover-b", size_mib=SIZE_MIB, device=DEVICE)
            gated_doc = gated(plain_doc)
            grants: tuple[HostPathGrant, ...] = ()
            with stale_holder(cri.pods, size_mib=SIZE_MIB, device=DEVICE, log=OUT / f"a-{n}.log") as holder:
                stand_in = (
                    StandinNvml(standin_dir, holder.process, SIZE_MIB * MIB)
                    if DEVICE != "cuda"
                    else contextlib.nullcontext()
                )
                with stand_in:
                    if DEVICE != "cuda":
                        gated_doc = with_standin(gated_doc, str(standin_dir))
                        grants = (HostPathGrant(str(standin_dir)),)
                    plain = run_b(cri, plain_doc, holder, device=DEVICE, reap_after_s=0, nvml=nvml, say=say)
                    result = run_b(
                        cri, gated_doc, holder, device=DEVICE, reap_after_s=REAP_AFTER_S, nvml=nvml, say=say,
                        host_paths=grants,
                    )  # fmt: skip
            (OUT / f"gate-{n}.log").write_text(result.gate_log + "\n== events\n" + "\n".join(result.events) + "\n")
            summary["runs"].append(
                {
                    "without_gate": {
                        "started_beside_the_holder": plain.workload_started_while_dirty,
                        "nvml_mib": plain.both_holders,
                    },
                    "with_gate": {
                        k: v
                        for k, v in dataclasses.asdict(result).items()
                        if k not in ("gate_log", "events", "both_holders", "reap_output")
                    },
                }
            )
            say(f"run {n}: {json.dumps(summary['runs'][-1])}")
    gates = [r["with_gate"] for r in summary["runs"]]
    summary["spread"] = {
        key: spread([g[key] for g in gates if g[key] is not None])
        for key in ("reap_to_free_s", "free_to_running_s", "free_to_holding_s")
    }
    ok = bool(gates) and all(
        not g["workload_started_while_dirty"] and g["gate_dirty_polls"] >= 2 and g["reap_exit"] == 0
        and g["free_to_running_s"] is not None
        for g in gates
    ) and all(r["without_gate"]["started_beside_the_holder"] for r in summary["runs"])  # fmt: skip
    summary["ok"] = ok
    (OUT / "handover.json").write_text(json.dumps(summary, indent=1))
    print(json.dumps(summary["spread"], indent=1))
    print("handover gate on the GPU:", "OK" if ok else "NOT AS EXPECTED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
