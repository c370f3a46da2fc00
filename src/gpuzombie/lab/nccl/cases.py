"""The five ways to run the same job when rank 0 dies mid-collective, side by side.

(a) PyTorch's defaults; (b) the original experiment's fix: a collective timeout and
``TORCH_NCCL_ASYNC_ERROR_HANDLING=1``; (c) the best of PyTorch's own knobs (c10d's
ProcessGroupNCCL reads them): the same timeout, error handling 3 (tear the process down without
cleaning up communicators), ``TORCH_NCCL_WAIT_TIMEOUT_DUMP_MILSEC`` small (the watchdog sleeps 4×
that before it ends the process: 60 s by default), no flight-recorder dump and no C++ stack on
the way out; (d) torchrun's elastic agent, which stops the surviving workers when one fails;
(e) our ``gpuzombie.graceful``: pidfd + store heartbeat peer detection, process-group abort,
hard exit within ``peer_exit_s``.

``TORCH_NCCL_BLOCKING_WAIT=1`` is not used: it replaces the watchdog with a timeout in ``wait()``,
which our ranks (``all_reduce`` + ``synchronize``) never call. ``TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC``
watches the watchdog thread itself (8 min), not the peers, so it does not shorten this case.
"""

from __future__ import annotations

from dataclasses import dataclass, field

CASE_KEYS = ("a", "b", "c", "d", "e")
DEFAULT_COLLECTIVE_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class CaseSpec:
    key: str
    name: str
    description: str
    env: dict[str, str] = field(default_factory=dict)
    timeout_s: float | None = None
    """``init_process_group(timeout=...)``; None keeps PyTorch's default (10 min for NCCL)."""
    launcher: str = "direct"
    """``direct``: one process per rank; ``torchrun``: torch.distributed.run's elastic agent."""
    graceful: bool = False
    on_error: str = "raise"
    """``hang``: a rank whose collective fails keeps its memory and waits (for orchestration tests
    on gloo, which fails fast where NCCL hangs)."""


def case_specs(collective_timeout_s: float = DEFAULT_COLLECTIVE_TIMEOUT_S) -> dict[str, CaseSpec]:
    t = collective_timeout_s
    return {
        "a": CaseSpec("a", "defaults", "PyTorch defaults (collective timeout 10 min)"),
        "b": CaseSpec(
            "b",
            "seed fix",
            f"init_process_group(timeout={t:g}s) + TORCH_NCCL_ASYNC_ERROR_HANDLING=1",
            env={"TORCH_NCCL_ASYNC_ERROR_HANDLING": "1"},
            timeout_s=t,
        ),
        "c": CaseSpec(
            "c",
            "best knobs",
            f"timeout={t:g}s, ASYNC_ERROR_HANDLING=3, WAIT_TIMEOUT_DUMP_MILSEC=100, DUMP_ON_TIMEOUT=0, no C++ stack",
            env={
                "TORCH_NCCL_ASYNC_ERROR_HANDLING": "3",
                "TORCH_NCCL_WAIT_TIMEOUT_DUMP_MILSEC": "100",
                "TORCH_NCCL_DUMP_ON_TIMEOUT": "0",
                "TORCH_NCCL_LOG_CPP_STACK_ON_UNCLEAN_SHUTDOWN": "0",
            },
            timeout_s=t,
        ),
        "d": CaseSpec(
            "d", "torchrun", "torchrun (elastic agent, --max-restarts 0), defaults otherwise", launcher="torchrun"
        ),
        "e": CaseSpec(
            "e",
            "gpuzombie.graceful",
            "defaults + gpuzombie.graceful.install() (peer pidfd/heartbeat, abort, exit)",
            graceful=True,
        ),
    }
