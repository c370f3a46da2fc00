"""The kernel-side backstop: a POSIX timer that delivers SIGKILL, for when no Python code can run.

The watchdog is a thread, and a thread needs the GIL: a C call that keeps it (a ctypes.PyDLL call,
an extension that never releases it) starves the watchdog. SIGALRM cannot stand in: an application
may handle it (then its default action never comes) or re-arm ``alarm()``/``setitimer()`` (the one
real-time timer a process has). A timer of its own (``timer_create``, ``CLOCK_MONOTONIC``,
``SIGEV_SIGNAL`` with SIGKILL) shares nothing with the application's handlers or timers, and
SIGKILL can be neither caught nor ignored: the kernel ends the process at the deadline whatever any
thread is doing. POSIX timers are not inherited across fork (data-loader workers keep none) and end
with the process. Standard library only (ctypes); where ``timer_create`` is missing, ``arm``
returns False and the caller says so.
"""

from __future__ import annotations

import ctypes
import math
import signal

CLOCK_MONOTONIC = 1
SIGEV_SIGNAL = 0
_SIGEVENT_SIZE = 64  # glibc and musl: sigval, signo, notify, then a union padded to 64 bytes


class _Sigevent(ctypes.Structure):
    _fields_ = [
        ("sigev_value", ctypes.c_void_p),
        ("sigev_signo", ctypes.c_int),
        ("sigev_notify", ctypes.c_int),
        ("_pad", ctypes.c_int * ((_SIGEVENT_SIZE - ctypes.sizeof(ctypes.c_void_p) - 8) // 4)),
    ]


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


class _Itimerspec(ctypes.Structure):
    _fields_ = [("it_interval", _Timespec), ("it_value", _Timespec)]


def _libc() -> ctypes.CDLL | None:
    """The C library with timer_create (glibc >= 2.34 and musl have it in libc, older glibc in librt)."""
    for name in (None, "librt.so.1"):
        try:
            lib = ctypes.CDLL(name, use_errno=True)
            lib.timer_create  # noqa: B018 - the lookup is the check
            return lib
        except (OSError, AttributeError):
            continue
    return None


class KernelBackstop:
    """One SIGKILL timer for this process, armed (and re-armed closer) at a stop, never fired otherwise."""

    def __init__(self) -> None:
        self._lib = _libc()
        self._timer: ctypes.c_void_p | None = None
        self.why_not: str | None = None if self._lib is not None else "no timer_create in the C library"

    def arm(self, seconds: float) -> bool:
        """SIGKILL this process ``seconds`` from now (replacing an earlier arm); False when impossible."""
        if self._lib is None:
            return False
        if self._timer is None:
            event = _Sigevent(sigev_signo=signal.SIGKILL, sigev_notify=SIGEV_SIGNAL)
            timer = ctypes.c_void_p()
            if self._lib.timer_create(CLOCK_MONOTONIC, ctypes.byref(event), ctypes.byref(timer)) != 0:
                self.why_not = f"timer_create failed: errno {ctypes.get_errno()}"
                return False
            self._timer = timer
        return self._settime(max(0.001, seconds))

    def disarm(self) -> None:
        if self._timer is not None:
            self._settime(0.0)

    def _settime(self, seconds: float) -> bool:
        assert self._lib is not None and self._timer is not None
        whole = math.floor(seconds)
        spec = _Itimerspec(it_value=_Timespec(whole, int((seconds - whole) * 1e9)))
        if self._lib.timer_settime(self._timer, 0, ctypes.byref(spec), None) != 0:
            self.why_not = f"timer_settime failed: errno {ctypes.get_errno()}"
            return False
        return True
