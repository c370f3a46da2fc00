"""The exporter and the webhook stop on SIGTERM whichever of their threads the kernel hands it to.

A process-directed signal goes to any thread that does not block it. When a server thread takes it,
CPython's C handler only notes it; a main thread asleep in ``Event.wait(3600)`` would run the Python
handler an hour later, and the kubelet SIGKILLs the agent at the end of its grace period. Under
``stress-ng --cpu 2`` that happened in 2 of 8 runs of test_cri_names' exporter test (issue 18).
Here the signal goes to a server thread on purpose (tgkill), so the case is not left to chance.
On 241ae16 the webhook's main thread slept in ``Event.wait`` on its 30 s TLS check: a SIGTERM taken
by a server thread stopped it 29.4-30.2 s later (3 of 3, benchmarks/bench_stop_signal.py); both now
wait in ``serving.serve_until_stopped``, on the wakeup fd.
"""

from __future__ import annotations

import ctypes
import os
import re
import shutil
import signal
import ssl
import subprocess
import sys
import urllib.request
from pathlib import Path

import pytest

pytest.importorskip("prometheus_client", reason="prometheus-client is in the 'exporter' extra")

from fakeproc import make_fake_proc, make_fake_root
from pidns import wait_until
from pki import make_pki

SYS_TGKILL = {"x86_64": 234, "aarch64": 131}.get(os.uname().machine)


def tgkill(pid: int, tid: int, signum: int) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.syscall(SYS_TGKILL, pid, tid, signum) != 0:
        raise OSError(ctypes.get_errno(), f"tgkill {pid} {tid}")


def _exporter(tmp_path) -> tuple[list[str], str]:
    root = tmp_path / "proc"
    root.mkdir()
    make_fake_root(root)
    make_fake_proc(root, 1, ppid=0, comm="sleep")
    argv = ["exporter", "--listen", "127.0.0.1:0", "--min-interval", "0", "--procfs", str(root)]
    return [*argv, "--cri-socket", str(tmp_path / "none.sock")], r"serving (http)://127\.0\.0\.1:(\d+)/"


def _webhook(tmp_path) -> tuple[list[str], str]:
    make_pki(tmp_path)
    argv = ["webhook", "--listen", "127.0.0.1:0", "--tls-cert", str(tmp_path / "server.pem")]
    return [
        *argv,
        "--tls-key",
        str(tmp_path / "server.key"),
        "--image",
        "registry.example/gpuzombie:1",
    ], r"serving (https)://127\.0\.0\.1:(\d+)/"


@pytest.mark.skipif(SYS_TGKILL is None, reason="tgkill's syscall number is known for x86_64 and aarch64 only")
@pytest.mark.parametrize("server", [_exporter, _webhook], ids=["exporter", "webhook"])
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_stop_signal_taken_by_a_server_thread_stops_the_server(server, signum, tmp_path):
    argv, serving = server(tmp_path)
    log = tmp_path / "server.log"
    with open(log, "w") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "gpuzombie", *argv],
            env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
            stderr=err,
        )
    try:
        scheme, port = wait_until(lambda: re.search(serving, log.read_text()), timeout=60).groups()
        context = ssl.create_default_context(cafile=str(tmp_path / "ca.pem")) if scheme == "https" else None
        with urllib.request.urlopen(f"{scheme}://127.0.0.1:{port}/healthz", timeout=30, context=context) as response:
            assert response.status == 200  # served: the main thread is in its wait by now
        threads = [int(tid) for tid in os.listdir(f"/proc/{proc.pid}/task") if int(tid) != proc.pid]
        assert threads, "the server serves from threads"
        tgkill(proc.pid, threads[0], signum)
        # A healthy stop takes 0.1-0.2 s (benchmarks/bench_stop_signal.py, interpreter exit included);
        # 20 s is the margin, and stays below the webhook's 30 s TLS check that 241ae16 slept through.
        code = proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        raise AssertionError(f"{argv[0]} ignored {signal.Signals(signum).name}: {log.read_text()}") from None
    finally:
        proc.kill()
        proc.wait()
    assert code == (0 if signum == signal.SIGTERM else 130), log.read_text()
    assert f"stopped ({signal.Signals(signum).name})" in log.read_text()


def test_the_exporter_serves_a_renewed_certificate_without_a_restart(tmp_path):
    """The webhook's reload, now the exporter's too (one ``serve_until_stopped``): on 241ae16 the
    exporter served the certificate it started with until restarted."""
    old, new, live = tmp_path / "old", tmp_path / "new", tmp_path / "live"
    for directory in (old, new, live):
        directory.mkdir()
    make_pki(old)
    make_pki(new)
    for name in ("server.pem", "server.key"):
        shutil.copy(old / name, live / name)
    argv, _ = _exporter(tmp_path)
    argv += ["--tls-cert", str(live / "server.pem"), "--tls-key", str(live / "server.key")]
    log = tmp_path / "server.log"
    with open(log, "w") as err:
        proc = subprocess.Popen(
            [sys.executable, "-m", "gpuzombie", *argv, "--tls-reload-seconds", "0.1"],
            env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
            stderr=err,
        )
    try:
        port = wait_until(lambda: re.search(r"serving https://127\.0\.0\.1:(\d+)/", log.read_text()), timeout=60)[1]

        def healthz(ca: Path) -> int:
            context = ssl.create_default_context(cafile=str(ca / "ca.pem"))
            with urllib.request.urlopen(f"https://127.0.0.1:{port}/healthz", timeout=30, context=context) as answer:
                return answer.status

        assert healthz(old) == 200
        for name in ("server.key", "server.pem"):  # a renewal: each file replaced whole
            shutil.copy(new / name, live / f".{name}")
            os.replace(live / f".{name}", live / name)
        wait_until(lambda: "TLS certificate reloaded" in log.read_text(), timeout=30)
        assert healthz(new) == 200
    finally:
        proc.terminate()
        proc.wait(timeout=20)
