"""Parsers on fixture strings, and a fake /proc tree in a temp dir."""

from __future__ import annotations

import os
import time

from fakeproc import make_fake_proc
from gpuzombie.proc.own import cgroup_v2_only, cpu_model, open_pid1_stdout
from gpuzombie.proc.parse import parse_cmdline, parse_cpu_model, parse_ns_link, parse_stat, parse_status
from gpuzombie.proc.procfs import Procfs
from gpuzombie.proc.read import Reason, Unreadable

STAT_WITH_PARENS = (
    "4242 (my (weird) proc) S 1 4242 4242 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 "
    "123456 1000000 250 18446744073709551615 0 0 0 0 0 0 0 0 0 0 0 0 17 1 0 0 0 0 0"
)


def test_parse_stat_handles_parentheses_in_comm():
    s = parse_stat(STAT_WITH_PARENS)
    assert (s.comm, s.state, s.ppid, s.pgid, s.sid) == ("my (weird) proc", "S", 1, 4242, 4242)
    assert s.start_ticks == 123456
    assert s.rss_pages == 250


def test_parse_status_nspid_and_uid():
    text = "Name:\tpython3\nState:\tS (sleeping)\nUid:\t1000\t1000\t1000\t1000\nNSpid:\t532\t3\n"
    st = parse_status(text)
    assert st.uid == 1000
    assert st.nspid == (532, 3)


def test_parse_cmdline_and_ns_link():
    assert parse_cmdline(b"python3\0worker.py\0--size\0002\0") == ("python3", "worker.py", "--size", "2")
    assert parse_cmdline(b"") == ()
    assert parse_ns_link("pid:[4026531836]") == 4026531836
    assert parse_ns_link("garbage") is None
    assert parse_ns_link("pid:[not-a-number]") is None and parse_ns_link("pid:[²]") is None


def test_fake_tree_snapshot(tmp_path):
    (tmp_path / "stat").write_text("cpu 0 0 0\nbtime 1700000000\n")
    make_fake_proc(tmp_path, 1, ppid=0, comm="sleep", cmdline=b"sleep\0infinity\0")
    make_fake_proc(tmp_path, 3, ppid=1, nspid=(532, 3), fds=("/dev/nvidia0", "/dev/nvidiactl", "/dev/null"))
    make_fake_proc(tmp_path, 4, ppid=1, state="Z", comm="python3", cmdline=b"")
    table = Procfs(str(tmp_path)).snapshot(now=time.time())
    assert sorted(table.processes) == [1, 3, 4]
    worker = table.get(3)
    assert worker.nvidia_fds == ("/dev/nvidia0", "/dev/nvidiactl")
    assert worker.nspid == (532, 3) and worker.innermost_pid == 3
    assert worker.pidns != table.get(1).pidns  # NSpid of two levels: a child namespace
    assert table.get(4).is_zombie and table.get(4).command == "[python3]"
    assert [p.pid for p in table.children(1)] == [3, 4]
    assert table.boot_time == 1700000000


def test_vanished_pid_is_skipped(tmp_path):
    (tmp_path / "stat").write_text("btime 1700000000\n")
    make_fake_proc(tmp_path, 1, ppid=0)
    table = Procfs(str(tmp_path)).snapshot([1, 99999], now=time.time())
    assert list(table.processes) == [1]


def test_missing_cmdline_keeps_the_process_as_incomplete(tmp_path):
    """Gone means stat is gone: a process whose stat is there but cmdline is not stays, marked."""
    (tmp_path / "stat").write_text("btime 1700000000\n")
    make_fake_proc(tmp_path, 1, ppid=0)
    make_fake_proc(tmp_path, 7, ppid=1)
    (tmp_path / "7" / "cmdline").unlink()
    table = Procfs(str(tmp_path)).snapshot(now=time.time())
    assert list(table.processes) == [1, 7]
    assert table.get(7).incomplete == (Unreadable("cmdline", Reason.MISSING, "No such file or directory"),)
    assert table.incomplete == (table.get(7),)


def test_process_without_stat_is_gone(tmp_path):
    (tmp_path / "stat").write_text("btime 1700000000\n")
    make_fake_proc(tmp_path, 1, ppid=0)
    (make_fake_proc(tmp_path, 7, ppid=1) / "stat").unlink()
    assert list(Procfs(str(tmp_path)).snapshot(now=time.time()).processes) == [1]


def test_device_prefix_stand_in(tmp_path):
    (tmp_path / "stat").write_text("btime 1700000000\n")
    make_fake_proc(tmp_path, 1, ppid=0, fds=("/tmp/dev/nvidia0", "/dev/nvidia1"))
    proc = Procfs(str(tmp_path), device_prefix="/tmp/dev/nvidia").snapshot(now=time.time()).get(1)
    assert proc.nvidia_fds == ("/tmp/dev/nvidia0",)


def test_status_is_read_only_for_processes_of_other_namespaces(tmp_path):
    """In the tree's own namespace NSpid is (pid,): the status file is skipped (it is the costliest)."""
    (tmp_path / "stat").write_text("btime 1700000000\n")
    make_fake_proc(tmp_path, 1, ppid=0, uid=0)
    make_fake_proc(tmp_path, 5, ppid=1, uid=1000)
    make_fake_proc(tmp_path, 6, ppid=1, nspid=(6, 1))
    (tmp_path / "5" / "status").write_text("garbage that would not parse\n")
    table = Procfs(str(tmp_path)).snapshot(now=time.time())
    assert table.get(5).nspid == (5,) and table.get(5).uid == 1000
    assert table.get(6).nspid == (6, 1)


def test_kernel_threads_are_read_from_stat_alone(tmp_path):
    """PF_KTHREAD in the stat flags: no argv, fds or namespace to read (a big node has thousands)."""
    (tmp_path / "stat").write_text("btime 1700000000\n")
    make_fake_proc(tmp_path, 1, ppid=0)
    make_fake_proc(tmp_path, 2, ppid=0, comm="kthreadd", cmdline=b"")
    kthread = make_fake_proc(tmp_path, 90, ppid=2, comm="kworker/0:1", cmdline=b"")
    (kthread / "stat").write_text("90 (kworker/0:1) I 2 0 0 0 -1 69238880 0 0 0 0 0 0 0 0 20 0 1 0 50 0 0 0")
    for name in ("cmdline", "status", "cgroup"):
        (kthread / name).unlink()  # would drop a user process as "gone mid-read"
    proc = Procfs(str(tmp_path)).snapshot(now=time.time()).get(90)
    assert proc is not None and proc.command == "[kworker/0:1]" and proc.nspid == (90,)
    assert parse_stat(STAT_WITH_PARENS).is_kernel_thread is False


CPUINFO = "processor\t: 0\nvendor_id\t: GenuineIntel\nmodel name\t: Intel(R) Xeon(R) Platinum 8480+\n\nprocessor\t: 1\n"


def test_parse_cpu_model_takes_the_first_model_name():
    assert parse_cpu_model(CPUINFO + "model name\t: other\n") == "Intel(R) Xeon(R) Platinum 8480+"
    assert parse_cpu_model("processor\t: 0\nCPU implementer\t: 0x41\n") is None  # arm64 names none


def test_machine_facts_from_a_tree_and_never_from_a_fifo(tmp_path):
    (tmp_path / "self").mkdir()
    (tmp_path / "self" / "cgroup").write_text("0::/user.slice/session-1.scope\n")
    (tmp_path / "cpuinfo").write_text(CPUINFO * 3000)  # larger than its cap: truncated, still read
    assert cgroup_v2_only(str(tmp_path)) and cpu_model(str(tmp_path)) == "Intel(R) Xeon(R) Platinum 8480+"
    (tmp_path / "self" / "cgroup").write_text("12:pids:/user.slice\n0::/user.slice\n")
    assert not cgroup_v2_only(str(tmp_path))
    for name in ("cpuinfo", "self/cgroup"):
        (tmp_path / name).unlink()
        os.mkfifo(tmp_path / name)  # would block a plain open() forever
    assert cpu_model(str(tmp_path)) is None and not cgroup_v2_only(str(tmp_path))


def test_pid1_stdout_is_opened_non_blocking_or_says_why_not(tmp_path):
    assert open_pid1_stdout(str(tmp_path / "absent"))[1].startswith("cannot stat ")
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)  # no reader: a blocking open would hang, a non-blocking one fails with ENXIO
    assert open_pid1_stdout(str(fifo))[1].startswith("cannot open ")
    log = tmp_path / "log"
    log.write_text("")
    fd, why_not = open_pid1_stdout(str(log))
    assert why_not is None and fd is not None
    os.write(fd, b"line\n")
    os.close(fd)
    assert log.read_text() == "line\n"
