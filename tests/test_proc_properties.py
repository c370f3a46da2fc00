"""Property-based tests of the procfs parsers and the escape: any text in, a result or ValueError out
(never IndexError, OverflowError, ...), and what the kernel could write parses back exactly."""

from __future__ import annotations

import time

import pytest

pytest.importorskip("hypothesis", reason="hypothesis is in the 'test' extra")

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fakeproc import make_fake_proc, make_fake_root
from gpuzombie.escape import escape
from gpuzombie.proc.parse import (
    StatusFields,
    parse_boot_time,
    parse_cgroup,
    parse_cmdline,
    parse_ns_link,
    parse_sigterm,
    parse_stat,
    parse_status,
)
from gpuzombie.proc.procfs import Procfs

anything = st.text(max_size=400) | st.binary(max_size=400).map(lambda b: b.decode(errors="replace"))
pids = st.integers(min_value=1, max_value=4194304)
comms = st.text(min_size=0, max_size=64)
states = st.sampled_from("RSDZTtWXxKPI")


@given(anything)
def test_parsers_raise_only_value_error(text):
    for parse in (parse_stat, parse_status, parse_boot_time):
        try:
            parse(text)
        except ValueError:
            pass
    parse_cgroup(text)
    parse_ns_link(text)
    parse_sigterm(text, text)
    parse_cmdline(text.encode(errors="surrogatepass"))


@given(pids, comms, states, pids, st.integers(min_value=0, max_value=2**63), st.integers(min_value=0, max_value=2**40))
def test_stat_round_trips_whatever_the_comm(pid, comm, state, ppid, start, rss):
    """A comm may hold spaces, parentheses and newlines: the fields after the last ')' still parse."""
    text = f"{pid} ({comm}) {state} {ppid} {pid} {pid} 0 -1 4194560 0 0 0 0 0 0 0 0 20 0 1 0 {start} 0 {rss} 0 0"
    fields = parse_stat(text)
    assert (fields.comm, fields.state, fields.ppid, fields.start_ticks, fields.rss_pages) == (
        comm,
        state,
        ppid,
        start,
        rss,
    )


@given(st.lists(pids, min_size=1, max_size=4), st.integers(min_value=0, max_value=2**32 - 1))
def test_status_round_trips(chain, uid):
    text = f"Name:\tx\nUid:\t{uid}\t{uid}\t{uid}\t{uid}\nNSpid:\t" + "\t".join(map(str, chain)) + "\n"
    assert parse_status(text) == StatusFields(uid=uid, nspid=tuple(chain))


@given(st.integers(min_value=0, max_value=2**40))
def test_boot_time_round_trips(btime):
    assert parse_boot_time(f"cpu 1 2 3\nbtime {btime}\nprocesses 4\n") == btime


@given(anything, st.integers(min_value=1, max_value=300))
def test_escape_leaves_no_control_character_and_is_bounded(text, limit):
    out = escape(text, limit)
    assert len(out) <= limit
    assert not any(ord(c) < 0x20 or 0x7F <= ord(c) <= 0x9F for c in out)
    assert "\u2028" not in out and "\u202e" not in out


@settings(max_examples=60, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(stat=anything, status=anything, cmdline=st.binary(max_size=300), cgroup=anything)
def test_any_file_contents_spoil_at_most_their_process(tmp_path_factory, stat, status, cmdline, cgroup):
    """Whatever a tree's files hold, the snapshot completes and the other process is intact."""
    root = tmp_path_factory.mktemp("tree")
    make_fake_root(root)
    make_fake_proc(root, 1, ppid=0)
    bad = make_fake_proc(root, 2, ppid=1, nspid=(2, 1))
    (bad / "stat").write_text(stat, errors="surrogateescape")
    (bad / "status").write_text(status, errors="surrogateescape")
    (bad / "cmdline").write_bytes(cmdline)
    (bad / "cgroup").write_text(cgroup, errors="surrogateescape")
    table = Procfs(str(root)).snapshot(now=time.time())
    assert table.get(1) is not None and table.get(1).incomplete == ()
    second = table.get(2)
    assert second is None or second.state == "?" or len(second.state) == 1
