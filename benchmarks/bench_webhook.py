"""Latency of `gpuzombie webhook` on a GPU pod's creation path: AdmissionReviews over TLS at a fixed rate.

    python3 benchmarks/bench_webhook.py [--seconds 60] [--rate 50] [--server-cpus 0,1] [--json]

The real CLI serves HTTPS on 127.0.0.1 (a certificate made by openssl). An open-loop client sends, at
``--rate`` per second each and interleaved:

* ``mutate``: POST /mutate with the AdmissionReview of a new GPU pod as the API server sends it (a
  defaulted Deployment pod, random uid; S1's `sh -c '... & exec sleep infinity'` as its command, so
  every answer carries a tini patch);
* ``healthz``: GET /healthz on the same server: the floor of a new TLS connection and an HTTP answer
  with no admission work.

Each request opens a new TLS connection (the server speaks HTTP/1.0) and is timed from its scheduled
send time (queueing included, no coordinated omission). Prints p50/p99/max and errors of each and the
ratio of their p99s. Goal (issue 19): mutate p99 <= 20 ms on 2 cores, no errors. On a machine with
4 or more CPUs the webhook is pinned to 2 (``--server-cpus``, default 0,1) and the client to the
others; on a smaller one both share every CPU (the client's handshakes then count against the server).
"""

from __future__ import annotations

import argparse
import collections
import http.client
import json
import os
import platform
import queue
import re
import ssl
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "src"), str(REPO / "tests")]

from admission_requests import admission_review, api_server_pod, container, webhook_argv  # the API server's shape
from pki import make_pki  # tests/pki.py: the CA and server certificate, made by openssl

S1 = ["sh", "-c", "python3 train.py & exec sleep infinity"]
WORKERS = 8
WARM_UP_S = 2.0


@dataclass
class Series:
    latencies_ms: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def summary(self) -> dict[str, float | int]:
        ordered = sorted(self.latencies_ms)

        def pct(p: float) -> float:
            return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))] if ordered else float("nan")

        return {
            "requests": len(ordered) + len(self.errors),
            "errors": len(self.errors),
            "p50_ms": round(pct(50), 2),
            "p99_ms": round(pct(99), 2),
            "max_ms": round(ordered[-1], 2) if ordered else float("nan"),
            "mean_ms": round(statistics.fmean(ordered), 2) if ordered else float("nan"),
        }


def one_request(port: int, context: ssl.SSLContext, kind: str, body: bytes) -> None:
    conn = http.client.HTTPSConnection("127.0.0.1", port, context=context, timeout=10)
    try:
        if kind == "mutate":
            conn.request("POST", "/mutate", body=body, headers={"Content-Type": "application/json"})
            response = conn.getresponse()
            answer = json.loads(response.read())
            if response.status != 200 or "patch" not in answer["response"]:
                raise RuntimeError(f"status {response.status}, no patch")
        else:
            conn.request("GET", "/healthz")
            response = conn.getresponse()
            if response.status != 200 or response.read() != b"ok\n":
                raise RuntimeError(f"status {response.status}")
    finally:
        conn.close()


def run(seconds: float, rate: float, port: int, context: ssl.SSLContext) -> dict[str, Series]:
    series = {"mutate": Series(), "healthz": Series()}
    jobs: queue.Queue[tuple[str, float, bytes] | None] = queue.Queue()
    count = int(seconds * rate)
    # built before the clock starts: each a new pod (random uids), as the API server would send it
    bodies = [json.dumps(admission_review(api_server_pod(container(command=S1)))).encode() for _ in range(count)]
    lock = threading.Lock()

    def worker() -> None:
        while (job := jobs.get()) is not None:
            kind, scheduled, body = job
            try:
                one_request(port, context, kind, body)
                elapsed = (time.monotonic() - scheduled) * 1000
                with lock:
                    series[kind].latencies_ms.append(elapsed)
            except Exception as exc:  # noqa: BLE001 -- every failure counts as an error of the run
                with lock:
                    series[kind].errors.append(f"{type(exc).__name__}: {exc}")

    threads = [threading.Thread(target=worker, daemon=True) for _ in range(WORKERS)]
    for t in threads:
        t.start()
    period = 1 / rate
    start = time.monotonic()
    for i in range(count):
        for kind, offset in (("mutate", 0.0), ("healthz", period / 2)):
            at = start + i * period + offset
            time.sleep(max(0.0, at - time.monotonic()))
            jobs.put((kind, at, bodies[i]))
    for _ in threads:
        jobs.put(None)
    for t in threads:
        t.join(timeout=30)
    return series


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--rate", type=float, default=50.0, help="requests per second of each kind")
    parser.add_argument("--server-cpus", default="0,1", help="CPUs of the webhook (with 4 or more CPUs)")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    all_cpus = sorted(os.sched_getaffinity(0))
    server_cpus = {int(c) for c in args.server_cpus.split(",")} if len(all_cpus) >= 4 else set(all_cpus)
    client_cpus = set(all_cpus) - server_cpus or set(all_cpus)
    with tempfile.TemporaryDirectory() as tmp:
        pki = make_pki(Path(tmp), ecdsa=True)  # the chart's Certificate: ECDSA P-256
        env = {**os.environ, "PYTHONPATH": str(REPO / "src")}
        server = subprocess.Popen(
            webhook_argv(pki / "server.pem", pki / "server.key"),
            stderr=subprocess.PIPE,
            text=True,
            env=env,
            preexec_fn=lambda: os.sched_setaffinity(0, server_cpus),
        )
        os.sched_setaffinity(0, client_cpus)
        try:
            assert server.stderr is not None
            line = server.stderr.readline()
            match = re.search(r"https://127\.0\.0\.1:(\d+)/mutate", line)
            if not match:
                raise SystemExit(f"the webhook did not start: {line.strip()}")
            logged = collections.deque(maxlen=3)  # its log, a line per pod patched: drained, the last kept
            threading.Thread(target=logged.extend, args=(server.stderr,), daemon=True).start()
            context = ssl.create_default_context(cafile=str(pki / "ca.pem"))
            run(WARM_UP_S, args.rate, int(match.group(1)), context)  # not counted
            cpu_before = _cpu_seconds(server.pid)
            started = time.monotonic()
            series = run(args.seconds, args.rate, int(match.group(1)), context)
            wall = time.monotonic() - started
            cpu = _cpu_seconds(server.pid) - cpu_before
        finally:
            server.terminate()
            server.wait(timeout=20)
    result = {k: v.summary() for k, v in series.items()}
    ratio = result["mutate"]["p99_ms"] / result["healthz"]["p99_ms"]
    report = {
        "machine": f"{platform.node()} {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f}, Python {platform.python_version()}",
        "server_cpus": sorted(server_cpus),
        "client_cpus": sorted(client_cpus),
        "seconds": args.seconds,
        "rate_per_s": args.rate,
        "mutate": result["mutate"],
        "healthz": result["healthz"],
        "p99_ratio_mutate_to_healthz": round(ratio, 2),
        "webhook_cpu_percent_of_a_core": round(100 * cpu / wall, 1),
        "first_errors": [e for s in series.values() for e in s.errors[:3]],
        "goal_met": result["mutate"]["p99_ms"] <= 20 and result["mutate"]["errors"] == 0,
    }
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print(f"webhook bench: {args.seconds:g} s at {args.rate:g}/s each, {report['machine']}")
        print(f"webhook on CPUs {sorted(server_cpus)}, client on CPUs {sorted(client_cpus)}")
        for kind in ("mutate", "healthz"):
            s = result[kind]
            print(
                f"{kind:8} requests {s['requests']}, errors {s['errors']}: p50 {s['p50_ms']} ms  "
                f"p99 {s['p99_ms']} ms  max {s['max_ms']} ms  mean {s['mean_ms']} ms"
            )
        print(f"p99 mutate / healthz: {ratio:.2f}x; webhook CPU {report['webhook_cpu_percent_of_a_core']}% of a core")
        print(f"goal (mutate p99 <= 20 ms, no errors): {'met' if report['goal_met'] else 'NOT met'}")
        for error in report["first_errors"]:
            print(f"error: {error}")
    return 0 if report["goal_met"] else 1


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


if __name__ == "__main__":
    sys.exit(main())
