"""``python3 -m gpuzombie.lab.nccl``: the NCCL comparison without the rest of the lab (device scripts).

Prints progress and the comparison as a table; writes OUT/nccl/ (comparison.md in markdown). Exit 0 when every case ran (whatever
it measured), 1 when a case failed to start, 2 when the scenario could not run here, 130 on Ctrl-C.
"""

from __future__ import annotations

import argparse
import signal
import sys
from pathlib import Path

from gpuzombie.lab.nccl.cases import CASE_KEYS, DEFAULT_COLLECTIVE_TIMEOUT_S
from gpuzombie.lab.nccl.report import print_comparison
from gpuzombie.lab.nccl.run import NcclScenarioError, run_nccl_comparison


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python3 -m gpuzombie.lab.nccl", description=__doc__.split("\n")[0])
    ap.add_argument("--ranks", type=int, default=None, help="default: every GPU (2 on the CPU stand-in)")
    ap.add_argument("--device", choices=("auto", "cuda", "cpu"), default="auto")
    ap.add_argument("--cases", default="".join(CASE_KEYS), help="which of a,b,c,d,e (default: all)")
    ap.add_argument(
        "--observe-seconds",
        type=float,
        default=None,
        help="window after the first kill (default 420 on GPUs, 20 on the stand-in)",
    )
    ap.add_argument(
        "--budget-seconds",
        type=float,
        default=None,
        help="end the window early so the whole run fits this many seconds",
    )
    ap.add_argument("--size-mib", type=int, default=None)
    ap.add_argument(
        "--collective-timeout",
        type=float,
        default=DEFAULT_COLLECTIVE_TIMEOUT_S,
        help="init_process_group(timeout=...) of cases b and c",
    )
    ap.add_argument("--out", type=Path, default=Path("results"))
    args = ap.parse_args(argv)
    # A `timeout` around us sends SIGTERM: unwind, so the ranks are stopped and nothing holds a GPU.
    signal.signal(signal.SIGTERM, _exit_on_sigterm)
    try:
        summary = run_nccl_comparison(
            ranks=args.ranks,
            device=args.device,
            out_dir=args.out,
            cases=list(args.cases),
            observe_seconds=args.observe_seconds,
            progress=lambda line: print(line, flush=True),
            size_mib=args.size_mib,
            collective_timeout_s=args.collective_timeout,
            budget_s=args.budget_seconds,
        )
    except NcclScenarioError as exc:
        print(f"gpuzombie.lab.nccl: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # the ranks are already stopped (run_nccl_comparison's finally)
        print("gpuzombie.lab.nccl: interrupted", file=sys.stderr)
        return 130
    print_comparison(summary)
    return 1 if any(c["error"] for c in summary["cases"]) else 0


def _exit_on_sigterm(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


if __name__ == "__main__":
    sys.exit(main())
