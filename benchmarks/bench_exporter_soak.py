"""Soak: `gpuzombie exporter` on this node's real /proc for N minutes under churn and a connection flood.

    sudo python3 benchmarks/bench_exporter_soak.py [--minutes 10] [--json]

While the exporter (a subprocess, default serving options) runs:

* churn: a helper process spawns ``/bin/true`` at 200 processes/s and reaps them in batches every
  0.5 s, so ~100 host zombies come and go all the time;
* PID namespaces come and go: every 2 s a new one (``unshare --pid``) whose PID 1 is ``sleep`` with a
  zombie and an orphan under it; at most 10 live, the oldest killed;
* 2,000 connections are held open against the exporter and every connection it cuts (evicted at its
  bound, or past its read deadline) is opened again, at most 100 per second: a persistent attacker;
* a scraper reads /metrics 5 times a second, timing each answer;
* with TLS (the default; ``--no-tls`` for plain HTTP): the exporter serves HTTPS with a certificate
  made by openssl for the run, the scraper verifies it, the held connections are stalled handshakes
  (TCP, no ClientHello), and failed handshakes come at 10 a second, three kinds in turn: a client
  that distrusts the certificate, plain HTTP to the TLS port, a hang-up before the ClientHello.

Prints scrape latency (p50, p99, max), errors, the exporter's RSS, fds and threads (after a 10 s
warm-up, at the end, and their trend: the mean of the last third of the samples minus that of the
first third), its CPU use, and the churn actually reached. Not run in CI (root, minutes).
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import platform
import re
import resource
import selectors
import signal
import socket
import ssl
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
from pki import make_pki  # tests/pki.py: the CA and server certificate, made by openssl

CHURN = """
import os, sys, time
period = 1 / float(sys.argv[1])
spawned, next_at, reaped_at = 0, time.monotonic(), time.monotonic()
while True:
    os.posix_spawn("/bin/true", ["true"], {})
    spawned += 1
    now = time.monotonic()
    if now - reaped_at >= 0.5:  # reap in batches: the exited children are zombies until then
        while True:
            try:
                if os.waitpid(-1, os.WNOHANG)[0] == 0:
                    break
            except ChildProcessError:
                break
        reaped_at = now
        print(spawned, flush=True)
    next_at += period
    time.sleep(max(0.0, next_at - time.monotonic()))
"""
NAMESPACE_SCRIPT = "sleep 0.05 & (sleep 1000 &); exec sleep 1000"


@dataclass
class ExporterSample:
    at_s: float
    rss_kib: int
    peak_rss_kib: int
    fds: int
    threads: int
    cpu_s: float


@dataclass
class Soak:
    scrape_ms: list[float] = field(default_factory=list)
    scrape_errors: dict[str, int] = field(default_factory=dict)
    samples: list[ExporterSample] = field(default_factory=list)
    namespaces_started: int = 0
    reconnects: int = 0
    connect_failures: int = 0
    held_at_end: int = 0
    failed_handshakes: int = 0
    exporter_log_lines: int = 0
    exporter_tracebacks: int = 0
    exporter_log_sample: list[str] = field(default_factory=list)
    failed_handshake_surprises: dict[str, int] = field(default_factory=dict)
    processes_spawned: int = 0
    exporter_counters: dict[str, float] = field(default_factory=dict)


def sample(pid: int, started: float) -> ExporterSample:
    status = dict(line.split(":", 1) for line in Path(f"/proc/{pid}/status").read_text().splitlines() if ":" in line)
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    ticks = os.sysconf("SC_CLK_TCK")
    return ExporterSample(
        at_s=round(time.monotonic() - started, 1),
        rss_kib=int(status["VmRSS"].split()[0]),
        peak_rss_kib=int(status["VmHWM"].split()[0]),
        fds=len(os.listdir(f"/proc/{pid}/fd")),
        threads=int(status["Threads"]),
        cpu_s=(int(fields[11]) + int(fields[12])) / ticks,
    )


@dataclass(frozen=True)
class Tls:
    """The run's PKI (tests/pki.py, made by openssl) and the scraper's context that trusts it."""

    directory: Path
    client: ssl.SSLContext

    @classmethod
    def make(cls, directory: Path) -> Tls:
        make_pki(directory)
        return cls(directory, ssl.create_default_context(cafile=str(directory / "ca.pem")))

    def flags(self) -> list[str]:
        return ["--tls-cert", str(self.directory / "server.pem"), "--tls-key", str(self.directory / "server.key")]


def start_exporter(args: argparse.Namespace, tls: Tls | None, soak: Soak) -> tuple[subprocess.Popen[str], int]:
    """The exporter under an address-space limit: a scan that reads an endless file (a tenant's
    /dev/zero link, issue 10) fails with MemoryError instead of taking the machine's memory."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO / "src"), os.environ.get("PYTHONPATH")]))}
    limit = args.memory_limit_mib * 1024 * 1024

    def limit_memory() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))

    exporter = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "gpuzombie",
            "exporter",
            "--listen",
            "127.0.0.1:0",
            "--min-interval",
            str(args.min_interval),
            "--max-connections",
            str(args.max_connections),
            "--read-timeout",
            str(args.read_timeout),
            *(tls.flags() if tls is not None else []),
        ],
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        preexec_fn=limit_memory,
    )
    first = exporter.stderr.readline()  # type: ignore[union-attr]
    if "127.0.0.1:" not in first:
        exporter.kill()
        raise SystemExit(f"bench_exporter_soak: the exporter did not start: {first.strip()}")
    port = int(first.split("127.0.0.1:")[1].split("/")[0])

    def drain() -> None:  # count what the exporter logs: warnings under churn, never one per scan
        for line in exporter.stderr:  # type: ignore[union-attr]
            soak.exporter_log_lines += 1
            soak.exporter_tracebacks += line.startswith("Traceback")
            if len(soak.exporter_log_sample) < 20:
                soak.exporter_log_sample.append(line.rstrip("\n"))

    threading.Thread(target=drain, daemon=True).start()
    return exporter, port


def scrape_loop(port: int, hz: float, tls: Tls | None, stop: threading.Event, soak: Soak) -> None:
    while not stop.wait(1 / hz):
        started = time.perf_counter()
        try:
            if tls is None:
                conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
            else:
                conn = http.client.HTTPSConnection("127.0.0.1", port, timeout=10, context=tls.client)
            conn.request("GET", "/metrics")
            response = conn.getresponse()
            body = response.read()
            conn.close()
            for name, value in re.findall(rb"^(gpuzombie_scans_total|gpuzombie_scan_errors_total) (\S+)$", body, re.M):
                soak.exporter_counters[name.decode()] = float(value)
            if response.status != 200 or b"gpuzombie_scan_success 1.0" not in body:
                kind = f"status {response.status}" if response.status != 200 else "scan failed"
                soak.scrape_errors[kind] = soak.scrape_errors.get(kind, 0) + 1
                continue
        except (OSError, http.client.HTTPException) as exc:
            kind = type(exc).__name__
            soak.scrape_errors[kind] = soak.scrape_errors.get(kind, 0) + 1
            continue
        soak.scrape_ms.append((time.perf_counter() - started) * 1000)


def hold_connections(port: int, count: int, rate: float, stop: threading.Event, soak: Soak) -> None:
    """Keep ``count`` idle connections open; reopen the ones the exporter cuts, ``rate`` a second."""
    selector = selectors.DefaultSelector()

    def connect() -> None:
        try:
            s = socket.create_connection(("127.0.0.1", port), timeout=5)
        except OSError:
            soak.connect_failures += 1
            return
        s.setblocking(False)
        selector.register(s, selectors.EVENT_READ)

    for _ in range(count):
        if stop.is_set():
            break
        connect()
    budget, last = 0.0, time.monotonic()
    while not stop.is_set():
        for key, _ in selector.select(timeout=0.2):  # readable: EOF or reset, the server cut it
            selector.unregister(key.fileobj)
            key.fileobj.close()  # type: ignore[union-attr]
        now = time.monotonic()
        budget = min(rate, budget + (now - last) * rate)
        last = now
        while len(selector.get_map()) < count and budget >= 1 and not stop.is_set():
            budget -= 1
            soak.reconnects += 1
            connect()
    soak.held_at_end = len(selector.get_map())
    for key in list(selector.get_map().values()):
        key.fileobj.close()  # type: ignore[union-attr]


def failed_handshakes(port: int, rate: float, stop: threading.Event, soak: Soak) -> None:
    """Handshakes that fail, ``rate`` a second, three kinds in turn; a kind that does not fail as
    it should is counted in ``failed_handshake_surprises``."""
    distrusting = ssl.create_default_context()  # the system CAs: the run's CA is not among them
    kind = 0
    while not stop.wait(1 / rate):
        surprise = None
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=10) as raw:
                if kind == 0:
                    try:
                        distrusting.wrap_socket(raw, server_hostname="127.0.0.1").close()
                        surprise = "handshake succeeded"
                    except ssl.SSLCertVerificationError:
                        pass
                elif kind == 1:
                    raw.sendall(b"GET /metrics HTTP/1.0\r\n\r\n")
                    if raw.recv(65536).startswith(b"HTTP/"):
                        surprise = "plain HTTP answered"
        except (OSError, ssl.SSLError) as exc:
            if kind != 1 or not isinstance(exc, ConnectionResetError):  # a reset is plain HTTP's answer
                surprise = type(exc).__name__
        if surprise is not None:
            soak.failed_handshake_surprises[surprise] = soak.failed_handshake_surprises.get(surprise, 0) + 1
        soak.failed_handshakes += 1
        kind = (kind + 1) % 3


def namespaces_loop(stop: threading.Event, soak: Soak) -> None:
    live: list[subprocess.Popen[bytes]] = []
    try:
        while not stop.wait(2):
            live.append(
                subprocess.Popen(
                    ["unshare", "--pid", "--fork", "--mount-proc", "--kill-child", "sh", "-c", NAMESPACE_SCRIPT],
                    stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL,
                )
            )
            soak.namespaces_started += 1
            if len(live) > 10:
                oldest = live.pop(0)
                oldest.kill()  # --kill-child: the namespace's PID 1 dies with it
                oldest.wait()
    finally:
        for p in live:
            p.kill()
            p.wait()


def percentile(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1] if len(values) > 1 else float("nan")


def trend(values: list[int]) -> float:
    """Mean of the last third minus mean of the first third: ~0 when flat, > 0 when growing."""
    third = max(1, len(values) // 3)
    return round(statistics.mean(values[-third:]) - statistics.mean(values[:third]), 1)


def run(args: argparse.Namespace) -> dict:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, min(hard, args.connections + 1024)), hard))
    soak = Soak()
    pki = tempfile.TemporaryDirectory(prefix="gpuzombie-soak-pki-")
    tls = Tls.make(Path(pki.name)) if args.tls else None
    exporter, port = start_exporter(args, tls, soak)
    churn = subprocess.Popen([sys.executable, "-c", CHURN, str(args.churn_rate)], stdout=subprocess.PIPE, text=True)
    last_count = ["0"]
    threading.Thread(
        target=lambda: [last_count.__setitem__(0, line.strip()) for line in churn.stdout], daemon=True
    ).start()  # type: ignore[union-attr]
    stop = threading.Event()
    threads = [
        threading.Thread(target=scrape_loop, args=(port, args.scrape_hz, tls, stop, soak)),
        threading.Thread(target=hold_connections, args=(port, args.connections, args.reconnect_rate, stop, soak)),
        threading.Thread(target=namespaces_loop, args=(stop, soak)),
    ]
    if tls is not None:
        threads.append(threading.Thread(target=failed_handshakes, args=(port, args.failed_handshake_rate, stop, soak)))
    started = time.monotonic()
    churn_started = started
    for t in threads:
        t.start()
    try:
        time.sleep(10)  # warm-up: the first scans, the flood established
        soak.samples.append(sample(exporter.pid, started))
        deadline = started + args.minutes * 60
        while time.monotonic() < deadline:
            time.sleep(min(30.0, max(0.0, deadline - time.monotonic())))
            soak.samples.append(sample(exporter.pid, started))
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=30)
        churn.send_signal(signal.SIGTERM)
        churn.wait(timeout=10)
        exporter.send_signal(signal.SIGTERM)
        exporter_rc = exporter.wait(timeout=30)
        pki.cleanup()
    soak.processes_spawned = int(last_count[0] or 0)
    elapsed = time.monotonic() - churn_started
    first, last = soak.samples[0], soak.samples[-1]
    ms = soak.scrape_ms
    return {
        "minutes": args.minutes,
        "tls": args.tls,
        "scrapes_ok": len(ms),
        "scrape_errors": soak.scrape_errors,
        "scrape_ms": {
            "p50": round(statistics.median(ms), 2) if ms else None,
            "p99": round(percentile(ms, 99), 2) if ms else None,
            "max": round(max(ms), 2) if ms else None,
        },
        "exporter": {
            "rss_kib": {
                "after_warmup": first.rss_kib,
                "end": last.rss_kib,
                "peak": last.peak_rss_kib,
            },
            "fds": {
                "after_warmup": first.fds,
                "end": last.fds,
                "max": max(s.fds for s in soak.samples),
                "trend": trend([s.fds for s in soak.samples]),
            },
            "threads": {
                "after_warmup": first.threads,
                "end": last.threads,
                "max": max(s.threads for s in soak.samples),
                "trend": trend([s.threads for s in soak.samples]),
            },
            "rss_kib_trend": trend([s.rss_kib for s in soak.samples]),
            "cpu_percent_of_one_core": round(100 * (last.cpu_s - first.cpu_s) / max(1e-9, last.at_s - first.at_s), 1),
            "exit_code_on_sigterm": exporter_rc,
            "scans": soak.exporter_counters.get("gpuzombie_scans_total"),
            "scan_errors": soak.exporter_counters.get("gpuzombie_scan_errors_total"),
            "stderr_lines_after_its_first": soak.exporter_log_lines,
            "stderr_tracebacks": soak.exporter_tracebacks,
            "stderr_sample": soak.exporter_log_sample,
        },
        "churn": {
            "processes_per_s": round(soak.processes_spawned / elapsed, 1),
            "pid_namespaces_started": soak.namespaces_started,
            "held_connections_at_end": soak.held_at_end,
            "reconnects_after_cuts": soak.reconnects,
            "connect_failures": soak.connect_failures,
            "failed_handshakes": soak.failed_handshakes,
            "failed_handshakes_not_failing_as_expected": soak.failed_handshake_surprises,
        },
        "options": vars(args),
        "samples": [asdict(s) for s in soak.samples],
    }


def report(result: dict) -> str:
    e, c, ms = result["exporter"], result["churn"], result["scrape_ms"]
    errors = sum(result["scrape_errors"].values())
    tls = (
        f"TLS (scrapes verify the certificate; {c['failed_handshakes']} failed handshakes, "
        f"{sum(c['failed_handshakes_not_failing_as_expected'].values())} not failing as expected), "
        if result["tls"]
        else "plain HTTP, "
    )
    return "\n".join(
        [
            f"exporter soak, {result['minutes']} min, {tls}{c['processes_per_s']} processes/s spawned, "
            f"{c['pid_namespaces_started']} PID namespaces (zombie + orphan each), "
            f"{result['options']['connections']} held connections ({c['reconnects_after_cuts']} reopened after cuts, "
            f"{c['connect_failures']} connects failed, {c['held_connections_at_end']} open at the end)",
            f"scrapes: {result['scrapes_ok']} ok, {errors} errors {result['scrape_errors'] or ''}".rstrip(),
            f"scrape latency ms: p50 {ms['p50']}  p99 {ms['p99']}  max {ms['max']}",
            f"exporter RSS KiB: {e['rss_kib']['after_warmup']} after warm-up -> {e['rss_kib']['end']} at the end "
            f"(peak {e['rss_kib']['peak']}, VmHWM; trend {e['rss_kib_trend']:+})",
            f"exporter fds: {e['fds']['after_warmup']} -> {e['fds']['end']} (max {e['fds']['max']}, trend "
            f"{e['fds']['trend']:+}); threads: {e['threads']['after_warmup']} -> {e['threads']['end']} "
            f"(max {e['threads']['max']}, trend {e['threads']['trend']:+})",
            f"exporter CPU: {e['cpu_percent_of_one_core']}% of one core; scans {e['scans']}, failed {e['scan_errors']}; "
            f"exit code on SIGTERM {e['exit_code_on_sigterm']}; {e['stderr_lines_after_its_first']} stderr lines "
            f"after its first, {e['stderr_tracebacks']} tracebacks",
        ]
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--minutes", type=float, default=10)
    parser.add_argument("--churn-rate", type=float, default=200, help="processes spawned per second")
    parser.add_argument("--connections", type=int, default=2000, help="connections held open")
    parser.add_argument("--reconnect-rate", type=float, default=100, help="cut connections reopened per second")
    parser.add_argument("--scrape-hz", type=float, default=5)
    parser.add_argument("--min-interval", type=float, default=1, help="the exporter's --min-interval")
    parser.add_argument("--max-connections", type=int, default=32, help="the exporter's --max-connections")
    parser.add_argument("--read-timeout", type=float, default=10, help="the exporter's --read-timeout")
    parser.add_argument(
        "--tls", action=argparse.BooleanOptionalAction, default=True, help="serve HTTPS (--no-tls: plain HTTP)"
    )
    parser.add_argument("--failed-handshake-rate", type=float, default=10, help="failed TLS handshakes per second")
    parser.add_argument("--memory-limit-mib", type=int, default=3072, help="the exporter's address-space limit")
    parser.add_argument("--json", action="store_true", help="print the result as JSON")
    args = parser.parse_args()
    if os.geteuid() != 0:
        print("bench_exporter_soak: needs root (PID namespaces, the whole /proc)", file=sys.stderr)
        return 2
    header = f"# {platform.node()} {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f}, {time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())}"
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # stopped: still clean up (run's finally)
    result = run(args)
    print(json.dumps(result, indent=2) if args.json else header + "\n" + report(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
