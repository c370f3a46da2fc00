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
            "line": self.line,
            "gpu_containers": list(self.gpu_containers),
            "findings": [{**f.to_dict(), "line": line} for f, line in zip(self.findings, self.finding_lines)],
        }


@dataclass
class CheckReport:
    files: list[str] = field(default_factory=list)
    pods: list[PodResult] = field(default_factory=list)

    def add(self, path: str, text: str) -> None:
        """Check every pod of one input. Raises ManifestError naming the input (and the pod)."""
        shown = "stdin" if path == "-" else path
        self.files.append(path)
        try:
            documents = podspec.load_documents(text)
        except podspec.ManifestError as exc:
            raise podspec.ManifestError(f"{shown}: {exc}") from exc
        nodes = {d.index: d.node for d in documents}
        for ref in podspec.pod_templates(documents):
            try:
                pod = rules.read(ref.spec)
                findings = rules.check(pod)
            except podspec.ManifestError as exc:
                raise podspec.ManifestError(f"{shown}: {ref.label}: {exc}") from exc
            node = nodes.get(ref.document)
            pointers = {c.name: c.pointer for c in pod.containers}
            lines = tuple(
                podspec.line_of(node, ref.pointer + pointers[f.container]) if f.container in pointers else None
                for f in findings
            )
            line = podspec.line_of(node, ref.pointer + "/spec")
            gpu = tuple(c.name for c in pod.gpu_containers)
            self.pods.append(PodResult(path, ref, line, gpu, tuple(findings), lines))

    @property
    def findings(self) -> list[tuple[PodResult, rules.Finding]]:
        return [(p, f) for p in self.pods for f in p.findings]

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
        for pod in self.pods:
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
    where = f"{pod.ref.label}/{finding.container}"
    return {
        "ruleId": finding.rule,
        "ruleIndex": rule_index,
        "level": finding.severity.value,
        "message": {"text": f"{pod.ref.label}, container {finding.container}: {finding.message}"},
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
