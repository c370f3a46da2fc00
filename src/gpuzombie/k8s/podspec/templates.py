"""Documents -> ``PodTemplate``s: every pod-shaped object where it stands (a Pod, a workload's
template, a bare pod spec, a container an operator wraps in a pod), found by a bounded search,
and the GPU requests no template holds."""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpuzombie.k8s.podspec.gpus import FRACTION_ANNOTATIONS, gpu_resource
from gpuzombie.k8s.podspec.loader import Document, objects
from gpuzombie.k8s.podspec.pointers import dotted, pointer_token, resolve
from gpuzombie.pid1kinds import SHELLS

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
