"""``gpuzombie check``'s report: the pods found in the inputs, their findings, and two renderings
of it as data: the versioned JSON (``gpuzombie.check/1``) and SARIF 2.1.0 for code-scanning UIs."""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from gpuzombie import __version__
from gpuzombie.admission import rules
from gpuzombie.k8s.podspec import templates
from gpuzombie.k8s.podspec.fields import ManifestError
from gpuzombie.k8s.podspec.gpus import GPU_DEVICE_CLASSES, GpuContext, claim_classes
from gpuzombie.k8s.podspec.loader import Document, Object, line_of, load_documents, objects
from gpuzombie.k8s.podspec.pointers import pointer_token, resolve, tokens

SCHEMA = "gpuzombie.check/1"
"""The form every schema id of gpuzombie has, ``gpuzombie.<command>/<N>``; until issue 35 it was
``gpuzombie.check/v1``, which a consumer of older output may still meet (``SCHEMAS_READ``)."""
SCHEMAS_READ = ("gpuzombie.check/v1", SCHEMA)
"""The ids of check's JSON that mean this layout: the rename changed the id, not a field."""
SARIF_SCHEMA = "https://docs.oasis-open.org/sarif/sarif/v2.1.0/errata01/os/schemas/sarif-schema-2.1.0.json"
SUPPRESS = "gpuzombie.dev/suppress"
"""The annotation that suppresses named rules for one object, each with its reason:
``gpuzombie.dev/suppress: "GZ002: the trainer reaps its own children; GZ006: ENTRYPOINT is tini"``."""
SEVERITY_RANK = {rules.Severity.NOTE: 0, rules.Severity.WARNING: 1, rules.Severity.ERROR: 2}


def parse_suppressions(value: object, where: str) -> dict[str, str]:
    """``RULE[,RULE]: reason`` entries separated by ``;`` or new lines -> {rule: reason}. A reason is
    required (a reviewer reads it); an unknown rule or a missing reason is a ManifestError naming ``where``."""
    if not isinstance(value, str):
        raise ManifestError(f"{where}: expected a string like 'GZ002: why', got {value!r}")
    out: dict[str, str] = {}
    for entry in (e.strip() for e in value.replace("\n", ";").split(";")):
        if not entry:
            continue
        ids, colon, reason = entry.partition(":")
        named = [i.strip().upper() for i in ids.split(",")]
        unknown = [i for i in named if i not in rules.RULES]
        if not colon or not reason.strip() or unknown:
            problem = f"unknown rule {unknown[0]!r}" if unknown and colon else "each entry is 'GZ00x: reason'"
            raise ManifestError(f"{where}: {problem} in {entry[:80]!r}")
        out.update(dict.fromkeys(named, reason.strip()))
    return out


def _suppressions(document: Any, pointer: str, start: str = "") -> dict[str, str]:
    """The annotation on every object from the object at ``start`` down to the pod template at
    ``pointer`` (a Deployment's or a custom resource's, and the template's own; the nearer one wins
    per rule). ``start`` is the item of a ``kind: List`` that holds the template: the List's own
    metadata is no object's (kubectl drops it), so it suppresses nothing."""
    out: dict[str, str] = {}
    node = resolve(document, start)
    path = start
    for token in ["", *tokens(pointer[len(start) :])]:
        if token:
            node = node[int(token)] if isinstance(node, list) else node[token]
            path += f"/{pointer_token(token)}"
        meta = node.get("metadata") if isinstance(node, Mapping) else None
        notes = meta.get("annotations") if isinstance(meta, Mapping) else None
        if isinstance(notes, Mapping) and SUPPRESS in notes:
            where = f"{path or '/'} metadata.annotations[{SUPPRESS}]"
            out.update(parse_suppressions(notes[SUPPRESS], where))
    return out


@dataclass(frozen=True)
class PodResult:
    path: str
    ref: templates.PodTemplate
    line: int | None
    gpu_containers: tuple[str, ...]
    findings: tuple[rules.Finding, ...]
    finding_lines: tuple[int | None, ...] = ()
    """The line of each finding's container (SARIF's region), as many as findings."""
    suppressed: tuple[str | None, ...] = ()
    """Each finding's suppression reason (the annotation's), None where it is not suppressed."""

    def results(self) -> list[tuple[rules.Finding, int | None, str | None]]:
        """(finding, line, suppression reason) of each finding."""
        reasons = self.suppressed or (None,) * len(self.findings)
        return list(zip(self.findings, self.finding_lines, reasons))

    def to_dict(self) -> dict[str, Any]:
        return {
            "file": self.path,
            "document": self.ref.document,
            "kind": self.ref.kind,
            "name": self.ref.name,
            "namespace": self.ref.namespace,
            "pointer": self.ref.pointer,
            "path": self.ref.path,
            "line": self.line,
            "gpu_containers": list(self.gpu_containers),
            "findings": [
                {**f.to_dict(), "line": line, "suppressed": why is not None, "justification": why}
                for f, line, why in self.results()
            ],
        }


@dataclass
class CheckReport:
    files: list[str] = field(default_factory=list)
    pods: list[PodResult] = field(default_factory=list)
    errors: list[tuple[str, str]] = field(default_factory=list)
    """(input, one line) of each input that could not be read or understood: the others are still
    reported, and the run exits 2."""
    disabled: frozenset[str] = frozenset()
    """Rules not run (``--disable``)."""
    fail_on: rules.Severity = rules.DEFAULT_FAIL_ON
    """The least severity that fails the check (``--fail-on``; by default only certain waste)."""
    unread: list[PodResult] = field(default_factory=list)
    """GPU requests outside every template read (GZ007), each on the object it stands in."""
    gpu_device_classes: frozenset[str] = GPU_DEVICE_CLASSES

    def add(self, path: str, text: str) -> None:
        """Check every pod of one input; one it cannot understand is recorded in ``errors`` as a whole
        (none of its pods reported), the others are unaffected."""
        shown = "stdin" if path == "-" else path
        self.files.append(path)
        try:
            self.pods += self._check(path, text)
        except ManifestError as exc:
            self.errors.append((path, f"{shown}: {exc}"))

    def add_error(self, path: str, message: str) -> None:
        """An input that could not be read."""
        self.files.append(path)
        self.errors.append((path, message))

    def _check(self, path: str, text: str) -> list[PodResult]:
        documents = load_documents(text)
        data = {d.index: d.data for d in documents}
        nodes = {d.index: d.node for d in documents}
        claims = claim_classes(documents)
        found = list(templates.pod_templates(documents))
        out = []
        for ref in found:
            try:
                context = GpuContext(ref.annotations, claims, self.gpu_device_classes)
                pod = rules.read(ref.spec, context=context)
                findings = [f for f in rules.check(pod) if f.rule not in self.disabled]
                reasons = _suppressions(data[ref.document], ref.pointer, ref.object_pointer)
            except ManifestError as exc:
                raise ManifestError(f"{ref.label}: {exc}") from exc
            node = nodes.get(ref.document)
            pointers = {c.name: ref.locate(c.pointer) for c in pod.every_container}
            lines = tuple(line_of(node, pointers.get(f.container or "") or ref.pointer) for f in findings)
            line = line_of(node, ref.locate("/spec") or ref.pointer)
            gpu = tuple(c.name for c in pod.gpu_containers)
            why = tuple(reasons.get(f.rule) for f in findings)
            out.append(PodResult(path, ref, line, gpu, tuple(findings), lines, why))
        if "GZ007" not in self.disabled:
            for document, pointer, what in templates.unread_gpu_requests(documents, found):
                self._unread(path, documents, data, document, pointer, what)
        return out

    def _unread(
        self, path: str, documents: list[Document], data: dict[int, Any], document: int, pointer: str, what: str
    ) -> None:
        """A GZ007 finding for a GPU request outside every template read, on the object it is in."""
        doc = next(d for d in documents if d.index == document)
        holders = [o for o in objects([doc]) if pointer.startswith(o.pointer + "/")]
        obj = holders[-1] if holders else Object(document, "", doc.data, None)
        meta = obj.data.get("metadata") if isinstance(obj.data, dict) else None
        meta = meta if isinstance(meta, dict) else {}
        kind = str(obj.data.get("kind", "(no kind)")) if isinstance(obj.data, dict) else "(no kind)"
        name = str(meta.get("name", "(unnamed)"))
        ref = templates.PodTemplate(document, kind, name, obj.namespace, pointer, {}, True, obj.pointer)
        message = f"{what}: no pod-template reader understood this place; its containers were not checked"
        line = line_of(doc.node, pointer)
        finding = rules.Finding("GZ007", rules.Severity.WARNING, None, message)
        why = _suppressions(data[document], obj.pointer, obj.pointer).get("GZ007")
        self.unread.append(PodResult(path, ref, line, (), (finding,), (line,), (why,)))

    @property
    def findings(self) -> list[tuple[PodResult, rules.Finding]]:
        """The findings that count: neither disabled nor suppressed."""
        return [(p, f) for p in self.pods + self.unread for f, _, why in p.results() if why is None]

    @property
    def suppressed(self) -> list[tuple[PodResult, rules.Finding, str]]:
        return [(p, f, why) for p in self.pods + self.unread for f, _, why in p.results() if why is not None]

    def counts(self) -> Counter[str]:
        return Counter(f.severity.value for _, f in self.findings)

    @property
    def failed(self) -> bool:
        """A finding at ``fail_on`` or above fails a check (by default errors only: certain waste)."""
        least = SEVERITY_RANK[self.fail_on]
        return any(SEVERITY_RANK[f.severity] >= least for _, f in self.findings)

    def to_dict(self) -> dict[str, Any]:
        counts = self.counts()
        used = sorted({f.rule for _, f in self.findings})
        return {
            "schema": SCHEMA,
            "files": self.files,
            "errors": [{"file": path, "message": message} for path, message in self.errors],
            "pods": [p.to_dict() for p in self.pods],
            "unread": [p.to_dict() for p in self.unread],
            "summary": {
                "pods": len(self.pods),
                "gpu_pods": sum(1 for p in self.pods if p.gpu_containers),
                "findings": len(self.findings),
                "by_severity": {s.value: counts.get(s.value, 0) for s in rules.Severity},
                "suppressed": len(self.suppressed),
                "disabled": sorted(self.disabled),
                "fail_on": self.fail_on.value,
                "unreadable": len(self.errors),
                "failed": self.failed,
            },
            "rules": {r: _rule_dict(rules.RULES[r]) for r in used},
        }

    def to_sarif(self) -> dict[str, Any]:
        ids = list(rules.RULES)
        results = []
        for pod in self.pods + self.unread:
            for finding, line, why in pod.results():
                result = _sarif_result(pod, finding, line or pod.line, ids.index(finding.rule))
                if why is not None:  # SARIF 2.1.0 §3.27.23, §3.35: shown as suppressed, with its reason
                    result["suppressions"] = [{"kind": "inSource", "status": "accepted", "justification": why}]
                results.append(result)
        driver = {
            "name": "gpuzombie check",
            "version": __version__,
            "rules": [_sarif_rule(rules.RULES[r]) for r in ids],
        }
        invocation: dict[str, Any] = {"executionSuccessful": not self.errors}
        if self.disabled:  # §3.20.5: the rules --disable turned off
            invocation["ruleConfigurationOverrides"] = [
                {"descriptor": {"id": r, "index": ids.index(r)}, "configuration": {"enabled": False}}
                for r in sorted(self.disabled)
            ]
        if self.errors:  # §3.20.21: the inputs not read, so a code-scanning UI shows the run incomplete
            invocation["toolExecutionNotifications"] = [
                {
                    "level": "error",
                    "message": {"text": message},
                    "locations": [{"physicalLocation": {"artifactLocation": {"uri": _uri(path)}}}],
                }
                for path, message in self.errors
            ]
        run = {"tool": {"driver": driver}, "invocations": [invocation], "results": results}
        return {"$schema": SARIF_SCHEMA, "version": "2.1.0", "runs": [run]}


def _sarif_result(pod: PodResult, finding: rules.Finding, line: int | None, rule_index: int) -> dict[str, Any]:
    location: dict[str, Any] = {"artifactLocation": {"uri": _uri(pod.path)}}
    if line is not None:
        location["region"] = {"startLine": line}
    where = pod.ref.label if finding.container is None else f"{pod.ref.label}/{finding.container}"
    about = pod.ref.label if finding.container is None else f"{pod.ref.label}, container {finding.container}"
    return {
        "ruleId": finding.rule,
        "ruleIndex": rule_index,
        "level": finding.severity.value,
        "message": {"text": f"{about}: {finding.message}"},
        "locations": [
            {"physicalLocation": location, "logicalLocations": [{"fullyQualifiedName": where, "kind": "object"}]}
        ],
        "partialFingerprints": {"podContainerRule/v1": f"{where}/{finding.rule}"},
    }


def _rule_dict(rule: rules.Rule) -> dict[str, str]:
    return {"name": rule.name, "summary": rule.summary, "evidence": rule.evidence, "fix": rule.fix}


def _sarif_rule(rule: rules.Rule) -> dict[str, Any]:
    return {
        "id": rule.id,
        "name": rule.name,
        "shortDescription": {"text": rule.summary.split(":")[0]},
        "fullDescription": {"text": f"{rule.summary}. Measured: {rule.evidence}."},
        "help": {"text": f"Fix: {rule.fix}.", "markdown": f"**Fix:** {rule.fix}.\n\n**Measured:** {rule.evidence}."},
    }


def _uri(path: str) -> str:
    """An input as SARIF's artifact URI: a relative reference for a relative path, an absolute-path
    one for an absolute path. ``//abs/path`` (POSIX keeps the two slashes) is written ``/abs/path``:
    as a URI, ``//abs/path`` is a network-path reference to the host ``abs``."""
    from urllib.parse import quote

    if path == "-":
        return "stdin"
    if path.startswith("/"):
        path = "/" + path.lstrip("/")
    return quote(path.removeprefix("./"))
