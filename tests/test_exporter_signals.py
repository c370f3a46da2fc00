"""The exporter stops on SIGTERM whichever of its threads the kernel hands the signal to.

A process-directed signal goes to any thread that does not block it. When a server thread takes it,
CPython's C handler only notes it; a main thread asleep in ``Event.wait(3600)`` would run the Python
handler an hour later, and the kubelet SIGKILLs the agent at the end of its grace period. Under
``stress-ng --cpu 2`` that happened in 2 of 8 runs of test_cri_names' exporter test (issue 18).
Here the signal goes to a server thread on purpose (tgkill), so the case is not left to chance.
"""

from __future__ import annotations

import ctypes
import os
import re
import signal
import subprocess
import sys
import urllib.request

import pytest

pytest.importorskip("prometheus_client", reason="prometheus-client is in the 'exporter' extra")

from fakeproc import make_fake_proc, make_fake_root
from pidns import wait_until

SYS_TGKILL = {"x86_64": 234, "aarch64": 131}.get(os.uname().machine)


def tgkill(pid: int, tid: int, signum: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.syscall(SYS_TGKILL, pid, tid, signum) != 0:
        raise OSError(ctypes.get_errno(), f"tgkill {pid} {tid}")


@pytest.mark.skipif(SYS_TGKILL is None, reason="tgkill's syscall number is known for x86_64 and aarch64 only")
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_stop_signal_taken_by_a_server_thread_stops_the_exporter(signum, tmp_path):
    root = tmp_path / "proc"
    root.mkdir()
    make_fake_root(root)
    make_fake_proc(root, 1, ppid=0, comm="sleep")
    log = tmp_path / "exporter.log"
    argv = ["exporter", "--listen", "127.0.0.1:0", "--min-interval", "0", "--procfs", str(root)]
    with open(log, "w") as err:
        exporter = subprocess.Popen(
            [sys.executable, "-m", "gpuzombie", *argv, "--cri-socket", str(tmp_path / "none.sock")],
            env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
            stderr=err,
        )
    try:
        port = wait_until(lambda: re.search(r"serving http://127\.0\.0\.1:(\d+)/", log.read_text()), timeout=60)[1]
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as response:
            assert response.status == 200  # served: the main thread is in its wait by now
        threads = [int(tid) for tid in os.listdir(f"/proc/{exporter.pid}/task") if int(tid) != exporter.pid]
        assert threads, "the exporter serves from threads"
        tgkill(exporter.pid, threads[0], signum)
        # A healthy stop takes well under a second (0.5 s: the server's poll interval); 30 s is the margin.
        code = exporter.wait(timeout=30)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"the exporter ignored {signal.Signals(signum).name}: {log.read_text()}") from None
    finally:
        exporter.kill()
        exporter.wait()
    assert code == (0 if signum == signal.SIGTERM else 130), log.read_text()
    assert f"stopped ({signal.Signals(signum).name})" in log.read_text()
