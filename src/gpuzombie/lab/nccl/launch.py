"""Start one case's ranks (one process each, or under torchrun) and wait until all hold memory."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from gpuzombie.lab.nccl.cases import CaseSpec
from gpuzombie.proc.own import PROCFS
from gpuzombie.proc.pidfd import Liveness, ProcessHandle, ProcessIdentity, read_start_and_state

RANK_MODULE = "gpuzombie.lab.nccl.rank"
MULTI_GPU_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
"""Kept on the lent multi-GPU machines (NVLink multicast off), in every child."""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class RankProc:
    rank: int
    pid: int
    gpu: int | None
    handle: ProcessHandle | None
    popen: subprocess.Popen | None = None
    """Set when the rank is our own child (direct launch): then its exit code is known."""
    exited_at: float | None = None
    exit_code: int | None = None

    def poll(self, now: float) -> bool:
        """Record the exit once; True while the rank runs."""
        if self.exited_at is not None:
            return False
        alive = self.handle is not None and self.handle.liveness() is Liveness.ALIVE
        if self.popen is not None:
            code = self.popen.poll()
            if code is None and not alive:
                try:  # exited a moment ago: collect its status
                    code = self.popen.wait(timeout=2)
                except subprocess.TimeoutExpired:
                    code = None
            if code is not None:
                self.exit_code = code
                alive = False
        if not alive:
            self.exited_at = now
            if self.handle:
                self.handle.close()
        return alive


@dataclass
class CaseLaunch:
    spec: CaseSpec
    port: int
    procs: list[subprocess.Popen]
    logs: list[IO[bytes]]
    ready_files: list[Path]
    ranks: list[RankProc] = field(default_factory=list)
    error: str | None = None

    def collect_ready(self) -> bool:
        """Read the ready files; True once every rank has written one."""
        if len(self.ranks) == len(self.ready_files):
            return True
        if not all(p.exists() for p in self.ready_files):
            return False
        for path in self.ready_files:
            info = json.loads(path.read_text())
            pid = int(info["pid"])
            start = read_start_and_state(PROCFS, pid)
            handle = None
            if start is not None:
                handle, _ = ProcessHandle.open(ProcessIdentity(pid, start[0]))
            popen = next((p for p in self.procs if p.pid == pid), None)
            self.ranks.append(
                RankProc(rank=int(info["rank"]), pid=pid, gpu=info.get("gpu"), handle=handle, popen=popen)
            )
        self.ranks.sort(key=lambda r: r.rank)
        return True

    def failed_early(self) -> str | None:
        for p in self.procs:
            code = p.poll()
            if code is not None and len(self.ranks) < len(self.ready_files):
                return f"a process exited with {code} before all ranks were ready"
        return None

    def stop_all(self) -> None:
        """SIGKILL what is left of this case (ranks first: torchrun's agent would restart nothing)."""
        for r in self.ranks:
            if r.handle is not None and r.exited_at is None:
                r.handle.send(signal.SIGKILL)
        for p in self.procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGKILL)
                except OSError:
                    p.kill()
        for p in self.procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        for f in self.logs:
            f.close()


def launch_case(spec: CaseSpec, *, ranks: int, device: str, size_mib: int, run_dir: Path, log_dir: Path) -> CaseLaunch:
    """Start the case's processes, each in its own session so the whole case can be killed."""
    port = free_port()
    env = {
        **os.environ,
        **MULTI_GPU_ENV,
        **spec.env,
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
        "WORLD_SIZE": str(ranks),
        "PYTHONUNBUFFERED": "1",
    }
    src = str(Path(__file__).resolve().parents[3])
    env["PYTHONPATH"] = src + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    ready = [run_dir / f"{spec.key}-rank{r}.json" for r in range(ranks)]
    rank_args = ["--device", device, "--size-mib", str(size_mib)]
    if spec.timeout_s:
        rank_args += ["--timeout-s", str(spec.timeout_s)]
    if spec.graceful:
        rank_args.append("--graceful")
    if spec.on_error != "raise":
        rank_args += ["--on-error", spec.on_error]
    procs: list[subprocess.Popen] = []
    logs: list[IO[bytes]] = []
    if spec.launcher == "torchrun":
        log = open(log_dir / f"{spec.key}-torchrun.log", "wb")  # noqa: SIM115 (closed by stop_all)
        logs.append(log)
        argv = [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nnodes",
            "1",
            "--nproc-per-node",
            str(ranks),
            "--master-addr",
            "127.0.0.1",
            "--master-port",
            str(port),
            "--max-restarts",
            "0",
            "-m",
            RANK_MODULE,
            *rank_args,
            "--ready-file",
            str(run_dir / f"{spec.key}-rank%RANK%.json"),
        ]
        # torchrun passes the same argv to every worker; the rank fills in its own ready file.
        procs.append(subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True))
    else:
        for r in range(ranks):
            log = open(log_dir / f"{spec.key}-rank{r}.log", "wb")  # noqa: SIM115 (closed by stop_all)
            logs.append(log)
            argv = [sys.executable, "-m", RANK_MODULE, *rank_args, "--ready-file", str(ready[r])]
            procs.append(
                subprocess.Popen(
                    argv,
                    env={**env, "RANK": str(r), "LOCAL_RANK": str(r)},
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            )
    return CaseLaunch(spec=spec, port=port, procs=procs, logs=logs, ready_files=ready)


def wait_ready(launches: list[CaseLaunch], timeout_s: float, clock: Callable[[], float] = time.monotonic) -> None:
    """Wait for every case's ranks; a case that fails or times out gets ``error`` and is stopped."""
    deadline = clock() + timeout_s
    pending = [c for c in launches if c.error is None]
    while pending and clock() < deadline:
        for case in list(pending):
            if case.collect_ready():
                pending.remove(case)
            elif (why := case.failed_early()) is not None:
                case.error = why
                case.stop_all()
                pending.remove(case)
        time.sleep(0.1)
    for case in pending:
        case.error = f"ranks not ready after {timeout_s:g} s"
        case.stop_all()
