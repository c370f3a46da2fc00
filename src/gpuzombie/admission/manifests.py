"""Pod specs out of Kubernetes manifests: Pods, any object with a pod template (Deployment,
StatefulSet, DaemonSet, ReplicaSet, Job, CronJob, PodTemplate, custom resources that follow the
``spec.template`` convention), ``kind: List``, multi-document YAML or JSON, ``helm template`` output.

Each pod found is a ``PodRef``: the document it is in, and a JSON pointer to the pod-shaped object
(``metadata`` + ``spec``: the Pod itself, or the template), so a fix can be applied in place.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any


class ManifestError(ValueError):
    """Input that is not YAML or JSON; the message is one line with where it broke."""


@dataclass(frozen=True)
class Document:
    index: int
    data: Any
    node: Any
    """The YAML node (line numbers for SARIF); None for JSON read as JSON."""


@dataclass(frozen=True)
class PodRef:
    document: int
    kind: str
    name: str
    namespace: str | None
    pointer: str
    """JSON pointer, in the document, to the pod-shaped object (``""`` for a Pod)."""
    pod: Mapping[str, Any]

    @property
    def spec(self) -> Mapping[str, Any]:
        spec = self.pod.get("spec")
        return spec if isinstance(spec, Mapping) else {}

    @property
    def label(self) -> str:
        where = f"{self.namespace}/" if self.namespace else ""
        return f"{self.kind}/{where}{self.name}"


def _loader() -> Any:
    import yaml

    return getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def load_documents(text: str) -> list[Document]:
    """Every non-empty document of ``text``. Raises ManifestError."""
    import yaml

    loader_class = _loader()
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


def escape(key: str) -> str:
    """A key as one JSON pointer token (RFC 6901)."""
    return key.replace("~", "~0").replace("/", "~1")


def _template_pointer(obj: Mapping[str, Any]) -> str | None:
    def pod_shaped(value: Any) -> bool:
        return isinstance(value, Mapping) and isinstance(value.get("spec"), Mapping) and "containers" in value["spec"]

    spec = obj.get("spec")
    if obj.get("kind") == "Pod":
        return ""
    if obj.get("kind") == "PodTemplate" and pod_shaped(obj.get("template")):
        return "/template"
    if not isinstance(spec, Mapping):
        return None
    if pod_shaped(spec.get("template")):
        return "/spec/template"
    job = spec.get("jobTemplate")
    if isinstance(job, Mapping) and isinstance(job.get("spec"), Mapping) and pod_shaped(job["spec"].get("template")):
        return "/spec/jobTemplate/spec/template"
    return None


def resolve(doc: Any, pointer: str) -> Any:
    for token in pointer.split("/")[1:] if pointer else []:
        token = token.replace("~1", "/").replace("~0", "~")
        doc = doc[int(token)] if isinstance(doc, list) else doc[token]
    return doc


def _walk(obj: Any, document: int, prefix: str, namespace: str | None) -> Iterator[PodRef]:
    if not isinstance(obj, Mapping):
        return
    kind = obj.get("kind")
    meta: Mapping[str, Any] = obj["metadata"] if isinstance(obj.get("metadata"), Mapping) else {}
    own = meta.get("namespace") if isinstance(meta.get("namespace"), str) else namespace
    if isinstance(kind, str) and kind.endswith("List") and isinstance(obj.get("items"), list):
        for i, item in enumerate(obj["items"]):
            yield from _walk(item, document, f"{prefix}/items/{i}", own)
        return
    pointer = _template_pointer(obj)
    if pointer is None or not isinstance(kind, str):
        return
    name = meta.get("name") or meta.get("generateName") or "(unnamed)"
    yield PodRef(document, kind, str(name), own, prefix + pointer, resolve(obj, pointer))


def pods(documents: list[Document]) -> Iterator[PodRef]:
    """Every pod spec of ``documents``, in order."""
    for doc in documents:
        yield from _walk(doc.data, doc.index, "", None)


def line_of(node: Any, pointer: str) -> int | None:
    """The 1-based line of ``pointer`` in a YAML node tree (as deep as the pointer resolves)."""
    if node is None:
        return None
    line = int(node.start_mark.line) + 1
    for token in pointer.split("/")[1:] if pointer else []:
        token = token.replace("~1", "/").replace("~0", "~")
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
