"""``serve_until_stopped``: how a command runs a server, until SIGTERM or SIGINT (whichever thread
the kernel hands it to), reloading renewed TLS files on the way."""

from __future__ import annotations

import os
import select
import signal
import socket
from collections.abc import Callable

from gpuzombie.serving.server import Server
from gpuzombie.serving.tls import TlsFiles

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
