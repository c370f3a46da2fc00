"""``gpuzombie reap``: end the processes of stale pods (GPU holders that outlived their pod)."""

from gpuzombie.reap.plan import ReapPlan, StalePod, stale_pods, stale_targets
from gpuzombie.reap.run import (
    DEFAULT_KILL_WAIT,
    REAP_TIMEOUT,
    ReapReport,
    ReapResult,
    reaping_pid,
    render_text,
    run_reap,
    summary_line,
)

__all__ = [
    "DEFAULT_KILL_WAIT",
    "REAP_TIMEOUT",
    "ReapPlan",
    "ReapReport",
    "ReapResult",
    "StalePod",
    "reaping_pid",
    "render_text",
    "run_reap",
    "stale_pods",
    "stale_targets",
    "summary_line",
]
