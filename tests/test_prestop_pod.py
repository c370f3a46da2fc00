"""A throw-away "pod" for the prestop tests: run as PID 1 of a fresh PID + mount namespace.

No tests here: ``test_prestop.py`` starts this file with ``unshare`` (see ``run_pod``; the
``host-scope`` scenario gets a mount namespace only, so it runs in the host's PID namespace). The pod gets
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


def hook_argv() -> list[str]:
    """``gpuzombie prestop``, or the fast hook's zipapp when GPUZOMBIE_TEST_HOOK names one."""
    pyz = os.environ.get("GPUZOMBIE_TEST_HOOK")
    return [sys.executable, "-S", "-I", pyz] if pyz else [sys.executable, "-m", "gpuzombie", "prestop"]


def run_cli(*args: str, json_report: bool = True, user: int | None = None, prefix: tuple[str, ...] = ()) -> dict:
    t0 = time.monotonic()
    as_user = ["setpriv", f"--reuid={user}", f"--regid={user}", "--clear-groups"] if user is not None else []
    done = subprocess.run(
        [*prefix, *as_user, *hook_argv(), *(["--json"] if json_report else []), *args],
        capture_output=True,
        text=True,
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
    # A dry run waits for nothing: a timeout it could not reach (20 s) shows it (test_prestop: wall < 10 s).
    timeout = "20" if dry_run else "1.5"
    result = run_cli("--timeout", timeout, "--kill-wait", "1", *(["--dry-run"] if dry_run else []))
    if dry_run:  # the table a person reads, once more: its summary must come once
        result["text"] = run_cli("--dry-run", json_report=False)["report"]
    result["pids"] = pids
    result["alive"] = {role: alive(pid) for role, pid in pids.items()}
    return result


def scenario_cascade() -> dict:
    """An orphan with a child of its own: the child becomes an orphan only when its parent exits."""
    pids = spawn_orphans("family")
    pids["child"] = first_child(pids["family"])
    result = run_cli("--timeout", "20", "--kill-wait", "1")  # far beyond the run: it ends when they exit
    result["pids"] = pids
    result["alive"] = {role: alive(pid) for role, pid in pids.items()}
    return result


def start_holder() -> subprocess.Popen:
    """``sleep 120`` holding /dev/nvidia0. Popen returns once the child runs sleep, so no scan meets
    it half-way through an exec (as one could a shell's ``exec sleep 120 3</dev/nvidia0``: then it
    was, rarely, read without its /dev/nvidia0 fd and not planned)."""
    device = os.open("/dev/nvidia0", os.O_RDONLY)
    try:
        return subprocess.Popen(["sleep", "120"], pass_fds=(device,))
    finally:
        os.close(device)


def start_ticks(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[19])


def recycle(pid: int, tries: int = 20) -> subprocess.Popen | None:
    """A new process with ``pid``, through this namespace's ns_last_pid (next pid = it + 1)."""
    for _ in range(tries):
        with open("/proc/sys/kernel/ns_last_pid", "w") as f:
            f.write(str(pid - 1))
        candidate = subprocess.Popen(["sleep", "120"])
        if candidate.pid == pid:
            return candidate
        candidate.kill()
        candidate.wait()
    return None


def reuse_trial() -> dict:
    """Plan (pidfds pinned), let the GPU holder exit and be reaped, give its pid to a new process,
    then execute the plan: the new process must receive nothing."""
    from gpuzombie.prestop import Terminator, plan_prestop
    from gpuzombie.proc import Procfs
    from gpuzombie.proc.pidfd import ProcessHandle

    victim = start_holder()
    plan, pins = plan_prestop(procfs=Procfs("/proc"), include_orphans=False)
    target = next((t for t in plan.targets if t.pid == victim.pid), None)
    victim.kill()
    victim.wait()
    replacement = recycle(victim.pid)
    results = Terminator(procfs_root="/proc").run(plan.targets, pins, timeout=0.2, kill_wait=0.2)
    trial = {
        "planned": target is not None,
        "recycled": replacement is not None,
        "outcome": next((r.outcome.value for r in results if r.target.pid == victim.pid), None),
    }
    if replacement is not None:
        trial["same_tick"] = target is not None and start_ticks(replacement.pid) == target.start_ticks
        if target is not None:  # the control: pinning only now, by (pid, start time), would take the new process
            late, _ = ProcessHandle.open(target.identity)
            trial["late_pin_takes_replacement"] = late is not None
            if late is not None:
                late.close()
        replacement.kill()  # a SIGTERM sent before this one would have decided its exit status
        trial["replacement_exit"] = replacement.wait()
    return trial


def scenario_reuse() -> dict:
    return {"trials": [reuse_trial() for _ in range(20)]}


def run_observe() -> dict:
    done = subprocess.run(
        [sys.executable, "-m", "gpuzombie", "observe", "--json"], capture_output=True, text=True, check=False
    )
    return json.loads(done.stdout)


def scenario_pid1_program() -> dict:
    """PID 1 is this python program: its own child (in PID 1's group) is "cannot tell", an orphan
    whose group leader exited is an orphan, for observe and prestop alike."""
    pids = spawn_orphans("sleep")
    own_child = subprocess.Popen(["sleep", "120"])
    result = run_cli("--dry-run", "--no-nvml")
    result["observe"] = run_observe()
    result["pids"] = {"orphan": pids["sleep"], "own_child": own_child.pid}
    return result


def scenario_unread(*nvml: str) -> dict:
    """The hook as uid 1000 (a training image's user) beside a root-owned orphan whose fds and namespace
    it may not read: it must neither signal it nor claim it saw everything."""
    pids = spawn_orphans("sleep")
    result = run_cli(*(nvml or ("--no-nvml",)), "--timeout", "1", "--kill-wait", "1", user=1000)
    result["pids"] = pids
    result["alive"] = {role: alive(pid) for role, pid in pids.items()}
    return result


CID = "9ec39b91f3d70e1beff50a308f77067065ea6be0d91a3378375056cd4422cf3d"


def cgroup2_root() -> str | None:
    """Where the unified (v2) hierarchy is mounted: /sys/fs/cgroup, or /sys/fs/cgroup/unified on a hybrid host."""
    for root in ("/sys/fs/cgroup", "/sys/fs/cgroup/unified"):
        if os.path.exists(f"{root}/cgroup.procs") and os.path.exists(f"{root}/cgroup.controllers"):
            return root
    return None


def scenario_host_scope() -> dict:
    """In the host's PID namespace: GPU holders in two plain cgroups, one container-named cgroup and
    this process's own cgroup. Without a scope prestop refuses; with one it stops only what is inside."""
    root = cgroup2_root()
    if root is None:
        return {"skip": "no cgroup v2 hierarchy mounted"}
    base = f"{root}/gpuzombie-prestop-test-{os.getpid()}"
    groups = {"a": f"{base}/a", "b": f"{base}/b", "container": f"{base}/cri-containerd-{CID}.scope"}
    holders: dict[str, subprocess.Popen] = {}
    try:
        for path in groups.values():
            os.makedirs(path)
        for name in (*groups, "outside"):
            holders[name] = start_holder()
            if name in groups:
                with open(f"{groups[name]}/cgroup.procs", "w") as f:
                    f.write(str(holders[name].pid))
        common = ("--no-nvml", "--timeout", "2", "--kill-wait", "1")
        result = {"pids": {name: p.pid for name, p in holders.items()}, "runs": {}}
        for run, scope in (
            ("none", ()),
            ("cgroup", ("--cgroup", base[len(root) :] + "/a")),
            ("container", ("--container", CID[:12])),
        ):
            result["runs"][run] = run_cli(*common, *scope)
            result["runs"][run]["alive"] = {name: alive(p.pid) for name, p in holders.items()}
        return result
    finally:
        for p in holders.values():
            p.kill()
            p.wait()
        for path in (*groups.values(), base):
            if os.path.isdir(path):
                os.rmdir(path)


def scenario_fd_limit() -> dict:
    """A busy node with a low hard open-files limit: ~EXTRA more processes than ``ulimit -n LIMIT``
    allows pidfds for, prestop under ``prlimit --nofile=LIMIT:LIMIT`` in the host's PID namespace
    with --cgroup. One holder in cgroup a (must be stopped); then LIMIT + 40 holders in cgroup b
    (more targets than pidfds: exit 2 naming the limit, nothing signalled)."""
    root = cgroup2_root()
    if root is None:
        return {"skip": "no cgroup v2 hierarchy mounted"}
    base = f"{root}/gpuzombie-prestop-fds-{os.getpid()}"
    groups = {"a": f"{base}/a", "b": f"{base}/b"}
    crowd = [subprocess.Popen(["sleep", "120"]) for _ in range(FD_LIMIT + 100)]
    holders: dict[str, list[subprocess.Popen]] = {"a": [], "b": []}
    try:
        for name, path in groups.items():
            os.makedirs(path)
            for _ in range(1 if name == "a" else FD_LIMIT + 40):
                holders[name].append(start_holder())
                with open(f"{path}/cgroup.procs", "w") as f:
                    f.write(str(holders[name][-1].pid))
        limit = ("prlimit", f"--nofile={FD_LIMIT}:{FD_LIMIT}", "--")
        common = ("--no-nvml", "--timeout", "2", "--kill-wait", "2")
        runs = {}
        for name in groups:
            runs[name] = run_cli(*common, "--cgroup", groups[name][len(root) :], prefix=limit)
            runs[name]["alive"] = sum(alive(p.pid) for p in holders[name])
        return {"runs": runs, "visible": len(os.listdir("/proc")), "limit": FD_LIMIT}
    finally:
        for p in crowd + holders["a"] + holders["b"]:
            p.kill()
            p.wait()
        for path in (*groups.values(), base):
            if os.path.isdir(path):
                os.rmdir(path)


FD_LIMIT = 256


# Ignores SIGTERM and, once it gets it, forks a child every 20 ms: each child ignores SIGTERM too and
# keeps /dev/nvidia0 ("holders": GPU holders from birth) or closes it ("orphans": plain processes
# that become orphans only when the forker dies).
FORKER = r"""
import os, signal, sys, time
fd = os.open("/dev/nvidia0", os.O_RDWR)
got = []
signal.signal(signal.SIGTERM, lambda *_: got.append(1))
print("ready", flush=True)
while not got:
    time.sleep(0.01)
while True:
    if os.fork() == 0:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        if sys.argv[1] == "orphans":
            os.close(fd)
        while True:
            time.sleep(1)
    time.sleep(0.02)
"""


def namespace_left() -> list[int]:
    """Every process of this namespace but PID 1 that is alive (zombies re-parented to us are reaped)."""
    pids = [int(p) for p in os.listdir("/proc") if p.isdigit() and int(p) != 1]
    return [pid for pid in pids if alive(pid)]


def forker_trial(kind: str) -> dict:
    parent = subprocess.Popen(
        [
            sys.executable,
            "-c",
            f"import subprocess, sys\np = subprocess.Popen([sys.executable, '-c', {FORKER!r}, "
            f"{kind!r}], stdout=subprocess.PIPE)\np.stdout.readline()\nprint(p.pid, flush=True)",
        ],
        stdout=subprocess.PIPE,
        start_new_session=True,
    )
    forker = int(parent.stdout.readline())
    parent.wait()
    result = run_cli("--no-nvml", "--timeout", "0.5", "--kill-wait", "3")
    left = namespace_left()
    for pid in left:  # the next trial starts from an empty namespace
        os.kill(pid, signal.SIGKILL)
    for pid in left:
        wait_gone(pid)
    report = result["report"] if isinstance(result["report"], dict) else {}
    return {
        "rc": result["rc"],
        "stderr": result["stderr"][-2000:],
        "forker": forker,
        "left": left,
        "survivors": report.get("survivors"),
        "targets": len(report.get("results", ())),
        "found_by_rescan": sum(r["found_by_rescan"] for r in report.get("results", ())),
        "wall_s": result["wall_s"],
    }


def wait_gone(pid: int, limit: float = 5.0) -> None:
    deadline = time.monotonic() + limit
    while alive(pid) and time.monotonic() < deadline:
        time.sleep(0.01)


def scenario_forker(kind: str, trials: int) -> dict:
    return {"trials": [forker_trial(kind) for _ in range(trials)]}


def main() -> None:
    scenario, out = sys.argv[1], sys.argv[2]
    log = os.open(out + ".pid1.log", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(log, 1)  # PID 1's stdout: where `kubectl logs` would read
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    if scenario in ("e2e", "dry-run"):
        result = scenario_e2e(dry_run=scenario == "dry-run")
    elif scenario == "cascade":
        result = scenario_cascade()
    elif scenario == "reuse":
        result = scenario_reuse()
    elif scenario == "unread":
        result = scenario_unread()
    elif scenario == "unread-nvml-undecided":
        result = scenario_unread("--nvml", "undecided")
    elif scenario == "host-scope":
        result = scenario_host_scope()
    elif scenario == "fd-limit":
        result = scenario_fd_limit()
    elif scenario == "forker-holders":
        result = scenario_forker("holders", 8)
    elif scenario == "forker-orphans":
        result = scenario_forker("orphans", 3)
    elif scenario == "pid1-program":
        result = scenario_pid1_program()
    else:
        raise SystemExit(f"unknown scenario {scenario}")
    with open(out, "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main()
