"""Issue 10's bad inputs against the hardened reader: real FIFOs, /dev/zero links, oversized and
malformed files in fake procfs trees. Each spoils at most its own process, and nothing blocks."""

from __future__ import annotations

import os
import time

import pytest

from fakeproc import make_fake_proc, make_fake_root
from gpuzombie.proc.procfs import Procfs
from gpuzombie.proc.read import CAPS, HostileFile, Reason, read_capped


def _tree(tmp_path):
    make_fake_root(tmp_path)
    make_fake_proc(tmp_path, 1, ppid=0, comm="sleep", cmdline=b"sleep\0infinity\0")
    make_fake_proc(tmp_path, 7, ppid=1)
    return tmp_path


def _fifo(path):
    path.unlink()
    os.mkfifo(path)


def _zero_link(path):
    path.unlink()
    os.symlink("/dev/zero", path)


@pytest.mark.parametrize("name", ["stat", "status", "cmdline", "cgroup"])
@pytest.mark.parametrize("make_hostile", [_fifo, _zero_link], ids=["fifo", "dev_zero_link"])
def test_a_hostile_process_file_spoils_only_that_process(tmp_path, name, make_hostile):
    tree = _tree(tmp_path)
    make_fake_proc(tree, 8, ppid=1, nspid=(8, 2))  # another namespace: its status is read
    make_hostile(tree / "8" / name)
    table = Procfs(str(tree)).snapshot(now=time.time())
    assert sorted(table.processes) == [1, 7, 8]
    assert [p.pid for p in table.incomplete] == [8]
    assert [(u.file, u.reason) for u in table.get(8).incomplete] == [(name, Reason.NOT_REGULAR)]


def test_a_stat_that_cannot_be_used_keeps_the_process_with_nothing_known(tmp_path):
    tree = _tree(tmp_path)
    _fifo(tree / "7" / "stat")
    proc = Procfs(str(tree)).snapshot(now=time.time()).get(7)
    assert (proc.state, proc.comm, proc.ppid) == ("?", "?", 0) and not proc.is_zombie
    assert proc.unread("stat")


@pytest.mark.parametrize("make_hostile", [_fifo, _zero_link], ids=["fifo", "dev_zero_link"])
def test_a_hostile_proc_stat_is_a_one_line_error(tmp_path, make_hostile):
    tree = _tree(tmp_path)
    make_hostile(tree / "stat")
    with pytest.raises(OSError, match=r"regular file|symbolic links"):
        Procfs(str(tree)).snapshot(now=time.time())


def test_dev_zero_bind_is_refused_as_a_device(tmp_path):
    """A character device (what a bind mount of /dev/zero shows) is refused by fstat, unread."""
    with pytest.raises(HostileFile) as caught:
        read_capped("/dev/zero", "stat")
    assert caught.value.reason is Reason.NOT_REGULAR


@pytest.mark.parametrize("kind", ["stat", "status", "cgroup"])
def test_a_file_over_its_cap_is_refused(tmp_path, kind):
    path = tmp_path / kind
    path.write_bytes(b"x" * (CAPS[kind] + 1))
    with pytest.raises(HostileFile) as caught:
        read_capped(str(path), kind)
    assert caught.value.reason is Reason.TOO_LARGE


def test_a_huge_cmdline_is_truncated_not_refused(tmp_path):
    tree = _tree(tmp_path)
    (tree / "7" / "cmdline").write_bytes(b"python3\0" + b"a" * (1 << 20))
    proc = Procfs(str(tree)).snapshot(now=time.time()).get(7)
    assert proc.cmdline[0] == "python3" and not proc.incomplete
    assert len(proc.command) <= CAPS["cmdline"]


def test_btime_without_a_number_is_a_value_error(tmp_path):
    tree = _tree(tmp_path)
    (tree / "stat").write_text("cpu 0\nbtime \n")
    with pytest.raises(ValueError, match="btime"):
        Procfs(str(tree)).snapshot(now=time.time())


def test_state_x_is_gone_not_a_live_process(tmp_path):
    tree = _tree(tmp_path)
    make_fake_proc(tree, 9, ppid=1, state="X")
    assert sorted(Procfs(str(tree)).snapshot(now=time.time()).processes) == [1, 7]


def test_one_bad_nspid_line_spoils_one_process(tmp_path):
    tree = _tree(tmp_path)
    make_fake_proc(tree, 8, ppid=1, nspid=(8, 2))
    (tree / "8" / "status").write_text("Name:\tx\nUid:\t0\t0\t0\t0\nNSpid:\t8\tnot-a-pid\n")
    table = Procfs(str(tree)).snapshot(now=time.time())
    assert sorted(table.processes) == [1, 7, 8]
    assert [(u.file, u.reason) for u in table.get(8).incomplete] == [("status", Reason.MALFORMED)]


def test_malformed_stat_spoils_one_process(tmp_path):
    tree = _tree(tmp_path)
    (tree / "7" / "stat").write_text("7 (python3) S 1 7")
    table = Procfs(str(tree)).snapshot(now=time.time())
    assert table.get(7).incomplete[0].reason is Reason.MALFORMED and table.get(1).incomplete == ()


def test_an_unlistable_fd_directory_is_incomplete_and_kept_by_the_cheap_scan(tmp_path):
    """An fd/ that cannot be listed may hide a /dev/nvidia* holder: never silently dropped."""
    tree = _tree(tmp_path)
    fd = tree / "7" / "fd"
    fd.rmdir()
    os.mkfifo(fd)
    procfs = Procfs(str(tree))
    assert procfs.relevant_pids(())[0] == [7]
    assert procfs.snapshot(now=time.time()).get(7).unread("fd")


def test_the_deadline_leaves_the_rest_unread(tmp_path):
    tree = _tree(tmp_path)
    table = Procfs(str(tree), deadline_s=0).snapshot(now=time.time())
    assert table.processes == {} and table.unread == (1, 7)


def test_failures_are_classified_access_denied_told_apart():
    import errno

    from gpuzombie.proc.read import reason_of, unreadable

    assert reason_of(PermissionError(errno.EACCES, "denied")) is Reason.ACCESS_DENIED
    assert reason_of(OSError(errno.EPERM, "not permitted")) is Reason.ACCESS_DENIED
    assert reason_of(FileNotFoundError(errno.ENOENT, "gone")) is Reason.MISSING
    assert reason_of(OSError(errno.ELOOP, "a symlink")) is Reason.NOT_REGULAR
    assert reason_of(OSError(errno.EIO, "i/o")) is Reason.ERROR
    assert unreadable("status", ValueError("NSpid is not a number")).reason is Reason.MALFORMED


def _stat_line(pid: int, *, state: str = "S", flags: str = "4194560") -> str:
    return f"{pid} (python3) {state} 1 {pid} {pid} 0 -1 {flags} 0 0 0 0 0 0 0 0 20 0 1 0 1000 0 10 0"


def test_negative_flags_are_malformed_not_a_kernel_thread(tmp_path):
    """flags=-1 would set PF_KTHREAD: the holder was read as a kernel thread, its fds never listed."""
    tree = _tree(tmp_path)
    make_fake_proc(tree, 8, ppid=1, fds=("/dev/nvidia0",))
    (tree / "8" / "stat").write_text(_stat_line(8, flags="-1"))
    proc = Procfs(str(tree)).snapshot(now=time.time()).get(8)
    assert [(u.file, u.reason) for u in proc.incomplete] == [("stat", Reason.MALFORMED)]
    assert "flags is negative" in proc.incomplete[0].detail and proc.could_hide_finding


@pytest.mark.parametrize("state", ["z", "r", "Q", "ZZ", "1"])
def test_a_state_the_kernel_never_prints_is_malformed(tmp_path, state):
    tree = _tree(tmp_path)
    make_fake_proc(tree, 8, ppid=1)
    (tree / "8" / "stat").write_text(_stat_line(8, state=state))
    proc = Procfs(str(tree)).snapshot(now=time.time()).get(8)
    assert not proc.is_zombie and proc.state == "?"
    assert [(u.file, u.reason) for u in proc.incomplete] == [("stat", Reason.MALFORMED)]


def test_a_pid_directory_that_is_a_symlink_is_not_read(tmp_path):
    """``8 -> 7``: the same process would be read twice, once under a pid that is not its own."""
    tree = _tree(tmp_path)
    os.symlink("7", tree / "8")
    os.symlink(str(tree / "1"), tree / "9")
    procfs = Procfs(str(tree))
    assert procfs.pids() == [1, 7]
    assert sorted(procfs.snapshot(now=time.time()).processes) == [1, 7]


def test_a_pid_directory_not_named_by_its_own_pid_is_malformed(tmp_path):
    """A copy of 7's directory as 8 (a recording, a hostile tree): its stat names pid 7."""
    tree = _tree(tmp_path)
    make_fake_proc(tree, 8, ppid=1, fds=("/dev/nvidia0",))
    (tree / "8" / "stat").write_text(_stat_line(7))
    proc = Procfs(str(tree)).snapshot(now=time.time()).get(8)
    assert proc.state == "?" and proc.nvidia_fds == ()
    assert proc.incomplete[0].reason is Reason.MALFORMED and "stat names pid 7" in proc.incomplete[0].detail


DEVICES = (
    "/dev/nvidia0",
    "/dev/nvidia15",
    "/dev/nvidiactl",
    "/dev/nvidia-uvm",
    "/dev/nvidia-uvm-tools",
    "/dev/nvidia-modeset",
    "/dev/nvidia-caps/nvidia-cap1",
)


def test_every_driver_device_counts_as_a_gpu_fd(tmp_path):
    tree = _tree(tmp_path)
    make_fake_proc(tree, 8, ppid=1, fds=(*DEVICES, "/dev/null", "socket:[123]"))
    proc = Procfs(str(tree)).snapshot(now=time.time()).get(8)
    assert proc.nvidia_fds == tuple(sorted(DEVICES)) and proc.incomplete == ()


@pytest.mark.parametrize(
    "link",
    [
        "/dev/nvidia" + "0" * 4000,
        "/dev/nvidia0 (deleted)",
        "/dev/nvidiafoo",
        "/dev/nvidia",
        "/dev/nvidia0/../../etc/passwd",
        "/dev/nvidia-caps/",
        "/dev/nvidia0\n/dev/nvidia1",
    ],
    ids=["4000-chars", "deleted", "foo", "bare-prefix", "dotdot", "caps-dir", "newline"],
)
def test_a_link_that_only_starts_with_dev_nvidia_is_malformed(tmp_path, link):
    """Not a GPU device: the fd is malformed, with the reason, so no report claims the process clean."""
    tree = _tree(tmp_path)
    make_fake_proc(tree, 8, ppid=1, fds=("/dev/nvidia1", link))
    proc = Procfs(str(tree)).snapshot(now=time.time()).get(8)
    assert proc.nvidia_fds == ("/dev/nvidia1",)
    assert [(u.file, u.reason) for u in proc.incomplete] == [("fd", Reason.MALFORMED)]
    assert "name no NVIDIA device" in proc.incomplete[0].detail and len(proc.incomplete[0].detail) <= 200
