"""A "pod" without a cluster: a fresh PID + mount namespace whose PID 1 is the scenario's init.

Started as ``unshare --pid --fork --mount-proc --kill-child <init argv>``. Deleting it follows the
kubelet: the preStop hook first (run inside the namespace), then SIGTERM to the namespace's PID 1,
then SIGKILL when the grace period, counted from the deletion request, runs out. SIGTERM to the
``unshare`` process would be ignored (it only waits), so PID 1 is signalled directly; a PID 1 with
no handler for SIGTERM ignores it (the kernel protects a namespace's init), which is the original experiment's
grace-period waste. ``--kill-child`` is only the backstop if the lab itself dies.
"""

from __future__ import annotations

import contextlib
import functools
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from typing import IO

from gpuzombie.lab.errors import PodError
from gpuzombie.lab.events import EventLog
from gpuzombie.lab.runtime.pod import HOST_PROCFS, Deletion, children_of, leftovers, pidns_of, pids_in_pidns

UNSHARE = ("unshare", "--pid", "--fork", "--mount-proc", "--kill-child")
UNSHARE_SIGKILL_MESSAGE = "unshare: sigprocmask unblock failed: Invalid argument"
UNSHARE_SIGKILL_NOTE = (
    "the line above is unshare (util-linux < 2.40, util-linux#2614) reporting that PID 1 died of "
    "SIGKILL, as PID 1 does at the grace's end or when the pod's sandbox goes; no failure of the pod"
)


@functools.cache
def pdeathsig_prefix() -> tuple[str, ...]:
    """``setpriv --pdeathsig KILL`` where util-linux has it: if the lab itself dies, the kernel
    SIGKILLs unshare, and --kill-child takes the pod with it."""
    setpriv = shutil.which("setpriv")
    if setpriv is None:
        return ()
    try:
        usage = subprocess.run([setpriv, "--help"], capture_output=True, text=True, timeout=5, check=False).stdout
    except (OSError, subprocess.TimeoutExpired):
        return ()
    return (setpriv, "--pdeathsig", "KILL") if "--pdeathsig" in usage else ()


PID1_CHOICES = ("sleep", "tini", "tini-g", "dumb-init")
"""What a namespaces-runtime pod may run as PID 1: the original experiment's ``sleep`` or an init (``--init``)."""
INIT_COMM = {"tini": "tini", "tini-g": "tini", "dumb-init": "dumb-init", "pause": "catatonit"}
PAUSE = "pause"
"""shareProcessNamespace: the pod's pause (``catatonit -P``, which reaps) is PID 1 and the container
runs S1's command beside it, not as PID 1."""


def init_binary(name: str) -> str:
    """The init's real binary: beside this Python first (a venv's pip-installed dumb-init), so a
    wrapper script on PATH (a pyenv shim) never is PID 1 while it execs the real one."""
    local = os.path.join(os.path.dirname(sys.executable), name)
    if os.access(local, os.X_OK):
        return local
    return shutil.which(name) or name


def init_argv(init: str, main_command: str, then: str = "sleep infinity") -> list[str]:
    """PID 1 and the container's command, as the scenario says.

    ``sleep``: the original experiment's S1, ``sh -c '<main> & exec sleep infinity'`` (the shell execs sleep,
    which becomes PID 1 and never reaps). With an init, the shell runs the main command in the
    foreground and then execs sleep, so the parent's orphans are re-parented to the init, as when
    ``kubectl exec`` starts parent.py in a tini container. ``then`` is what the shell execs last:
    the container's long-running main process (``sleep infinity``, or a workload).
    """
    if init == "sleep":
        return ["sh", "-c", f"{main_command} & exec {then}"]
    shell = ["sh", "-c", f"{main_command}; exec {then}"]
    if init == "tini":
        return [init_binary("tini"), "-s", "--", *shell]
    if init == "tini-g":
        return [init_binary("tini"), "-s", "-g", "--", *shell]
    if init == "dumb-init":
        return [init_binary("dumb-init"), "--", *shell]
    raise PodError(f"unknown init {init!r} (one of {', '.join(PID1_CHOICES)})")


def absolute_pythonpath(environ: Mapping[str, str]) -> dict[str, str]:
    """The environment with PYTHONPATH made absolute: entering a mount namespace (nsenter --mount)
    moves the working directory to its root, where ``PYTHONPATH=src`` would point at nothing."""
    env = dict(environ)
    if env.get("PYTHONPATH"):
        env["PYTHONPATH"] = os.pathsep.join(os.path.abspath(p) if p else p for p in env["PYTHONPATH"].split(os.pathsep))
    return env


class Pod:
    """One pod: start it, run commands inside it (nsenter), delete it like the kubelet."""

    def __init__(
        self,
        name: str,
        init: str,
        main_command: Sequence[str],
        *,
        log: IO[str],
        events: EventLog,
        env: dict[str, str] | None = None,
        then: Sequence[str] = ("sleep", "infinity"),
        prestop: Sequence[str] | None = None,
    ) -> None:
        self.name = name
        self.prestop = prestop
        """The preStop hook's command, run inside the pod when it is deleted."""
        self.init = init
        command = init_argv("sleep" if init == PAUSE else init, shlex.join(main_command), shlex.join(then))
        self.container_argv = command if init == PAUSE else None
        """With a pause as PID 1, the container's command, started beside it by nsenter."""
        self.argv = [*UNSHARE, *([init_binary("catatonit"), "-P"] if init == PAUSE else command)]
        self.launch = [*pdeathsig_prefix(), *self.argv]
        self.log = log
        self.events = events
        self.env = env if env is not None else absolute_pythonpath(os.environ)
        self.proc: subprocess.Popen[bytes] | None = None
        self.container: subprocess.Popen[bytes] | None = None
        self.pid1 = 0
        self.main_pid = 0
        self.pidns = 0

    def start(self, timeout: float = 10.0) -> None:
        self.proc = subprocess.Popen(
            self.launch,
            stdout=self.log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=self.env,
            start_new_session=True,
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            kids = children_of(self.proc.pid)
            if kids:
                self.pid1 = kids[0]
                ns = pidns_of(self.pid1)
                if ns is not None and ns != pidns_of(os.getpid()) and self._init_running():
                    self.pidns = ns
                    self.main_pid = self.pid1
                    if self.container_argv is not None:
                        self._start_container(deadline)
                    self.events.add("pod-start", f"{self.init} as PID 1 (host pid {self.pid1})")
                    return
            if self.proc.poll() is not None:
                raise PodError(
                    f"pod {self.name}: unshare exited with {self.proc.returncode}"
                    f"{self._last_log_line()} (the lab needs root, unshare and nsenter)"
                )
            time.sleep(0.005)
        self.kill()
        raise PodError(f"pod {self.name}: no PID 1 appeared within {timeout:.0f} s")

    def _start_container(self, deadline: float) -> None:
        """shareProcessNamespace: the container's command joins the pod's PID namespace beside the
        pause (nsenter forks it there; its orphans are re-parented to the pause, which reaps)."""
        assert self.container_argv is not None
        self.container = subprocess.Popen(
            ["nsenter", "--target", str(self.pid1), "--pid", "--mount", *self.container_argv],
            stdout=self.log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=self.env,
            start_new_session=True,
        )
        while time.monotonic() < deadline:
            kids = children_of(self.container.pid)
            if kids:
                self.main_pid = kids[0]
                return
            time.sleep(0.005)
        self.kill()
        raise PodError(f"pod {self.name}: the container did not start beside the pause")

    @property
    def ids(self) -> dict[str, int | str]:
        return {
            "unshare_pid": self.proc.pid if self.proc else 0,
            "pid1": self.pid1,
            "main_pid": self.main_pid,
            "pidns": self.pidns,
        }

    def log_text(self) -> str:
        """The pod's output so far."""
        with open(self.log.name, errors="replace") as f:
            return f.read()

    def _last_log_line(self) -> str:
        """': <the pod's last line of output>' (why unshare failed), or '' when it wrote none."""
        try:
            with open(self.log.name, errors="replace") as f:
                lines = f.read().strip().splitlines()
        except (OSError, AttributeError):
            return ""
        return f": {lines[-1]}" if lines else ""

    def _init_running(self) -> bool:
        """PID 1 has exec'd the init (signals sent before that would hit a wrapper instead)."""
        want = INIT_COMM.get(self.init)
        if want is None:
            return True
        stat = HOST_PROCFS.stat(self.pid1)
        return stat is not None and stat.comm == want

    @property
    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def processes(self) -> list[int]:
        """Host pids of every process of the pod, PID 1 first."""
        pids = pids_in_pidns(self.pidns) if self.pidns else []
        return sorted(pids, key=lambda p: (p != self.pid1, p))

    def tree(self) -> list[int]:
        """PID 1 and its descendants, and with a pause the container's main process and its own:
        cheaper than ``processes()`` (what the sampler uses). The container was forked by nsenter
        from outside, so it is no child of the pause: from PID 1 alone S5's memory read 0 until its
        workers were re-parented at the parent's exit."""
        if not self.running:
            return []
        found: list[int] = []
        stack = [self.pid1, *([self.main_pid] if self.main_pid not in (0, self.pid1) else [])]
        while stack:
            pid = stack.pop()
            if pid not in found:  # a worker re-parented between two reads is counted once
                found.append(pid)
                stack.extend(children_of(pid))
        return found

    def exec(self, argv: Sequence[str], *, timeout: float) -> subprocess.CompletedProcess[str]:
        """Run a command inside the pod's PID and mount namespaces (``kubectl exec``)."""
        cmd = ["nsenter", "--target", str(self.pid1), "--pid", "--mount", *argv]
        try:
            return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=self.env, check=False)
        except subprocess.TimeoutExpired as exc:
            out = exc.stdout.decode(errors="replace") if isinstance(exc.stdout, bytes) else exc.stdout
            return subprocess.CompletedProcess(cmd, 124, out or "", f"timed out after {timeout:.1f} s")

    @property
    def command_line(self) -> str:
        """How the pod was started, for the report."""
        line = shlex.join(self.argv)
        if self.container_argv is not None:
            line += " + (container, by nsenter beside it) " + shlex.join(self.container_argv)
        return line

    def container_exited(self) -> bool:
        """The container's main process is gone (with a pause, the pod itself lives on)."""
        watched = self.container if self.container is not None else self.proc
        return watched is not None and watched.poll() is not None

    def wait_exit(self, until: float) -> bool:
        """Wait until the container's main process is gone or the events' clock reaches ``until``."""
        while self.events.now() < until:
            if self.container_exited():
                return True
            time.sleep(0.002)
        return self.container_exited()

    def delete(self, *, grace: float) -> Deletion:
        """The kubelet's order: preStop, SIGTERM to the container's main process, SIGKILL at the end
        of the grace; with a pause as PID 1, then the pod sandbox (the pause) goes too."""
        assert self.proc is not None
        requested = self.events.add("delete", f"grace {grace:g} s").t
        deadline = requested + grace
        prestop_rc, prestop_out, prestop_err = None, "", ""
        if prestop := self.prestop:
            self.events.add("prestop-start", shlex.join(prestop))
            budget = max(0.1, deadline - self.events.now())
            done = self.exec(prestop, timeout=budget)
            prestop_rc, prestop_out, prestop_err = done.returncode, done.stdout, done.stderr
            self.events.add("prestop-end", f"exit {prestop_rc}")
        role = "PID 1" if self.main_pid == self.pid1 else "the container's main process"
        sigterm_at = self.events.add("sigterm", f"{role} (host pid {self.main_pid})").t
        self._signal(self.main_pid, signal.SIGTERM)
        sigkill_at = None
        if not self.wait_exit(deadline):
            sigkill_at = self.events.add("sigkill", f"grace period over: {role}").t
            self._signal(self.main_pid, signal.SIGKILL)
            if not self.wait_exit(self.events.now() + 10.0):
                self.kill()
        exit_code = self._end_container()
        exited = self.events.add("pod-exit", f"container exit {exit_code}").t
        self._stop_sandbox()
        self._explain_unshare_message()
        return Deletion(
            requested_at=requested,
            grace_s=grace,
            prestop_rc=prestop_rc,
            prestop_stdout=prestop_out,
            prestop_stderr=prestop_err,
            sigterm_at=sigterm_at,
            sigkill_at=sigkill_at,
            exited_at=exited,
            pod_exit_code=exit_code,
            leftovers=leftovers(self.processes),
        )

    def _explain_unshare_message(self) -> None:
        """util-linux's unshare before 2.40 prints UNSHARE_SIGKILL_MESSAGE (and exits 1) when its
        child, PID 1, dies of SIGKILL (util-linux#2614: it cannot re-raise SIGKILL on itself). The
        pod's log says so beside it, so the line is not read as the lab's own failure."""
        if self.proc is None or self.proc.poll() is None or UNSHARE_SIGKILL_MESSAGE not in self.log_text():
            return
        self.log.write(f"# gpuzombie lab: {UNSHARE_SIGKILL_NOTE}\n")
        self.log.flush()

    def _end_container(self) -> int | None:
        """After the main process exited: with a pause as PID 1, the runtime SIGKILLs the rest of the
        container (its processes share the pod's namespace, so the kernel would not); the exit code."""
        if self.container is None:
            return self.proc.returncode if self.proc else None
        rest = [p for p in self.processes() if p != self.pid1]
        if rest:
            self.events.add("runtime-kill-all", f"SIGKILL to the container's {len(rest)} other process(es)")
        for pid in rest:
            self._signal(pid, signal.SIGKILL)
        return self.container.returncode

    def _stop_sandbox(self) -> None:
        """With a pause as PID 1: StopPodSandbox kills it, and with it the namespace."""
        if self.container is None:
            return
        self._signal(self.pid1, signal.SIGKILL)
        if self.proc is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=10)
        self.events.add("sandbox-removed", "the pause is gone")

    def _signal(self, pid: int, sig: int) -> None:
        # Only while unshare still runs and the pid is still in the pod: else it may be another's.
        if not self.running or pidns_of(pid) != self.pidns:
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, sig)

    def kill(self) -> None:
        """Backstop: SIGKILL PID 1 (the kernel then kills the namespace) and unshare; reap."""
        self._signal(self.pid1, signal.SIGKILL)
        if self.container is not None and self.container.poll() is None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.container.wait(timeout=5)
        if self.proc is not None and self.proc.poll() is None:
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=5)
