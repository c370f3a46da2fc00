"""``gpuzombie check``'s report: the pods found in the inputs, their findings, and two renderings
of it as data: the versioned JSON (``gpuzombie.check/v1``) and SARIF 2.1.0 for code-scanning UIs."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from gpuzombie import __version__
from gpuzombie.admission import rules
from gpuzombie.k8s import podspec

SCHEMA = "gpuzombie.check/v1"
SARIF_SCHEMA = "https://docs.oasis-open.org/sarif/sarif/v2.1.0/errata01/os/schemas/sarif-schema-2.1.0.json"


@dataclass(frozen=True)
class PodResult:
    path: str
    ref: podspec.PodTemplate
    line: int | None
    gpu_containers: tuple[str, ...]
    findings: tuple[rules.Finding, ...]
    finding_lines: tuple[int | None, ...] = ()
    """The line of each finding's container (SARIF's region), as many as findings."""

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
            "findings": [{**f.to_dict(), "line": line} for f, line in zip(self.findings, self.finding_lines)],
        }


@dataclass
class CheckReport:
    files: list[str] = field(default_factory=list)
    pods: list[PodResult] = field(default_factory=list)
    """The pod templates read."""
    unread: list[PodResult] = field(default_factory=list)
    """GPU requests outside every template read (GZ007), each on the object it stands in."""
    gpu_device_classes: frozenset[str] = podspec.GPU_DEVICE_CLASSES

    def add(self, path: str, text: str) -> None:
        """Check every pod of one input. Raises ManifestError naming the input (and the pod)."""
        shown = "stdin" if path == "-" else path
        self.files.append(path)
        try:
            documents = podspec.load_documents(text)
        except podspec.ManifestError as exc:
            raise podspec.ManifestError(f"{shown}: {exc}") from exc
        nodes = {d.index: d.node for d in documents}
        claims = podspec.claim_classes(documents)
        templates = list(podspec.pod_templates(documents))
        for ref in templates:
            try:
                context = podspec.GpuContext(ref.annotations, claims, self.gpu_device_classes)
                pod = rules.read(ref.spec, context=context)
                findings = rules.check(pod)
            except podspec.ManifestError as exc:
                raise podspec.ManifestError(f"{shown}: {ref.label}: {exc}") from exc
            node = nodes.get(ref.document)
            pointers = {c.name: ref.locate(c.pointer) for c in pod.every_container}
            lines = tuple(podspec.line_of(node, pointers.get(f.container or "") or ref.pointer) for f in findings)
            line = podspec.line_of(node, ref.locate("/spec") or ref.pointer)
            gpu = tuple(c.name for c in pod.gpu_containers)
            self.pods.append(PodResult(path, ref, line, gpu, tuple(findings), lines))
        for document, pointer, what in podspec.unread_gpu_requests(documents, templates):
            self._unread(path, documents, document, pointer, what)

    def _unread(self, path: str, documents: list[podspec.Document], document: int, pointer: str, what: str) -> None:
        """A GZ007 finding for a GPU request outside every template read, on the object it is in."""
        doc = next(d for d in documents if d.index == document)
        holders = [o for o in podspec.objects([doc]) if pointer.startswith(o.pointer + "/")]
        obj = holders[-1] if holders else podspec.Object(document, "", doc.data, None)
        data = obj.data if isinstance(obj.data, dict) else {}
        meta = podspec.mapping(data.get("metadata"), "metadata") if isinstance(data.get("metadata"), dict) else {}
        name, kind = str(meta.get("name", "(unnamed)")), str(data.get("kind", "(no kind)"))
        ref = podspec.PodTemplate(document, kind, name, obj.namespace, pointer, {}, True, obj.pointer)
        message = f"{what}: no pod-template reader understood this place; its containers were not checked"
        line = podspec.line_of(doc.node, pointer)
        finding = rules.Finding("GZ007", rules.Severity.WARNING, None, message)
        self.unread.append(PodResult(path, ref, line, (), (finding,), (line,)))

    @property
    def findings(self) -> list[tuple[PodResult, rules.Finding]]:
        return [(p, f) for p in self.pods + self.unread for f in p.findings]

    def counts(self) -> Counter[str]:
        return Counter(f.severity.value for _, f in self.findings)

    @property
    def failed(self) -> bool:
        """Errors or warnings fail a check; notes are advice."""
        return any(f.severity is not rules.Severity.NOTE for _, f in self.findings)

    def to_dict(self) -> dict[str, Any]:
        counts = self.counts()
        used = sorted({f.rule for _, f in self.findings})
        return {
            "schema": SCHEMA,
            "files": self.files,
            "pods": [p.to_dict() for p in self.pods],
            "unread": [p.to_dict() for p in self.unread],
            "summary": {
                "pods": len(self.pods),
                "gpu_pods": sum(1 for p in self.pods if p.gpu_containers),
                "findings": len(self.findings),
                "by_severity": {s.value: counts.get(s.value, 0) for s in rules.Severity},
                "failed": self.failed,
            },
            "rules": {r: _rule_dict(rules.RULES[r]) for r in used},
        }

    def to_sarif(self) -> dict[str, Any]:
        ids = list(rules.RULES)
        results = []
        for pod in self.pods + self.unread:
            for finding, line in zip(pod.findings, pod.finding_lines):
                results.append(_sarif_result(pod, finding, line or pod.line, ids.index(finding.rule)))
        driver = {
            "name": "gpuzombie check",
            "version": __version__,
            "rules": [_sarif_rule(rules.RULES[r]) for r in ids],
        }
        return {"$schema": SARIF_SCHEMA, "version": "2.1.0", "runs": [{"tool": {"driver": driver}, "results": results}]}


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
    from urllib.parse import quote

    return "stdin" if path == "-" else quote(path.removeprefix("./"))
