"""The connection bounds of a server: each connection's read deadline (a watchdog), at most
``max_connections`` at once (the oldest still sending evicted at the bound), and the request
bodies held by all connections together."""

from __future__ import annotations

import socket
import threading
import time
from typing import Any


class Connection:
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


class Connections:
    """The bound on concurrent connections and the request deadline, with the watchdog thread that
    enforces the deadline (a socket timeout alone restarts with every byte a slow sender trickles).
    A connection is its own key: admitted once, released once (the server's ``finally``)."""

    def __init__(self, *, read_timeout: float, max_connections: int) -> None:
        self.read_timeout = read_timeout
        self.max_connections = max_connections
        self._lock = threading.Lock()
        self._open: set[Connection] = set()
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

    def admit(self, sock: socket.socket, address: Any) -> Connection | None:
        """Room for ``sock``? At the bound, the oldest connection still sending its request makes room."""
        with self._lock:
            live = [c for c in self._open if not c.cut]
            if len(live) >= self.max_connections:
                waiting = [c for c in live if c.deadline is not None]
                if not waiting:
                    return None
                min(waiting, key=lambda c: c.deadline or 0.0).cut_off()
            conn = Connection(sock, address, time.monotonic() + self.read_timeout)
            self._open.add(conn)
            return conn

    def wrapped(self, conn: Connection, tls: socket.socket) -> None:
        """The TLS socket took over the connection's descriptor: cut that one from now on."""
        with self._lock:
            conn.sock = tls
            if conn.cut:
                conn.cut_off()

    def request_read(self, conn: Connection) -> None:
        with self._lock:
            conn.deadline = None

    def release(self, conn: Connection) -> None:
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


class BodyBytes:
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
