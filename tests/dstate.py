"""A real process in state D, made safely and for a bounded time.

glibc's ``posix_spawn`` clones the child with CLONE_VFORK: the calling thread waits in the kernel,
uninterruptible (state D, wchan ``kernel_clone``), until the child execs. A file action that opens
a FIFO with no writer makes the child block before its exec, so the caller stays in D until someone
opens the FIFO for writing (``release``). The child runs glibc's own spawn code on its own stack
(nothing of Python), and the wait is killable (SIGKILL ends both), so nothing can be left stuck.

``python3 tests/dstate.py FIFO [DEVICE]`` holds DEVICE open (a stand-in for /dev/nvidia0) and enters
D; a process with CUDA memory can call ``enter_d_state`` itself (scripts/device/dstate_gpu.sh).
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path


def enter_d_state(fifo: str) -> None:
    """Block this thread in state D until ``fifo`` is opened for writing, then reap the child."""
    child = os.posix_spawn("/bin/true", ["true"], {}, file_actions=[(os.POSIX_SPAWN_OPEN, 3, fifo, os.O_RDONLY, 0)])
    os.waitpid(child, 0)


def state_of(pid: int) -> str | None:
    """The state letter of /proc/<pid>/stat; None when gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text[text.rindex(")") + 2]


def release(fifo: str) -> None:
    """Let the blocked child go on to its exec: open the FIFO's write end (non-blocking) once."""
    with contextlib.suppress(OSError):  # ENXIO: no reader, nothing is blocked
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))


@contextlib.contextmanager
def d_state_process(tmp: Path, device: Path | None = None, *, timeout: float = 10.0) -> Iterator[subprocess.Popen]:
    """A child process in state D (holding ``device`` open, if given) until the block ends."""
    fifo = tmp / "dstate.fifo"
    os.mkfifo(fifo)
    argv = [sys.executable, __file__, str(fifo)] + ([str(device)] if device else [])
    proc = subprocess.Popen(argv)
    try:
        deadline = time.monotonic() + timeout
        while state_of(proc.pid) != "D":
            if time.monotonic() > deadline or proc.poll() is not None:
                raise AssertionError(f"pid {proc.pid} did not enter state D (state {state_of(proc.pid)})")
            time.sleep(0.02)
        yield proc
    finally:
        release(str(fifo))
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()  # the vfork wait is killable: SIGKILL ends it
            proc.wait()


if __name__ == "__main__":
    held = open(sys.argv[2], "rb") if len(sys.argv) > 2 else None  # noqa: SIM115 - held until exit
    enter_d_state(sys.argv[1])
