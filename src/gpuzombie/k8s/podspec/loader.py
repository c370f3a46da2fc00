"""Text -> documents: multi-document YAML or JSON with the YAML nodes (line numbers), and the
objects in them (``kind: List`` opened). Input nested too deep for the parser is a
``ManifestError``, never a crash."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpuzombie.k8s.podspec.fields import ManifestError
from gpuzombie.k8s.podspec.pointers import tokens


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
