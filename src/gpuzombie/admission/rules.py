"""The rules of ``gpuzombie check`` and the webhook: pure functions over a pod spec (a dict as the API
sends it) -> findings, each with the lab's measured cost as its evidence.

What PID 1 will be is ``pid1``'s reading of the argv (a shell's ``-c`` script split by ``shell``);
the rules judge it, the preStop hook and the grace.
"""

from __future__ import annotations

import dataclasses
import enum
import posixpath
import re
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpuzombie.admission import preflight
from gpuzombie.admission.pid1 import Pid1, analyse_argv
from gpuzombie.admission.shell import lex_script, shell_script
from gpuzombie.k8s.podspec.gpus import GpuContext
from gpuzombie.k8s.podspec.model import Container, PodSpec, read_pod_spec
from gpuzombie.pid1kinds import REAPING_KINDS, SHELLS, Pid1Kind

TORCHRUN_DEFAULT_SHUTDOWN_TIMEOUT = 30
"""torch.distributed.run: ``--shutdown-timeout`` / TORCH_ELASTIC_SHUTDOWN_TIMEOUT when unset."""
TORCHRUN_SHUTDOWN_ENV = "TORCH_ELASTIC_SHUTDOWN_TIMEOUT"
TORCHRUN_WORDS = ("torchrun", "torch.distributed.run", "torch.distributed.launch")
SOURCE = "results/runtimes/comparison.md"


@dataclass(frozen=True)
class Measured:
    """One measured outcome of the lab (H200, 2 GiB SIGTERM-ignoring worker, 30 s grace, 3 runs)."""

    scenario: str
    setup: str
    result: str


EVIDENCE: Mapping[str, Measured] = {
    "S1": Measured("S1", "sleep as PID 1, worker in the background", "30.13 s deletion → free (whole grace), 78 GiB·s"),
    "S2": Measured("S2", "tini as PID 1", "0.15 s deletion → free"),
    "S3": Measured("S3", "tini + a preStop that waits --timeout 20 for the worker", "20.4 s deletion → free"),
    "S4": Measured("S4", "tini + preStop + a SIGTERM handler", "0.45 s deletion → free"),
    "S5": Measured("S5", "shareProcessNamespace: true (pause is PID 1)", "0.16–0.22 s deletion → free"),
}
"""The lab's numbers every finding cites, from results/runtimes/comparison.md (2026-12-01, NVIDIA H200,
driver 580.159.04; medians of 3 runs on the namespaces and containerd runtimes)."""


def evidence(*keys: str) -> str:
    return "; ".join(f"{EVIDENCE[k].scenario} {EVIDENCE[k].setup}: {EVIDENCE[k].result}" for k in keys) + (
        f" ({SOURCE})"
    )


class Severity(enum.Enum):
    """How sure a finding is that a deletion wastes the GPU (docs/admission.md, "Levels")."""

    ERROR = "error"
    """Certain: the manifest alone shows that every deletion holds the GPU for the whole grace (a PID 1
    that drops SIGTERM), or that the kubelet kills the hook. ``check`` fails on it by default."""
    WARNING = "warning"
    """Possible: it depends on what the program does, which a manifest does not show (a program as
    PID 1 without an init handles SIGTERM only if it has a handler; nothing reaps its orphans)."""
    NOTE = "note"
    """Cannot tell, or advice (the image's ENTRYPOINT, a drain delay that only waits)."""


DEFAULT_FAIL_ON = Severity.ERROR
"""``check --fail-on``'s default: only certain waste fails, so a team can adopt it on day one. Of the
33 GPU pod specs of the fleet corpus (tests/fixtures/fleet: public manifests of LWS, KubeRay, Kubeflow,
KServe, ...), 5 fail, each a ``sh -c`` that holds its GPU for the whole grace; at ``warning`` 16 do."""


@dataclass(frozen=True)
class Rule:
    id: str
    name: str
    summary: str
    evidence: str
    fix: str


RULES: Mapping[str, Rule] = {
    r.id: r
    for r in (
        Rule(
            "GZ001",
            "pid1-without-reaping",
            "PID 1 is a shell or sleep with work in the background: it reaps no zombies and the kernel "
            "drops the SIGTERM it has no handler for, so the pod holds its GPU memory the whole grace",
            evidence("S1", "S2"),
            "run an init as PID 1 (command: [tini, -s, -g, --, ...]) or set shareProcessNamespace: true",
        ),
        Rule(
            "GZ002",
            "no-init",
            "a GPU container has no init as PID 1 and the pod does not share its process namespace: nothing "
            "reaps orphaned processes, and SIGTERM reaches the program only through a handler of its own",
            evidence("S1", "S2", "S5"),
            "run an init as PID 1 (tini, dumb-init, catatonit) or set shareProcessNamespace: true",
        ),
        Rule(
            "GZ003",
            "prestop-only-waits",
            "the preStop hook only waits: a worker that ignores SIGTERM holds its memory until the wait ends",
            evidence("S3", "S4"),
            "let the hook signal the workers and exit (gpuzombie prestop), and handle SIGTERM in the worker",
        ),
        Rule(
            "GZ004",
            "grace-shorter-than-prestop",
            "the preStop hook's timeout does not fit in terminationGracePeriodSeconds: the kubelet kills "
            "the hook (2 s after the grace) and the containers get no SIGTERM time",
            evidence("S3"),
            "make terminationGracePeriodSeconds longer than the hook's timeout plus the time to exit",
        ),
        Rule(
            "GZ005",
            "torchrun-shutdown-exceeds-grace",
            "torchrun's shutdown timeout (the wait before it SIGKILLs its workers, 30 s unless set) is not "
            "shorter than the grace left after preStop: the kubelet's SIGKILL comes first",
            evidence("S1"),
            f"set --shutdown-timeout or {TORCHRUN_SHUTDOWN_ENV} below the grace",
        ),
        Rule(
            "GZ006",
            "pid1-cannot-tell",
            "PID 1 cannot be told from the manifest: command is not set (the image's ENTRYPOINT runs), or "
            "its shell script is too long or nested too deep to read",
            evidence("S1", "S5"),
            "set command explicitly (a short one: a long script goes in a file), or shareProcessNamespace: "
            "true (what the webhook does without a command)",
        ),
        Rule(
            "GZ007",
            "gpu-request-not-read",
            "a GPU is requested in a place no pod-template reader understood (a custom resource's own "
            "field, an inline serving-runtime component): its containers were not checked",
            evidence("S1"),
            "check the pods the operator generates (gpuzombie webhook sees them), or put the GPU request in "
            "a pod template; docs/admission.md lists the kinds and fields read",
        ),
        Rule(
            "GZ008",
            "pid1-drops-sigterm",
            "PID 1 is a shell that stays PID 1 (dash, Debian's and Ubuntu's sh, always does; bash does when "
            "its last command is not a plain one) or sleep: it has no SIGTERM handler and passes none on, so "
            "the kernel drops the kubelet's SIGTERM and every deletion holds the GPU for the whole grace",
            evidence("S1", "S2"),
            "exec the program (sh -c '...; exec python3 ...'), or run an init as PID 1 "
            "(command: [tini, -s, -g, --, ...]), or set shareProcessNamespace: true",
        ),
    )
}


class OverBudget(Exception):
    """A review ran out of its time: nothing it found so far is acted on."""


class Budget:
    """A wall-clock deadline for the work on one pod, checked between containers (each container's
    analysis is linear in its bytes and bounded by pid1.MAX_SCRIPT_CHARS, so the step is short). Wall
    clock bounds the CPU too: one review runs on one thread."""

    def __init__(self, seconds: float | None = None) -> None:
        self.seconds = seconds
        self.deadline = None if seconds is None else time.monotonic() + seconds

    def check(self) -> None:
        """Raises OverBudget once the deadline has passed."""
        if self.deadline is not None and time.monotonic() > self.deadline:
            raise OverBudget(f"the review took over its {self.seconds:g} s budget")


UNBOUNDED = Budget()


@dataclass(frozen=True)
class Finding:
    rule: str
    severity: Severity
    container: str | None
    message: str

    @property
    def name(self) -> str:
        return RULES[self.rule].name

    def to_dict(self) -> dict[str, Any]:
        rule = RULES[self.rule]
        return {
            "rule": self.rule,
            "name": rule.name,
            "severity": self.severity.value,
            "container": self.container,
            "message": self.message,
            "evidence": rule.evidence,
            "fix": rule.fix,
        }


def read(
    spec: Mapping[str, Any],
    budget: Budget = UNBOUNDED,
    *,
    annotations: Mapping[str, Any] | None = None,
    context: GpuContext | None = None,
) -> PodSpec:
    """The pod spec as the rules read it: leniently, ``budget`` checked before each container, the
    GPUs its pod's ``annotations`` (a fractional GPU) and ``context`` (DRA claims) give counted."""
    context = context or GpuContext()
    if annotations is not None:
        context = dataclasses.replace(context, annotations=annotations)
    return read_pod_spec(spec, between=budget.check, context=context)


def short(text: str, limit: int = 72) -> str:
    """One line of at most ``limit`` characters, its middle cut (a script's end, ``& exec sleep
    infinity``, is what tells its PID 1)."""
    text = " ".join(text.split())
    if len(text) <= limit:
        return text
    head = (limit - 1) // 3
    return text[:head] + "…" + text[len(text) - (limit - 1 - head) :]


def _shown(pid1: Pid1, words: Sequence[str]) -> str:
    if pid1.script is not None:
        return f"{posixpath.basename(words[0])} -c {short(pid1.script)!r}"
    return short(" ".join(words))


@dataclass(frozen=True)
class HookWait:
    """A preStop hook as the rules judge it: how long it may wait, and whether it only waits."""

    wait_seconds: float | None
    only_waits: bool
    shown: str


def _number_after(words: Sequence[str], flag: str) -> float | None:
    for i, word in enumerate(words):
        value = None
        if word == flag and i + 1 < len(words):
            value = words[i + 1]
        elif word.startswith(flag + "="):
            value = word.split("=", 1)[1]
        if value is not None:
            try:
                return float(value)
            except ValueError:
                return None
    return None


def _sleep_seconds(words: Sequence[str]) -> float | None:
    if len(words) == 2 and posixpath.basename(words[0]) == "sleep":
        try:
            return float(words[1])
        except ValueError:
            return None
    return None


def hook_wait(c: Container) -> HookWait | None:
    """The container's preStop hook judged, or None (no hook, or an httpGet one this cannot judge)."""
    if c.prestop is None:
        return None
    if c.prestop.sleep_s is not None:
        return HookWait(float(c.prestop.sleep_s), True, f"sleep {c.prestop.sleep_s}")
    words = c.prestop.command
    shown = short(" ".join(words))
    slept = _sleep_seconds(words)
    if slept is not None:
        return HookWait(slept, True, shown)
    script = shell_script(words) if posixpath.basename(words[0]) in SHELLS else None
    if script is not None:
        sleeps = [_sleep_seconds(c) for c in lex_script(script).commands]
        if sleeps and all(s is not None for s in sleeps):
            return HookWait(sum(s or 0.0 for s in sleeps), True, shown)
    if any("prestop" in w for w in words):  # gpuzombie prestop, python -m gpuzombie.prestop, prestop.pyz
        timeout = _number_after(words, "--timeout")
        return HookWait(20.0 if timeout is None else timeout, False, shown)
    return HookWait(None, False, shown)


def torchrun_shutdown(c: Container) -> int | None:
    """torchrun's shutdown timeout for this container, or None when it runs no torchrun."""
    text = " ".join(c.words)
    if not any(w in text for w in TORCHRUN_WORDS):
        return None
    match = re.search(r"--shutdown[-_]timeout(?:=|\s+)(\d+)", text)
    if match:
        return int(match.group(1))
    for name in (TORCHRUN_SHUTDOWN_ENV, "PET_SHUTDOWN_TIMEOUT"):
        if c.env.get(name, "").isdigit():
            return int(c.env[name])
    return TORCHRUN_DEFAULT_SHUTDOWN_TIMEOUT


REAPING = "it reaps no orphaned processes (they stay zombies, holding what they held)"
SIGTERM_IF_HANDLED = (
    "it gets SIGTERM only through a handler of its own (the kernel drops a signal PID 1 has no handler for)"
)


def _known_pid1_finding(c: Container, pid1: Pid1, grace: int) -> Finding | None:
    """The finding for a container whose ``command`` shows PID 1 (None: an init)."""
    shown = _shown(pid1, c.words)
    via = "" if pid1.via in (None, "exec") else f", which {pid1.via} execs as its last command"
    if pid1.kind in REAPING_KINDS:
        return None
    if pid1.traps_term:  # trap 'exit 0' TERM; ... & wait: exits on SIGTERM at once (measured 0.00 s)
        return Finding(
            "GZ002",
            Severity.WARNING,
            c.name,
            f"PID 1 is {pid1.program} ({shown}): it traps SIGTERM and exits, but it is not an init: {REAPING}",
        )
    if pid1.background:
        return Finding(
            "GZ001",
            Severity.ERROR,
            c.name,
            f"PID 1 is {pid1.program} with work in the background: {shown}: it passes no SIGTERM "
            f"to that work and has no handler of its own, and {REAPING}",
        )
    whole_grace = f"every deletion holds the GPU for the whole grace ({grace} s)"
    if pid1.kind is Pid1Kind.NON_FORKING:
        return Finding(  # certain: sleep (tail) has no SIGTERM handler, and PID 1 gets no default action
            "GZ008",
            Severity.ERROR,
            c.name,
            f"PID 1 is {pid1.program} ({shown}){via}: the kernel drops its SIGTERM, so {whole_grace}, and work "
            "started in it (kubectl exec) is not reaped",
        )
    if pid1.kind is Pid1Kind.SHELL and pid1.plain_last and pid1.program not in ("sh", "dash"):
        return Finding(  # possible: busybox's ash (and zsh) exec a plain last command, which then is PID 1
            "GZ002",
            Severity.WARNING,
            c.name,
            f"PID 1 is {pid1.program} ({shown}), which stays PID 1 unless it execs its plain last command "
            f"(busybox's ash does): a shell that stays passes no SIGTERM on (it has no handler; the kernel "
            f"drops it), and {REAPING}",
        )
    if pid1.kind is Pid1Kind.SHELL:
        stays = (
            "which stays PID 1 where sh is dash (Debian's and Ubuntu's sh, the base of the CUDA images; "
            "busybox's sh and bash exec a plain last command)"
            if pid1.program == "sh" and pid1.plain_last
            else "which stays PID 1 while its commands run"
        )
        return Finding(  # certain: a shell has no SIGTERM handler of its own (measured: S1's 30.13 s)
            "GZ008",
            Severity.ERROR,
            c.name,
            f"PID 1 is {pid1.program} ({shown}), {stays}: it has no SIGTERM handler and passes none on, so "
            f"{whole_grace}; and {REAPING}",
        )
    return Finding(
        "GZ002",
        Severity.WARNING,
        c.name,
        f"PID 1 is {pid1.program} ({shown}){via}, not an init: {REAPING}, and {SIGTERM_IF_HANDLED}",
    )


def _pid1_findings(c: Container, pod: PodSpec) -> Iterator[Finding]:
    if pod.share_process_namespace or pod.host_pid or preflight.is_gate(c):
        return  # PID 1 is the pod's pause (or the host's init): it reaps, and SIGTERM reaches the workload
    if c.argv_known:
        pid1 = analyse_argv(c.words)
        if pid1.kind is Pid1Kind.UNKNOWN:
            yield Finding("GZ006", Severity.NOTE, c.name, f"cannot tell PID 1: {pid1.unread}")
            return
        finding = _known_pid1_finding(c, pid1, pod.grace_seconds)
        if finding is not None:
            yield finding
        return
    seen = analyse_argv(c.words)
    if seen.background and not seen.traps_term and seen.kind not in REAPING_KINDS | {Pid1Kind.UNKNOWN}:
        # S1's own pattern; right only if the unseen ENTRYPOINT is an init: worth a warning
        yield Finding(
            "GZ001",
            Severity.WARNING,
            c.name,
            f"cannot tell PID 1 (no command: the image's ENTRYPOINT runs first), but args run "
            f"{_shown(seen, c.words)}: unless that ENTRYPOINT is an init, PID 1 is {seen.program} "
            "with work in the background",
        )
        return
    unless = f" (unless it is an init, PID 1 is {seen.program})" if seen.kind is Pid1Kind.NON_FORKING else ""
    yield Finding(
        "GZ006",
        Severity.NOTE,
        c.name,
        "cannot tell PID 1: command is not set, so the image's ENTRYPOINT runs"
        + (f" before args {_shown(seen, c.words)!r}{unless}" if c.args else ""),
    )


def _shutdown_findings(c: Container, grace: int) -> Iterator[Finding]:
    hook = hook_wait(c)
    if hook is not None and hook.only_waits:
        yield Finding(  # advice: a drain delay for a load balancer is a choice, its cost is the point
            "GZ003",
            Severity.NOTE,
            c.name,
            f"preStop ({hook.shown}) only waits {hook.wait_seconds:g} s: the GPU memory stays held that long",
        )
    if hook is not None and hook.wait_seconds is not None and hook.wait_seconds >= grace:
        yield Finding(
            "GZ004",
            Severity.ERROR,
            c.name,
            f"preStop ({hook.shown}) may take {hook.wait_seconds:g} s, terminationGracePeriodSeconds is {grace}",
        )
    shutdown = torchrun_shutdown(c)
    waited = hook.wait_seconds if hook is not None and hook.wait_seconds is not None else 0.0
    left = grace - waited
    if shutdown is not None and shutdown >= left:
        yield Finding(
            "GZ005",
            Severity.WARNING,
            c.name,
            f"torchrun's shutdown timeout is {shutdown} s, the grace left after preStop {left:g} s",
        )


def check_pod_spec(spec: Mapping[str, Any], budget: Budget = UNBOUNDED) -> list[Finding]:
    """Every finding of a pod spec's GPU containers (a pod without GPUs has none).
    Raises ManifestError for a spec with a wrong type where the API takes a list or a map,
    OverBudget when ``budget`` runs out."""
    return check(read(spec, budget), budget)


def check(pod: PodSpec, budget: Budget = UNBOUNDED) -> list[Finding]:
    """Every finding of a read pod spec (``check_pod_spec``)."""
    if pod.windows:
        return []
    findings: list[Finding] = []
    for c in pod.gpu_containers:
        budget.check()
        findings += _pid1_findings(c, pod)
        findings += _shutdown_findings(c, pod.grace_seconds)
    return findings
