"""The lab's arithmetic on hand-made sample series."""

from gpuzombie.lab.metrics import (
    GIB,
    dropped_at,
    integral_gib_s,
    released_at,
    scenario_metrics,
)
from gpuzombie.lab.sampler import Sample


def series(points):
    return [Sample(t=t, held_bytes=int(h), process_bytes=0) for t, h in points]


HELD = series([(0, 0), (1, 2 * GIB), (2, 2 * GIB), (3, GIB), (10, GIB), (10.5, 0), (11, 0)])


def test_release_is_the_first_time_memory_stays_low():
    assert released_at(HELD, 3.0, GIB // 2) == 10.5
    assert released_at(series([(0, 0), (1, GIB), (2, 0)]), 0.0, 10) == 2
    assert released_at(HELD[:-2], 3.0, GIB // 2) is None


def test_integral_is_clipped_to_the_window():
    assert integral_gib_s(HELD, 3.0, 10.0) == 7.0
    assert abs(integral_gib_s(HELD, 10.0, 10.5) - 0.25) < 1e-9
    assert integral_gib_s(HELD, 5.0, 5.0) == 0.0


def test_drop_after_a_kill():
    assert dropped_at(HELD, 2.0, GIB // 2) == 3


def test_scenario_metrics():
    m = scenario_metrics(
        samples=HELD,
        marks={"delete": 3.0, "sigkill": 10.0, "pod_exit": 10.6, "kill9": 2.0},
        grace=7.0,
        worker_bytes=GIB,
    )
    assert m.release_latency_s == 7.5 and m.sigkill_to_free_s == 0.5
    assert m.waited_whole_grace and m.kill9_to_free_s == 1.0
    assert m.grace_waste_gib_s == 7.25 and m.release_over_kill9 == 7.5
