"""cheroot (builtin TLS adapter) or gpuzombie.serving against the cases the serving tests pin: 40
sequential TLS requests past a bound of 4, 100 failed handshakes (fds left), and a TLS request
beside one stalled handshake (TCP, no ClientHello). Usage: python cheroot_vs_cases.py cheroot|ours
(tests/pki.py on PYTHONPATH; cheroot installed for "cheroot", src/ for "ours")."""
import os, socket, ssl, sys, threading, time, http.client, contextlib, json
from pathlib import Path
from pki import make_pki

d = Path("pki"); d.mkdir(exist_ok=True); make_pki(d)
def app(environ, start_response):
    start_response("200 OK", [("Content-Type", "text/plain")]); return [b"ok\n"]
if sys.argv[1] == "cheroot":
    from cheroot import wsgi
    from cheroot.ssl.builtin import BuiltinSSLAdapter

    server = wsgi.Server(("127.0.0.1", 0), app, numthreads=4, max=4, timeout=10)
    server.ssl_adapter = BuiltinSSLAdapter(str(d / "server.pem"), str(d / "server.key"))
    server.prepare()
    port = server.bind_addr[1]
    threading.Thread(target=server.serve, daemon=True).start()
else:
    from gpuzombie.serving import Server, TlsFiles, parse_listen

    tls = TlsFiles(str(d / "server.pem"), str(d / "server.key"))
    port = Server({"/": app}, listen=parse_listen("127.0.0.1:0"), max_connections=4, read_timeout=10, tls=tls).start().port
ctx = ssl.create_default_context(cafile=str(d / "ca.pem"))
def get(timeout=5):
    c = http.client.HTTPSConnection("127.0.0.1", port, timeout=timeout, context=ctx)
    try:
        c.request("GET", "/"); r = c.getresponse(); r.read(); return r.status
    except Exception as e:
        return type(e).__name__
    finally:
        c.close()
fds = lambda: len(os.listdir("/proc/self/fd"))
out = {"server": sys.argv[1], "first": get()}
base = fds()
out["40_sequential"] = [get() for _ in range(40)].count(200)
distrust = ssl.create_default_context()
for i in range(100):
    with contextlib.suppress(Exception):
        s = socket.create_connection(("127.0.0.1", port), timeout=5)
        if i % 2 == 0:
            distrust.wrap_socket(s, server_hostname="127.0.0.1")
        s.close()
time.sleep(2)
out["fds_after_100_failed_handshakes"] = fds() - base
stalled = socket.create_connection(("127.0.0.1", port), timeout=30)  # TCP only, no ClientHello
time.sleep(0.5)
t = time.monotonic(); out["get_beside_a_stalled_handshake"] = get(timeout=5); out["waited_s"] = round(time.monotonic() - t, 2)
stalled.close()
print(json.dumps(out))
os._exit(0)
