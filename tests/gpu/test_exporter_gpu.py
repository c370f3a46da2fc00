"""The exporter against three "pods" holding GPU memory through torch (1 GiB each).

- s1: ``sleep`` as PID 1, the parent exits without wait(): a zombie, an orphan, and PID 1 drops SIGTERM;
- s2: tini as PID 1, its child the SIGTERM-ignoring worker: tini forwards, the worker ignores;
- s4: tini as PID 1, its child the worker with a SIGTERM handler: no grace risk.

``gpuzombie exporter --once`` must show the zombie by a PID-1 parent, the orphan, and GPU memory at
grace risk for exactly the first two reasons; a served exporter answers two scrapes (the second from
its cache) and exits 0 on SIGTERM.
"""

from __future__ import annotations

import re
import signal
import subprocess
import time
import urllib.request

import pytest

from gpupods import GPU_TEST, PY, nvml_pids, parent_pod, save, wait_parents_done, wait_ready, workload
from markers import needs_tini
from pidns import PidNamespace, wait_until

pytestmark = [*GPU_TEST, needs_tini]
SIZE_MIB = 1024


def samples(exposition: str, name: str) -> list[tuple[dict[str, str], float]]:
    """(labels, value) of every sample of ``name``."""
    from prometheus_client.parser import text_string_to_metric_families

    return [
        (s.labels, s.value) for f in text_string_to_metric_families(exposition) for s in f.samples if s.name == name
    ]


def test_zombies_orphans_and_grace_risk_of_real_gpu_pods(tmp_path, evidence):
    pytest.importorskip("prometheus_client")
    logs = {name: tmp_path / f"{name}.log" for name in ("s1", "s2", "s4")}
    s2 = PidNamespace("tini", "--", "sh", "-c", f"exec {workload('worker', SIZE_MIB)} > {logs['s2']} 2>&1")
    s4 = PidNamespace("tini", "--", "sh", "-c", f"exec {workload('worker_fixed', SIZE_MIB)} > {logs['s4']} 2>&1")
    with parent_pod(logs["s1"], workers=1, size_mib=SIZE_MIB), s2, s4:
        wait_parents_done(logs["s1"])
        wait_ready(logs["s2"])
        wait_ready(logs["s4"])
        wait_until(lambda: len(nvml_pids()) >= 3)
        start = time.perf_counter()
        once = subprocess.run([PY, "-m", "gpuzombie", "exporter", "--once"], capture_output=True, text=True, timeout=60)
        once_s = time.perf_counter() - start
        served, scrapes = serve_and_stop(tmp_path)
    save(evidence, "exposition.txt", once.stdout)
    save(evidence, "served.txt", served.stdout or "")
    assert once.returncode == 0, once.stderr
    risk = {labels["reason"]: value for labels, value in samples(once.stdout, "gpuzombie_grace_risk_gpu_memory_bytes")}
    print(f"exporter --once: {once_s:.3f} s (interpreter start included); scrapes {scrapes}")
    print("grace risk (MiB):", {reason: round(value / 2**20) for reason, value in risk.items()})
    assert set(risk) == {"pid1_drops_sigterm", "main_ignores_sigterm"}, risk
    assert all(value >= SIZE_MIB * 2**20 for value in risk.values())
    by_pid1 = [
        v for labels, v in samples(once.stdout, "gpuzombie_zombies_by_parent") if labels["parent_is_pid1"] == "true"
    ]
    assert sum(by_pid1) >= 1
    assert sum(v for labels, v in samples(once.stdout, "gpuzombie_orphans") if labels["verdict"] == "orphan") >= 1
    assert served.returncode == 0, served.stderr


def serve_and_stop(tmp_path) -> tuple[subprocess.CompletedProcess[str], list[str]]:
    """A served exporter on a free loopback port: two timed scrapes, then SIGTERM."""
    err = tmp_path / "served.err"
    with open(err, "w") as stderr:
        server = subprocess.Popen(
            [PY, "-m", "gpuzombie", "exporter", "--listen", "127.0.0.1:0", "--min-interval", "5"],
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
        )
    try:
        url = wait_until(lambda: re.search(r"http://(\S+)/metrics", err.read_text()), timeout=60).group(0)
        scrapes, body = [], ""
        for _ in range(2):
            start = time.perf_counter()
            body = urllib.request.urlopen(url, timeout=30).read().decode()
            scrapes.append(f"{time.perf_counter() - start:.3f} s")
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=30)
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
    return subprocess.CompletedProcess(server.args, server.returncode, body, err.read_text()), scrapes
