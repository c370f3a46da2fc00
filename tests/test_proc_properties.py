"""Property-based tests of the procfs parsers and the escape: any text in, a result or ValueError out
(never IndexError, OverflowError, ...), and what the kernel could write parses back exactly."""

from __future__ import annotations

import os
import re
import time

import pytest

pytest.importorskip("hypothesis", reason="hypothesis is in the 'test' extra")

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from fakeproc import make_fake_proc, make_fake_root
from gpuzombie.escape import escape
from gpuzombie.proc.parse import (
    STATES,
    StatusFields,
    _parse_stat_checked,
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


@given(st.characters(codec="utf-8") | st.text(min_size=2, max_size=3))
@example("P ")  # found beside load (issue 29's last suite run): two spaces were read as one
def test_only_the_kernels_state_letters_parse(state):
    text = f"7 (x) {state} 1 7 7 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 1000 0 10 0"
    try:
        fields = parse_stat(text)
    except ValueError:
        assert state not in STATES
    else:
        assert state in STATES and fields.state == state


@given(st.integers(min_value=-(2**63), max_value=2**64))
def test_flags_parse_only_unsigned(flags):
    text = f"7 (x) S 1 7 7 0 -1 {flags} 0 0 0 0 0 0 0 0 20 0 1 0 1000 0 10 0"
    try:
        assert parse_stat(text).flags == flags and flags >= 0
    except ValueError:
        assert flags < 0


stat_fields = st.sampled_from(["0", "-1", "", "12", "-", "+3", "9" * 21, "x", "S", "1\n", "\n", "\u0663"])


@settings(max_examples=400)
@given(
    st.sampled_from(["7", " 7", "-7", "x"]),
    comms,
    st.lists(stat_fields | st.integers(min_value=-(2**65), max_value=2**65).map(str) | anything, max_size=30),
    st.sampled_from(["", "\n", "\n\n", " ", "\nx"]),
)
@example("7", "x", ["S", "1", "7", "7", "0", "-1", "0"] + ["0"] * 12 + ["1000", "0", "10"], "\n")
@example("7", "x", ["S", "1", "7", "7", "0", "-1", "0"] + ["0"] * 12 + ["1000", "0", "10"], "\nx")
def test_the_one_match_parse_of_stat_is_the_field_by_field_one(pid, comm, fields, end):
    """The fast path of parse_stat (one regex) reads exactly what the field-by-field checks read,
    and takes nothing they refuse."""
    text = f"{pid} ({comm}) " + " ".join(fields) + end
    try:
        expected: object = _parse_stat_checked(text)
    except ValueError:
        expected = ValueError
    try:
        got: object = parse_stat(text)
    except ValueError:
        got = ValueError
    assert got == expected


suffixes = st.text(
    alphabet=st.characters(blacklist_characters="\0", blacklist_categories=("Cs",)), max_size=60
) | st.sampled_from(
    ["0", "12", "ctl", "-uvm", "-uvm-tools", "-modeset", "-caps/nvidia-cap3", "0 (deleted)", "ctlx", "-uvm-"]
)


@settings(max_examples=80, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(suffix=suffixes)
def test_a_dev_nvidia_link_is_a_device_or_malformed_never_both(tmp_path_factory, suffix):
    """Whatever follows /dev/nvidia, the fd is an exact driver device or a malformed fd with its reason."""
    root = tmp_path_factory.mktemp("tree")
    make_fake_root(root)
    make_fake_proc(root, 1, ppid=0, fds=("/dev/nvidia" + suffix,))
    proc = Procfs(str(root)).snapshot(now=time.time()).get(1)
    exact = re.fullmatch(r"[0-9]{1,3}|ctl|-uvm|-uvm-tools|-modeset|-caps/nvidia-cap[0-9]{1,6}", suffix)
    if exact:
        assert proc.nvidia_fds == ("/dev/nvidia" + suffix,) and proc.incomplete == ()
    else:
        assert proc.nvidia_fds == () and [(u.file, u.reason.value) for u in proc.incomplete] == [("fd", "malformed")]


@settings(max_examples=40, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(real=st.sets(st.integers(min_value=2, max_value=60), min_size=1, max_size=6), links=st.data())
def test_each_process_is_read_once_under_its_own_pid(tmp_path_factory, real, links):
    """Symlinks named like pids (to real pid directories) are never read: each process appears
    once, under the pid its stat names."""
    root = tmp_path_factory.mktemp("tree")
    make_fake_root(root)
    make_fake_proc(root, 1, ppid=0)
    for pid in real:
        make_fake_proc(root, pid, ppid=1)
    aliases = links.draw(st.sets(st.integers(min_value=61, max_value=120), max_size=4))
    for alias in aliases:
        os.symlink(str(links.draw(st.sampled_from(sorted(real)))), root / str(alias))
    table = Procfs(str(root)).snapshot(now=time.time())
    assert sorted(table.processes) == sorted({1, *real})
    assert all(p.incomplete == () for p in table)
