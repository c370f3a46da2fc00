"""The one model of a pod spec: pure functions over manifests (dicts as the API sends them, or as
YAML gives them), shared by the admission rules (``gpuzombie check``, the webhook), ``lab pod`` and
the node agent's reading of the kubelet's device assignments.

Three layers, each usable alone:

* text -> ``Document`` (``load_documents``: multi-document YAML or JSON, with line numbers);
* document -> ``PodTemplate``: each pod-shaped object, located by a JSON pointer in its document
  (``kind: List`` opened, the Pod itself, ``spec.template``, a CronJob's job template); a reader of
  custom resources (Ray, training operators, LeaderWorkerSet...) adds pointers in ``_template_pointers``;
* pod spec -> ``PodSpec``: its containers of every kind (init, native sidecar, regular, ephemeral),
  each with its argv, literal env, preStop hook and the GPUs it asks for, and the pod's grace.

``read_pod_spec`` has two modes. Lenient (admission): a wrong type where the API takes a list or a
map is a ``ManifestError``, anything else it cannot judge is left out (an env value from a secret, an
httpGet hook). Strict (the lab, which must run what it reads): names must be what the API server
takes and a hook exactly one handler; the caller refuses the fields it does not apply by name.

GPU recognition is ``gpu_resource`` alone: every reader (admission, the lab, the kubelet's device
assignments) asks it. A container's GPUs are ``GpuRequest``s, so another way to ask for one (a DRA
claim in ``resources.claims``, resolved against the pod's ``resourceClaims`` in ``read_pod_spec``)
adds requests, not a second model.
"""

from __future__ import annotations

import dataclasses
import enum
import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpuzombie.pid1kinds import SHELLS

DEFAULT_GRACE_SECONDS = 30
"""What the API server defaults ``terminationGracePeriodSeconds`` to (a file may leave it out)."""


class ManifestError(ValueError):
    """Input that is not a manifest the reader takes: not YAML or JSON, a wrong type where the API
    takes a list or a map, or (strict) a value the API server would refuse. One line, naming the
    field (``spec.containers[0].args``) or the line."""


# -- GPU resources ------------------------------------------------------------------------------


class GpuForm(enum.Enum):
    WHOLE = "whole"
    MIG = "mig"
    """A MIG instance (the device plugin's mixed strategy): a slice with its own memory."""
    SHARED = "shared"
    """A time-sliced or MPS replica (the device plugin's ``renameByDefault``): one GPU, many pods."""
    FRACTION = "fraction"
    """A fraction the scheduler gives (KAI's and run.ai's ``gpu-fraction`` annotation)."""
    DRA = "dra"
    """A DRA claim whose device class is a GPU class (``gpu.nvidia.com``, ``mig.nvidia.com``)."""
    DRA_ASSUMED = "dra-assumed"
    """A DRA claim whose device class is not in the input: assumed a GPU, said so."""


@dataclass(frozen=True)
class GpuResource:
    name: str
    vendor: str
    """``nvidia`` or ``amd``: whose ids the kubelet's device assignments carry."""
    form: GpuForm


_GPU_NAMES = {
    "nvidia.com/gpu": ("nvidia", GpuForm.WHOLE),
    "nvidia.com/gpu.shared": ("nvidia", GpuForm.SHARED),
    "amd.com/gpu": ("amd", GpuForm.WHOLE),
}
_GPU_PREFIXES = {"nvidia.com/mig-": ("nvidia", GpuForm.MIG)}
"""The device plugins' extended resources that are GPUs (``nvidia.com/mig-1g.10gb``,
``nvidia.com/mig-1g.10gb.shared``: MIG, shared or not)."""


def gpu_resource(name: str) -> GpuResource | None:
    """The GPU an extended resource name stands for, or None (cpu, memory, a NIC, ...)."""
    if name in _GPU_NAMES:
        return GpuResource(name, *_GPU_NAMES[name])
    for prefix, (vendor, form) in _GPU_PREFIXES.items():
        if name.startswith(prefix):
            return GpuResource(name, vendor, form)
    return None


@dataclass(frozen=True)
class GpuRequest:
    """A GPU a container asks for: a device plugin's resource with a non-zero quantity, a
    fractional-GPU annotation, or a DRA claim (its name is the resource's name then)."""

    resource: GpuResource
    quantity: str


GPU_DEVICE_CLASSES = frozenset({"gpu.nvidia.com", "mig.nvidia.com", "vfio.gpu.nvidia.com", "gpu.amd.com"})
"""DRA device classes that are GPUs by default (NVIDIA's DRA driver's GPU, MIG and VFIO classes,
AMD's); ``--gpu-device-class`` adds more. NVIDIA's ``compute-domain-*`` classes (IMEX channels)
are not GPUs."""
FRACTION_ANNOTATIONS = ("gpu-fraction", "gpu-memory")
"""KAI-Scheduler's (and run.ai's) fractional-GPU annotations on the pod; the GPU goes to the
container ``gpu-fraction-container-name`` names, the first regular container by default."""
FRACTION_CONTAINER_ANNOTATION = "gpu-fraction-container-name"


@dataclass(frozen=True)
class GpuContext:
    """What decides a container's GPUs beyond its own resources: the pod's annotations, the DRA
    claims and claim templates of the input (name -> device classes) and the GPU device classes."""

    annotations: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    claim_classes: Mapping[str, tuple[str, ...]] = dataclasses.field(default_factory=dict)
    """``ResourceClaim/NAME`` and ``ResourceClaimTemplate/NAME`` -> their requests' device classes."""
    gpu_device_classes: frozenset[str] = GPU_DEVICE_CLASSES


def _device_classes(claim_spec: Any) -> tuple[str, ...]:
    """The device classes a claim's spec requests (resource.k8s.io v1 ``exactly`` and
    ``firstAvailable``, v1beta1's flat ``deviceClassName``)."""
    devices = claim_spec.get("devices") if isinstance(claim_spec, Mapping) else None
    requests = devices.get("requests") if isinstance(devices, Mapping) else None
    found: list[str] = []
    for request in requests if isinstance(requests, list) else []:
        if not isinstance(request, Mapping):
            continue
        options = [request, request.get("exactly")]
        options += request["firstAvailable"] if isinstance(request.get("firstAvailable"), list) else []
        found += [
            o["deviceClassName"]
            for o in options
            if isinstance(o, Mapping) and isinstance(o.get("deviceClassName"), str)
        ]
    return tuple(found)


def claim_classes(documents: Sequence[Document]) -> dict[str, tuple[str, ...]]:
    """Every ResourceClaim and ResourceClaimTemplate of ``documents`` -> its device classes."""
    out: dict[str, tuple[str, ...]] = {}
    for obj in objects(documents):
        data = obj.data
        if not isinstance(data, Mapping) or data.get("kind") not in ("ResourceClaim", "ResourceClaimTemplate"):
            continue
        meta, spec = data.get("metadata"), data.get("spec")
        if not isinstance(meta, Mapping) or not isinstance(spec, Mapping):
            continue  # not a claim the API server takes: nothing to resolve against
        out[f"{data['kind']}/{meta.get('name')}"] = _device_classes(
            spec.get("spec") if data["kind"] == "ResourceClaimTemplate" else spec
        )
    return out


# -- typed access, one message form ---------------------------------------------------------------

_JSON_TYPES = {bool: "true/false", int: "a number", float: "a number", str: "a string", list: "a list"}


def _shown_type(value: object) -> str:
    if value is None:
        return "null"
    if isinstance(value, Mapping):
        return "a map"
    return _JSON_TYPES.get(type(value), type(value).__name__)


def mapping(value: object, where: str) -> Mapping[str, Any]:
    """``value`` as a map; absent (None) is empty."""
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ManifestError(f"{where} is not a map ({_shown_type(value)})")
    return value


def sequence(value: object, where: str) -> Sequence[Any]:
    """``value`` as a list; absent (None) is empty."""
    if value is None:
        return []
    if not isinstance(value, list):
        raise ManifestError(f"{where} is not a list ({_shown_type(value)})")
    return value


def strings(value: object, where: str) -> tuple[str, ...]:
    """A list of strings (as the API takes ``command``, ``args``: a number is refused there too)."""
    items = sequence(value, where)
    if not all(isinstance(i, str) for i in items):
        raise ManifestError(f"{where} holds something other than strings")
    return tuple(items)


def integer(value: object, where: str, minimum: int | None = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or (minimum is not None and value < minimum):
        bound = "" if minimum is None else f" >= {minimum}"
        raise ManifestError(f"{where}: expected an integer{bound}, got {value!r}")
    return value


def boolean(value: object, where: str) -> bool:
    if not isinstance(value, bool):
        raise ManifestError(f"{where}: expected true or false, got {value!r}")
    return value


QUANTITY = re.compile(r"^([0-9]+(?:\.[0-9]+)?)(Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E|m)?$")
SUFFIX = {
    "Ki": 2**10,
    "Mi": 2**20,
    "Gi": 2**30,
    "Ti": 2**40,
    "Pi": 2**50,
    "Ei": 2**60,
    "k": 10**3,
    "M": 10**6,
    "G": 10**9,
    "T": 10**12,
    "P": 10**15,
    "E": 10**18,
    "m": 1e-3,
}


def parse_quantity(value: object, where: str) -> float:
    """A Kubernetes quantity (``2Gi``, ``250m``, ``1``) as a number of base units."""
    m = QUANTITY.match(str(value).strip())
    if m is None or isinstance(value, bool):
        raise ManifestError(f"{where}: {value!r} is not a quantity the lab understands")
    return float(m.group(1)) * SUFFIX.get(m.group(2) or "", 1)


DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
DNS1123_LABEL_MAX = 63
DNS1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
DNS1123_SUBDOMAIN_MAX = 253
"""The API server's name rules (k8s.io/apimachinery validation ``IsDNS1123Label`` and
``IsDNS1123Subdomain``): a namespace, a container and a volume name is a label, a pod name a
subdomain. A strict reader checks them, because the lab makes paths of them (the pod's log
directory, each container's log file, each emptyDir's directory)."""


def dns_label(value: object, where: str) -> str:
    """``value`` if it is a DNS-1123 label (a namespace, container or volume name)."""
    if not isinstance(value, str) or len(value) > DNS1123_LABEL_MAX or not DNS1123_LABEL.match(value):
        raise ManifestError(
            f"{where}: {value!r} is not a DNS-1123 label (at most {DNS1123_LABEL_MAX} lower-case letters, "
            "digits and '-', starting and ending with a letter or digit), as the API server requires"
        )
    return value


def dns_subdomain(value: object, where: str) -> str:
    """``value`` if it is a DNS-1123 subdomain (a pod name)."""
    if not isinstance(value, str) or len(value) > DNS1123_SUBDOMAIN_MAX or not DNS1123_SUBDOMAIN.match(value):
        raise ManifestError(
            f"{where}: {value!r} is not a DNS-1123 subdomain (at most {DNS1123_SUBDOMAIN_MAX} lower-case "
            "letters, digits, '-' and '.', each part starting and ending with a letter or digit), as the "
            "API server requires"
        )
    return value


# -- containers ------------------------------------------------------------------------------------


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


def _dra_requests(
    resources: Mapping[str, Any], where: str, pod_claims: Mapping[str, str | None], context: GpuContext
) -> Iterator[GpuRequest]:
    """The GPUs a container's ``resources.claims`` ask for through the pod's ``resourceClaims``."""
    for i, claim in enumerate(sequence(resources.get("claims"), f"{where}.resources.claims")):
        name = mapping(claim, f"{where}.resources.claims[{i}]").get("name")
        if not isinstance(name, str) or name not in pod_claims:
            continue
        source = pod_claims[name]
        classes = context.claim_classes.get(source) if source is not None else None
        if classes is None:
            yield GpuRequest(GpuResource(f"claim {name}", "unknown", GpuForm.DRA_ASSUMED), "DRA claim, assumed GPU")
            continue
        for device_class in classes:
            if device_class in context.gpu_device_classes:
                vendor = "amd" if device_class.endswith("amd.com") else "nvidia"
                yield GpuRequest(GpuResource(device_class, vendor, GpuForm.DRA), f"claim {name}")
                break


def _gpu_requests(
    container: Mapping[str, Any],
    where: str,
    pod_claims: Mapping[str, str | None] | None = None,
    context: GpuContext | None = None,
) -> tuple[GpuRequest, ...]:
    resources = mapping(container.get("resources"), f"{where}.resources")
    found: dict[str, GpuRequest] = {}
    if pod_claims and context is not None:
        found.update((r.resource.name, r) for r in _dra_requests(resources, where, pod_claims, context))
    for part in ("limits", "requests"):
        for name, quantity in mapping(resources.get(part), f"{where}.resources.{part}").items():
            gpu = gpu_resource(str(name))
            if gpu is not None and str(quantity).strip() not in ("0", "") and gpu.name not in found:
                found[gpu.name] = GpuRequest(gpu, str(quantity))
    return tuple(found.values())


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
        gpus=_gpu_requests(c, where, pod_claims, context),
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


def _pod_claims(spec: Mapping[str, Any]) -> dict[str, str | None]:
    """The pod's ``resourceClaims``: name -> ``ResourceClaim/NAME`` or ``ResourceClaimTemplate/NAME``
    (None when it names neither)."""
    out: dict[str, str | None] = {}
    for i, claim in enumerate(sequence(spec.get("resourceClaims"), "spec.resourceClaims")):
        claim = mapping(claim, f"spec.resourceClaims[{i}]")
        if not isinstance(claim.get("name"), str):
            continue
        source = None
        for field, kind in (
            ("resourceClaimName", "ResourceClaim"),
            ("resourceClaimTemplateName", "ResourceClaimTemplate"),
        ):
            if isinstance(claim.get(field), str):
                source = f"{kind}/{claim[field]}"
        out[claim["name"]] = source
    return out


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
    pod_claims = _pod_claims(spec)

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


# -- documents and the pod templates in them -----------------------------------------------------


@dataclass(frozen=True)
class Document:
    index: int
    data: Any
    node: Any
    """The YAML node (line numbers for SARIF)."""


def load_documents(text: str) -> list[Document]:
    """Every non-empty document of ``text`` (YAML, or JSON: YAML reads it). Raises ManifestError."""
    import yaml

    loader_class = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    try:
        nodes = list(yaml.compose_all(text, Loader=loader_class))
        documents = []
        for i, node in enumerate(nodes):
            if node is None:
                continue
            data = loader_class("").construct_document(node)
            if data is not None:
                documents.append(Document(i, data, node))
        return documents
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise ManifestError(f"not YAML or JSON{where}: {problem}") from exc
    except (RecursionError, ValueError) as exc:
        raise ManifestError(f"not a manifest: {type(exc).__name__}") from exc


@dataclass(frozen=True)
class Object:
    """One Kubernetes object of a document (an item of a ``kind: List`` is one too)."""

    document: int
    pointer: str
    """JSON pointer to the object in its document (``""``, or ``/items/3``)."""
    data: Any
    namespace: str | None
    """Its own, or the one its List gives it."""


def objects(documents: Sequence[Document]) -> Iterator[Object]:
    """Every object of ``documents``, ``kind: List`` (and ``PodList``...) opened, in order."""
    for doc in documents:
        yield from _open(doc.data, doc.index, "", None)


def _open(obj: Any, document: int, pointer: str, namespace: str | None) -> Iterator[Object]:
    meta = obj.get("metadata") if isinstance(obj, Mapping) else None
    if isinstance(meta, Mapping) and isinstance(meta.get("namespace"), str):
        namespace = meta["namespace"]
    kind = obj.get("kind") if isinstance(obj, Mapping) else None
    if isinstance(kind, str) and kind.endswith("List") and isinstance(obj.get("items"), list):
        for i, item in enumerate(obj["items"]):
            yield from _open(item, document, f"{pointer}/items/{i}", namespace)
        return
    yield Object(document, pointer, obj, namespace)


def pointer_token(key: str) -> str:
    """A key as one JSON pointer token (RFC 6901)."""
    return key.replace("~", "~0").replace("/", "~1")


def tokens(pointer: str) -> list[str]:
    """The unescaped tokens of a JSON pointer."""
    return [t.replace("~1", "/").replace("~0", "~") for t in pointer.split("/")[1:]] if pointer else []


def resolve(doc: Any, pointer: str) -> Any:
    for token in tokens(pointer):
        doc = doc[int(token)] if isinstance(doc, list) else doc[token]
    return doc


def dotted(pointer: str) -> str:
    """A JSON pointer as a field path in messages (``/spec/workerGroupSpecs/0/template`` ->
    ``spec.workerGroupSpecs[0].template``)."""
    out = ""
    for token in tokens(pointer):
        out += f"[{token}]" if token.isdigit() else f".{token}" if out else token
    return out


_PLAIN_PATHS = frozenset({"", "template", "spec.template", "spec.jobTemplate.spec.template"})
"""Where a Pod, a PodTemplate and the built-in workloads hold their one template: not repeated in labels."""


@dataclass(frozen=True)
class PodTemplate:
    """A pod-shaped object (``metadata`` + ``spec``: a Pod, or a workload's template) where it
    stands: its document, and a JSON pointer to it there, so a fix applies in place. A bare pod
    spec (KServe's LLMInferenceService ``spec.template``, its predictor) stands in a pod of its own
    with no metadata: ``bare``, and its pointer is the spec's."""

    document: int
    kind: str
    """The kind of the object that holds it (Deployment, Pod...)."""
    name: str
    namespace: str | None
    pointer: str
    """JSON pointer, in the document, to the pod-shaped object (``""`` for a Pod)."""
    pod: Mapping[str, Any]
    bare: bool = False
    object_pointer: str = ""
    """JSON pointer to the object that holds it (an item of a List)."""
    container: Mapping[str, Any] | None = None
    """A container standing for a pod whose other parts an operator writes (an Argo Workflow's
    ``container`` or ``script`` template, a KServe model-format predictor): its map; then ``pod``
    is the one-container pod made of it (``single_container_pods``) and the pointer the map's.
    ``--patch`` leaves it alone."""

    @property
    def node(self) -> Any:
        """What it stands for in its document: the pod-shaped map, the bare spec, Argo's container."""
        if self.container is not None:
            return self.container
        return self.spec if self.bare else self.pod

    @property
    def spec(self) -> Mapping[str, Any]:
        spec = self.pod.get("spec")
        return spec if isinstance(spec, Mapping) else {}

    @property
    def annotations(self) -> Mapping[str, Any]:
        meta = self.pod.get("metadata")
        annotations = meta.get("annotations") if isinstance(meta, Mapping) else None
        return annotations if isinstance(annotations, Mapping) else {}

    @property
    def path(self) -> str:
        """Where it stands in its object (``spec.workerGroupSpecs[0].template``; ``""``: the object)."""
        return dotted(self.pointer[len(self.object_pointer) :])

    @property
    def label(self) -> str:
        where = f"{self.namespace}/" if self.namespace else ""
        shown = "" if self.path in _PLAIN_PATHS else f" {self.path}"
        return f"{self.kind}/{where}{self.name}{shown}"

    def locate(self, pod_pointer: str) -> str | None:
        """A pointer into the pod (``/spec/containers/0``) as one into the document; None where a
        bare spec has no such place (its pod's metadata)."""
        if self.container is not None:
            inside = pod_pointer.removeprefix(SINGLE_CONTAINER_POINTER)
            return self.pointer + inside if inside != pod_pointer else None
        if not self.bare:
            return self.pointer + pod_pointer
        if pod_pointer == "/spec" or pod_pointer.startswith("/spec/"):
            return self.pointer + pod_pointer[len("/spec") :]
        return None


def _container_list(value: Any) -> bool:
    """A list of containers: maps with a ``name`` or an ``image`` (KServe's LLMInferenceService
    leaves the image to its config)."""
    return (
        isinstance(value, list)
        and bool(value)
        and all(isinstance(c, Mapping) and ("image" in c or "name" in c) for c in value)
    )


def _pod_spec_shaped(value: Any) -> bool:
    """A PodSpec: a map with ``containers``, a list of maps with an ``image``."""
    return isinstance(value, Mapping) and _container_list(value.get("containers"))


def _pod_shaped(value: Any) -> bool:
    return isinstance(value, Mapping) and isinstance(value.get("spec"), Mapping) and "containers" in value["spec"]


MAX_SEARCH_NODES = 100_000
"""The structural searches visit at most this many maps and lists of one object (YAML aliases can
make a small file a huge tree: each node is visited once, by identity)."""

_Path = tuple[Any, str] | None
"""A place in a document, built lazily: (the parent's place, this token); None is the root."""


def _pointer(path: _Path) -> str:
    found: list[str] = []
    while path is not None:
        path, token = path
        found.append(token)
    return "".join(f"/{pointer_token(t)}" for t in reversed(found))


class _Search:
    """Every map and list under ``root`` once (by identity; ``skip``'s ids not at all), depth
    first in document order, at most MAX_SEARCH_NODES: iterate for (place, value); ``prune(place)``
    keeps the search out of the value just given; ``truncated`` says it stopped at the bound."""

    def __init__(self, root: Any, skip: set[int] | None = None) -> None:
        self.stack: list[tuple[_Path, Any]] = [(None, root)]
        self.seen = set(skip or ())
        self.pruned = False
        self.truncated = False

    def __iter__(self) -> Iterator[tuple[_Path, Any]]:
        while self.stack:
            if len(self.seen) >= MAX_SEARCH_NODES:
                self.truncated = True
                return
            path, value = self.stack.pop()
            if id(value) in self.seen:
                continue
            self.seen.add(id(value))
            self.pruned = False
            yield path, value
            if self.pruned:
                continue
            items = value.items() if isinstance(value, Mapping) else enumerate(value)
            children = [((path, str(k)), v) for k, v in items if isinstance(v, (Mapping, list))]
            self.stack += reversed(children)

    def prune(self) -> None:
        self.pruned = True


def _template_pointers(obj: Mapping[str, Any]) -> Iterator[tuple[str, bool]]:
    """Where ``obj`` holds pod templates, relative to it, and whether each is a bare pod spec: a
    search of the whole object for PodTemplateSpec-shaped maps (``metadata``/``spec`` with
    ``containers``) and bare PodSpecs, which finds every kind's known paths (docs/admission.md's
    table) and those of kinds it does not know. It does not look inside what it found, nor in
    a template's metadata."""
    if obj.get("kind") == "Pod":
        yield "", False
        return
    search = _Search(obj)
    for path, value in search:
        if path is None or not isinstance(value, Mapping):
            continue
        if path[1] == "metadata":
            search.prune()
        elif _pod_shaped(value) and _pod_spec_shaped(value["spec"]):
            search.prune()
            yield _pointer(path), False
        elif _pod_spec_shaped(value):
            search.prune()
            yield _pointer(path), True


ARGO_KINDS = frozenset({"Workflow", "WorkflowTemplate", "ClusterWorkflowTemplate", "CronWorkflow"})
ARGO_EXECUTOR = ("/var/run/argo/argoexec", "emissary", "--")
"""What Argo's controller puts before a main container's command (its ENTRYPOINT looked up when the
template has none): argoexec is PID 1, starts the command in a process group of its own, forwards
every signal to that group and reaps every child (``wait4(-1)``) until the command exits, as an
init does (argo-workflows workflow/controller/workflowpod.go, workflow/executor/osspecific)."""
ARGO_SCRIPT = "/argo/staging/script"
"""Where Argo writes a ``script`` template's ``source``, the last argument of its ``command``."""
SINGLE_CONTAINER_POINTER = "/spec/containers/0"
KSERVE_KINDS = frozenset({"InferenceService"})
KSERVE_MODEL_FORMATS = (
    "sklearn",
    "xgboost",
    "tensorflow",
    "pytorch",
    "triton",
    "onnx",
    "huggingface",
    "pmml",
    "lightgbm",
    "paddle",
    "model",
    "art",
)
"""InferenceService components' model-format fields (kserve pkg/apis/serving/v1beta1 predictor.go,
explainer.go): each a container merged into a ServingRuntime's, named ``kserve-container``."""
KSERVE_CONTAINER = "kserve-container"


def _map_or_empty(value: Any) -> Mapping[str, Any]:
    """``value`` where it is a map; an empty one for anything else (a reader that finds no place)."""
    return value if isinstance(value, Mapping) else {}


def _argo_pointers(obj: Mapping[str, Any]) -> Iterator[str]:
    """``spec.templates[i].container`` and ``.script`` of an Argo Workflow, WorkflowTemplate,
    ClusterWorkflowTemplate and CronWorkflow (``spec.workflowSpec.templates``)."""
    if not str(obj.get("apiVersion", "")).startswith("argoproj.io/") or obj.get("kind") not in ARGO_KINDS:
        return
    spec, prefix = _map_or_empty(obj.get("spec")), "/spec"
    if obj["kind"] == "CronWorkflow":
        spec, prefix = _map_or_empty(spec.get("workflowSpec")), "/spec/workflowSpec"
    templates = spec.get("templates")
    for i, template in enumerate(templates if isinstance(templates, list) else []):
        for field in ("container", "script"):
            if isinstance(template, Mapping) and isinstance(template.get(field), Mapping):
                yield f"{prefix}/templates/{i}/{field}"


def _argo_main(container: Mapping[str, Any], script: bool) -> dict[str, Any]:
    """The main container Argo runs for a ``container`` or ``script`` template: its command
    behind argoexec; a script's ``source`` is the file its command runs (a shell's ``-c`` script
    here, so the shell reading sees it)."""
    command = container.get("command")
    words = [str(w) for w in command] if isinstance(command, list) else []
    if script:
        source = container.get("source")
        shell = bool(words) and words[0].rsplit("/", 1)[-1] in SHELLS - {"busybox"}
        words += ["-c", source] if shell and isinstance(source, str) else [ARGO_SCRIPT]
    return {**container, "name": "main", "command": [*ARGO_EXECUTOR, *words]}


def _kserve_pointers(obj: Mapping[str, Any]) -> Iterator[str]:
    """``spec.<component>.<model format>`` of a KServe InferenceService."""
    if not str(obj.get("apiVersion", "")).startswith("serving.kserve.io/") or obj.get("kind") not in KSERVE_KINDS:
        return
    spec = _map_or_empty(obj.get("spec"))
    for component in ("predictor", "transformer", "explainer"):
        part = spec.get(component)
        for field in KSERVE_MODEL_FORMATS:
            if isinstance(part, Mapping) and isinstance(part.get(field), Mapping):
                yield f"/spec/{component}/{field}"


def single_container_pods(obj: Mapping[str, Any]) -> Iterator[tuple[str, Mapping[str, Any]]]:
    """The containers of ``obj`` that stand for a pod an operator writes around them, each as
    (pointer, the one-container pod): Argo's ``container``/``script`` templates (PID 1 argoexec, an
    init) and KServe's model formats (PID 1 the ServingRuntime's, which the file does not show)."""
    for pointer in _argo_pointers(obj):
        main = _argo_main(resolve(obj, pointer), pointer.endswith("/script"))
        yield pointer, {"spec": {"containers": [main]}}
    for pointer in _kserve_pointers(obj):
        yield pointer, {"spec": {"containers": [{**resolve(obj, pointer), "name": KSERVE_CONTAINER}]}}


def pod_templates(documents: Sequence[Document]) -> Iterator[PodTemplate]:
    """Every pod template of ``documents``, in order."""
    for obj in objects(documents):
        data = obj.data
        if not isinstance(data, Mapping) or not isinstance(data.get("kind"), str):
            continue
        meta = data["metadata"] if isinstance(data.get("metadata"), Mapping) else {}
        name = meta.get("name") or meta.get("generateName") or "(unnamed)"
        for pointer, pod in single_container_pods(data):
            yield PodTemplate(
                obj.document,
                data["kind"],
                str(name),
                obj.namespace,
                obj.pointer + pointer,
                pod,
                object_pointer=obj.pointer,
                container=resolve(data, pointer),
            )
        for pointer, bare in _template_pointers(data):
            found = resolve(data, pointer)
            pod = {"spec": found} if bare else found
            yield PodTemplate(
                obj.document, data["kind"], str(name), obj.namespace, obj.pointer + pointer, pod, bare, obj.pointer
            )


_EMBEDDED_GPU = re.compile(
    r"(?m)^[ \t]*[\"']?(nvidia\.com/gpu[\w.-]*|nvidia\.com/mig-[\w.-]+|amd\.com/gpu)[\"']?[ \t]*:[ \t]*[\"']?([1-9][0-9]*)"
)
"""A GPU resource with a quantity inside a string (Argo's ``resource.manifest``, a Helm value)."""


def unread_gpu_requests(
    documents: Sequence[Document], templates: Sequence[PodTemplate]
) -> Iterator[tuple[int, str, str]]:
    """GPU requests (a GPU resource name with a quantity, a ``gpu-fraction`` annotation) outside
    every template read: (document, JSON pointer, what). A file whose GPUs no reader understood is
    a finding, never a silent pass."""
    for doc in documents:
        search = _Search(doc.data, {id(t.node) for t in templates if t.document == doc.index})
        reported: set[str] = set()
        for path, value in search:
            items = value.items() if isinstance(value, Mapping) else enumerate(value)
            for key, item in items:
                if isinstance(item, str) and (embedded := _EMBEDDED_GPU.search(item)):
                    yield doc.index, _pointer((path, str(key))), f"{embedded[1]}: {embedded[2]} in an embedded manifest"
                elif (
                    isinstance(key, str)
                    and (gpu_resource(key) or key in FRACTION_ANNOTATIONS)
                    and isinstance(item, (str, int, float))
                    and str(item).strip() not in ("0", "")
                ):
                    holder = _pointer(path[0] if path is not None and path[1] in ("limits", "requests") else path)
                    if holder not in reported:  # a container's limits and requests: one finding
                        reported.add(holder)
                        yield doc.index, _pointer((path, key)), f"{key}: {item}"
        if search.truncated:  # stopped at its bound: what it did not see is not a silent pass either
            yield doc.index, "", f"over {MAX_SEARCH_NODES} maps and lists, not searched to the end for GPU requests"


def line_of(node: Any, pointer: str) -> int | None:
    """The 1-based line of ``pointer`` in a YAML node tree (as deep as the pointer resolves)."""
    if node is None:
        return None
    line = int(node.start_mark.line) + 1
    for token in tokens(pointer):
        value = node.value
        mark = None
        if isinstance(value, list) and value and isinstance(value[0], tuple):
            found = [(k, v) for k, v in value if getattr(k, "value", None) == token]
            node, mark = (found[-1][1], found[-1][0].start_mark) if found else (None, None)
        elif isinstance(value, list) and token.isdigit() and int(token) < len(value):
            node = value[int(token)]
            mark = node.start_mark
        else:
            node = None
        if node is None or mark is None:
            break
        line = int(mark.line) + 1  # a key's line, not its value's
    return line
