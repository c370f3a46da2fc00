"""``Server``: WSGI apps by path beside the health probes, on one or more listen addresses, under
the bounds of ``serving.connections`` and with the TLS files of ``serving.tls``."""

from __future__ import annotations

import io
import ipaddress
import re
import selectors
import socket
import ssl
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer

from gpuzombie.serving.connections import BodyBytes, Connection, Connections
from gpuzombie.serving.tls import TlsFiles

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


_CONTENT_LENGTH = re.compile(r"[0-9]{1,18}")


class _Handler(WSGIRequestHandler):
    """One request per connection; the body, bounded by ``max_body_bytes``, is read under the read
    deadline before the app runs (the app reads it from memory)."""

    server: _Server

    def __init__(self, conn: Connection, server: _Server) -> None:
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
        connections: Connections,
        tls: ssl.SSLContext | None,
        app: Any,
        max_body_bytes: int,
        body_bytes: BodyBytes,
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

    def _serve(self, conn: Connection) -> None:
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
        self.body_bytes = BodyBytes(max_body_bytes_held)
        self.tls = tls
        self.name = name
        self.connections = Connections(read_timeout=read_timeout, max_connections=max_connections)
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
