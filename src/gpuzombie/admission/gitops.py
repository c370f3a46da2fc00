"""``gpuzombie webhook --patch`` for a Git repository: the webhook's fix (``mutate``) written into
manifest text so that the file changes where the fix is and nowhere else. Pure: text in, text out.

- A document with nothing to fix is kept as its text, byte for byte (documents are split at their
  ``---`` lines, which YAML forbids inside content), and a file with nothing to fix is the same text.
- A document with a fix is read and written by ruamel.yaml's round trip, which keeps comments, key
  order, quoting, block scalars and anchors; the indentation is the document's own (guessed), and a
  line that came back differing only in whitespace, blank lines or comments is put back as it was.
- The fix is the webhook's JSONPatch, applied to that tree. A list reached through an alias (two
  containers sharing ``volumeMounts: *mounts``) is one list there: an item is added to it once, not
  once per container.
- What comes out is checked: read again, it must equal the webhook's own patch of the input
  (``mutate.patched``), or nothing is written. The comparison takes each pair of maps or lists once
  (by identity), so an alias bomb costs its distinct nodes, not the paths through them, and stops
  at MAX_COMPARED_NODES.
- A file whose every line ends in CRLF is fixed as LF text and written back with CRLF throughout.
"""

from __future__ import annotations

import difflib
import io
import itertools
import json
import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from gpuzombie.admission import mutate
from gpuzombie.k8s.podspec.fields import ManifestError
from gpuzombie.k8s.podspec.gpus import GPU_DEVICE_CLASSES, GpuContext, claim_classes
from gpuzombie.k8s.podspec.loader import load_documents
from gpuzombie.k8s.podspec.pointers import tokens
from gpuzombie.k8s.podspec.templates import MAX_SEARCH_NODES, pod_templates

DOCUMENT_MARKER = re.compile(r"^---(?=[ \t\r\n]|$)")
"""A line that starts a document: ``---`` at column 0 followed by a blank or the end (YAML 1.2 §9.1.4:
it cannot start a content line, so splitting there never cuts a scalar)."""
MAX_COMPARED_NODES = 10 * MAX_SEARCH_NODES
"""The pairs of maps and lists the check of the written text compares, at most (each pair once;
past it the fix is refused, not compared for hours)."""
NEEDS_IMAGE = ("tini:", "prestop:", "preflight")
"""Actions that add an init container of gpuzombie's image (the install one, the preflight gate)."""


class PatchError(ValueError):
    """The fix could not be written as asked: one line."""


@dataclass
class Patched:
    text: str
    changed: bool = False
    warnings: list[str] = field(default_factory=list)
    needs_image: list[str] = field(default_factory=list)
    """The pods whose fix adds the init container (a tini or preStop copy): they need --image."""


def documents_text(text: str) -> list[str]:
    """``text`` cut before each ``---`` line; joined, the pieces are ``text``."""
    lines = text.splitlines(keepends=True)
    cuts = [i for i, line in enumerate(lines) if i and DOCUMENT_MARKER.match(line)]
    bounds = [0, *cuts, len(lines)]
    return ["".join(lines[a:b]) for a, b in itertools.pairwise(bounds) if b > a] or [text]


def patch_text(text: str, policy: mutate.Policy, gpu_device_classes: frozenset[str] = GPU_DEVICE_CLASSES) -> Patched:
    """``text`` with every pod template fixed as the webhook would fix the pod; a DRA claim is a GPU
    where its device class is one of ``gpu_device_classes``. Raises ManifestError for input that is
    not a manifest, PatchError where the fix cannot be written."""
    if "\r\n" in text and text.count("\n") == text.count("\r\n"):  # YAML and JSON read CRLF as LF
        result = patch_text(text.replace("\r\n", "\n"), policy, gpu_device_classes)
        result.text = result.text.replace("\n", "\r\n")
        return result
    # DRA claim templates are looked up across the whole input: a pod and its claims are often in
    # documents of their own.
    claims = claim_classes(load_documents(text))
    gpus = GpuContext(claim_classes=claims, gpu_device_classes=gpu_device_classes)
    try:
        pieces = documents_text(text)
        results = [_patch_piece(piece, policy, gpus) for piece in pieces]
    except ManifestError:
        if len(documents_text(text)) == 1:
            raise
        results = [_patch_piece(text, policy, gpus)]  # pieces that only parse together (directives)
    out = Patched("".join(r.text for r in results))
    for r in results:
        out.changed |= r.changed
        out.warnings += r.warnings
        out.needs_image += r.needs_image
    return out


def _patch_piece(text: str, policy: mutate.Policy, gpus: GpuContext) -> Patched:
    documents = load_documents(text)
    result = Patched(text)
    ops: dict[int, list[dict[str, Any]]] = {}
    for ref in list(pod_templates(documents)):
        if ref.container is not None:  # its pod is an operator's to write (docs/admission.md)
            continue
        try:
            mutation = mutate.mutate(ref.pod, ref.namespace, policy, gpus=gpus)
        except ValueError as exc:
            result.warnings.append(f"{ref.label}: could not understand the pod ({exc}); left unchanged")
            continue
        result.warnings += [f"{ref.label}: {w}" for w in mutation.warnings]
        if mutation.skipped and mutation.skipped != "no GPU container":
            result.warnings.append(f"{ref.label}: left alone: {mutation.skipped}")
        if any(a.startswith(NEEDS_IMAGE) for a in mutation.actions):
            result.needs_image.append(ref.label)
        located = [(op, ref.locate(op["path"])) for op in mutation.ops]  # a bare spec has no metadata
        ops.setdefault(ref.document, []).extend({**op, "path": path} for op, path in located if path is not None)
    if not any(ops.values()):
        return result
    expected = [mutate.patched({"": d.data}, _under_root(ops.get(d.index, [])))[""] for d in documents]
    result.text = _as_json(text, expected) or _round_trip(text, ops, expected)
    result.changed = True
    return result


def _as_json(text: str, expected: list[Any]) -> str | None:
    """A JSON file's fix as JSON, indented as the file was (None: the text is not one JSON value).
    JSON has no comments or anchors to keep, and YAML's flow style would not be JSON any more."""
    if len(expected) != 1 or not text.lstrip().startswith(("{", "[")):
        return None
    try:
        json.loads(text)
    except ValueError:
        return None
    lines = text.splitlines()
    indent = next((len(line) - len(line.lstrip(" ")) for line in lines[1:] if line.strip()), 0) if len(lines) > 1 else 0
    written = json.dumps(expected[0], indent=indent or None, ensure_ascii=False)
    return written + ("\n" if text.endswith("\n") else "")


def _under_root(ops: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Operations on a document as operations on ``{"": document}`` (so one on the root copies it)."""
    return [{**op, "path": "/" + op["path"]} for op in ops]


def guess_indent(text: str) -> tuple[int, int]:
    """(a map's indent, a list's dash offset under its key) as most of ``text`` writes them: ``key:``
    then ``  child:`` is 2; ``key:`` then ``- item`` is 0, ``key:`` then ``  - item`` is 2."""
    lines = [line for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
    maps: Counter[int] = Counter()
    lists: Counter[int] = Counter()
    for parent, child in itertools.pairwise(lines):
        if not parent.rstrip().endswith(":"):
            continue
        body = parent.lstrip()
        column = len(parent) - len(body) + (len(body) - len(body.lstrip("- ")) if body.startswith("- ") else 0)
        indent = len(child) - len(child.lstrip())
        if child.lstrip().startswith("- ") and indent >= column:
            lists[indent - column] += 1
        elif indent > column:
            maps[indent - column] += 1
    return (maps.most_common(1)[0][0] if maps else 2), (lists.most_common(1)[0][0] if lists else 0)


def _yaml(text: str) -> Any:
    from ruamel.yaml import YAML

    yaml = YAML(typ="rt")
    yaml.preserve_quotes = True
    yaml.width = 1 << 16  # never fold a long line that was one line
    mapping, offset = guess_indent(text)
    yaml.indent(mapping=mapping, sequence=offset + 2, offset=offset)
    yaml.explicit_start = bool(DOCUMENT_MARKER.match(text.lstrip("\ufeff")))
    return yaml


def _round_trip(text: str, ops: dict[int, list[dict[str, Any]]], expected: list[Any]) -> str:
    """The fixed text: first with aliases kept (an alias shared by the containers the fix changes
    gets one item), then, where that would change an object the fix does not (an init container
    sharing ``volumeMounts: *mounts`` with a GPU container), with each shared list or map the fix
    writes to copied out of its alias. The first that reads back as ``expected`` is returned."""
    import yaml as pyyaml
    from ruamel.yaml.error import YAMLError

    loader = getattr(pyyaml, "CSafeLoader", pyyaml.SafeLoader)

    def faithful(candidate: str) -> bool:
        try:
            return same([d for d in pyyaml.load_all(candidate, Loader=loader) if d is not None], expected)
        except pyyaml.YAMLError:
            return False

    rt = _yaml(text)
    for unshare in (False, True):
        try:
            trees = list(rt.load_all(text))
        except YAMLError as exc:  # PyYAML read it: ruamel should, but say so rather than crash
            raise PatchError(f"the round-trip YAML reader refused it: {str(exc).splitlines()[0]}") from exc
        applied: set[tuple[int, str]] = set()
        for index, tree in enumerate(trees):
            shared = _shared(tree) if unshare else set()
            for op in ops.get(index, []):
                _apply(tree, op, applied, shared)
        buffer = io.StringIO()
        rt.dump_all(trees, buffer)
        written = buffer.getvalue()
        for candidate in (_restore_formatting(text, written), written):
            if faithful(candidate):
                return candidate
    raise PatchError("the fix could not be written without changing something else; apply the webhook's patch instead")


def same(a: Any, b: Any, budget: int = MAX_COMPARED_NODES) -> bool:
    """``a == b`` for YAML data (maps, lists, scalars of the same type), each pair of maps or lists
    compared once: ``==`` walks every path through aliases, exponential in an alias bomb's depth (a
    loop of aliases is equal where nothing else differs). Raises PatchError past ``budget`` pairs."""
    compared: set[tuple[int, int]] = set()
    stack = [(a, b)]
    while stack:
        x, y = stack.pop()
        if not isinstance(x, (dict, list)):
            if isinstance(y, (dict, list)) or type(x) is not type(y) or x != y:
                return False
            continue
        if isinstance(x, dict) != isinstance(y, dict) or not isinstance(y, (dict, list)) or len(x) != len(y):
            return False
        if (id(x), id(y)) in compared:
            continue
        compared.add((id(x), id(y)))
        if len(compared) > budget:
            raise PatchError(f"the fix could not be checked: over {budget} maps and lists to compare (aliases?)")
        if isinstance(x, dict) and isinstance(y, dict):
            if x.keys() != y.keys():
                return False
            stack.extend((v, y[k]) for k, v in x.items())
        else:
            stack.extend(zip(x, y, strict=True))
    return True


def _shared(tree: Any) -> set[int]:
    """The ids of the lists and maps that stand in more than one place (anchored and aliased)."""
    seen: set[int] = set()
    shared: set[int] = set()
    stack = [tree]
    while stack:
        node = stack.pop()
        children = node.values() if isinstance(node, dict) else node if isinstance(node, list) else ()
        for child in children:
            if not isinstance(child, (dict, list)):
                continue
            if id(child) in seen:
                shared.add(id(child))
            else:
                seen.add(id(child))
                stack.append(child)
    return shared


def _plain(node: Any, copies: dict[int, Any] | None = None) -> Any:
    """A copy of ``node`` that shares nothing with the tree but what the file names: a list or map
    inside it with an anchor of its own (``&name``) stays itself, written as its alias (``*name``);
    the rest is copied once each (so an alias bomb inside costs its size, not its paths)."""
    top = copies is None
    copies = {} if copies is None else copies
    if not isinstance(node, (dict, list)):
        return node
    anchor = getattr(node, "anchor", None)
    if not top and anchor is not None and anchor.value:
        return node
    if id(node) in copies:
        return copies[id(node)]
    out: Any = {} if isinstance(node, dict) else []
    copies[id(node)] = out
    if isinstance(node, dict):
        out.update((k, _plain(v, copies)) for k, v in node.items())
    else:
        out.extend(_plain(v, copies) for v in node)
    return out


def _apply(tree: Any, op: dict[str, Any], applied: set[tuple[int, str]], shared: set[int]) -> None:
    """One of mutate's operations (``add``/``replace`` on a key, a list index or ``-``) on a round-trip
    tree; a list or map on its way whose id is in ``shared`` is first copied out of its alias."""
    *parents, last = tokens(op["path"])
    target = tree
    for token in parents:
        key: Any = int(token) if isinstance(target, list) else token
        child = target[key]
        if id(child) in shared:
            anchor = getattr(child, "anchor", None)
            if anchor is not None and anchor.value:  # written where it stands, even with no alias left
                anchor.always_dump = True
            child = target[key] = _plain(child)
        target = child
    value = op["value"]
    if isinstance(target, list) and last == "-":
        seen = (id(target), json.dumps(value, sort_keys=True))
        if seen in applied:  # this very list (an alias) has the item from another container's operation
            return
        applied.add(seen)
        target.append(value)
    elif isinstance(target, list) and op["op"] == "add":
        target.insert(int(last), value)
    elif isinstance(target, list):
        target[int(last)] = value
    else:
        target[last] = _keeping(target.get(last), value) if op["op"] == "replace" else value


def _keeping(old: Any, new: Any) -> Any:
    """``new``, a list that ends with ``old``'s items (tini before a command), as a list that keeps
    ``old``'s items as written (quotes, block scalars) and its flow or block style."""
    from ruamel.yaml.comments import CommentedSeq

    if not isinstance(old, list) or not isinstance(new, list) or len(new) < len(old):
        return new
    head = len(new) - len(old)
    if list(new[head:]) != list(old):
        return new
    seq = CommentedSeq([*new[:head], *old])
    if isinstance(old, CommentedSeq) and old.fa.flow_style():
        seq.fa.set_flow_style()
    return seq


def _restore_formatting(original: str, written: str) -> str:
    """``written`` with each changed run of lines that differs from ``original`` only in whitespace,
    blank lines or comments put back as it was: ruamel writes one indentation per document."""
    old, new = original.splitlines(keepends=True), written.splitlines(keepends=True)
    out: list[str] = []
    matcher = difflib.SequenceMatcher(None, old, new, autojunk=False)
    for tag, a, b, c, d in matcher.get_opcodes():
        if tag == "equal" or _form(old[a:b]) == _form(new[c:d]):
            out += old[a:b]
        else:
            out += new[c:d]
    return "".join(out)


def _form(lines: list[str]) -> list[str]:
    """What a run of lines says, without its layout: no blank or comment-only lines, no whitespace."""
    return ["".join(line.split()) for line in lines if line.strip() and not line.lstrip().startswith("#")]
