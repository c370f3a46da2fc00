"""The webhook's fix of a GPU pod as explicit JSONPatch operations (RFC 6902), from the same rules
``check`` reports. Pure: a pod-shaped object (``metadata`` + ``spec``) and a policy in, operations,
the actions taken and the warnings for kubectl out. No I/O, no registry lookup.

Per GPU container that runs no init (the contract in ADMISSION-CONTRACT.md):
- ``command`` set: an init container copies a static tini into a memory-backed emptyDir and the
  command becomes ``[/.gpuzombie/tini-static, -s, -g, --, <command...>]``, ``args`` untouched;
- ``command`` empty (the image's ENTRYPOINT, unknown here): ``shareProcessNamespace: true``.
Opt-ins (pod annotation, or a namespace default): the gpuzombie preStop hook, the grace, torchrun's
shutdown timeout. The annotation ``gpuzombie.dev/injected`` records what was done; a pod that has
it (or the volume) gets nothing more, so reinvocation and re-applied manifests wrap nothing twice.
"""

from __future__ import annotations

import enum
import posixpath
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from gpuzombie import __version__
from gpuzombie.admission import preflight, rules
from gpuzombie.admission.pid1 import container_pid1
from gpuzombie.admission.security import restricted_security_context
from gpuzombie.k8s.podspec.gpus import GpuContext
from gpuzombie.k8s.podspec.model import Container, PodSpec, windows_only
from gpuzombie.k8s.podspec.pointers import pointer_token
from gpuzombie.pid1kinds import REAPING_KINDS

DOMAIN = "gpuzombie.dev"
INJECT = f"{DOMAIN}/inject"
INJECTED = f"{DOMAIN}/injected"
OPT_INS = ("prestop", "grace-seconds", "torchrun-shutdown", "preflight")
"""Opt-in keys: the pod annotation ``gpuzombie.dev/<key>``, or a namespace default (--opt-in)."""
VOLUME = "gpuzombie-bin"
MOUNT = "/.gpuzombie"
TINI = f"{MOUNT}/tini-static"
TINI_FLAGS = ("-s", "-g", "--")
"""tini as a subreaper (-s: it reaps even when not PID 1), signals to the child's process group (-g)."""
PRESTOP_PYZ = f"{MOUNT}/prestop.pyz"
INIT_CONTAINER = "gpuzombie-install"
NAME_TAKEN = f"a container is named {INIT_CONTAINER} already"
"""Why a pod is left alone whose container has the install container's name: a second one would
make the pod invalid. (A container named like the preflight gate only keeps the gate out.)"""
IMAGE_TINI = "/usr/bin/tini-static"
IMAGE_PRESTOP = "/opt/gpuzombie/prestop.pyz"
DEFAULT_IMAGE = f"localhost/gpu-zombie/gpuzombie-node:{__version__}"
"""What the chart's image values render to by default; the chart passes --image explicitly."""
ALWAYS_SKIPPED_NAMESPACES = frozenset({"kube-system"})
MAX_CONTAINERS = 256
"""A pod with more containers (init containers included) is not looked at, so the work and memory of
one review stay bounded (docs/reliability.md): no pod a person writes comes near it."""
MAX_WARNINGS = 12
TORCHRUN_MARGIN_SECONDS = 5
"""Time left after torchrun's SIGKILL for the exit to land before the kubelet's."""


class Mode(enum.Enum):
    MUTATE = "mutate"
    WARN = "warn"


@dataclass(frozen=True)
class Policy:
    image: str = DEFAULT_IMAGE
    mode: Mode = Mode.MUTATE
    skip_namespaces: frozenset[str] = ALWAYS_SKIPPED_NAMESPACES
    """kube-system, and the webhook's own namespace (the CLI adds it)."""
    namespace_opt_ins: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    """namespace -> {opt-in key: value}, the defaults of the pod annotations."""
    preflight: bool = False
    """The handover gate for every GPU pod (--preflight); ``gpuzombie.dev/preflight: "false"`` opts out."""


@dataclass(frozen=True)
class Mutation:
    ops: list[dict[str, Any]]
    actions: list[str]
    warnings: list[str]
    skipped: str | None = None
    """Why the pod was left alone as a whole (None: it was looked at)."""
    tell: bool = False
    """The skip is news to whoever sent the pod (a name of ours is taken): the serving webhook says it
    as a warning, as ``--patch`` says every skip; the others (a namespace left out, a pod opted out or
    mutated already) are the expected, silent ones."""

    @property
    def changed(self) -> bool:
        return bool(self.ops)


def _none(*warnings: str) -> Mutation:
    return Mutation([], [], list(warnings))


def _annotations(pod: Mapping[str, Any]) -> Mapping[str, Any]:
    meta = pod.get("metadata")
    annotations = meta.get("annotations") if isinstance(meta, Mapping) else None
    return annotations if isinstance(annotations, Mapping) else {}


def _opt_ins(pod: Mapping[str, Any], namespace: str | None, policy: Policy) -> dict[str, str]:
    chosen = dict(policy.namespace_opt_ins.get(namespace or "", {}))
    for key in OPT_INS:
        value = _annotations(pod).get(f"{DOMAIN}/{key}")
        if isinstance(value, str):
            chosen[key] = value
    return chosen


def _grace_opt_in(value: str | None) -> int | None:
    if value is None:
        return None
    if not value.isdigit() or not 1 <= int(value) <= 86400:
        raise ValueError(f"{DOMAIN}/grace-seconds must be a whole number of seconds from 1 to 86400, not {value!r}")
    return int(value)


def prestop_timeout(grace: int) -> int:
    """The injected hook's --timeout: two thirds of the grace (S4 measured 20 s in a 30 s grace), so
    the SIGKILL fallback and the exit fit before the kubelet's."""
    return max(1, grace * 2 // 3)


def install_container(image: str, *, prestop: bool, spec: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The init container that copies tini (and the hook) into the shared emptyDir: an explicit
    command, never the image's (kubernetes#69467), least privilege (the pod ``spec``'s own seccomp
    profile kept)."""
    sources = [IMAGE_TINI, *([IMAGE_PRESTOP] if prestop else [])]
    return {
        "name": INIT_CONTAINER,
        "image": image,
        "imagePullPolicy": "IfNotPresent",
        "command": ["cp", *sources, f"{MOUNT}/"],
        "resources": {
            "requests": {"cpu": "10m", "memory": "16Mi"},
            "limits": {"cpu": "100m", "memory": "32Mi"},
        },
        "securityContext": restricted_security_context(spec),
        "volumeMounts": [{"name": VOLUME, "mountPath": MOUNT}],
    }


def _append(ops: list[dict[str, Any]], obj: Mapping[str, Any], path: str, key: str, item: Any) -> None:
    """Add ``item`` to the list ``obj[key]`` at ``path``, creating the list when absent."""
    if isinstance(obj.get(key), list) and obj[key]:
        ops.append({"op": "add", "path": f"{path}/{key}/-", "value": item})
    else:
        ops.append({"op": "add", "path": f"{path}/{key}", "value": [item]})


def _annotate(ops: list[dict[str, Any]], pod: Mapping[str, Any], actions: list[str]) -> None:
    value = ",".join(actions)
    meta = pod.get("metadata")
    if not isinstance(meta, Mapping):
        ops.append({"op": "add", "path": "/metadata", "value": {"annotations": {INJECTED: value}}})
    elif not isinstance(meta.get("annotations"), Mapping):
        ops.append({"op": "add", "path": "/metadata/annotations", "value": {INJECTED: value}})
    else:
        ops.append({"op": "add", "path": f"/metadata/annotations/{pointer_token(INJECTED)}", "value": value})


def _every_container(spec: Mapping[str, Any]) -> list[Any]:
    listed = [spec.get(k) for k in ("containers", "initContainers", "ephemeralContainers")]
    return [c for cs in listed if isinstance(cs, list) for c in cs]


def _named(spec: Mapping[str, Any], name: str) -> bool:
    return any(isinstance(c, Mapping) and c.get("name") == name for c in _every_container(spec))


def _skip_reason(pod: Mapping[str, Any], namespace: str | None, policy: Policy) -> str | None:
    spec = pod.get("spec")
    if not isinstance(spec, Mapping):
        return "no pod spec"
    if namespace in policy.skip_namespaces:
        return f"namespace {namespace} is excluded"
    annotations = _annotations(pod)
    if str(annotations.get(INJECT, "")).lower() == "false":
        return f"{INJECT}: false"
    if INJECTED in annotations:
        return f"already mutated ({INJECTED}: {annotations[INJECTED]})"
    volumes = spec.get("volumes")
    if isinstance(volumes, list) and any(isinstance(v, Mapping) and v.get("name") == VOLUME for v in volumes):
        return f"already mutated (volume {VOLUME})"
    if _named(spec, INIT_CONTAINER):
        return NAME_TAKEN
    if windows_only(spec):
        return "a Windows pod"
    if spec.get("hostPID") is True:
        return "hostPID: the containers' processes are not PID 1"
    return None


@dataclass
class _Plan:
    """What to do to one pod, decided before any operation is written."""

    grace: int
    """The grace the pod will have (an opt-in's, else its own)."""
    set_grace: bool = False
    share: bool = False
    wrap: list[Container] = field(default_factory=list)
    hooks: list[Container] = field(default_factory=list)
    torchrun: list[tuple[Container, int]] = field(default_factory=list)
    gate: preflight.GateGpus | None = None
    actions: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)


def _mounts_ours(container: Mapping[str, Any]) -> bool:
    """Something is mounted at MOUNT already, however the path is written (``/.gpuzombie/``, ``//.gpuzombie``)."""
    mounts = container.get("volumeMounts")
    return isinstance(mounts, list) and any(
        isinstance(m, Mapping)
        and isinstance(m.get("mountPath"), str)
        and posixpath.normpath("/" + m["mountPath"].lstrip("/")) == MOUNT
        for m in mounts
    )


def _own_wait(c: Container) -> float:
    """How long the container's own preStop hook may wait (0: none, or one that cannot be judged)."""
    hook = rules.hook_wait(c)
    return hook.wait_seconds if hook is not None and hook.wait_seconds is not None else 0.0


def _plan(pod: PodSpec, opt_ins: Mapping[str, str], policy: Policy, budget: rules.Budget, *, vouched: bool) -> _Plan:
    """``vouched``: the pod's own annotation asks for the gate (preflight.gate_gpus)."""
    mode = policy.mode
    grace = _grace_opt_in(opt_ins.get("grace-seconds"))
    plan = _Plan(grace=pod.grace_seconds)
    if opt_ins.get("preflight", "true" if policy.preflight else "").lower() == "true":
        if _named(pod.raw, preflight.CONTAINER):
            plan.warnings.append(f"the preflight gate is not added: a container is named {preflight.CONTAINER} already")
        else:
            plan.gate, said = preflight.gate_gpus(pod, vouched=vouched)
            plan.actions += ["preflight"] if plan.gate else []
            plan.warnings += said
    gpu = pod.gpu_containers
    longest_wait = max((_own_wait(c) for c in gpu), default=0.0)
    if grace is not None and grace <= longest_wait:  # GZ004: the kubelet would kill the pod's own hook
        plan.warnings.append(
            f"{DOMAIN}/grace-seconds {grace} is not applied: a preStop hook of the pod may wait "
            f"{longest_wait:g} s (the grace stays {plan.grace} s)"
        )
        grace = None
    elif grace is not None:
        plan.grace = grace
    want_prestop = opt_ins.get("prestop", "").lower() == "true"
    want_torchrun = opt_ins.get("torchrun-shutdown", "").lower() == "true"
    sharing = pod.share_process_namespace
    for c in gpu:
        budget.check()
        if _mounts_ours(c.raw):
            plan.warnings.append(f"container {c.name}: {MOUNT} is mounted already; left alone")
            continue
        if sharing or container_pid1(c).kind in REAPING_KINDS:
            pass
        elif c.argv_known:
            plan.wrap.append(c)
            plan.actions.append(f"tini:{c.name}")
        elif not plan.share:
            plan.share = True
            plan.actions.append("shareProcessNamespace")
            verb = "would be" if mode is Mode.WARN else "is"
            plan.warnings.append(
                f"container {c.name} has no command: its PID 1 is the image's ENTRYPOINT, unknown at admission "
                f"(no registry lookup), so shareProcessNamespace: true {verb} set instead of tini (measured: "
                f"{rules.EVIDENCE['S5'].result}; set command to get tini)"
            )
        fits = prestop_timeout(plan.grace) < plan.grace  # GZ004 otherwise
        hooked = want_prestop and fits and not _has_prestop(c.raw)
        if hooked:
            plan.hooks.append(c)
            plan.actions.append(f"prestop:{c.name}")
        elif want_prestop and not fits:
            plan.warnings.append(
                f"container {c.name}: the gpuzombie hook was not added: its --timeout "
                f"{prestop_timeout(plan.grace)} s does not fit in a {plan.grace} s grace"
            )
        elif want_prestop:
            plan.warnings.append(f"container {c.name} has a preStop hook already; the gpuzombie hook was not added")
        shutdown = rules.torchrun_shutdown(c)
        if want_torchrun and shutdown is not None:
            target = max(1, plan.grace - (prestop_timeout(plan.grace) if hooked else 0) - TORCHRUN_MARGIN_SECONDS)
            given = "shutdown-timeout" in " ".join(c.words).replace("_", "-") or rules.TORCHRUN_SHUTDOWN_ENV in c.env
            if shutdown > target and given:
                plan.warnings.append(
                    f"container {c.name}: torchrun's shutdown timeout is set ({shutdown} s); left as is"
                )
            elif shutdown > target:
                plan.torchrun.append((c, target))
                plan.actions.append(f"torchrun-shutdown:{c.name}")
    if grace is not None and grace != pod.raw.get("terminationGracePeriodSeconds"):
        plan.set_grace = True
        plan.actions.append(f"grace:{grace}")
    return plan


def _ops(pod: Mapping[str, Any], plan: _Plan, image: str) -> list[dict[str, Any]]:
    """The plan as explicit operations, each valid after the ones before it."""
    spec: Mapping[str, Any] = pod["spec"]
    ops: list[dict[str, Any]] = []
    _annotate(ops, pod, plan.actions)
    if plan.share:
        ops.append({"op": "add", "path": "/spec/shareProcessNamespace", "value": True})
    if plan.wrap or plan.hooks:
        _append(ops, spec, "/spec", "volumes", {"name": VOLUME, "emptyDir": {"medium": "Memory", "sizeLimit": "16Mi"}})
        init = install_container(image, prestop=bool(plan.hooks), spec=spec)
        if isinstance(spec.get("initContainers"), list) and spec["initContainers"]:
            ops.append({"op": "add", "path": "/spec/initContainers/0", "value": init})
        else:
            ops.append({"op": "add", "path": "/spec/initContainers", "value": [init]})
    if plan.gate is not None:  # first of all: nothing of the pod runs before the GPU is known clean
        gate = preflight.gate_container(image, plan.gate, spec)
        if (isinstance(spec.get("initContainers"), list) and spec["initContainers"]) or plan.wrap or plan.hooks:
            ops.append({"op": "add", "path": "/spec/initContainers/0", "value": gate})
        else:
            ops.append({"op": "add", "path": "/spec/initContainers", "value": [gate]})
    inserted = int(bool(plan.wrap or plan.hooks)) + int(plan.gate is not None)  # at initContainers/0

    def where(c: Container) -> str:
        """The container's pointer once ours are in (an init container's moves)."""
        if c.kind.field == "initContainers":
            return f"/spec/initContainers/{c.index + inserted}"
        return c.pointer

    wrapped, hooked = {c.pointer for c in plan.wrap}, {c.pointer for c in plan.hooks}
    for c in sorted({c.pointer: c for c in plan.wrap + plan.hooks}.values(), key=lambda c: (c.kind.field, c.index)):
        path = where(c)
        _append(ops, c.raw, path, "volumeMounts", {"name": VOLUME, "mountPath": MOUNT, "readOnly": True})
        if c.pointer in wrapped:
            assert c.command is not None
            ops.append({"op": "replace", "path": f"{path}/command", "value": [TINI, *TINI_FLAGS, *c.command]})
        if c.pointer in hooked:
            hook = {"exec": {"command": _hook_command(plan.grace)}}
            if isinstance(c.raw.get("lifecycle"), Mapping):
                ops.append({"op": "add", "path": f"{path}/lifecycle/preStop", "value": hook})
            else:
                ops.append({"op": "add", "path": f"{path}/lifecycle", "value": {"preStop": hook}})
    for c, seconds in plan.torchrun:
        variable = {"name": rules.TORCHRUN_SHUTDOWN_ENV, "value": str(seconds)}
        _append(ops, c.raw, where(c), "env", variable)
    if plan.set_grace:
        ops.append({"op": "add", "path": "/spec/terminationGracePeriodSeconds", "value": plan.grace})
    return ops


def mutate(
    pod: Mapping[str, Any],
    namespace: str | None,
    policy: Policy,
    budget: rules.Budget = rules.UNBOUNDED,
    gpus: GpuContext | None = None,
) -> Mutation:
    """The fix of ``pod`` as JSONPatch operations; ``gpus`` gives the DRA claims of the input
    (``--patch``: a claim of an IMEX channel is no GPU; the webhook sees a pod alone, so a claim is
    assumed a GPU there). Raises ManifestError or ValueError (a bad opt-in value) for a pod it
    cannot understand, rules.OverBudget when ``budget`` runs out; the caller then admits the pod
    unchanged."""
    reason = _skip_reason(pod, namespace, policy)
    if reason is not None:
        return Mutation([], [], [], reason, tell=reason == NAME_TAKEN)
    count = len(_every_container(pod["spec"]))
    if count > MAX_CONTAINERS:
        why = f"cannot tell: {count} containers, over the {MAX_CONTAINERS} a pod is read for; admitted unchanged"
        return Mutation([], [], [why], why)
    spec = rules.read(pod["spec"], budget, annotations=_annotations(pod), context=gpus)
    if not spec.gpu_containers:
        return Mutation([], [], [], "no GPU container")
    vouched = str(_annotations(pod).get(f"{DOMAIN}/preflight", "")).lower() == "true"
    plan = _plan(spec, _opt_ins(pod, namespace, policy), policy, budget, vouched=vouched)
    if not plan.actions:
        return _none(*plan.warnings)
    described = [_describe(a) for a in plan.actions if a != "shareProcessNamespace"]
    ops = _ops(pod, plan, policy.image)
    worse = _new_findings(pod, ops, budget)
    if worse:
        return _none(f"no change made: the patched pod would have {worse}", *plan.warnings)
    if policy.mode is Mode.WARN:
        return _none(*[f"would {d} (--mode warn)" for d in described], *plan.warnings)
    return Mutation(ops, plan.actions, [*described, *plan.warnings])


def _serious(spec: Mapping[str, Any], budget: rules.Budget) -> set[tuple[str, str | None]]:
    return {(f.rule, f.container) for f in rules.check_pod_spec(spec, budget) if f.severity is not rules.Severity.NOTE}


def _new_findings(pod: Mapping[str, Any], ops: list[dict[str, Any]], budget: rules.Budget) -> str | None:
    """The first error or warning of ``check`` that the patched pod has and ``pod`` has not, as
    "GZ004 (container train)"; None when the patch makes nothing worse. The webhook's own
    safety net: a change it makes must check clean."""
    new = _serious(patched(pod, ops)["spec"], budget) - _serious(pod["spec"], budget)
    if not new:
        return None
    rule, container = min(new, key=lambda f: (f[0], f[1] or ""))
    return f"{rule} {rules.RULES[rule].name}" + (f" (container {container})" if container else "")


def patched(pod: Mapping[str, Any], ops: list[dict[str, Any]]) -> dict[str, Any]:
    """``pod`` with mutate's operations applied (add and replace on object keys, list indices and
    ``-``: the only ones it writes), ``pod`` untouched: each map and list on an operation's path is
    copied once, nothing else (no deep copy of what a request may nest deep). The webhook needs no
    JSONPatch library."""
    out = dict(pod)
    copied = {id(out)}
    for op in ops:
        *parents, last = [p.replace("~1", "/").replace("~0", "~") for p in op["path"].split("/")[1:]]
        target: Any = out
        for part in parents:
            key: Any = int(part) if isinstance(target, list) else part
            child = target[key]
            if id(child) not in copied:
                child = list(child) if isinstance(child, list) else dict(child)
                target[key] = child
                copied.add(id(child))
            target = child
        if isinstance(target, list) and last == "-":
            target.append(op["value"])
        elif isinstance(target, list) and op["op"] == "add":
            target.insert(int(last), op["value"])
        elif isinstance(target, list):
            target[int(last)] = op["value"]
        else:
            target[last] = op["value"]
    return out


def _has_prestop(container: Mapping[str, Any]) -> bool:
    lifecycle = container.get("lifecycle")
    return isinstance(lifecycle, Mapping) and lifecycle.get("preStop") is not None


def _hook_command(grace: int) -> list[str]:
    return ["python3", "-S", "-I", PRESTOP_PYZ, "--timeout", str(prestop_timeout(grace))]


def _describe(action: str) -> str:
    what, _, detail = action.partition(":")
    return {
        "tini": f"run container {detail}'s command under tini (measured: {rules.EVIDENCE['S2'].result})",
        "prestop": f"add the gpuzombie preStop hook to container {detail}",
        "torchrun-shutdown": f"set {rules.TORCHRUN_SHUTDOWN_ENV} in container {detail} below the grace",
        "grace": f"set terminationGracePeriodSeconds: {detail}",
        "preflight": f"add the preflight gate ({preflight.CONTAINER}) first: the pod waits until its GPUs are clean",
    }[what]
