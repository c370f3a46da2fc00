"""The NCCL scenario: N ranks in collectives, rank 0 SIGKILLed, five ways of surviving it compared.

``gpuzombie lab run --scenario nccl --ranks N`` calls ``run_nccl_comparison``. On a machine
without 2+ GPUs it runs the same orchestration on gloo, labelled as a stand-in.
"""

from gpuzombie.lab.nccl.cases import CASE_KEYS, CaseSpec, case_specs
from gpuzombie.lab.nccl.run import NcclScenarioError, run_nccl_comparison

__all__ = ["CASE_KEYS", "CaseSpec", "NcclScenarioError", "case_specs", "run_nccl_comparison"]
