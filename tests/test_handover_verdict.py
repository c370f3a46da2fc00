from gpuzombie.handover.verdict import MIB, GpuReading, judge

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
