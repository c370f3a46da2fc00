"""A pod spec -> ``PodSpec``: its containers of every kind with their argv, literal env, preStop
hook and GPUs, and the settings that decide how the pod stops."""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from gpuzombie.k8s.podspec.fields import ManifestError, boolean, dns_label, integer, mapping, sequence, strings
from gpuzombie.k8s.podspec.gpus import (
    FRACTION_ANNOTATIONS,
    FRACTION_CONTAINER_ANNOTATION,
    GpuContext,
    GpuForm,
    GpuRequest,
    GpuResource,
    container_gpus,
    read_pod_claims,
)

DEFAULT_GRACE_SECONDS = 30
"""What the API server defaults ``terminationGracePeriodSeconds`` to (a file may leave it out)."""


class ContainerKind(enum.Enum):
    """What a container is in its pod: a native sidecar is an init container with
    ``restartPolicy: Always`` that runs beside the regular ones."""

    INIT = "init"
    SIDECAR = "sidecar"
    REGULAR = "regular"
    EPHEMERAL = "ephemeral"

    @property
    def field(self) -> str:
        """The pod spec's list it stands in."""
        return _FIELDS[self]


_FIELDS = {
    ContainerKind.INIT: "initContainers",
    ContainerKind.SIDECAR: "initContainers",
    ContainerKind.REGULAR: "containers",
    ContainerKind.EPHEMERAL: "ephemeralContainers",
}


@dataclass(frozen=True)
class PreStop:
    """A preStop hook the kubelet runs: a command in the container, or its own sleep."""

    command: tuple[str, ...] = ()
    """exec: run in the container (ExecSync)."""
    sleep_s: int | None = None
    """sleep: the kubelet itself waits (no process in the container)."""


@dataclass(frozen=True)
class Container:
    """One container of a pod spec as its manifest writes it."""

    kind: ContainerKind
    index: int
    """Its place in its list (``spec.initContainers[index]``)."""
    name: str
    command: tuple[str, ...] | None
    """None: not set (or empty, which Kubernetes treats the same): the image's ENTRYPOINT runs."""
    args: tuple[str, ...] | None
    env: Mapping[str, str]
    """The variables with a literal value (one from a secret or a field is not known here)."""
    prestop: PreStop | None
    """None: no hook, or one a lenient reader cannot judge (httpGet)."""
    gpus: tuple[GpuRequest, ...]
    raw: Mapping[str, Any]

    @property
    def gpu(self) -> bool:
        return bool(self.gpus)

    @property
    def argv_known(self) -> bool:
        return self.command is not None

    @property
    def words(self) -> tuple[str, ...]:
        """What the spec shows of the argv: command + args, or args alone after an unseen ENTRYPOINT."""
        return (self.command or ()) + (self.args or ())

    @property
    def pointer(self) -> str:
        """JSON pointer to the container in its pod (``/spec/containers/0``)."""
        return f"/spec/{self.kind.field}/{self.index}"

    @property
    def where(self) -> str:
        """Its field path in messages (``spec.containers[0]``)."""
        return f"spec.{self.kind.field}[{self.index}]"


def _env(value: object, where: str, strict: bool) -> dict[str, str]:
    env = {}
    for i, item in enumerate(sequence(value, where)):
        item = mapping(item, f"{where}[{i}]")
        name, literal = item.get("name"), item.get("value", "" if strict else None)
        if isinstance(name, str) and isinstance(literal, str):
            env[name] = literal
        elif strict:
            raise ManifestError(f"{where}[{i}]: a name and a string value are needed")
    return env


def _prestop(container: Mapping[str, Any], where: str, strict: bool) -> PreStop | None:
    lifecycle = mapping(container.get("lifecycle"), f"{where}.lifecycle")
    if lifecycle.get("preStop") is None:
        return None
    where = f"{where}.lifecycle.preStop"
    hook = mapping(lifecycle["preStop"], where)
    if strict and len(hook) != 1:
        raise ManifestError(f"{where}: exactly one of exec and sleep")
    if "sleep" in hook:
        seconds = mapping(hook["sleep"], f"{where}.sleep").get("seconds")
        if strict:
            return PreStop(sleep_s=integer(seconds, f"{where}.sleep.seconds"))
        if isinstance(seconds, int) and not isinstance(seconds, bool):
            return PreStop(sleep_s=seconds)
    if "exec" in hook:
        command = strings(mapping(hook["exec"], f"{where}.exec").get("command"), f"{where}.exec.command")
        if command:
            return PreStop(command=command)
        if strict:
            raise ManifestError(f"{where}.exec.command: empty")
    if strict:
        raise ManifestError(f"{where}: exactly one of exec and sleep")
    return None


def _container(
    raw: object,
    kind: ContainerKind,
    index: int,
    strict: bool,
    pod_claims: Mapping[str, str | None] | None = None,
    context: GpuContext | None = None,
) -> Container:
    where = f"spec.{kind.field}[{index}]"
    c = mapping(raw, where)
    name = dns_label(c.get("name"), f"{where}.name") if strict else str(c.get("name", f"#{index}"))
    return Container(
        kind=kind,
        index=index,
        name=name,
        command=strings(c.get("command"), f"{where}.command") or None,
        args=strings(c.get("args"), f"{where}.args") or None,
        env=_env(c.get("env"), f"{where}.env", strict),
        prestop=_prestop(c, where, strict),
        gpus=container_gpus(c, where, pod_claims, context),
        raw=c,
    )


@dataclass(frozen=True)
class PodSpec:
    """A pod spec's containers of every kind, and the settings that decide how it stops."""

    init_containers: tuple[Container, ...]
    """Init containers and native sidecars (kind SIDECAR), in their order."""
    containers: tuple[Container, ...]
    ephemeral_containers: tuple[Container, ...]
    grace_seconds: int
    share_process_namespace: bool
    host_pid: bool
    windows: bool
    """It can run on Windows nodes only (``windows_only``): none of the rules apply there."""
    raw: Mapping[str, Any]

    @property
    def every_container(self) -> tuple[Container, ...]:
        return self.init_containers + self.containers + self.ephemeral_containers

    @property
    def gpu_containers(self) -> tuple[Container, ...]:
        """The containers that ask for a GPU: init containers and native sidecars too (a GPU held
        by an init container blocks the pod's start; by a sidecar, its whole life); not ephemeral
        ones (a debugger attached by hand)."""
        return tuple(c for c in self.init_containers + self.containers if c.gpu)


OS_LABELS = ("kubernetes.io/os", "beta.kubernetes.io/os")
"""The node labels the kubelet sets to its OS, ``linux`` or ``windows`` (the beta one deprecated, still set)."""


def _windows_term(term: Any) -> bool:
    """A nodeSelectorTerm that only a Windows node matches: one of its expressions (ANDed) asks an OS
    label to be ``In`` windows alone, or ``NotIn`` linux."""
    expressions = term.get("matchExpressions") if isinstance(term, Mapping) else None
    for e in expressions if isinstance(expressions, list) else []:
        values = e.get("values") if isinstance(e, Mapping) else None
        if not isinstance(values, list) or e.get("key") not in OS_LABELS:
            continue
        if e.get("operator") == "In" and values and all(v == "windows" for v in values):
            return True
        if e.get("operator") == "NotIn" and "linux" in values:
            return True
    return False


def windows_only(spec: Mapping[str, Any]) -> bool:
    """The pod can run on Windows nodes only: ``spec.os.name: windows``, a ``nodeSelector`` on the
    node's OS label, or a required node affinity every term of which (they are ORed) asks for it.
    Lenient: a field of a wrong type says nothing."""
    os_field = spec.get("os")
    if isinstance(os_field, Mapping) and os_field.get("name") == "windows":
        return True
    selector = spec.get("nodeSelector")
    if isinstance(selector, Mapping) and any(selector.get(label) == "windows" for label in OS_LABELS):
        return True
    affinity = spec.get("affinity")
    node = affinity.get("nodeAffinity") if isinstance(affinity, Mapping) else None
    required = node.get("requiredDuringSchedulingIgnoredDuringExecution") if isinstance(node, Mapping) else None
    terms = required.get("nodeSelectorTerms") if isinstance(required, Mapping) else None
    return isinstance(terms, list) and bool(terms) and all(_windows_term(t) for t in terms)


def _with_fraction(containers: list[Container], annotations: Mapping[str, Any]) -> None:
    """Give the fractional GPU of the pod's annotations to its container (KAI, run.ai)."""
    asked = [(a, annotations[a]) for a in FRACTION_ANNOTATIONS if str(annotations.get(a, "")).strip() not in ("", "0")]
    if not asked or not containers:
        return
    named = annotations.get(FRACTION_CONTAINER_ANNOTATION)
    chosen = next((i for i, c in enumerate(containers) if c.name == named), None) if named else None
    if chosen is None:
        chosen = next((i for i, c in enumerate(containers) if c.kind is ContainerKind.REGULAR), None)
    if chosen is None:
        return
    name, value = asked[0]
    request = GpuRequest(GpuResource(f"annotation {name}", "nvidia", GpuForm.FRACTION), str(value))
    containers[chosen] = dataclasses.replace(containers[chosen], gpus=(*containers[chosen].gpus, request))


def read_pod_spec(
    spec: object,
    *,
    strict: bool = False,
    between: Callable[[], None] = lambda: None,
    context: GpuContext | None = None,
) -> PodSpec:
    """``spec`` (a pod's or a template's ``spec``) as a PodSpec; ``between`` is called before each
    container (a review's deadline); ``context`` adds the GPUs a pod's annotations and DRA claims
    give. Raises ManifestError naming the field (see the module's docstring for what each mode
    refuses)."""
    spec = mapping(spec, "spec")
    context = context or GpuContext()
    pod_claims = read_pod_claims(spec)

    def listed(kind: ContainerKind) -> tuple[Container, ...]:
        out = []
        for i, raw in enumerate(sequence(spec.get(kind.field), f"spec.{kind.field}")):
            between()
            sidecar = kind is ContainerKind.INIT and isinstance(raw, Mapping) and raw.get("restartPolicy") == "Always"
            out.append(_container(raw, ContainerKind.SIDECAR if sidecar else kind, i, strict, pod_claims, context))
        return tuple(out)

    grace = spec.get("terminationGracePeriodSeconds")
    if grace is None:
        grace = DEFAULT_GRACE_SECONDS
    else:  # a lenient reader judges a negative grace as written (what the API server makes of it is its own)
        grace = integer(grace, "spec.terminationGracePeriodSeconds", 0 if strict else None)
    share = spec.get("shareProcessNamespace", False)
    ordinary = list(listed(ContainerKind.INIT) + listed(ContainerKind.REGULAR))
    _with_fraction(ordinary, mapping(context.annotations, "metadata.annotations"))
    inits = sum(1 for c in ordinary if c.kind is not ContainerKind.REGULAR)
    pod = PodSpec(
        init_containers=tuple(ordinary[:inits]),
        containers=tuple(ordinary[inits:]),
        ephemeral_containers=listed(ContainerKind.EPHEMERAL),
        grace_seconds=grace,
        share_process_namespace=boolean(share, "spec.shareProcessNamespace") if strict else share is True,
        host_pid=spec.get("hostPID") is True,
        windows=mapping(spec.get("os"), "spec.os").get("name") == "windows" or windows_only(spec),
        raw=spec,
    )
    if strict:
        names = [c.name for c in pod.every_container]
        if len(set(names)) != len(names):
            raise ManifestError("spec.containers: two containers with one name")
    return pod
