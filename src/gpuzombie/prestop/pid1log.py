"""Copy the hook's lines to PID 1's stdout, the stream ``kubectl logs`` shows.

The kubelet discards a preStop exec hook's output unless the hook fails (then it lands, cut short, in
an event). Writing to ``/proc/1/fd/1`` puts the lines into the container's log instead. Opened
non-blocking, so a full pipe drops lines rather than hanging the hook; skipped when it is the same
file as our own stdout (no doubled lines) or cannot be opened.
"""

from __future__ import annotations

import os

PID1_STDOUT = "/proc/1/fd/1"


class Pid1Log:
    """A best-effort copy of the hook's lines; ``why_not`` says why there is none (None: working)."""

    def __init__(self, path: str = PID1_STDOUT) -> None:
        self.path = path
        self.fd: int | None = None
        self.why_not: str | None = None
        try:
            target = os.stat(path)
        except OSError as exc:
            self.why_not = f"cannot stat {path}: {exc.strerror}"
            return
        try:
            mine = os.fstat(1)
            if (mine.st_dev, mine.st_ino) == (target.st_dev, target.st_ino):
                self.why_not = "PID 1's stdout is our own stdout"
                return
        except OSError:
            pass
        try:
            self.fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError as exc:
            self.why_not = f"cannot open {path}: {exc.strerror}"

    def write_line(self, line: str) -> None:
        if self.fd is None:
            return
        try:
            os.write(self.fd, (line.rstrip("\n") + "\n").encode(errors="replace"))
        except BlockingIOError:
            pass  # a full pipe: lose the line, never block the hook
        except OSError as exc:  # e.g. PID 1's stdout closed: stop trying, and say so in the report
            self.why_not = f"writing to {self.path} failed: {exc.strerror}"
            self.close()

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None
