"""The CPU stand-in's workers against MemAvailable: scaled down when the size was not given,
refused in one line (exit 2) when it was, before any pod starts."""

from __future__ import annotations

import pytest

from gpuzombie.cli.main import main
from gpuzombie.errors import GpuzombieError
from gpuzombie.lab.host_memory import MARGIN_MIB, fit_to_memory, needed_mib
from gpuzombie.lab.labrun import LabConfig
from gpuzombie.proc.parse import parse_mem_available
from gpuzombie.units import MIB
from markers import needs_root

MEMINFO = "MemTotal:        8130472 kB\nMemFree:          201524 kB\nMemAvailable:    3145728 kB\nBuffers: 1 kB\n"


def test_mem_available_is_read_in_bytes():
    assert parse_mem_available(MEMINFO) == 3145728 * 1024
    assert parse_mem_available("MemTotal: 1 kB\n") is None  # a kernel before 3.14
    assert parse_mem_available("MemAvailable: lots kB\n") is None


def test_the_default_run_needs_about_4_gib():
    assert needed_mib(LabConfig()) == 2 * 2048 + MARGIN_MIB


def test_a_size_that_fits_is_kept():
    config = LabConfig(size_mib=2048)
    assert fit_to_memory(config, 8192 * MIB, scale=True) == (config, None)


def test_the_default_size_is_scaled_down_to_fit_and_says_so():
    config, note = fit_to_memory(LabConfig(), 3072 * MIB, scale=True)
    assert config.size_mib == 1280  # (3072 - 512) / 2 workers, down to a multiple of 64
    assert note is not None and "MemAvailable is 3072 MiB" in note and "1280 MiB" in note


def test_a_given_size_that_does_not_fit_is_refused_with_what_would():
    with pytest.raises(
        GpuzombieError, match=r"--size-mib 2048: .* MemAvailable is 3072 MiB: use --size-mib 1280 or less"
    ):
        fit_to_memory(LabConfig(), 3072 * MIB, scale=False)


def test_too_little_for_any_size_is_refused():
    with pytest.raises(GpuzombieError, match="not enough memory"):
        fit_to_memory(LabConfig(workers=8), 600 * MIB, scale=True)


def test_unreadable_meminfo_runs_and_says_it_was_not_checked():
    config, note = fit_to_memory(LabConfig(), None, scale=True)
    assert config == LabConfig() and note is not None and "not checked" in note


@needs_root  # the lab checks it can make pods first
def test_lab_run_refuses_a_size_this_machine_cannot_hold_before_any_pod(tmp_path, capsys):
    argv = ["lab", "run", "--scenario", "s1-nofix", "--device", "cpu", "--size-mib", str(1 << 30)]
    assert main([*argv, "--out", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("gpuzombie: error: --size-mib 1073741824: the CPU stand-in needs"), err
    assert not (tmp_path / "out").exists()
