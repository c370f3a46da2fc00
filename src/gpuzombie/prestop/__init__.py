"""The preStop terminator: stop a pod's GPU holders and orphans before the grace period runs out.

Standard library (+ NVML through gpuzombie.gpu.nvml) only: it runs inside the user's training image.
"""

from gpuzombie.prestop.run import (
    DEFAULT_KILL_WAIT,
    PRESTOP_TIMEOUT,
    PrestopReport,
    plan_prestop,
    render_text,
    run_prestop,
    summary_line,
)
from gpuzombie.prestop.scope import Scope
from gpuzombie.prestop.targets import PrestopPlan, Target, Untargeted, plan_targets
from gpuzombie.prestop.terminate import Outcome, PrestopEvent, TargetResult, Terminator

__all__ = [
    "DEFAULT_KILL_WAIT",
    "PRESTOP_TIMEOUT",
    "Outcome",
    "PrestopEvent",
    "PrestopPlan",
    "PrestopReport",
    "Scope",
    "Target",
    "TargetResult",
    "Terminator",
    "Untargeted",
    "plan_prestop",
    "plan_targets",
    "render_text",
    "run_prestop",
    "summary_line",
]
