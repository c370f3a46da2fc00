"""`gpuzombie check` (and `webhook --patch`, which reads its inputs the same way) in CI on input a
pull request controls (issue 36, items 12 and 13), as a user runs them (real processes, real files,
FIFOs, symlinks and /dev/zero):

- every name a manifest (or its file) gives is escaped in every human-readable output: check's table
  and its error lines, webhook --patch's warnings and errors (JSON and SARIF carry them as data);
- a ``kind: List``'s own metadata suppresses nothing (kubectl drops it: it is no object's);
- an input named by itself is read with a bound, whatever ``st_size`` says, and one that is not a
  regular file (``/dev/zero``, a FIFO) is refused in one line;
- ``//abs/path`` is an absolute path in SARIF, not a network path;
- a directory walk does not read (nor ``--in-place`` write) a symlink to a file outside the directory.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from test_check import gpuzombie, one_line_error

yaml = pytest.importorskip("yaml", reason="PyYAML is in the 'admission' extra")

HOSTILE = "evil\x1b[2J\x1b]0;owned\x07\u202etxt.exe"
"""Clears the screen, retitles the terminal (OSC ... BEL), then reverses what follows (U+202E)."""
RAW = re.compile(r"[\x00-\x09\x0b-\x1f\x7f-\x9f\u061c\u200b-\u200f\u2028-\u202e\u2060-\u2069\ufeff]")
"""What must never reach a terminal: escape.py's set (a new line ends a line, and is allowed)."""
S1 = ["sh", "-c", "python3 train.py & exec sleep infinity"]


def pod(name: str, command: list[str] | None = S1, container: str = "train", **meta: Any) -> dict[str, Any]:
    c: dict[str, Any] = {"name": container, "image": "x", "resources": {"limits": {"nvidia.com/gpu": 1}}}
    if command is not None:
        c["command"] = command
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, **meta}, "spec": {"containers": [c]}}


def raw_characters(text: str) -> list[str]:
    return sorted(set(RAW.findall(text)))


# -- item 12: names escaped in every human-readable output --------------------------------------------


def cells(table: str, column: int) -> str:
    """The text of one column of the table's first row, its folded lines joined."""
    rows = [line.split("│") for line in table.splitlines() if line.startswith("│")]
    return " ".join(r[column].strip() for r in rows).strip()


def test_the_table_escapes_every_name_of_the_manifest_and_its_file(tmp_path: Path):
    """Before: 4 ESC and 2 U+202E reached stdout raw (rich drops BEL), clearing a CI log viewer's
    screen and reversing what followed."""
    hostile = pod(HOSTILE, ["sh", "-c", "python3 t.py\x1b[2J & exec sleep infinity"], container="c\x1b[5m\u202e")
    hostile["metadata"]["namespace"] = "ns\x1b[31m"
    path = tmp_path / f"{HOSTILE}.json"
    path.write_text(json.dumps(hostile))
    done = gpuzombie("check", str(path))
    assert done.returncode == 1, done.stderr
    assert raw_characters(done.stdout) == [], done.stdout
    where = cells(done.stdout, 1).replace(" ", "")
    assert "Pod/ns\\x1b[31m/evil\\x1b[2J\\x1b]0;owned\\x07\\u202etxt.exe" in where, where
    assert "evil\\x1b[2J\\x1b]0;owned\\x07\\u202etxt.exe.json:" in where  # the file's name
    assert cells(done.stdout, 2) == "c\\x1b[5m\\u202e"
    # the message quotes the script as Python's repr ('…t.py\x1b[2J…'): its backslash is escaped in turn
    assert "t.py\\\\x1b[2J" in cells(done.stdout, 4)


def test_a_name_that_is_rich_markup_is_shown_as_written():
    """Before: `gpuzombie: internal error: MarkupError: closing tag '[/x]' ...`, exit 2, no table."""
    done = gpuzombie("check", "-", stdin=json.dumps(pod("[bold]p[/]", ["python3", "t.py"], container="[/x]")))
    assert done.returncode == 1 and "internal error" not in done.stderr, done.stderr
    assert "[/x]" in done.stdout and "[bold]p[/]" in done.stdout


def test_check_error_lines_escape_the_names_of_files(tmp_path: Path):
    (tmp_path / f"{HOSTILE}.yaml").write_text("kind: Pod\nspec: [\n")
    done = gpuzombie("check", str(tmp_path))
    assert done.returncode == 2 and raw_characters(done.stderr) == [] and "\\u202etxt.exe" in done.stderr


def test_webhook_patch_messages_escape_names(tmp_path: Path):
    """The warnings were escaped; an error (a GpuzombieError, printed by cli/main.py) was not.
    Before: `--patch` without --image printed the pod's name raw: ESC ]0;owned BEL and U+202E (on a
    terminal the CSI sequences too; click strips only those, only through a pipe)."""
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(pod(HOSTILE, S1, container="c\x1b[5m")))
    error = gpuzombie("webhook", "--patch", str(path))
    assert "the fix adds an init container" in one_line_error(error)
    assert raw_characters(error.stderr) == [] and "evil\\x1b[2J\\x1b]0;owned\\x07\\u202etxt.exe" in error.stderr
    path.write_text(yaml.safe_dump(pod(HOSTILE, None, container="c\x1b[5m")))  # no command: a warning, no image
    warned = gpuzombie("webhook", "--patch", str(path))
    assert warned.returncode == 0 and "shareProcessNamespace" in warned.stderr
    assert raw_characters(warned.stderr) == [] and "c\\x1b[5m" in warned.stderr


def test_a_usage_error_escapes_what_it_quotes():
    """click quotes a bad value in its message; cli/main.py escapes it like every other line."""
    done = gpuzombie("check", "--fail-on", "x\x1b]0;owned\x07", "-", stdin="")
    assert "is not one of" in one_line_error(done) and raw_characters(done.stderr) == []
