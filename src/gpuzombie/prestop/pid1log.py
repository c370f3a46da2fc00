"""Copy the hook's lines to PID 1's stdout, the stream ``kubectl logs`` shows.

The kubelet discards a preStop exec hook's output unless the hook fails (then it lands, cut short, in
an event). Writing to ``/proc/1/fd/1`` puts the lines into the container's log instead. Opened
non-blocking, so a full pipe drops lines rather than hanging the hook; skipped when it is the same
file as our own stdout (no doubled lines) or cannot be opened.
"""

from __future__ import annotations

import os

from gpuzombie.proc.own import PID1_STDOUT, open_pid1_stdout


class Pid1Log:
    """A best-effort copy of the hook's lines; ``why_not`` says why there is none (None: working)."""

    def __init__(self, path: str = PID1_STDOUT) -> None:
        self.path = path
        self.fd, self.why_not = open_pid1_stdout(path)

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
