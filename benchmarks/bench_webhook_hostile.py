"""The webhook under hostile AdmissionReviews (issue 29, items 7 and 8): CPU of one long shell word,
peak RSS of the largest reviews, as the real CLI serves them over TLS on 127.0.0.1.

    python3 benchmarks/bench_webhook_hostile.py cpu [--src DIR] [--sizes 100K,400K,800K,3.9M]
    python3 benchmarks/bench_webhook_hostile.py memory [--src DIR] [--concurrent 1,2]

``--src``: the gpuzombie sources to measure (default this checkout's src/; a worktree of 241ae16 for
the "before" figure). ``cpu``: one GPU container running ``[sh, -c, <one word of SIZE bytes>]``,
timed (a) as ``review`` of the AdmissionReview in a fresh process, (b) as three concurrent POSTs to
the served webhook; each capped at ``--cap`` seconds. ``memory``: a fresh ``gpuzombie webhook``
process per run, sent N concurrent reviews of a ~3.94 MiB pod with ~35,000 GPU containers; the
figure is the process's VmHWM (peak RSS) from /proc.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import re
import ssl
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "tests")]

from admission_requests import admission_review, api_server_pod, container, many_containers_review, webhook_argv
from pki import make_pki

MAX_BODY = 4 * 1024 * 1024


def _size(text: str) -> int:
    units = {"K": 1024, "M": 1024 * 1024}
    return int(float(text[:-1]) * units[text[-1]]) if text[-1] in units else int(text)


def long_word_review(size: int) -> bytes:
    return json.dumps(admission_review(api_server_pod(container(command=["sh", "-c", "a" * size])))).encode()


def _env(src: Path) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": f"{src}:{REPO / 'tests'}"}


def review_seconds(src: Path, size: int, cap: float) -> float | None:
    code = (
        "import sys, time\n"
        "from gpuzombie.admission.mutate import Policy\n"
        "from gpuzombie.admission.review import review\n"
        "body = sys.stdin.buffer.read()\n"
        "started = time.process_time()\n"
        "answer = review(body, Policy())\n"
        "print(time.process_time() - started, answer.body['response'].get('warnings', [])[-1:])\n"
    )
    try:
        done = subprocess.run(
            [sys.executable, "-c", code],
            input=long_word_review(size),
            capture_output=True,
            timeout=cap,
            env=_env(src),
            check=True,
        )
    except subprocess.TimeoutExpired:
        return None
    seconds, _, said = done.stdout.decode().partition(" ")
    print(f"    review said: {said.strip()}", flush=True)
    return float(seconds)


def check_seconds(src: Path, size: int, cap: float, directory: Path) -> float | None:
    """Wall time of ``gpuzombie check`` on a Pod manifest (JSON) with one SIZE-byte shell word."""
    pod = api_server_pod(container(command=["sh", "-c", "a" * size]))
    manifest = directory / f"long-word-{size}.json"
    manifest.write_text(json.dumps(pod))
    started = time.monotonic()
    try:
        done = subprocess.run(
            [sys.executable, "-m", "gpuzombie", "check", "--json", str(manifest)],
            capture_output=True,
            timeout=cap,
            env=_env(src),
        )
    except subprocess.TimeoutExpired:
        return None
    rules = sorted(json.loads(done.stdout)["rules"]) if done.stdout else done.stderr[-200:]
    print(f"    check exit {done.returncode}, rules {rules}", flush=True)
    return time.monotonic() - started


class Webhook:
    """``gpuzombie webhook`` of ``src`` on 127.0.0.1, a fresh process."""

    def __init__(self, src: Path, pki: Path) -> None:
        self.proc = subprocess.Popen(
            webhook_argv(pki / "server.pem", pki / "server.key"),
            stderr=subprocess.PIPE,
            text=True,
            env=_env(src),
        )
        assert self.proc.stderr is not None
        line = self.proc.stderr.readline()
        self.port = int(re.search(r"https://127\.0\.0\.1:(\d+)/mutate", line).group(1))  # type: ignore[union-attr]
        self.context = ssl.create_default_context(cafile=str(pki / "ca.pem"))

    def post(self, body: bytes, timeout: float) -> tuple[float, str]:
        started = time.monotonic()
        conn = http.client.HTTPSConnection("127.0.0.1", self.port, context=self.context, timeout=timeout)
        try:
            conn.request("POST", "/mutate", body=body, headers={"Content-Type": "application/json"})
            response = conn.getresponse()
            data = response.read()
            said = f"{response.status}"
            if response.status == 200:
                answer = json.loads(data)["response"]
                said += " patch" if "patch" in answer else " no patch"
                said += f" {answer.get('warnings', [])[-1:]}"
        except (OSError, http.client.HTTPException) as exc:
            said = type(exc).__name__
        finally:
            conn.close()
        return time.monotonic() - started, said

    def concurrently(self, bodies: list[bytes], timeout: float) -> list[tuple[float, str]]:
        results: list[tuple[float, str]] = [(0.0, "")] * len(bodies)

        def one(i: int) -> None:
            results[i] = self.post(bodies[i], timeout)

        threads = [threading.Thread(target=one, args=(i,)) for i in range(len(bodies))]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return results

    def peak_rss_bytes(self) -> int:
        status = Path(f"/proc/{self.proc.pid}/status").read_text()
        return int(re.search(r"VmHWM:\s+(\d+) kB", status).group(1)) * 1024  # type: ignore[union-attr]

    def close(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=["cpu", "memory"])
    parser.add_argument("--src", type=Path, default=REPO / "src")
    parser.add_argument("--sizes", default="100K,400K,800K,3.9M")
    parser.add_argument("--concurrent", default="1,2")
    parser.add_argument("--cap", type=float, default=200.0, help="seconds before a measurement is given up")
    args = parser.parse_args()
    print(f"src {args.src}, python {sys.version.split()[0]}, {os.cpu_count()} CPUs", flush=True)
    with tempfile.TemporaryDirectory(prefix="bench-webhook-hostile-") as tmp:
        pki = make_pki(Path(tmp))
        if args.what == "cpu":
            for text in args.sizes.split(","):
                size = _size(text)
                seconds = review_seconds(args.src, size, args.cap)
                shown = f"{seconds:.3f} s CPU" if seconds is not None else f"over {args.cap:.0f} s (cut)"
                print(f"review of one {text} shell word: {shown}", flush=True)
                checked = check_seconds(args.src, size, args.cap, Path(tmp))
                shown = f"{checked:.2f} s wall" if checked is not None else f"over {args.cap:.0f} s (cut)"
                print(f"gpuzombie check of one {text} shell word: {shown}", flush=True)
            for text in ("400K",):
                webhook = Webhook(args.src, pki)
                try:
                    results = webhook.concurrently([long_word_review(_size(text))] * 3, args.cap)
                finally:
                    webhook.close()
                shown = ", ".join(f"{s:.2f} s ({said})" for s, said in results)
                print(f"3 concurrent {text} reviews over TLS: {shown}", flush=True)
        else:
            body, count = many_containers_review()
            print(f"review body {len(body)} bytes, {count} GPU containers", flush=True)
            for n in (int(x) for x in args.concurrent.split(",")):
                webhook = Webhook(args.src, pki)
                try:
                    idle = webhook.peak_rss_bytes()
                    results = webhook.concurrently([body] * n, args.cap)
                    peak = webhook.peak_rss_bytes()
                finally:
                    webhook.close()
                shown = ", ".join(f"{s:.2f} s ({said[:90]})" for s, said in results)
                print(
                    f"{n} concurrent: peak RSS {peak / 2**20:.1f} MiB (idle {idle / 2**20:.1f} MiB); {shown}",
                    flush=True,
                )
    return 0


if __name__ == "__main__":
    sys.exit(main())
