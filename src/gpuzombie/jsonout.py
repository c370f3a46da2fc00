"""The one JSON serializer of every report: dataclasses, enums, tuples and mappings to plain JSON.

A report that has a documented schema of its own says so with ``to_dict``; a field that holds bytes
and is rendered in MiB says so with ``metadata=IN_MIB`` (``gpu_memory`` becomes ``gpu_memory_mib``):
the model stays in bytes and MiB is only how the JSON shows it.
"""

from __future__ import annotations

import dataclasses
import enum
import json
from collections.abc import Mapping
from typing import Any

from gpuzombie.units import mib

IN_MIB: Mapping[str, str] = {"json": "mib"}
"""Field metadata: bytes in the model, ``<name>_mib`` (one decimal) in the JSON."""


def to_jsonable(value: Any) -> Any:
    """``value`` as plain JSON types, recursively (``to_dict`` first where a report has one)."""
    to_dict = getattr(value, "to_dict", None)
    if callable(to_dict) and not isinstance(value, type):
        return to_jsonable(to_dict())
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        out = {}
        for f in dataclasses.fields(value):
            item = getattr(value, f.name)
            if f.metadata.get("json") == "mib":
                out[f"{f.name}_mib"] = None if item is None else mib(item)
            else:
                out[f.name] = to_jsonable(item)
        return out
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, Mapping):
        return {str(k): to_jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_jsonable(v) for v in value]
    return value


@dataclasses.dataclass(frozen=True)
class SchemaReport:
    """A report whose JSON is its own fields, in order, under its schema (top's frame, the trace): the
    head they share, so their ``to_dict`` is written once."""

    schema: str
    taken_at: float

    def to_dict(self) -> dict[str, Any]:
        """The JSON form under ``schema`` (memory in MiB)."""
        return {f.name: to_jsonable(getattr(self, f.name)) for f in dataclasses.fields(self)}


def dumps(value: Any, *, indent: int | None = 2) -> str:
    """The JSON text of a report (observe, trace, prestop, lab results, or any dataclass)."""
    return json.dumps(to_jsonable(value), indent=indent)
