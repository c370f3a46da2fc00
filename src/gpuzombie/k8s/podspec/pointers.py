"""JSON pointers (RFC 6901): how a place in a document is named, in patches, findings and messages."""

from __future__ import annotations

from typing import Any


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
