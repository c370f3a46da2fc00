"""`gpuzombie check` (and `webhook --patch`, which reads its inputs the same way) in CI on input a
pull request controls (issue 36, items 12 and 13), as a user runs them (real processes, real files,
FIFOs, symlinks and /dev/zero):

- every name a manifest (or its file) gives is escaped in every human-readable output: check's table
  and its error lines, webhook --patch's warnings and errors (JSON and SARIF carry them as data);
- a ``kind: List``'s own metadata suppresses nothing (kubectl drops it: it is no object's);
- an input (stdin too) is read with a bound, whatever ``st_size`` says, and one that is not a
  regular file (``/dev/zero``, a FIFO) is refused in one line;
- ``//abs/path`` is an absolute path in SARIF, not a network path;
- a directory walk does not read (nor ``--in-place`` write) a symlink to a file outside the directory.
"""

from __future__ import annotations

import json
import os
import re
import resource
import subprocess
import sys
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

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
    markup = json.dumps(pod("[bold]p[/]", ["python3", "t.py"], container="[/x]"))
    done = gpuzombie("check", "--fail-on", "warning", "-", stdin=markup)
    assert done.returncode == 1 and "internal error" not in done.stderr, done.stderr
    assert "[/x]" in done.stdout and "[bold]p[/]" in done.stdout


def test_check_error_lines_escape_the_names_of_files(tmp_path: Path):
    (tmp_path / f"{HOSTILE}.yaml").write_text("kind: Pod\nspec: [\n")
    done = gpuzombie("check", str(tmp_path))
    assert done.returncode == 2 and raw_characters(done.stderr) == [] and "\\u202etxt.exe" in done.stderr


def test_webhook_patch_messages_escape_names(tmp_path: Path):
    """The warnings were escaped; an error (a GpuzombieError, printed by cli/main.py) was not.
    Before: `--patch` without --image (now `--in-place` without it) printed the pod's name raw: ESC ]0;owned BEL and U+202E (on a
    terminal the CSI sequences too; click strips only those, only through a pipe)."""
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(pod(HOSTILE, S1, container="c\x1b[5m")))
    error = gpuzombie("webhook", "--patch", str(path), "--in-place")
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


# -- item 13: suppressions, inputs by name, SARIF URIs, the directory walk --------------------------------


def test_a_lists_own_suppress_annotation_suppresses_nothing(tmp_path: Path):
    """Before: the List's annotation suppressed both items' GZ001 (0 findings, exit 0)."""
    item = pod("b")
    item["metadata"]["annotations"] = {"gpuzombie.dev/suppress": "GZ001: this item, reviewed"}
    listed = {
        "apiVersion": "v1",
        "kind": "List",
        "metadata": {"annotations": {"gpuzombie.dev/suppress": "GZ001: every item?"}},
        "items": [pod("a"), item],
    }
    path = tmp_path / "list.yaml"
    path.write_text(yaml.safe_dump(listed))
    done = gpuzombie("check", "--json", str(path))
    assert done.returncode == 1
    marked = {
        p["name"]: [(f["rule"], f["justification"]) for f in p["findings"]] for p in json.loads(done.stdout)["pods"]
    }
    assert marked == {"a": [("GZ001", None)], "b": [("GZ001", "this item, reviewed")]}


def _address_space_of(limit: int):
    """A preexec_fn bounding the child's address space: before the fix `check /dev/zero` read until
    MemoryError, which without a bound takes every byte the machine has."""
    return lambda: resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


@pytest.mark.parametrize("command", [["check"], ["webhook", "--patch"]])
def test_dev_zero_and_a_fifo_by_name_are_refused_in_one_line(tmp_path: Path, command: list[str]):
    """Before: /dev/zero ended in `internal error: MemoryError` (8.2 s, 1.8 GiB under a 2 GiB address
    space); a FIFO with no writer hung (killed after 20 s). st_size is 0 for both."""
    fifo = tmp_path / "pod.yaml"
    os.mkfifo(fifo)
    for path, kind in (("/dev/zero", "a character device"), (str(fifo), "a FIFO")):
        done = subprocess.run(
            [sys.executable, "-m", "gpuzombie", *command, path],
            capture_output=True,
            text=True,
            timeout=30,  # the FIFO hung for ever before; refused now in well under a second
            preexec_fn=_address_space_of(2 << 30),
        )
        assert f"cannot read {path}: {kind}, not a regular file" in one_line_error(done)


def test_a_file_past_the_bound_is_refused_as_read_not_as_stat_says(tmp_path: Path, monkeypatch):
    """The bound counts the bytes read (one past it is enough), never st_size."""
    from gpuzombie.cli import check

    monkeypatch.setattr(check, "MAX_INPUT_BYTES", 1024)
    big = tmp_path / "big.yaml"
    big.write_text("# " + "x" * 2000 + "\n")
    with pytest.raises(check.GpuzombieError, match="over 0 MiB"):
        check.read_input(str(big))
    assert check.read_input("/proc/self/comm")  # st_size 0, read all the same


@pytest.mark.slow
def test_stdin_past_the_bound_is_refused_not_cut():
    """Before: stdin was cut at 64 MiB without a word: a pod past the cut was never checked (exit 0,
    "0 pod spec(s)")."""
    from gpuzombie.cli.check import MAX_INPUT_BYTES

    text = "#" + "x" * MAX_INPUT_BYTES + "\n" + yaml.safe_dump(pod("late"))
    assert "stdin: over 64 MiB, not a manifest" in one_line_error(gpuzombie("check", "-", stdin=text))


def test_a_path_with_two_leading_slashes_is_an_absolute_path_in_sarif(tmp_path: Path):
    """Before: `//tmp/…/p.yaml` was written as is, a network-path reference (host `tmp`)."""
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(pod("p")))
    missing = tmp_path / "missing.yaml"
    done = gpuzombie("check", "--sarif", f"/{path}", f"//{missing}")
    run = json.loads(done.stdout)["runs"][0]
    uris = [r["locations"][0]["physicalLocation"]["artifactLocation"]["uri"] for r in run["results"]]
    uris += [
        n["locations"][0]["physicalLocation"]["artifactLocation"]["uri"]
        for n in run["invocations"][0]["toolExecutionNotifications"]
    ]
    assert uris == [str(path), str(missing)]
    assert all(urlsplit(u).netloc == "" for u in uris)


def _tree(tmp_path: Path) -> tuple[Path, Path]:
    """tree/ with a pod, a link to it (inside) and a link to outside/secret.yaml; outside/ beside it."""
    tree, outside = tmp_path / "tree", tmp_path / "outside"
    tree.mkdir()
    outside.mkdir()
    (tree / "in.yaml").write_text(yaml.safe_dump(pod("inside")))
    (tree / "same.yaml").symlink_to("in.yaml")
    (outside / "secret.yaml").write_text(yaml.safe_dump(pod("outside", None)))
    (tree / "out.yaml").symlink_to(outside / "secret.yaml")
    return tree, outside


def test_a_directory_walk_does_not_read_a_symlink_out_of_the_tree(tmp_path: Path):
    """Before: tree/out.yaml was read through the link (its pod reported, exit 1)."""
    tree, _ = _tree(tmp_path)
    done = gpuzombie("check", "--json", str(tree))
    assert done.returncode == 2
    report = json.loads(done.stdout)
    assert sorted(p["name"] for p in report["pods"]) == ["inside", "inside"]  # in.yaml and the link inside
    (error,) = report["errors"]
    assert error["file"] == str(tree / "out.yaml") and "outside" in error["message"] and "not read" in error["message"]
    assert len(done.stderr.strip().splitlines()) == 1
    named = gpuzombie("check", "--json", str(tree / "out.yaml"))  # named by itself, it is read
    assert [p["name"] for p in json.loads(named.stdout)["pods"]] == ["outside"]


def test_patch_in_place_never_writes_through_a_symlink_out_of_the_tree(tmp_path: Path):
    """Before: `webhook --patch tree --in-place` wrote the fix into outside/secret.yaml through the
    link (exit 0, `patched tree/out.yaml`)."""
    tree, outside = _tree(tmp_path)
    secret = (outside / "secret.yaml").read_bytes()
    done = gpuzombie("webhook", "--patch", str(tree), "--in-place", "--image", "img:1")
    # the link is skipped and named (exit 1, docs/admission.md); the files of the tree are patched
    assert done.returncode == 1, done.stderr
    assert "a symbolic link: not followed" in done.stderr
    assert (outside / "secret.yaml").read_bytes() == secret
