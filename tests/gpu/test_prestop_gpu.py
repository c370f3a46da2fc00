"""``gpuzombie prestop`` inside a pod against real CUDA workers, as a preStop hook runs it.

The pod: tini as PID 1, the parent started twice (the seed's S3 and S4 workers: one ignores SIGTERM,
one frees its memory and exits on it), 1 GiB each, both orphans of tini. ``python3 -m
gpuzombie.prestop --timeout 5`` runs inside it (``nsenter --pid --mount``), while NVML is read every
10 ms from the host: the handling worker's memory must be free at once, the ignoring one's right
after the SIGKILL at the timeout; the hook exits 0 and its lines reach PID 1's stdout (the pod log).
"""

from __future__ import annotations

import json
import threading
import time

from gpupods import GPU_TEST, PY, live_children, save, wait_parents_done, workload
from gpuzombie.gpu.nvml import PynvmlBackend
from markers import needs_tini
from pidns import PidNamespace, wait_until

pytestmark = [*GPU_TEST, needs_tini]
SIZE_MIB = 1024
TIMEOUT_S = 5.0


class NvmlSampler(threading.Thread):
    """The host pids NVML lists, every 10 ms, with their monotonic time."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.nvml = PynvmlBackend()
        self.samples: list[tuple[float, set[int]]] = []
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.is_set():
            snapshot = self.nvml.read()
            self.samples.append((time.monotonic(), {p.pid for d in snapshot.devices for p in d.processes}))
            time.sleep(0.01)

    def freed_after(self, pid: int, start: float) -> float | None:
        """Seconds from ``start`` to the first sample without ``pid``."""
        return next((round(t - start, 3) for t, pids in self.samples if t >= start and pid not in pids), None)


def test_prestop_frees_the_handling_worker_at_once_and_the_ignoring_one_at_the_timeout(tmp_path, evidence):
    pod_log = tmp_path / "pod.log"
    parents = f"{workload('parent', SIZE_MIB)}; {workload('parent', SIZE_MIB, '--fixed')}; exec sleep infinity"
    with PidNamespace("tini", "-s", "--", "sh", "-c", parents, log=pod_log) as pod:
        wait_parents_done(pod_log, parents=2)
        commands = {p.pid: " ".join(p.cmdline()) for p in live_children(pod)}  # tini's: sleep and the two workers
        workers = {
            pid: "handling" if "worker_fixed" in command else "ignoring"
            for pid, command in commands.items()
            if "gpuzombie.workloads.worker" in command
        }
        assert sorted(workers.values()) == ["handling", "ignoring"], workers
        sampler = NvmlSampler()
        sampler.start()
        wait_until(lambda: sampler.samples and set(workers) <= sampler.samples[-1][1])
        start = time.monotonic()
        hook = pod.run(PY, "-m", "gpuzombie.prestop", "--timeout", str(TIMEOUT_S), "--json", timeout=60)
        wait_until(lambda: not set(workers) & sampler.samples[-1][1])
        sampler.done.set()
        sampler.join()
    freed = {kind: sampler.freed_after(pid, start) for pid, kind in workers.items()}
    log_lines = [line for line in pod_log.read_text().splitlines() if line.startswith("gpuzombie prestop:")]
    save(evidence, "prestop.json", json.loads(hook.stdout))
    save(evidence, "pod.log", pod_log.read_text())
    print(
        f"prestop --timeout {TIMEOUT_S:g} inside a tini pod: exit {hook.returncode}, {len(log_lines)} lines in PID 1's log"
    )
    for kind, seconds in freed.items():
        print(f"  {kind} worker: GPU memory free {seconds} s after the hook started")
    assert hook.returncode == 0, hook.stderr
    assert freed["handling"] is not None and freed["handling"] < 2.0
    assert freed["ignoring"] is not None and TIMEOUT_S <= freed["ignoring"] < TIMEOUT_S + 2.0
    assert log_lines
