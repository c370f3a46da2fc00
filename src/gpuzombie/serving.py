"""One HTTP(S) server for every port gpuzombie opens: the exporter's /metrics and the admission
webhook's /mutate, each beside the same health probes.

``Server(routes, ...)`` serves WSGI apps by path. Loopback by default; a node DaemonSet asks for its
pod IP explicitly. Hardened for a port that anything on the network can reach: each connection must
deliver its request within ``read_timeout`` seconds (a watchdog cuts slow senders, slowloris
included, whatever the pace of their bytes), at most ``max_connections`` are served at once (at the
bound a new connection evicts the oldest one still sending its request, so a held-open flood cannot
starve the scraper), the TLS handshake runs in the connection's thread under the same deadline, a
request body is bounded by ``max_body_bytes`` (over it: 413, never read) and read under the same
deadline, the bodies held by all connections together by ``max_body_bytes_held`` (over it: 503,
never read), a certificate renewal swaps the TLS context for new connections without closing the
listener (``reload_tls``), TLS files that cannot serve (encrypted key, certificate expired or not
yet valid) are refused naming the file, every connection (plain, TLS, failed handshake) is released and closed in one
``finally``, and nothing is logged per request. One server may listen on several addresses (a pod
IP and loopback) under one bound, all accepted by one loop that ``stop`` ends at once.
``serve_until_stopped`` is how a command runs one: until SIGTERM or SIGINT, whichever thread the
kernel hands it to, reloading renewed TLS files on the way. Standard library only: the webhook's image needs no extra (why
not cheroot: docs/reliability.md).
"""

from __future__ import annotations

import datetime
import io
import ipaddress
import os
import re
import select
import selectors
import signal
import socket
import ssl
import stat
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer

DEFAULT_READ_TIMEOUT = 10.0
DEFAULT_MAX_CONNECTIONS = 32
DEFAULT_MAX_BODY_BYTES = 1024 * 1024
"""A request body over this is answered 413, unread. An AdmissionReview of an ordinary pod is a few
KiB; a webhook that must take the largest bodies the API server accepts (3 MiB) asks for more."""

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


class ListenError(OSError):
    """An address that cannot be bound (in use, not local, not resolvable); names the address."""

    def __init__(self, address: ListenAddress, cause: OSError) -> None:
        super().__init__(cause.errno, cause.strerror or str(cause))
        self.address = address

    def __str__(self) -> str:
        return f"cannot listen on {self.address}: {self.strerror}"


class TlsFileError(OSError):
    """A TLS file that cannot be read or does not hold what it should; the message names it."""


def _ssl_reason(exc: ssl.SSLError) -> str:
    return exc.reason.lower().replace("_", " ") if exc.reason else str(exc)


CLOCK_SKEW = datetime.timedelta(minutes=5)
"""A certificate whose notBefore is this little ahead of our clock is served (cert-manager issues
one the moment it is asked; a node's clock may lag)."""


@dataclass(frozen=True)
class TlsFiles:
    """PEM files of the server certificate and key; ``client_ca`` makes clients show a certificate."""

    certfile: str
    keyfile: str
    client_ca: str | None = None

    def context(self, now: datetime.datetime | None = None) -> ssl.SSLContext:
        """Raises TlsFileError (an OSError) naming the file that is missing, unreadable or wrong, a
        key encrypted with a passphrase (never asked for on a terminal), or a certificate outside
        its validity at ``now`` (default: the current time)."""
        for role, path in (("certificate", self.certfile), ("key", self.keyfile), ("client CA", self.client_ca)):
            if path is not None:
                _regular_file(role, path)
        _certificates("certificate", self.certfile)
        _within_validity(self.certfile, now or datetime.datetime.now(datetime.UTC))
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2

        def no_passphrase() -> str:  # OpenSSL would prompt on the terminal, twice, then fail unnamed
            raise TlsFileError(f"key {self.keyfile}: encrypted with a passphrase; serve an unencrypted key")

        try:
            context.load_cert_chain(self.certfile, self.keyfile, password=no_passphrase)
        except ssl.SSLError as exc:  # the certificate itself loaded above: the key is what is wrong
            raise TlsFileError(
                f"key {self.keyfile}: not a PEM private key of certificate {self.certfile} ({_ssl_reason(exc)})"
            ) from exc
        if self.client_ca is not None:
            _certificates("client CA", self.client_ca, context)
            context.verify_mode = ssl.CERT_REQUIRED
        return context


def _regular_file(role: str, path: str) -> None:
    """Readable and a regular file (a Secret's symlinks are followed); never blocks on a FIFO."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        raise TlsFileError(f"{role} {path}: {exc.strerror or exc}") from exc
    try:
        regular = stat.S_ISREG(os.fstat(fd).st_mode)
    finally:
        os.close(fd)
    if not regular:
        raise TlsFileError(f"{role} {path}: not a regular file")


_PEM_CERTIFICATE = re.compile(r"-----BEGIN CERTIFICATE-----.*?-----END CERTIFICATE-----", re.S)


def _der_items(data: bytes, start: int, end: int) -> list[tuple[int, int, int]]:
    """(tag, start, end) of each DER item between ``start`` and ``end``; ValueError when malformed."""
    items = []
    while start < end:
        if start + 2 > end:
            raise ValueError("truncated")
        tag, length, at = data[start], data[start + 1], start + 2
        if length & 0x80:
            count = length & 0x7F
            if not 1 <= count <= 4 or at + count > end:
                raise ValueError("bad length")
            length, at = int.from_bytes(data[at : at + count], "big"), at + count
        if at + length > end:
            raise ValueError("truncated")
        items.append((tag, at, at + length))
        start = at + length
    return items


def _der_time(tag: int, text: bytes) -> datetime.datetime:
    """UTCTime (0x17, YYMMDDHHMMSSZ) or GeneralizedTime (0x18, YYYYMMDDHHMMSSZ), as RFC 5280 writes them."""
    if tag == 0x17:
        moment = datetime.datetime.strptime(text.decode("ascii"), "%y%m%d%H%M%SZ")
    elif tag == 0x18:
        moment = datetime.datetime.strptime(text.decode("ascii"), "%Y%m%d%H%M%SZ")
    else:
        raise ValueError(f"tag {tag:#x} is not a time")
    return moment.replace(tzinfo=datetime.UTC)


def certificate_validity(pem: str) -> tuple[datetime.datetime, datetime.datetime]:
    """(notBefore, notAfter) of the first certificate of ``pem``, read from its DER (the standard
    library's ssl module shows them only for a peer's certificate). ValueError when there is none."""
    match = _PEM_CERTIFICATE.search(pem)
    if match is None:
        raise ValueError("no PEM certificate")
    der = ssl.PEM_cert_to_DER_cert(match.group())
    ((_, cert_start, cert_end),) = _der_items(der, 0, len(der))[:1]
    tbs = _der_items(der, cert_start, cert_end)[0]
    fields = _der_items(der, tbs[1], tbs[2])
    if fields and fields[0][0] == 0xA0:  # [0] version
        fields = fields[1:]
    _, start, end = fields[3]  # serialNumber, signature, issuer, validity
    (before_tag, b0, b1), (after_tag, a0, a1) = _der_items(der, start, end)
    return _der_time(before_tag, der[b0:b1]), _der_time(after_tag, der[a0:a1])


def _within_validity(path: str, now: datetime.datetime) -> None:
    try:
        with open(path, encoding="ascii", errors="replace") as f:
            not_before, not_after = certificate_validity(f.read())
    except (ValueError, IndexError) as exc:
        raise TlsFileError(f"certificate {path}: its validity cannot be read ({exc})") from exc
    if now > not_after:
        raise TlsFileError(f"certificate {path}: expired (notAfter {not_after:%Y-%m-%d %H:%M:%S} UTC)")
    if now + CLOCK_SKEW < not_before:
        raise TlsFileError(f"certificate {path}: not valid yet (notBefore {not_before:%Y-%m-%d %H:%M:%S} UTC)")


def _certificates(role: str, path: str, into: ssl.SSLContext | None = None) -> None:
    """Load the PEM certificates of ``path`` as trust anchors (of a scratch context when ``into`` is
    None: only to check that the file holds one)."""
    try:
        (into or ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)).load_verify_locations(cafile=path)
    except ssl.SSLError as exc:
        raise TlsFileError(f"{role} {path}: holds no PEM certificate ({_ssl_reason(exc)})") from exc


class _Connection:
    """One connection being served, the same entry from accept to close whether or not TLS wraps its
    socket; ``deadline`` is None once its request (headers and body) has been read."""

    def __init__(self, sock: socket.socket, address: Any, deadline: float) -> None:
        self.sock = sock
        self.address = address
        self.deadline: float | None = deadline
        self.cut = False

    def cut_off(self) -> None:
        """Unblock the connection's thread: its reads and writes fail at once. The descriptor is
        shut down under the TLS object, not through it: SSLSocket.shutdown drops its SSL object,
        and a thread about to start its handshake would die on that (AttributeError)."""
        self.cut = True
        try:
            socket.socket.shutdown(self.sock, socket.SHUT_RDWR)
        except OSError:
            pass  # already closed by its thread, or detached into its TLS socket a moment ago

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass


class _Connections:
    """The bound on concurrent connections and the request deadline, with the watchdog thread that
    enforces the deadline (a socket timeout alone restarts with every byte a slow sender trickles).
    A connection is its own key: admitted once, released once (the server's ``finally``)."""

    def __init__(self, *, read_timeout: float, max_connections: int) -> None:
        self.read_timeout = read_timeout
        self.max_connections = max_connections
        self._lock = threading.Lock()
        self._open: set[_Connection] = set()
        self._stop = threading.Event()
        self._watchdog = threading.Thread(target=self._watch, name="gpuzombie-http-watchdog", daemon=True)

    def start(self) -> None:
        self._watchdog.start()

    def stop(self) -> None:
        self._stop.set()
        self._watchdog.join(timeout=5)
        with self._lock:
            for conn in self._open:
                conn.cut_off()

    def admit(self, sock: socket.socket, address: Any) -> _Connection | None:
        """Room for ``sock``? At the bound, the oldest connection still sending its request makes room."""
        with self._lock:
            live = [c for c in self._open if not c.cut]
            if len(live) >= self.max_connections:
                waiting = [c for c in live if c.deadline is not None]
                if not waiting:
                    return None
                min(waiting, key=lambda c: c.deadline or 0.0).cut_off()
            conn = _Connection(sock, address, time.monotonic() + self.read_timeout)
            self._open.add(conn)
            return conn

    def wrapped(self, conn: _Connection, tls: socket.socket) -> None:
        """The TLS socket took over the connection's descriptor: cut that one from now on."""
        with self._lock:
            conn.sock = tls
            if conn.cut:
                conn.cut_off()

    def request_read(self, conn: _Connection) -> None:
        with self._lock:
            conn.deadline = None

    def release(self, conn: _Connection) -> None:
        with self._lock:
            self._open.discard(conn)

    def count(self) -> int:
        with self._lock:
            return len(self._open)

    def _watch(self) -> None:
        tick = min(1.0, self.read_timeout / 4)
        while not self._stop.wait(tick):
            now = time.monotonic()
            with self._lock:
                late = [c for c in self._open if not c.cut and c.deadline is not None and c.deadline <= now]
                for conn in late:
                    conn.cut_off()


class _BodyBytes:
    """The bytes of request bodies held at once, bounded: a body that does not fit is refused (503)
    before it is read, so many connections sending the largest body cannot add up past a memory limit."""

    def __init__(self, limit: int | None) -> None:
        self.limit = limit
        self._held = 0
        self._lock = threading.Lock()

    def take(self, length: int) -> bool:
        with self._lock:
            if self.limit is not None and self._held + length > self.limit:
                return False
            self._held += length
            return True

    def give_back(self, length: int) -> None:
        with self._lock:
            self._held -= length

    @property
    def held(self) -> int:
        """The bytes taken now (for a probe, and for a test to know a body's headers were read)."""
        return self._held


_CONTENT_LENGTH = re.compile(r"[0-9]{1,18}")


class _Handler(WSGIRequestHandler):
    """One request per connection; the body, bounded by ``max_body_bytes``, is read under the read
    deadline before the app runs (the app reads it from memory)."""

    server: _Server

    def __init__(self, conn: _Connection, server: _Server) -> None:
        self.conn = conn
        self._socket_rfile: Any = None
        self._held = 0
        super().__init__(conn.sock, conn.address, server)

    def parse_request(self) -> bool:
        if not super().parse_request():
            return False
        body = self._read_body()
        if body is None:
            return False
        self.server.connections.request_read(self.conn)
        self._socket_rfile, self.rfile = self.rfile, io.BytesIO(body)
        return True

    def _read_body(self) -> bytes | None:
        """The body; None when refused (answered with 400, 411 or 413, never read) or cut short."""
        if self.headers.get("Transfer-Encoding") is not None:
            self.send_error(HTTPStatus.LENGTH_REQUIRED, "send the body with a Content-Length")
            return None
        text = (self.headers.get("Content-Length") or "0").strip()
        if not _CONTENT_LENGTH.fullmatch(text):
            self.send_error(HTTPStatus.BAD_REQUEST, "Content-Length is not a number of bytes")
            return None
        length = int(text)
        if length > self.server.max_body_bytes:
            self.send_error(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, f"the body is over {self.server.max_body_bytes} bytes")
            return None
        if not self.server.body_bytes.take(length):
            self.send_error(HTTPStatus.SERVICE_UNAVAILABLE, "too many request bodies held at once")
            return None
        self._held = length
        body = self.rfile.read(length) if length else b""
        return body if len(body) == length else None

    def finish(self) -> None:
        try:
            super().finish()
        finally:
            self.server.body_bytes.give_back(self._held)
            self._held = 0
            if self._socket_rfile is not None:
                self._socket_rfile.close()

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: a log line per scrape (or per attacker's byte) helps no one."""


class _Server(WSGIServer):
    """One listening socket; each accepted connection is served in its own daemon thread."""

    request_queue_size = 128

    def __init__(
        self,
        address: ListenAddress,
        *,
        connections: _Connections,
        tls: ssl.SSLContext | None,
        app: Any,
        max_body_bytes: int,
        body_bytes: _BodyBytes,
        name: str,
    ) -> None:
        family, _, _, _, sockaddr = socket.getaddrinfo(
            address.host, address.port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
        self.address_family = family
        self.connections = connections
        self.tls = tls
        """The context each new connection is wrapped with, replaced whole on a reload: a connection
        keeps the one it was accepted with, the listening socket never closes."""
        self.max_body_bytes = max_body_bytes
        self.body_bytes = body_bytes
        self.name = name
        # _serve builds each _Handler from its connection entry; socketserver never calls it.
        super().__init__((str(sockaddr[0]), int(sockaddr[1])), _Handler)  # type: ignore[arg-type]
        self.set_app(app)

    def process_request(self, request: Any, client_address: Any) -> None:
        conn = self.connections.admit(request, client_address)
        if conn is None:
            self.shutdown_request(request)
            return
        try:
            threading.Thread(target=self._serve, args=(conn,), name=f"{self.name}-connection", daemon=True).start()
        except RuntimeError:  # no thread to be had (a process or cgroup limit): drop this one, keep serving
            self.connections.release(conn)
            conn.close()

    def _serve(self, conn: _Connection) -> None:
        """The TLS handshake (in this thread, under the read deadline) and the request; whatever
        happens, the connection leaves the table and its socket, TLS or not, is closed."""
        try:
            conn.sock.settimeout(self.connections.read_timeout)
            # wsgiref writes the headers and the body apart: with Nagle the body waits for the client's
            # delayed ACK, 40 ms an answer (measured over TLS on 127.0.0.1: p50 48 ms, 1.6 ms without)
            conn.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            context = self.tls  # read once: a reload may replace it meanwhile
            if context is not None:
                tls = context.wrap_socket(conn.sock, server_side=True, do_handshake_on_connect=False)
                self.connections.wrapped(conn, tls)
                tls.do_handshake()
            _Handler(conn, self)
        except (OSError, ValueError):
            pass  # a client that hangs up, times out, is cut or fails the handshake: its own loss
        finally:
            self.connections.release(conn)
            conn.close()

    def handle_ready(self) -> None:
        """Accept and serve the connection the accept loop found waiting on this socket (never blocks:
        a client gone before the accept leaves nothing to wait for; ``handle_request`` would wait)."""
        self._handle_request_noblock()  # type: ignore[attr-defined]  # socketserver's, not in typeshed

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
    """Serves ``routes`` (path -> WSGI app) and ``probes`` at their paths from daemon threads, on one
    address or several (e.g. the pod IP and loopback), all under one connection bound."""

    def __init__(
        self,
        routes: Mapping[str, WsgiApp],
        *,
        listen: ListenAddress | Sequence[ListenAddress],
        probes: Mapping[str, Probe] | None = None,
        read_timeout: float = DEFAULT_READ_TIMEOUT,
        max_connections: int = DEFAULT_MAX_CONNECTIONS,
        max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
        max_body_bytes_held: int | None = None,
        tls: TlsFiles | None = None,
        name: str = "gpuzombie-http",
    ) -> None:
        """``max_body_bytes_held``: the request bodies of all connections together (None: only the
        connection bound bounds them); a body past it is answered 503, unread."""
        self.routes = dict(routes)
        self.addresses = (listen,) if isinstance(listen, ListenAddress) else tuple(listen)
        if not self.addresses:
            raise ValueError("no address to listen on")
        self.listen = self.addresses[0]
        self.probes = dict(probes or {})
        self.max_body_bytes = max_body_bytes
        self.body_bytes = _BodyBytes(max_body_bytes_held)
        self.tls = tls
        self.name = name
        self.connections = _Connections(read_timeout=read_timeout, max_connections=max_connections)
        self.bound: tuple[ListenAddress, ...] = ()
        """The addresses bound by start(), in the order asked, with the real ports."""
        self._servers: list[_Server] = []
        self._accepting: threading.Thread | None = None
        self._wake: tuple[socket.socket, socket.socket] | None = None
        """Written to by ``stop``: the accept loop returns at once (socketserver's polls every 0.5 s)."""

    def start(self) -> ListenAddress:
        """Bind and serve; returns the first bound address (the real port when 0 was asked; all of
        them in ``bound``). Raises ListenError when an address cannot be bound (in use, not local, not
        resolvable; then none stays bound), TlsFileError when a TLS file cannot be used; both
        OSErrors that name what failed."""
        context = None if self.tls is None else self.tls.context()
        app = _routed_app(self.routes, self.probes)
        for address in self.addresses:
            try:
                server = _Server(
                    address,
                    connections=self.connections,
                    tls=context,
                    app=app,
                    max_body_bytes=self.max_body_bytes,
                    body_bytes=self.body_bytes,
                    name=self.name,
                )
            except OSError as exc:
                for bound in self._servers:
                    bound.server_close()
                self._servers = []
                raise ListenError(address, exc) from exc
            self._servers.append(server)
        self.connections.start()
        self._wake = socket.socketpair()
        self._accepting = threading.Thread(target=self._accept, args=(self._wake[0],), name=self.name, daemon=True)
        self._accepting.start()
        self.bound = tuple(
            ListenAddress(a.host, s.server_address[1]) for a, s in zip(self.addresses, self._servers, strict=True)
        )
        return self.bound[0]

    def reload_tls(self) -> None:
        """Serve the TLS files as they are now to every new connection, without closing the listening
        sockets or cutting a connection in flight (each keeps the context it was accepted with).
        Raises TlsFileError, the old context still served, when the files cannot be used."""
        if self.tls is None:
            raise ValueError("this server serves no TLS")
        context = self.tls.context()
        for server in self._servers:
            server.tls = context

    def _accept(self, wake: socket.socket) -> None:
        """Accept on every listening socket from one thread, until ``stop`` writes to ``wake``. poll(2),
        as socketserver's loop: it holds no descriptor of its own (epoll would, opened in this thread
        after ``start`` returned)."""
        with selectors.PollSelector() as selector:
            selector.register(wake, selectors.EVENT_READ)
            for server in self._servers:
                selector.register(server, selectors.EVENT_READ, server)
            while True:
                for key, _ in selector.select():
                    if key.data is None:
                        return
                    key.data.handle_ready()

    def stop(self) -> None:
        """Close the listening sockets and cut the connections still open; returns once the accept
        loop has ended (at once: it waits on the wake-up socket, not on a poll interval)."""
        if self._wake is not None:
            self._wake[1].send(b"x")
        if self._accepting is not None:
            self._accepting.join(timeout=5)
            self._accepting = None
        if self._wake is not None:
            for sock in self._wake:
                sock.close()
            self._wake = None
        for server in self._servers:
            server.server_close()
        if self._servers:
            self.connections.stop()
            self._servers = []


STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)


class _StopSignals:
    """SIGTERM and SIGINT taken over for a ``with`` block; ``wait`` returns the one that came.

    The kernel may hand the signal to any thread (a server or gRPC one): CPython's C handler then only
    writes its number to the wakeup fd, and a main thread asleep in ``Event.wait`` would not run a
    Python handler before its timeout. Waiting on the wakeup fd returns at once, whichever thread took it.
    """

    def __enter__(self) -> _StopSignals:
        self._read, self._write = socket.socketpair()
        self._write.setblocking(False)
        self._previous_fd = signal.set_wakeup_fd(self._write.fileno(), warn_on_full_buffer=False)
        self._previous = {s: signal.signal(s, lambda signum, frame: None) for s in STOP_SIGNALS}
        return self

    def __exit__(self, *exc: object) -> None:
        for s, handler in self._previous.items():
            signal.signal(s, handler)
        signal.set_wakeup_fd(self._previous_fd)
        self._read.close()
        self._write.close()

    def wait(self, timeout: float | None) -> signal.Signals | None:
        """The stop signal received within ``timeout`` s (None: forever); None when none came."""
        readable, _, _ = select.select([self._read], [], [], timeout)
        if readable:
            for signum in self._read.recv(64):
                if signum in STOP_SIGNALS:
                    return signal.Signals(signum)
        return None


def _stamp(tls: TlsFiles) -> tuple[float, ...]:
    """The TLS files' modification times (-1 for one that cannot be read): a change means a renewal."""
    stamps = []
    for path in (tls.certfile, tls.keyfile, tls.client_ca):
        try:
            stamps.append(os.stat(path).st_mtime if path is not None else 0.0)
        except OSError:
            stamps.append(-1.0)
    return tuple(stamps)


def serve_until_stopped(
    server: Server,
    *,
    announce: Callable[[Server], None],
    log: Callable[[str], None],
    tls_check_seconds: float,
) -> signal.Signals:
    """Start ``server``, serve until SIGTERM or SIGINT, stop it; the signal that stopped it.

    The one way a gpuzombie server runs: the stop signals are taken over before the start (so one
    that comes during it is not lost) and end the wait at once, whichever thread the kernel gave
    them to. ``announce`` is called once serving. With TLS, the files are checked every
    ``tls_check_seconds``: a renewed certificate (cert-manager rotates the Secret) is served to new
    connections (``reload_tls``); files that cannot serve are ``log``ged and the old ones stay
    served, tried again at the next check. Raises what ``start`` raises (ListenError, TlsFileError)."""
    with _StopSignals() as stop:
        # Stamped before start() loads the files: a renewal from then on, even one done before the
        # announcement (a caller that swaps files as soon as it reads it), is seen at the next check.
        stamp = None if server.tls is None else _stamp(server.tls)
        server.start()
        try:
            announce(server)
            while (received := stop.wait(None if stamp is None else tls_check_seconds)) is None:
                now = stamp if server.tls is None else _stamp(server.tls)
                if now == stamp:
                    continue
                try:
                    server.reload_tls()
                except OSError as exc:
                    log(f"warning: new TLS files not served, the old ones are: {exc}")
                    continue
                stamp = now
                log("TLS certificate reloaded")
        finally:
            server.stop()
    return received
