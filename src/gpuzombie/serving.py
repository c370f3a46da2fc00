"""One HTTP(S) server for every port gpuzombie opens: the exporter's /metrics and the admission
webhook's /mutate, each beside the same health probes.

``Server(routes, ...)`` serves WSGI apps by path. Loopback by default; a node DaemonSet asks for its
pod IP explicitly. Hardened for a port that anything on the network can reach: each connection must
deliver its request within ``read_timeout`` seconds (a watchdog cuts slow senders, slowloris
included, whatever the pace of their bytes), at most ``max_connections`` are served at once (at the
bound a new connection evicts the oldest one still sending its request, so a held-open flood cannot
starve the scraper), the TLS handshake runs in the connection's thread under the same deadline, and
nothing is logged per request. Standard library only: the webhook's image needs no extra.
"""

from __future__ import annotations

import ipaddress
import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from socketserver import ThreadingMixIn
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer

DEFAULT_READ_TIMEOUT = 10.0
DEFAULT_MAX_CONNECTIONS = 32

WsgiApp = Callable[[dict[str, Any], Callable[..., Any]], Iterable[bytes]]
Probe = Callable[[], tuple[bool, str]]
"""A health check: (ok, one-line reason) -> 200 or 503 with the reason as the body."""


@dataclass(frozen=True)
class ListenAddress:
    host: str
    port: int

    def __str__(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


EXAMPLE_LISTEN = "127.0.0.1:9844"


def parse_listen(text: str) -> ListenAddress:
    """``HOST:PORT`` or ``[V6]:PORT``; raises ValueError with a one-line reason."""
    host, sep, port = text.rpartition(":")
    if not sep or not host:
        raise ValueError(f"{text!r} is not HOST:PORT (e.g. {EXAMPLE_LISTEN} or [::1]:9844)")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
        ipaddress.IPv6Address(host)  # ValueError when not one
    elif ":" in host:
        raise ValueError(f"{text!r}: write an IPv6 address in brackets, e.g. [::1]:9844")
    if not port.isdigit() or not 0 <= int(port) <= 65535:
        raise ValueError(f"{text!r}: port must be a number from 0 to 65535")
    return ListenAddress(host, int(port))


@dataclass(frozen=True)
class TlsFiles:
    """PEM files of the server certificate and key; ``client_ca`` makes clients show a certificate."""

    certfile: str
    keyfile: str
    client_ca: str | None = None

    def context(self) -> ssl.SSLContext:
        """Raises OSError or ssl.SSLError when a file is missing or does not hold what it should."""
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.load_cert_chain(self.certfile, self.keyfile)
        if self.client_ca is not None:
            context.load_verify_locations(cafile=self.client_ca)
            context.verify_mode = ssl.CERT_REQUIRED
        return context


class _Connection:
    """One connection being served; ``deadline`` is None once its request has been read."""

    def __init__(self, sock: socket.socket, deadline: float) -> None:
        self.sock = sock
        self.deadline: float | None = deadline
        self.cut = False

    def cut_off(self) -> None:
        """Unblock the connection's thread: its reads and writes fail at once."""
        self.cut = True
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass  # already closed by its thread


class _Connections:
    """The bound on concurrent connections and the request deadline, with the watchdog thread that
    enforces the deadline (a socket timeout alone restarts with every byte a slow sender trickles)."""

    def __init__(self, *, read_timeout: float, max_connections: int) -> None:
        self.read_timeout = read_timeout
        self.max_connections = max_connections
        self._lock = threading.Lock()
        self._open: dict[int, _Connection] = {}
        self._stop = threading.Event()
        self._watchdog = threading.Thread(target=self._watch, name="gpuzombie-http-watchdog", daemon=True)

    def start(self) -> None:
        self._watchdog.start()

    def stop(self) -> None:
        self._stop.set()
        self._watchdog.join(timeout=5)
        with self._lock:
            for conn in self._open.values():
                conn.cut_off()

    def admit(self, sock: socket.socket) -> bool:
        """Room for ``sock``? At the bound, the oldest connection still sending its request makes room."""
        with self._lock:
            live = [c for c in self._open.values() if not c.cut]
            if len(live) >= self.max_connections:
                waiting = [c for c in live if c.deadline is not None]
                if not waiting:
                    return False
                min(waiting, key=lambda c: c.deadline or 0.0).cut_off()
            self._open[id(sock)] = _Connection(sock, time.monotonic() + self.read_timeout)
            return True

    def wrapped(self, old: socket.socket, new: socket.socket) -> None:
        """The TLS socket took over ``old``'s descriptor: cut that one from now on."""
        with self._lock:
            conn = self._open.pop(id(old), None)
            if conn is not None:
                conn.sock = new
                self._open[id(new)] = conn
                if conn.cut:
                    conn.cut_off()

    def request_read(self, sock: socket.socket) -> None:
        with self._lock:
            conn = self._open.get(id(sock))
            if conn is not None:
                conn.deadline = None

    def done(self, sock: socket.socket) -> None:
        with self._lock:
            self._open.pop(id(sock), None)

    def count(self) -> int:
        with self._lock:
            return len(self._open)

    def _watch(self) -> None:
        tick = min(1.0, self.read_timeout / 4)
        while not self._stop.wait(tick):
            now = time.monotonic()
            with self._lock:
                late = [c for c in self._open.values() if not c.cut and c.deadline is not None and c.deadline <= now]
                for conn in late:
                    conn.cut_off()


class _Handler(WSGIRequestHandler):
    server: _Server

    def setup(self) -> None:
        self.request.settimeout(self.server.connections.read_timeout)
        # wsgiref writes the headers and the body apart: with Nagle the body waits for the client's
        # delayed ACK, 40 ms an answer (measured over TLS on 127.0.0.1: p50 48 ms, 1.6 ms without)
        self.request.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        if self.server.tls is not None:  # the handshake here, in this connection's thread
            raw = self.request
            self.request = self.server.tls.wrap_socket(raw, server_side=True, do_handshake_on_connect=False)
            self.server.connections.wrapped(raw, self.request)
            self.request.do_handshake()
        super().setup()

    def parse_request(self) -> bool:
        ok = super().parse_request()
        if ok:
            self.server.connections.request_read(self.request)
        return ok

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: a log line per scrape (or per attacker's byte) helps no one."""


class _Server(ThreadingMixIn, WSGIServer):
    daemon_threads = True
    block_on_close = False
    request_queue_size = 128

    def __init__(
        self, address: ListenAddress, *, connections: _Connections, tls: ssl.SSLContext | None, app: Any
    ) -> None:
        family, _, _, _, sockaddr = socket.getaddrinfo(
            address.host, address.port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
        self.address_family = family
        self.connections = connections
        self.tls = tls
        super().__init__((str(sockaddr[0]), int(sockaddr[1])), _Handler)
        self.set_app(app)

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self.connections.admit(request):
            self.shutdown_request(request)
            return
        super().process_request(request, client_address)

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.connections.done(request)

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that hangs up, times out or fails the handshake ends its own connection, quietly."""

    def server_bind(self) -> None:
        if self.address_family == socket.AF_INET6:
            self.socket.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        super().server_bind()


def _routed_app(routes: Mapping[str, WsgiApp], probes: Mapping[str, Probe]) -> WsgiApp:
    """Each route's app at its path, each probe path a 200/503 text answer, 404 otherwise."""

    def app(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        path = environ.get("PATH_INFO", "")
        route = routes.get(path)
        if route is not None:
            return route(environ, start_response)
        probe = probes.get(path)
        if probe is None:
            served = ", ".join(sorted([*routes, *probes]))
            status, body = "404 Not Found", f"not found: {served} are served\n"
        else:
            ok, reason = probe()
            status, body = ("200 OK" if ok else "503 Service Unavailable"), reason + "\n"
        start_response(status, [("Content-Type", "text/plain; charset=utf-8")])
        return [body.encode()]

    return app


class Server:
    """Serves ``routes`` (path -> WSGI app) and ``probes`` at their paths from daemon threads."""

    def __init__(
        self,
        routes: Mapping[str, WsgiApp],
        *,
        listen: ListenAddress,
        probes: Mapping[str, Probe] | None = None,
        read_timeout: float = DEFAULT_READ_TIMEOUT,
        max_connections: int = DEFAULT_MAX_CONNECTIONS,
        tls: TlsFiles | None = None,
        name: str = "gpuzombie-http",
    ) -> None:
        self.routes = dict(routes)
        self.listen = listen
        self.probes = dict(probes or {})
        self.tls = tls
        self.name = name
        self.connections = _Connections(read_timeout=read_timeout, max_connections=max_connections)
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> ListenAddress:
        """Bind and serve; returns the bound address (the real port when 0 was asked).
        Raises OSError when the address cannot be bound (in use, not local, not resolvable) or a
        TLS file cannot be read (ssl.SSLError is an OSError)."""
        context = None if self.tls is None else self.tls.context()
        app = _routed_app(self.routes, self.probes)
        self._server = _Server(self.listen, connections=self.connections, tls=context, app=app)
        self.connections.start()
        self._thread = threading.Thread(target=self._server.serve_forever, name=self.name, daemon=True)
        self._thread.start()
        return ListenAddress(self.listen.host, self._server.server_address[1])

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self.connections.stop()
            self._server = None
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
