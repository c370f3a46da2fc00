"""Issue 7 on the CPU: the seed's "NCCL 3 GPU" variant, 3 ranks on the gloo stand-in, every case."""

from __future__ import annotations

import pytest

from gpuzombie.lab.nccl import CASE_KEYS
from test_nccl import check_summary, run_standin

pytestmark = pytest.mark.slow


def test_three_ranks_all_cases(tmp_path):
    summary = run_standin(tmp_path, 3)
    check_summary(summary, tmp_path, 3, CASE_KEYS)
