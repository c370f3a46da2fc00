"""One rank of the NCCL scenario: hold memory, loop ``all_reduce`` + ``synchronize`` until stopped.

``python -m gpuzombie.lab.nccl.rank --device cuda|cpu --size-mib M --ready-file F [--timeout-s T]
[--graceful]``; rank, world size and the rendezvous come from the environment (RANK, WORLD_SIZE,
MASTER_ADDR, MASTER_PORT), as torchrun sets them. On the CPU stand-in the backend is gloo and
the memory is host RAM. It writes one JSON line to the ready file once memory is held and the
first collective completed.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from datetime import timedelta


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="gpuzombie.lab.nccl.rank")
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--size-mib", type=int, default=2048)
    ap.add_argument("--timeout-s", type=float, default=None)
    ap.add_argument("--graceful", action="store_true")
    ap.add_argument("--deadline-s", type=float, default=10.0)
    ap.add_argument("--peer-exit-s", type=float, default=2.0)
    ap.add_argument("--ready-file", required=True)
    ap.add_argument(
        "--on-error",
        choices=("raise", "hang"),
        default="raise",
        help="hang: keep the memory and wait when a collective fails (test double of a hang)",
    )
    args = ap.parse_args(argv)

    import torch
    import torch.distributed as dist

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local = int(os.environ.get("LOCAL_RANK", rank))
    if args.device == "cuda":
        gpu = local % torch.cuda.device_count()
        torch.cuda.set_device(gpu)
        device, backend = torch.device("cuda", gpu), "nccl"
    else:
        gpu, device, backend = None, torch.device("cpu"), "gloo"
    timeout = timedelta(seconds=args.timeout_s) if args.timeout_s else None  # None: PyTorch's default
    dist.init_process_group(backend, init_method="env://", rank=rank, world_size=world, timeout=timeout)
    held = torch.ones(args.size_mib * (1 << 20) // 4, dtype=torch.float32, device=device)
    x = torch.ones(1 << 18, device=device)  # 1 MiB per all_reduce

    guard = None
    if args.graceful:
        from gpuzombie import graceful

        guard = graceful.install(deadline_s=args.deadline_s, peer_exit_s=args.peer_exit_s)
        guard.hold(held)

    def step() -> None:
        dist.all_reduce(x)
        if device.type == "cuda":
            torch.cuda.synchronize()
        else:
            time.sleep(0.01)  # the stand-in need not burn the CPU

    step()
    ready_file = args.ready_file.replace("%RANK%", str(rank))
    with open(ready_file + ".tmp", "w") as f:
        json.dump(
            {
                "rank": rank,
                "pid": os.getpid(),
                "gpu": gpu,
                "backend": backend,
                "torch": torch.__version__,
                "world": world,
            },
            f,
        )
    os.replace(ready_file + ".tmp", ready_file)
    if guard is None:
        try:
            while True:
                step()
        except Exception:
            if args.on_error == "raise":
                raise
            while True:
                time.sleep(3600)
    with guard:
        while not guard.should_stop():
            step()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
