"""Options and output helpers shared by the commands."""

from __future__ import annotations

import dataclasses
import enum
import json
from typing import Any

import click

procfs_option = click.option(
    "--procfs",
    default="/proc",
    show_default=True,
    envvar="GPUZOMBIE_PROCFS",
    type=click.Path(file_okay=False),
    help="procfs root to read (a node agent reads /host/proc). Env: GPUZOMBIE_PROCFS.",
)
json_option = click.option("--json", "as_json", is_flag=True, help="Print JSON (schema in the README).")


def to_jsonable(value: Any) -> Any:
    """Dataclasses, enums, tuples and mappings to plain JSON types, recursively."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: to_jsonable(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, enum.Enum):
        return value.value
    if isinstance(value, dict):
        return {str(k): to_jsonable(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_jsonable(v) for v in value]
    return value


def echo_json(value: Any) -> None:
    click.echo(json.dumps(to_jsonable(value), indent=2, sort_keys=False))
