"""observe against real CUDA workers in PID namespaces (the seed's scenario 1), inside and from the host.

Namespace A: ``sleep`` as PID 1, the parent starts one 2 GiB worker and exits without wait();
namespace B: the same with two workers. Every worker must be ``live`` with its local pid inside and
its host + local pid from the host, never an orphaned context; inside B, A's worker is memory of
another namespace, which observe must call ``cannot_tell``, not a ghost. Then A's worker gets
``kill -9``: a zombie under ``sleep``, no longer listed by NVML (a zombie holds no GPU memory).
"""

from __future__ import annotations

import os
import signal

import psutil

from gpupods import GPU_TEST, gpuzombie_json, live_children, nvml_pids, parent_pod, save, wait_parents_done
from pidns import wait_until

pytestmark = GPU_TEST
SIZE_MIB = 2048


def test_cuda_workers_live_inside_and_from_the_host_then_a_zombie_frees(tmp_path, evidence):
    with parent_pod(tmp_path / "a.log", workers=1, size_mib=SIZE_MIB) as a:
        wait_parents_done(tmp_path / "a.log")
        (worker_a,) = live_children(a)
        inside_a = gpuzombie_json("observe", enter=a)
        with parent_pod(tmp_path / "b.log", workers=2, size_mib=SIZE_MIB) as b:
            wait_parents_done(tmp_path / "b.log")
            workers_b = live_children(b)
            inside_b = gpuzombie_json("observe", enter=b)
            host = gpuzombie_json("observe")
            os.kill(worker_a.pid, signal.SIGKILL)
            wait_until(lambda: worker_a.pid not in nvml_pids() and worker_a.status() == psutil.STATUS_ZOMBIE)
            after_kill = gpuzombie_json("observe")
    for name, report in (
        ("inside_A", inside_a),
        ("inside_B", inside_b),
        ("host_AB", host),
        ("host_after_kill", after_kill),
    ):
        save(evidence, f"observe_{name}.json", report)
    by_host_pid = {g["host_pid"]: g for g in host["gpu_processes"]}
    print("ns  local  host  MiB inside  MiB host  verdict inside  verdict host")
    for ns, inside, workers in (("A", inside_a, [worker_a]), ("B", inside_b, workers_b)):
        for worker in workers:
            seen = by_host_pid[worker.pid]
            (local,) = [g for g in inside["gpu_processes"] if g["local_pid"] == seen["local_pid"]]
            print(
                f"{ns}   {local['local_pid']:<5}  {worker.pid:<5} {local['used_memory_mib']:<10}  "
                f"{seen['used_memory_mib']:<8}  {local['verdict']:<14}  {seen['verdict']}"
            )
            assert local["verdict"] == seen["verdict"] == "live"
            assert local["used_memory_mib"] == seen["used_memory_mib"] >= SIZE_MIB
            assert local["local_pid"] in [o["pid"] for o in inside["orphans"]]  # orphaned, and alive
    for report in (inside_a, inside_b, host, after_kill):
        assert report["orphaned_contexts"] == [] and report["summary"]["orphaned_contexts"] == 0
        assert all(g["verdict"] != "gone" for g in report["gpu_processes"])
    gpu = by_host_pid[worker_a.pid]["gpu_index"]
    assert not next(g for g in inside_a["ghosts"] if g["gpu_index"] == gpu)["flagged"]
    # Inside B, A's 2 GiB are another namespace's: invisible from there, never a ghost.
    ghost_b = next(g for g in inside_b["ghosts"] if g["gpu_index"] == gpu)
    assert ghost_b["verdict"] == "cannot_tell" and not ghost_b["flagged"], ghost_b
    assert not any(g["flagged"] for g in host["ghosts"])
    killed = next(p for p in after_kill["processes"] if p["pid"] == worker_a.pid)
    assert killed["state"] == "Z" and worker_a.pid not in {g["host_pid"] for g in after_kill["gpu_processes"]}
    for name, report in (("inside A", inside_a), ("inside B", inside_b), ("host", host), ("after kill", after_kill)):
        ghosts = "; ".join(
            f"GPU{g['gpu_index']} {g['used_mib']} - {g['baseline_mib']} - {g['process_memory_mib']} = "
            f"{g['unexplained_mib']} MiB {g['verdict']}"
            for g in report["ghosts"]
        )
        print(f"{name:11} zombies {report['summary']['zombies']} orphans {report['summary']['orphans']} | {ghosts}")
