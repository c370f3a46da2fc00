"""A throw-away "pod" for the prestop tests: run as PID 1 of a fresh PID + mount namespace.

No tests here: ``test_prestop.py`` starts this file with ``unshare`` (see ``run_pod``). The pod gets
its own /dev (a tmpfs with null, zero, urandom and fake ``nvidia0``/``nvidiactl`` files), so its
workers hold ``/dev/nvidia*`` fds exactly as CUDA processes do, on a machine without a GPU. This
process is PID 1; it writes its findings as JSON to the path in argv[2].
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

POD_DEV_SETUP = (
    "mount -t tmpfs -o mode=755 pod-dev /dev && "
    "mknod -m 666 /dev/null c 1 3 && mknod -m 666 /dev/zero c 1 5 && "
    "mknod -m 666 /dev/urandom c 1 9 && touch /dev/nvidia0 /dev/nvidiactl"
)

WORKER = r"""
import os, signal, sys, time
fds = [os.open(p, os.O_RDWR) for p in ("/dev/nvidia0", "/dev/nvidiactl")]
if sys.argv[1] == "ignore":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
else:
    def stop(*_):
        time.sleep(0.1)  # "free memory", then exit
        os._exit(0)
    signal.signal(signal.SIGTERM, stop)
print("ready", flush=True)
while True:
    time.sleep(1)
"""

# Spawns the workers, waits for "ready", prints their pids and exits without wait(): orphans.
PARENT = r"""
import json, subprocess, sys
procs = {}
for role in sys.argv[1:]:
    if role == "sleep":
        procs[role] = subprocess.Popen(["sleep", "120"])
    elif role == "family":  # exits on SIGTERM, leaving its own child (a sleep) behind
        procs[role] = subprocess.Popen(["sh", "-c", "trap 'exit 0' TERM; sleep 120 & wait"])
    else:
        procs[role] = subprocess.Popen([sys.executable, "-c", WORKER, role], stdout=subprocess.PIPE)
        procs[role].stdout.readline()
print(json.dumps({r: p.pid for r, p in procs.items()}), flush=True)
"""


def spawn_orphans(*roles: str) -> dict[str, int]:
    """A parent in its own session spawns ``roles`` and exits: they are re-parented to us, PID 1."""
    parent = subprocess.Popen(
        [sys.executable, "-c", f"WORKER = {WORKER!r}\n{PARENT}", *roles], stdout=subprocess.PIPE, start_new_session=True
    )
    pids = json.loads(parent.stdout.readline())
    parent.wait()
    return pids


def alive(pid: int) -> bool:
    """Alive and not a zombie (a zombie of ours is reaped here)."""
    try:
        if os.waitpid(pid, os.WNOHANG) != (0, 0):
            return False
    except ChildProcessError:
        pass
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def first_child(pid: int, limit: float = 5.0) -> int | None:
    """The first child of ``pid`` once it has one (bounded wait)."""
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            kids = f.read().split()
        if kids:
            return int(kids[0])
        time.sleep(0.01)
    return None


def run_cli(*args: str) -> dict:
    t0 = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "gpuzombie", "prestop", "--json", *args], capture_output=True, text=True
    )
    return {
        "rc": done.returncode,
        "wall_s": time.monotonic() - t0,
        "stderr": done.stderr,
        "report": json.loads(done.stdout) if done.stdout.strip().startswith("{") else done.stdout,
    }


def scenario_e2e(dry_run: bool) -> dict:
    pids = spawn_orphans("ignore", "handle", "sleep")
    # A process of a nested PID namespace holding /dev/nvidia0: visible here, but not ours.
    nested = subprocess.Popen(
        ["unshare", "--pid", "--fork", "sh", "-c", "exec sleep 120 3</dev/nvidia0"], start_new_session=True
    )
    # PID 1's own child leading its group (like tini's main process): not an orphan, no GPU.
    bystander = subprocess.Popen(["sleep", "120"], start_new_session=True)
    pids.update(nested_unshare=nested.pid, nested=first_child(nested.pid), bystander=bystander.pid)
    result = run_cli("--timeout", "1.5", "--kill-wait", "1", *(["--dry-run"] if dry_run else []))
    result["pids"] = pids
    result["alive"] = {role: alive(pid) for role, pid in pids.items()}
    return result


def scenario_cascade() -> dict:
    """An orphan with a child of its own: the child becomes an orphan only when its parent exits."""
    pids = spawn_orphans("family")
    pids["child"] = first_child(pids["family"])
    result = run_cli("--timeout", "3", "--kill-wait", "1")
    result["pids"] = pids
    result["alive"] = {role: alive(pid) for role, pid in pids.items()}
    return result


def scenario_reuse(use_pidfd: bool) -> dict:
    from gpuzombie.prestop import execute_plan, plan_prestop
    from gpuzombie.proc import Procfs

    victim = subprocess.Popen([sys.executable, "-c", WORKER, "ignore"], stdout=subprocess.PIPE)
    victim.stdout.readline()
    plan = plan_prestop(procfs=Procfs("/proc"))
    planned = [t.pid for t in plan.targets]
    victim.kill()
    victim.wait()
    replacement = None
    for _ in range(20):  # ask the kernel for the same pid: next pid = ns_last_pid + 1
        with open("/proc/sys/kernel/ns_last_pid", "w") as f:
            f.write(str(victim.pid - 1))
        candidate = subprocess.Popen(["sleep", "120"])
        if candidate.pid == victim.pid:
            replacement = candidate
            break
        candidate.kill()
        candidate.wait()
    results = execute_plan(plan, procfs_root="/proc", timeout=0.3, kill_wait=0.3, use_pidfd=use_pidfd)
    time.sleep(0.1)
    return {
        "victim": victim.pid,
        "planned": planned,
        "replacement": replacement.pid if replacement else None,
        "replacement_alive": replacement is not None and alive(replacement.pid),
        "outcomes": {r.target.pid: r.outcome.value for r in results},
    }


def main() -> None:
    scenario, out = sys.argv[1], sys.argv[2]
    log = os.open(out + ".pid1.log", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(log, 1)  # PID 1's stdout: where `kubectl logs` would read
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    if scenario in ("e2e", "dry-run"):
        result = scenario_e2e(dry_run=scenario == "dry-run")
    elif scenario == "cascade":
        result = scenario_cascade()
    elif scenario in ("reuse", "reuse-nopidfd"):
        result = scenario_reuse(use_pidfd=scenario == "reuse")
    else:
        raise SystemExit(f"unknown scenario {scenario}")
    with open(out, "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main()
