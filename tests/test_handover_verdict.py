import math

import pytest

pytest.importorskip("hypothesis", reason="hypothesis is in the 'test' extra")

from hypothesis import given
from hypothesis import strategies as st

from gpuzombie.handover.verdict import MIB, GpuReading, judge

CLEAN, DIRTY, UNREADABLE = "clean", "dirty", "unreadable"  # HandoverVerdict.state, as preflight's JSON writes it

IDLE_H200 = GpuReading(used_bytes=615 * MIB, reserved_bytes=615 * MIB, listed_processes=0)


def test_idle_h200_with_its_reservation_is_clean():
    assert judge(IDLE_H200).clean


def test_a_listed_process_is_dirty_whatever_it_holds():
    v = judge(GpuReading(used_bytes=615 * MIB, reserved_bytes=615 * MIB, listed_processes=1))
    assert not v.clean and "1 process" in v.reason


def test_memory_held_with_no_process_listed_is_dirty():
    v = judge(GpuReading(used_bytes=3281 * MIB, reserved_bytes=615 * MIB, listed_processes=0))
    assert not v.clean and v.held_bytes == 2666 * MIB


def test_without_v2_the_given_baseline_is_subtracted():
    reading = GpuReading(used_bytes=615 * MIB, reserved_bytes=None, listed_processes=0)
    assert not judge(reading).clean
    assert judge(reading, baseline_bytes=615 * MIB).clean


def test_unreadable_is_never_clean():
    v = judge(None, error="NVML_ERROR_UNKNOWN")
    assert not v.clean and "NVML_ERROR_UNKNOWN" in v.reason
    assert not judge(GpuReading(615 * MIB, 615 * MIB, 0, processes_read=False)).clean


# Issue 36, item 1: the verdict is total, and a reading it cannot trust is unreadable, never clean.
# On e95cc19 each of these was clean (or, for a string, raised TypeError).

IMPOSSIBLE = {
    "used NaN": GpuReading(math.nan, 615 * MIB, 0),
    "used -1": GpuReading(-1, None, 0),
    "used -inf": GpuReading(-math.inf, 615 * MIB, 0),
    "used +inf": GpuReading(math.inf, 615 * MIB, 0),
    "used a float": GpuReading(615 * MIB + 0.5, 615 * MIB, 0),
    "used True": GpuReading(True, None, 0),
    "used a string": GpuReading("615", 615 * MIB, 0),
    "used NVML's not-available marker": GpuReading((1 << 64) - 1, 615 * MIB, 0),
    "reserved above used": GpuReading(615 * MIB, 2000 * MIB, 0),
    "reserved NaN": GpuReading(615 * MIB, math.nan, 0),
    "reserved -1": GpuReading(615 * MIB, -1, 0),
    "processes read 'false'": GpuReading(615 * MIB, 615 * MIB, 0, "false"),
    "processes read 1": GpuReading(615 * MIB, 615 * MIB, 0, 1),
    "listed -1": GpuReading(615 * MIB, 615 * MIB, -1),
    "listed NaN": GpuReading(615 * MIB, 615 * MIB, math.nan),
    "listed a string": GpuReading(615 * MIB, 615 * MIB, "0"),
}


@pytest.mark.parametrize("reading", IMPOSSIBLE.values(), ids=IMPOSSIBLE.keys())
def test_an_impossible_reading_is_unreadable_never_clean(reading):
    v = judge(reading)
    assert not v.clean
    assert (v.state, v.held_bytes) == (UNREADABLE, 0)
    assert v.reason.startswith("impossible reading: ") and "nan MiB" not in v.reason


def test_a_listed_process_is_dirty_even_beside_an_impossible_memory_reading():
    """Dirty, not unreadable: --fail-open passes an unreadable GPU, never one with a process on it."""
    v = judge(GpuReading(math.nan, 615 * MIB, 2))
    assert v.state == DIRTY and "2 process(es) listed, impossible reading" in v.reason


@pytest.mark.parametrize(("tolerance", "baseline"), [(math.nan, 0), (-1, 0), (16 * MIB, math.nan), (16 * MIB, -5)])
def test_a_tolerance_or_baseline_that_is_no_byte_count_judges_nothing_clean(tolerance, baseline):
    assert judge(IDLE_H200, tolerance_bytes=tolerance, baseline_bytes=baseline).state == UNREADABLE


def test_what_is_not_a_reading_is_unreadable():
    assert judge({"used_bytes": 0}).state == UNREADABLE
    assert judge(None, error=ValueError("x")).state == UNREADABLE


_ANY = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(1 << 70), max_value=1 << 70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=8),
)


@given(used=_ANY, reserved=_ANY, listed=_ANY, read=_ANY, tolerance=_ANY, baseline=_ANY)
def test_judge_is_total_and_clean_only_on_a_well_formed_reading(used, reserved, listed, read, tolerance, baseline):
    v = judge(GpuReading(used, reserved, listed, read), tolerance_bytes=tolerance, baseline_bytes=baseline)
    if v.clean:
        counts = (used, tolerance, baseline, listed)
        assert all(type(x) is int and 0 <= x < 1 << 63 for x in counts) and listed == 0 and read is True
        assert reserved is None or (type(reserved) is int and 0 <= reserved <= used)
        assert v.held_bytes <= tolerance
    assert v.state in (CLEAN, DIRTY, UNREADABLE) and type(v.held_bytes) is int and v.held_bytes >= 0
    assert "\n" not in v.reason and len(v.reason) < 400
