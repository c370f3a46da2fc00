"""The webhook served for real: HTTPS on 127.0.0.1 through gpuzombie.serving with certificates made
by openssl, AdmissionReviews as the API server sends them, and hostile requests (huge, malformed,
wrong kind, missing fields, 250 containers and more, slow, long shell words, certificates renewed
under load, encrypted or expired): always an answer, in bounded time and memory."""

from __future__ import annotations

import http.client
import io
import json
import os
import re
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
import tracemalloc

import pytest

from admission_requests import many_containers_review, webhook_argv
from admission_support import admission_review, api_server_pod, apply, container, patch_of, validate_pod
from gpuzombie.admission.app import make_app
from gpuzombie.admission.mutate import MAX_CONTAINERS, Policy
from gpuzombie.admission.review import review
from gpuzombie.serving import ListenAddress, Server, TlsFiles
from pki import make_dated_certificate, make_pki

S1 = ["sh", "-c", "python3 train.py & exec sleep infinity"]
MAX_BODY = 256 * 1024
# Measured on this 2-core machine (shared): a 500-container review (250 since the container bound) is answered in 70–160 ms (0.3 s
# under tracemalloc), any hostile one here in < 0.1 s; the bound leaves 15x and more for a loaded one.
ANSWER_BOUND_S = 5.0


@pytest.fixture(scope="module")
def webhook(pki):
    server = Server(
        {"/mutate": make_app(Policy(), max_body_bytes=MAX_BODY)},
        listen=ListenAddress("127.0.0.1", 0),
        tls=TlsFiles(str(pki / "server.pem"), str(pki / "server.key")),
        probes={"/healthz": lambda: (True, "ok"), "/readyz": lambda: (True, "ready")},
        read_timeout=1.0,
        max_connections=8,  # fewer than the module's connections: a released entry makes room
    )
    bound = server.start()
    yield bound.port, ssl.create_default_context(cafile=str(pki / "ca.pem"))
    server.stop()


def tls_to(port: int, context: ssl.SSLContext) -> ssl.SSLSocket:
    return context.wrap_socket(socket.create_connection(("127.0.0.1", port), timeout=10), server_hostname="127.0.0.1")


def post(webhook, body: bytes, *, method: str = "POST", headers: dict[str, str] | None = None):
    port, context = webhook
    conn = http.client.HTTPSConnection("127.0.0.1", port, context=context, timeout=10)
    try:
        started = time.monotonic()
        conn.request(method, "/mutate", body=body, headers={"Content-Type": "application/json", **(headers or {})})
        response = conn.getresponse()
        data = response.read()
        elapsed = time.monotonic() - started
    finally:
        conn.close()
    assert elapsed < ANSWER_BOUND_S, elapsed
    return response.status, json.loads(data)


def test_a_gpu_pod_is_patched_over_tls_and_the_uid_is_echoed(webhook):
    pod = api_server_pod(container(command=S1))
    request = admission_review(pod)
    status, answer = post(webhook, json.dumps(request).encode())
    assert status == 200
    assert answer["apiVersion"] == "admission.k8s.io/v1" and answer["kind"] == "AdmissionReview"
    assert answer["response"]["uid"] == request["request"]["uid"] and answer["response"]["allowed"] is True
    patched = apply(pod, patch_of(answer))
    validate_pod(patched)
    assert patched["spec"]["containers"][0]["command"][0] == "/.gpuzombie/tini-static"
    assert any("under tini" in w for w in answer["response"]["warnings"])
    status, again = post(webhook, json.dumps(admission_review(patched)).encode())
    assert status == 200 and "patch" not in again["response"]  # reinvocation: nothing more


def test_probes(webhook):
    port, context = webhook
    for path, body in (("/healthz", b"ok\n"), ("/readyz", b"ready\n")):
        conn = http.client.HTTPSConnection("127.0.0.1", port, context=context, timeout=10)
        conn.request("GET", path)
        response = conn.getresponse()
        assert (response.status, response.read()) == (200, body)
        conn.close()


def _review_of(kind: str) -> bytes:
    request = admission_review(api_server_pod(container(command=S1)))
    request["request"]["kind"] = {"group": "apps", "version": "v1", "kind": kind}
    request["request"]["resource"] = {"group": "apps", "version": "v1", "resource": kind.lower() + "s"}
    return json.dumps(request).encode()


def _without(*path: str) -> bytes:
    request = admission_review(api_server_pod(container(command=S1)))
    obj = request
    for key in path[:-1]:
        obj = obj[key]
    del obj[path[-1]]
    return json.dumps(request).encode()


def _replaced(value, *path: str) -> bytes:
    request = admission_review(api_server_pod(container(command=S1)))
    obj = request
    for key in path[:-1]:
        obj = obj[key]
    obj[path[-1]] = value
    return json.dumps(request).encode()


@pytest.mark.parametrize(
    ("body", "status", "says"),
    [
        (b"", 400, "not JSON"),
        (b"{not json", 400, "not JSON"),
        (b"[" * 200000, 400, "not JSON"),  # nesting past the recursion limit
        (b'{"n": ' + b"9" * 5000 + b"}", 400, "not JSON"),  # past int's digit limit
        (b'"a string"', 400, "not a JSON object"),
        (json.dumps({"apiVersion": "admission.k8s.io/v1beta1", "kind": "AdmissionReview"}).encode(), 400, "expected"),
        (_without("request"), 400, "no request"),
        (_without("request", "uid"), 400, "no uid"),
        (_replaced(12, "request", "uid"), 400, "no uid"),
        (_review_of("Deployment"), 200, "only Pods"),
        (_without("request", "object"), 200, "no pod object"),
        (_replaced("a pod", "request", "object"), 200, "no pod object"),
        (_replaced({"spec": {"containers": "x"}}, "request", "object"), 200, "could not understand"),
        (_replaced({"spec": {"containers": [{"resources": {"limits": []}}]}}, "request", "object"), 200, "could not"),
        (_replaced({"spec": {"containers": [None, 3]}}, "request", "object"), 200, "could not understand"),
        (_replaced({"metadata": [], "spec": {}}, "request", "object"), 200, None),
        (_replaced("UPDATE", "request", "operation"), 200, None),
    ],
)
def test_hostile_and_malformed_requests_get_an_answer(webhook, body, status, says):
    got, answer = post(webhook, body)
    assert got == status
    if status == 400:  # the API's error response: a v1 Status
        assert answer["kind"] == "Status" and answer["status"] == "Failure" and answer["code"] == 400
        assert says in answer["message"]
    else:
        assert answer["response"]["allowed"] is True and "patch" not in answer["response"]
        if says:
            assert any(says in w for w in answer["response"]["warnings"]), answer


def test_bodies_over_the_bound_are_refused_before_they_are_read(webhook):
    got, answer = post(webhook, b"x" * (MAX_BODY + 1))
    assert got == 413 and answer["reason"] == "RequestEntityTooLarge"
    port, context = webhook
    with tls_to(port, context) as tls:  # claims 1 GiB, sends nothing
        tls.sendall(b"POST /mutate HTTP/1.1\r\nHost: x\r\nContent-Length: 1073741824\r\n\r\n")
        head = tls.recv(4096)
    assert head.startswith((b"HTTP/1.0 413", b"HTTP/1.1 413")), head


def test_wrong_method_and_no_length(webhook):
    assert post(webhook, b"", method="GET")[0] == 405
    port, context = webhook
    with tls_to(port, context) as tls:
        tls.sendall(b"POST /mutate HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n")
        assert re.match(rb"HTTP/1\.[01] 411", tls.recv(4096))


def test_a_slow_sender_is_cut_and_others_are_served(webhook):
    port, context = webhook
    tls = tls_to(port, context)
    tls.sendall(b"POST /mutate HTTP/1.1\r\nHost: x\r\n")  # and never the rest
    try:
        status, _ = post(webhook, json.dumps(admission_review(api_server_pod())).encode())
        assert status == 200
        tls.settimeout(10)
        started = time.monotonic()
        assert tls.recv(1) == b""  # the read deadline (1 s) cut it
        assert time.monotonic() - started < 10
    finally:
        tls.close()


def test_a_pod_with_250_containers_is_answered_in_bounded_time_and_memory(webhook):
    pod = api_server_pod(*[container(f"c{i}", command=S1) for i in range(250)])
    body = json.dumps(admission_review(pod)).encode()
    assert len(body) < MAX_BODY * 8
    tracemalloc.start()
    started = time.monotonic()
    answer = review(body, Policy())
    elapsed = time.monotonic() - started
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert answer.status == 200 and elapsed < ANSWER_BOUND_S
    assert peak < 64 * len(body), (peak, len(body))  # measured ~12x the body
    patched = apply(pod, patch_of(answer.body))
    assert all(c["command"][0] == "/.gpuzombie/tini-static" for c in patched["spec"]["containers"])
    assert len(answer.body["response"]["warnings"]) <= 13  # capped: the API server prints each one
    many = api_server_pod(*[container(f"c{i}", command=S1) for i in range(MAX_CONTAINERS + 1)])
    got, answer = post(webhook, json.dumps(admission_review(many)).encode())
    assert got == 200 and "patch" not in answer["response"]  # over the container bound: not looked at
    assert f"cannot tell: {MAX_CONTAINERS + 1} containers" in answer["response"]["warnings"][0]
    big = api_server_pod(*[container(f"c{i}", command=S1) for i in range(1500)])
    got, _refused = post(webhook, json.dumps(admission_review(big)).encode())
    assert got == 413  # over this server's 256 KiB bound: refused, not parsed


def test_the_cli_serves_https_and_stops_on_sigterm(pki):
    proc = subprocess.Popen(
        webhook_argv(pki / "server.pem", pki / "server.key", "--namespace", "gpuzombie"),
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        line = proc.stderr.readline()
        port = int(re.search(r"https://127\.0\.0\.1:(\d+)/mutate", line).group(1))
        context = ssl.create_default_context(cafile=str(pki / "ca.pem"))
        pod = api_server_pod(container(command=S1), namespace="gpuzombie")
        status, answer = post((port, context), json.dumps(admission_review(pod)).encode())
        assert status == 200 and "patch" not in answer["response"]  # its own namespace
        pod["metadata"]["namespace"] = "ml"
        status, answer = post((port, context), json.dumps(admission_review(pod)).encode())
        assert patch_of(answer)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=20) == 0
        assert "stopped (SIGTERM)" in proc.stderr.read()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_the_cli_refuses_to_serve_without_tls_in_one_line(tmp_path):
    done = subprocess.run([sys.executable, "-m", "gpuzombie", "webhook"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "--tls-cert" in done.stderr and "Traceback" not in done.stderr
    alone = [sys.executable, "-m", "gpuzombie", "webhook", "--tls-cert", str(tmp_path / "no.pem")]
    done = subprocess.run(alone, capture_output=True, text=True, timeout=60)  # common.server_options, as the exporter
    assert done.returncode == 2 and "give --tls-cert and --tls-key together" in done.stderr
    missing = [str(tmp_path / "no.pem"), str(tmp_path / "no.key")]
    done = subprocess.run(
        webhook_argv(missing[0], missing[1]),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2 and "cannot serve TLS" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


def _atomic_writer_swap(live, source, version: str) -> None:
    """Write ``source``'s server files into ``live`` the way the kubelet updates a Secret volume:
    a new ``..<version>`` directory, then the ``..data`` symlink swapped in one rename."""
    (live / version).mkdir()
    for name in ("server.pem", "server.key"):
        shutil.copy(source / name, live / version / name)
        if not (live / name).is_symlink():
            (live / name).symlink_to(f"..data/{name}")
    (live / "..tmp").symlink_to(version)
    os.replace(live / "..tmp", live / "..data")


def test_a_renewed_certificate_is_served_without_a_restart(tmp_path):
    """cert-manager renews the Secret, the kubelet swaps its files: the next connection gets the new one."""
    old, new, live = tmp_path / "old", tmp_path / "new", tmp_path / "live"
    for d in (old, new, live):
        d.mkdir()
    make_pki(old)
    make_pki(new, ecdsa=True)
    _atomic_writer_swap(live, old, "..v1")
    proc = subprocess.Popen(
        webhook_argv(live / "server.pem", live / "server.key", "--tls-reload-seconds", "0.2"),
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        port = int(re.search(r"https://127\.0\.0\.1:(\d+)/mutate", proc.stderr.readline()).group(1))
        trust_new = ssl.create_default_context(cafile=str(new / "ca.pem"))
        body = json.dumps(admission_review(api_server_pod())).encode()
        assert post((port, ssl.create_default_context(cafile=str(old / "ca.pem"))), body)[0] == 200
        with pytest.raises(ssl.SSLCertVerificationError):
            post((port, trust_new), body)
        _atomic_writer_swap(live, new, "..v2")
        logged = [proc.stderr.readline() for _ in range(2)]  # the pod changed by the first post, the reload
        assert "shareProcessNamespace" in logged[0] and "TLS certificate reloaded" in logged[-1], logged
        assert post((port, trust_new), body)[0] == 200
    finally:
        proc.terminate()
        proc.wait(timeout=20)


def test_serving_loads_no_optional_library():
    """The webhook's image needs no extra: answering a review loads neither PyYAML, jsonpatch nor rich."""
    probe = (
        "import sys, json\n"
        "from gpuzombie.cli.main import main\n"
        "main(['webhook', '--help'])\n"
        "from gpuzombie.admission.app import make_app\n"
        "from gpuzombie.admission.review import review\n"
        "from gpuzombie.admission.mutate import Policy\n"
        f"review({json.dumps(admission_review(api_server_pod(container(command=S1)))).encode()!r}, Policy())\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('yaml', 'jsonpatch', 'rich')), file=sys.stderr)\n"
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stderr.strip().splitlines()[-1] == "[]"


def test_one_escaped_log_line_per_pod_changed():
    lines: list[str] = []
    app = make_app(Policy(), log=lines.append)
    pod = api_server_pod(container(command=S1), container("c2\x1b[2J", command=S1))
    request = admission_review(pod)
    body = json.dumps(request).encode()
    environ = {"REQUEST_METHOD": "POST", "CONTENT_LENGTH": str(len(body)), "wsgi.input": io.BytesIO(body)}
    b"".join(app(environ, lambda status, headers: None))
    (line,) = lines
    assert line.startswith(f"ml-train/train-7c9d5b8f6d-* (uid {request['request']['uid']}): tini:train,tini:c2")
    assert "\x1b" not in line and "\\x1b" in line
    for quiet in (api_server_pod(container(gpu=False)), api_server_pod(container(command=["tini", "--", "x"]))):
        body = json.dumps(admission_review(quiet)).encode()
        environ = {"REQUEST_METHOD": "POST", "CONTENT_LENGTH": str(len(body)), "wsgi.input": io.BytesIO(body)}
        b"".join(app(environ, lambda status, headers: None))
    assert len(lines) == 1  # nothing to say about pods left as they are


# Issue 29, items 7, 8 and 10: the real CLI, served over TLS on 127.0.0.1.


class Served:
    """``gpuzombie webhook`` in its own process, its port read from its first line."""

    def __init__(self, cert, key, *flags: str) -> None:
        self.proc = subprocess.Popen(
            webhook_argv(cert, key, *flags),
            stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            text=True,
            start_new_session=True,  # no terminal to prompt on
        )
        line = self.proc.stderr.readline()
        found = re.search(r"https://127\.0\.0\.1:(\d+)/mutate", line)
        if found is None:
            self.close()
            raise AssertionError(line)
        self.port = int(found.group(1))

    def peak_rss_bytes(self) -> int:
        with open(f"/proc/{self.proc.pid}/status") as f:
            status = f.read()
        return int(re.search(r"VmHWM:\s+(\d+) kB", status).group(1)) * 1024

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=20)
        self.proc.stderr.close()


def _at_once(count: int, call) -> list:
    """``call(i)`` in ``count`` threads started together; their results (or exceptions)."""
    results: list = [None] * count

    def one(i: int) -> None:
        try:
            results[i] = call(i)
        except Exception as exc:
            results[i] = exc

    threads = [threading.Thread(target=one, args=(i,)) for i in range(count)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


def test_three_long_shell_words_at_once_are_answered_within_the_api_servers_timeout(pki):
    """241ae16: three 400 KiB words took 14.9-15.8 s each (the API server gives up at 3); 800 KiB here."""
    body = json.dumps(admission_review(api_server_pod(container(command=["sh", "-c", "a" * 800 * 1024])))).encode()
    served = Served(pki / "server.pem", pki / "server.key")
    try:
        context = ssl.create_default_context(cafile=str(pki / "ca.pem"))
        results = _at_once(3, lambda i: post((served.port, context), body))  # post asserts ANSWER_BOUND_S
    finally:
        served.close()
    for result in results:
        assert not isinstance(result, BaseException), result
        status, answer = result
        assert status == 200 and patch_of(answer)  # tini still wraps it: harmless whatever the script runs


CHART_MEMORY_LIMIT = 256 * 2**20  # charts/gpuzombie/values.yaml webhook.resources.limits.memory
# Measured (2 cores, shared): two ~4 MiB reviews of ~39,700 GPU containers at once peaked at 303 MiB
# on 241ae16, 117 MiB after (idle: 24 MiB); the bound keeps a quarter of the limit as margin.
MEMORY_BOUND = CHART_MEMORY_LIMIT * 3 // 4


def test_the_largest_reviews_at_once_fit_the_charts_memory_limit(pki):
    body, count = many_containers_review()
    served = Served(pki / "server.pem", pki / "server.key")
    try:
        context = ssl.create_default_context(cafile=str(pki / "ca.pem"))
        results = _at_once(2, lambda i: post((served.port, context), body))
        peak = served.peak_rss_bytes()
    finally:
        served.close()
    assert peak < MEMORY_BOUND, f"peak RSS {peak / 2**20:.1f} MiB"
    for result in results:
        assert not isinstance(result, BaseException), result
        status, answer = result
        assert status == 200 and "patch" not in answer["response"]
        assert f"cannot tell: {count} containers" in answer["response"]["warnings"][0]


@pytest.mark.slow
def test_a_certificate_reloaded_under_load_cuts_no_request(tmp_path):
    """241ae16 stopped the listener and started a new one per reload: 41 reloads, 4 clients, 109
    requests reset or truncated. Now each new connection is wrapped with the current context."""
    pkis = [make_pki(tmp_path / name) for name in ("a", "b") if not (tmp_path / name).mkdir()]
    live = tmp_path / "live"
    live.mkdir()
    _atomic_writer_swap(live, pkis[0], "..v0")
    context = ssl.create_default_context(cafile=str(pkis[0] / "ca.pem"))
    context.load_verify_locations(cafile=str(pkis[1] / "ca.pem"))
    served = Served(live / "server.pem", live / "server.key", "--tls-reload-seconds", "0.1")
    body = json.dumps(admission_review(api_server_pod(container(gpu=False)))).encode()
    stop = threading.Event()
    done: list[int] = []
    failed: list[str] = []

    def client(i: int) -> None:
        while not stop.is_set():
            try:
                status, answer = post((served.port, context), body)
                assert status == 200 and answer["response"]["allowed"] is True
                done.append(1)
            except Exception as exc:
                failed.append(f"{type(exc).__name__}: {exc}")

    clients = [threading.Thread(target=client, args=(i,)) for i in range(4)]
    try:
        for t in clients:
            t.start()
        for version in range(1, 21):
            _atomic_writer_swap(live, pkis[version % 2], f"..v{version}")
            # Once in the suite beside load, a check read a pair it called mismatched: the old pair
            # stays served and the next check reloads (serve_until_stopped); what this test pins is
            # that no request is cut, so a retried reload is allowed, a missing one is not.
            lines = [served.proc.stderr.readline()]
            while "TLS certificate reloaded" not in lines[-1] and len(lines) < 5:
                assert "new TLS files not served, the old ones are" in lines[-1], lines
                lines.append(served.proc.stderr.readline())
            assert "TLS certificate reloaded" in lines[-1], lines
            time.sleep(0.1)
    finally:
        stop.set()
        for t in clients:
            t.join()
        served.close()
    assert failed == [] and len(done) > 40, (len(failed), failed[:3], len(done))


def test_an_encrypted_key_is_refused_in_one_line_that_names_it(pki, tmp_path):
    key = tmp_path / "encrypted.key"
    subprocess.run(
        ["openssl", "pkey", "-in", str(pki / "server.key"), "-aes256", "-passout", "pass:secret", "-out", str(key)],
        check=True,
        capture_output=True,
    )
    with pytest.raises(AssertionError) as refused:
        Served(pki / "server.pem", key)
    assert f"key {key}: encrypted with a passphrase" in str(refused.value)


def test_an_expired_certificate_is_refused_at_start_and_not_served_on_reload(pki, tmp_path):
    (tmp_path / "old").mkdir()
    cert, key = make_dated_certificate(tmp_path / "old", "20200101000000Z", "20200102000000Z")
    done = subprocess.run(
        webhook_argv(cert, key),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert f"certificate {cert}: expired (notAfter 2020-01-02 00:00:00 UTC)" in done.stderr
    live = tmp_path / "live"
    live.mkdir()
    _atomic_writer_swap(live, pki, "..v1")
    served = Served(live / "server.pem", live / "server.key", "--tls-reload-seconds", "0.1")
    try:
        shutil.copy(cert, tmp_path / "old" / "server.pem")
        shutil.copy(key, tmp_path / "old" / "server.key")
        _atomic_writer_swap(live, tmp_path / "old", "..v2")
        line = served.proc.stderr.readline()
        assert "new TLS files not served, the old ones are" in line and "expired" in line, line
        context = ssl.create_default_context(cafile=str(pki / "ca.pem"))
        body = json.dumps(admission_review(api_server_pod(container(gpu=False)))).encode()
        assert post((served.port, context), body)[0] == 200  # the old certificate, still valid, served
    finally:
        served.close()


def test_warnings_escape_control_characters_of_container_names():
    pod = api_server_pod(container("c2\x1b[2J\x07", command=S1), container("\u202etxt.exe", command=S1))
    got = review(json.dumps(admission_review(pod)).encode(), Policy())
    warnings = got.body["response"]["warnings"]
    assert warnings and not any(re.search(r"[\x00-\x1f\x7f-\x9f\u202e]", w) for w in warnings), warnings
    assert any("c2\\x1b[2J\\x07" in w for w in warnings) and any("\\u202etxt.exe" in w for w in warnings)


def test_reviews_past_the_slots_wait_within_their_time_then_get_429(monkeypatch):
    """--max-reviews: a review that finds every slot taken waits within its time, then is told 429
    (which failurePolicy Ignore turns into an unchanged pod). The slow review is a stand-in that
    waits on an event, so the slot stays taken for as long as the test needs."""
    from gpuzombie.admission import app as app_module

    entered, release = threading.Event(), threading.Event()
    real = app_module.review

    def slow(body, policy, budget):
        entered.set()
        release.wait(20)
        return real(body, policy, budget)

    monkeypatch.setattr(app_module, "review", slow)
    app = make_app(Policy(), review_seconds=0.3, max_reviews=1)
    body = json.dumps(admission_review(api_server_pod(container(command=S1)))).encode()

    def call(i: int) -> str:
        environ = {"REQUEST_METHOD": "POST", "CONTENT_LENGTH": str(len(body)), "wsgi.input": io.BytesIO(body)}
        statuses: list[str] = []
        b"".join(app(environ, lambda status, headers: statuses.append(status)))
        return statuses[0]

    first = threading.Thread(target=lambda: results.append(call(0)))
    results: list[str] = []
    first.start()
    try:
        assert entered.wait(20)  # the first review holds the only slot
        assert call(1) == "429 Too Many Requests"
    finally:
        release.set()
        first.join()
    assert results == ["200 OK"]
