"""proc/pidfd: handles that signal only through a pidfd, on real processes (pid reuse itself is forced
inside a PID namespace in test_prestop.py)."""

from __future__ import annotations

import os
import resource
import signal
import subprocess

from fakeproc import make_fake_proc, make_fake_root
from gpuzombie.proc.pidfd import (
    Liveness,
    PinnedPids,
    ProcessHandle,
    ProcessIdentity,
    read_start_and_state,
    wait_any_exit,
)
from gpuzombie.proc.pidns import ROOT_PIDNS_INODE, is_root_pidns, own_pid_in, reader_pidns
from pidns import wait_until


def _identity(pid: int) -> ProcessIdentity:
    found = read_start_and_state("/proc", pid)
    assert found is not None
    return ProcessIdentity(pid, found[0])


def test_handle_signals_its_process_and_sees_it_exit():
    child = subprocess.Popen(["sleep", "60"])
    handle, state = ProcessHandle.open(_identity(child.pid))
    assert handle is not None and state is Liveness.ALIVE
    assert handle.send(signal.SIGTERM) is Liveness.ALIVE
    wait_any_exit([handle], 10)
    # Exited but not reaped (a zombie of ours): exited for the handle, and nothing more is sent.
    assert wait_until(lambda: handle.liveness() is Liveness.EXITED)
    assert handle.send(signal.SIGKILL) is Liveness.EXITED
    assert child.wait(timeout=10) == -signal.SIGTERM
    handle.close()
    assert handle.liveness() is Liveness.EXITED


def test_open_with_another_start_time_is_a_reused_pid():
    child = subprocess.Popen(["sleep", "60"])
    identity = _identity(child.pid)
    handle, state = ProcessHandle.open(ProcessIdentity(child.pid, identity.start_ticks - 1))
    assert handle is None and state is Liveness.REUSED
    child.kill()
    child.wait()
    assert ProcessHandle.open(identity) == (None, Liveness.EXITED)


def test_a_pinned_process_that_exits_is_never_handed_over():
    child = subprocess.Popen(["sleep", "60"])
    identity = _identity(child.pid)
    with PinnedPids([child.pid, 2**22 + 1]) as pins:  # the second pid does not exist: skipped
        child.kill()
        child.wait()
        assert pins.take(identity, "/proc") == (None, Liveness.EXITED)
        assert pins.unpinned == {}


def test_a_pinned_live_process_is_handed_over_once():
    child = subprocess.Popen(["sleep", "60"])
    identity = _identity(child.pid)
    with PinnedPids([child.pid]) as pins:
        handle, state = pins.take(identity, "/proc")
        assert handle is not None and state is Liveness.ALIVE
        assert pins.take(identity, "/proc") == (None, Liveness.EXITED)  # already taken
    assert handle.send(signal.SIGKILL) is Liveness.ALIVE
    assert child.wait(timeout=10) == -signal.SIGKILL
    handle.close()


def test_stat_reader_refuses_a_fifo_and_a_huge_file(tmp_path):
    """A procfs tree that is not the kernel's cannot hang or flood the identity check."""
    make_fake_root(tmp_path)
    make_fake_proc(tmp_path, 7, ppid=1, starttime=4242)
    assert read_start_and_state(str(tmp_path), 7) == (4242, "S")
    (tmp_path / "7" / "stat").unlink()
    os.mkfifo(tmp_path / "7" / "stat")
    assert read_start_and_state(str(tmp_path), 7) is None
    (tmp_path / "7" / "stat").unlink()
    (tmp_path / "7" / "stat").write_text("7 (x) S " + "1 " * 100_000)
    assert read_start_and_state(str(tmp_path), 7) is None
    assert read_start_and_state(str(tmp_path), 8) is None


def test_root_pid_namespace_check():
    assert is_root_pidns(ROOT_PIDNS_INODE) and not is_root_pidns(None) and not is_root_pidns(4026532000)
    assert own_pid_in("/proc") == os.getpid()
    assert reader_pidns("/nonexistent") is None
    # This test process runs in the host's namespace here; inside a pod it would not.
    assert is_root_pidns(reader_pidns("/proc")) == (os.readlink("/proc/self/ns/pid") == f"pid:[{ROOT_PIDNS_INODE}]")


def soft_now() -> int:
    return resource.getrlimit(resource.RLIMIT_NOFILE)[0]


def test_a_pid_that_cannot_be_pinned_is_named_with_why():
    """Out of file descriptors: the pids left over are listed in ``unpinned``, never silently dropped."""
    children = [subprocess.Popen(["sleep", "60"]) for _ in range(4)]
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    fillers: list[int] = []
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(int(fd) for fd in os.listdir("/proc/self/fd")) + 8, hard))
    try:
        while True:  # every free descriptor taken...
            try:
                fillers.append(os.open("/dev/null", os.O_RDONLY))
            except OSError:
                break
        for _ in range(2):  # ...but two: two pidfds fit, two do not
            os.close(fillers.pop())
        with PinnedPids([c.pid for c in children], reserve=0) as pins:
            assert set(pins.unpinned) == {c.pid for c in children[2:]}  # pinned in the order given
            assert pins.out_of_fds and set(pins.unpinned.values()) == {
                f"no pidfd: the open-files limit is reached (ulimit -n {soft_now()} (hard {hard}))"
            }
            assert children[0].pid in pins and children[2].pid not in pins
        for _ in range(2):  # the default keeps RESERVED_FDS free for the scan: nothing is pinned then
            os.close(fillers.pop())
        with PinnedPids([c.pid for c in children]) as pins:
            assert pins.out_of_fds and set(pins.unpinned) == {c.pid for c in children}
            assert os.open("/dev/null", os.O_RDONLY) >= 0  # the scan still opens files
    finally:
        for fd in fillers:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
