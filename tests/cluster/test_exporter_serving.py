"""The exporter's HTTP serving under hostile clients: real sockets on 127.0.0.1 against the real
server (held-open connections, a slowloris sender, a client that never finishes its TLS handshake),
the health probes, TLS and mutual TLS with certificates made by the real openssl, and the CLI."""

from __future__ import annotations

import dataclasses
import json
import re
import signal
import socket
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest

pytest.importorskip("prometheus_client", reason="prometheus-client is in the 'exporter' extra")

from prometheus_client import CollectorRegistry

from gpuzombie.cli.main import main
from gpuzombie.exporter import DEFAULT_LISTEN, NodeCollector, PrometheusExporter, TlsFiles, parse_listen
from gpuzombie.trace.scan import NodeScan
from pidns import wait_until


class Switch:
    """A scan that reads a fake node, or fails while ``broken`` is set."""

    def __init__(self, scan_of_node) -> None:
        self.scan_of_node = scan_of_node
        self.broken = False

    def __call__(self) -> NodeScan:
        if self.broken:
            raise PermissionError(13, "Permission denied", "/host/proc")
        return self.scan_of_node()


@pytest.fixture
def fake_node_scan(tmp_path):
    test_exporter = pytest.importorskip("test_exporter")
    root = tmp_path / "proc"
    test_exporter.build_node(root)
    return lambda: test_exporter.fake_scan(root)


def serve(collector: NodeCollector, **kw) -> tuple[PrometheusExporter, int]:
    registry = CollectorRegistry()
    registry.register(collector)
    exporter = PrometheusExporter(
        registry,
        listen=parse_listen("127.0.0.1:0"),
        probes={"/healthz": collector.liveness, "/readyz": collector.readiness},
        **kw,
    )
    return exporter, exporter.start().port


def get(url: str, context: ssl.SSLContext | None = None) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=10, context=context) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def closed_by_peer(sock: socket.socket) -> bool:
    """True once the server has closed its side (a read returns EOF or the connection is reset)."""
    sock.settimeout(0.05)
    try:
        return sock.recv(1) == b""
    except TimeoutError:
        return False
    except OSError:
        return True


def test_probes_follow_the_scans(fake_node_scan):
    scan = Switch(fake_node_scan)
    collector = NodeCollector(scan, min_interval=0, unhealthy_after=2)
    exporter, port = serve(collector)
    base = f"http://127.0.0.1:{port}"
    try:
        assert get(f"{base}/healthz")[0] == 200  # live before any scan
        status, body = get(f"{base}/readyz")
        assert status == 200 and body.startswith("ready")
        scan.broken = True
        status, body = get(f"{base}/readyz")
        assert status == 503 and "PermissionError" in body
        assert get(f"{base}/healthz")[0] == 200  # one failure in a row: still live
        get(f"{base}/metrics")
        status, body = get(f"{base}/healthz")
        assert status == 503 and "2 scans in a row failed" in body
        status, text = get(f"{base}/metrics")
        assert status == 200 and "gpuzombie_scan_success 0.0" in text
        assert re.search(r"^gpuzombie_last_successful_scan_timestamp_seconds \d", text, re.MULTILINE)
        scan.broken = False
        assert get(f"{base}/readyz")[0] == 200 and get(f"{base}/healthz")[0] == 200
        status, body = get(f"{base}/nothing-here")
        assert status == 404 and "/metrics" in body
    finally:
        exporter.stop()


def test_no_successful_scan_means_no_last_success_timestamp():
    def broken() -> NodeScan:
        raise FileNotFoundError(2, "No such file or directory", "/host/proc")

    collector = NodeCollector(broken, min_interval=0)
    exporter, port = serve(collector)
    try:
        status, text = get(f"http://127.0.0.1:{port}/metrics")
    finally:
        exporter.stop()
    assert status == 200 and "gpuzombie_last_successful_scan_timestamp_seconds" not in text


def test_held_open_connections_neither_starve_the_scraper_nor_pile_up(fake_node_scan):
    collector = NodeCollector(fake_node_scan, min_interval=60)
    exporter, port = serve(collector, max_connections=8, read_timeout=30)
    held: list[socket.socket] = []
    try:
        for _ in range(200):  # 25x the bound, each sending nothing
            held.append(socket.create_connection(("127.0.0.1", port), timeout=5))
        for _ in range(5):
            status, text = get(f"http://127.0.0.1:{port}/metrics")
            assert status == 200 and "gpuzombie_zombies" in text
        # Evicted connections end their threads: the server holds at most the bound (plus the
        # ones it is cutting right now), not 200.
        assert wait_until(lambda: exporter.connections.count() <= 8 or None, timeout=10)
        assert sum(closed_by_peer(s) for s in held) >= 200 - 8
    finally:
        for s in held:
            s.close()
        exporter.stop()


def test_slowloris_is_cut_at_the_read_deadline_whatever_its_pace(fake_node_scan):
    collector = NodeCollector(fake_node_scan, min_interval=60)
    exporter, port = serve(collector, read_timeout=1.0)
    slow = socket.create_connection(("127.0.0.1", port), timeout=5)
    request = b"GET /metrics HTTP/1.1\r\nHost: x\r\n" + b"X-Pad: " + b"a" * 400
    started = time.monotonic()
    sent = 0
    try:
        # One byte every 50 ms (faster than any per-read socket timeout would notice), never ending.
        while time.monotonic() - started < 20 and sent < len(request):
            try:
                slow.send(request[sent : sent + 1])
            except OSError:
                break
            sent += 1
            if closed_by_peer(slow):
                break
        cut_after = time.monotonic() - started
        assert sent < len(request), "the slow sender was never cut"
        assert cut_after < 10, cut_after  # the deadline is 1 s; the watchdog checks every 0.25 s
        assert get(f"http://127.0.0.1:{port}/metrics")[0] == 200
    finally:
        slow.close()
        exporter.stop()


def test_tls_serves_https_and_a_stalled_handshake_blocks_no_one(fake_node_scan, pki):
    collector = NodeCollector(fake_node_scan, min_interval=60)
    tls = TlsFiles(str(pki / "server.pem"), str(pki / "server.key"))
    exporter, port = serve(collector, tls=tls, read_timeout=1.0)
    trusting = ssl.create_default_context(cafile=str(pki / "ca.pem"))
    stalled = socket.create_connection(("127.0.0.1", port), timeout=5)  # TCP only, no ClientHello
    try:
        status, text = get(f"https://127.0.0.1:{port}/metrics", trusting)
        assert status == 200 and "gpuzombie_zombies" in text
        assert get(f"https://127.0.0.1:{port}/readyz", trusting)[0] == 200
        with pytest.raises((urllib.error.URLError, ConnectionError)):  # plain HTTP gets no answer
            urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5)
        assert wait_until(lambda: closed_by_peer(stalled) or None, timeout=10)
    finally:
        stalled.close()
        exporter.stop()


def test_mutual_tls_requires_a_client_certificate(fake_node_scan, pki):
    collector = NodeCollector(fake_node_scan, min_interval=60)
    tls = TlsFiles(str(pki / "server.pem"), str(pki / "server.key"), client_ca=str(pki / "ca.pem"))
    exporter, port = serve(collector, tls=tls)
    anonymous = ssl.create_default_context(cafile=str(pki / "ca.pem"))
    known = ssl.create_default_context(cafile=str(pki / "ca.pem"))
    known.load_cert_chain(str(pki / "client.pem"), str(pki / "client.key"))
    try:
        with pytest.raises((urllib.error.URLError, ssl.SSLError, ConnectionError)):
            get(f"https://127.0.0.1:{port}/metrics", anonymous)
        assert get(f"https://127.0.0.1:{port}/metrics", known)[0] == 200
    finally:
        exporter.stop()


@pytest.mark.parametrize(
    ("flags", "complaint"),
    [
        (["--tls-cert", "/nonexistent.pem"], "give --tls-cert and --tls-key together"),
        (["--tls-client-ca", "/nonexistent.pem"], "needs --tls-cert and --tls-key"),
        (
            ["--tls-cert", "/nonexistent.pem", "--tls-key", "/nonexistent.key"],
            "cannot serve TLS on 127.0.0.1:0: certificate /nonexistent.pem: No such file or directory",
        ),
    ],
    ids=["cert-without-key", "ca-without-cert", "missing-files"],
)
def test_bad_tls_options_are_one_line_exit_2(flags, complaint, capsys):
    assert main(["exporter", "--listen", "127.0.0.1:0", "--procfs", "/proc", *flags]) == 2
    err = capsys.readouterr().err
    assert complaint in err and err.count("\n") == 1, err


def test_default_port_is_no_common_gpu_or_node_exporters(capsys):
    taken = {
        9100: "node-exporter",
        9400: "dcgm-exporter",
        9445: "nvidia_gpu_prometheus_exporter",
        9835: "nvidia_gpu_exporter (utkuozdemir)",
        9256: "process-exporter",
        8080: "kube-state-metrics",
        10250: "kubelet",
    }
    assert parse_listen(DEFAULT_LISTEN).port not in taken
    assert main(["exporter", "--help"]) == 0
    assert DEFAULT_LISTEN in capsys.readouterr().out  # the help text names the real default


def test_cli_listens_on_every_listen_address(tmp_path):
    """Issue 18 (6): the chart gives the pod IP and 127.0.0.1 (kubectl port-forward dials loopback)."""
    test_exporter = pytest.importorskip("test_exporter")
    root = tmp_path / "proc"
    test_exporter.build_node(root)
    replay = tmp_path / "nvml.json"
    replay.write_text(json.dumps(dataclasses.asdict(test_exporter.gpus())))
    argv = [sys.executable, "-m", "gpuzombie", "exporter", "--procfs", str(root), "--nvml-replay", str(replay)]
    proc = subprocess.Popen(
        [*argv, "--listen", "127.0.0.1:0", "--listen", "127.0.0.2:0"], stderr=subprocess.PIPE, text=True
    )
    try:
        first = proc.stderr.readline()
        ports = re.findall(r"http://(127\.0\.0\.[12]):(\d+)/metrics", first)
        assert [host for host, _ in ports] == ["127.0.0.1", "127.0.0.2"], first
        for host, port in ports:
            assert get(f"http://{host}:{port}/healthz")[0] == 200
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0
    finally:
        proc.kill()
        proc.wait()
        proc.stderr.close()


def test_cli_serves_probes_and_stops_on_sigterm(tmp_path):
    test_exporter = pytest.importorskip("test_exporter")
    root = tmp_path / "proc"
    test_exporter.build_node(root)
    replay = tmp_path / "nvml.json"
    replay.write_text(json.dumps(dataclasses.asdict(test_exporter.gpus())))
    argv = [sys.executable, "-m", "gpuzombie", "exporter", "--listen", "127.0.0.1:0", "--procfs", str(root)]
    proc = subprocess.Popen(
        [*argv, "--nvml-replay", str(replay), "--read-timeout", "2"], stderr=subprocess.PIPE, text=True
    )
    try:
        first = proc.stderr.readline()
        port = int(re.search(r"http://127\.0\.0\.1:(\d+)/metrics, /healthz and /readyz", first).group(1))
        assert get(f"http://127.0.0.1:{port}/readyz")[0] == 200
        assert get(f"http://127.0.0.1:{port}/healthz")[0] == 200
        status, text = get(f"http://127.0.0.1:{port}/metrics")
        assert status == 200 and 'verdict="ghost"' in text
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0
    finally:
        proc.kill()
        proc.wait()
        proc.stderr.close()
