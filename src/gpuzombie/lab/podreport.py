"""The report's parts for ``lab pod`` runs (results.json runs whose subject is a manifest's pod): a table in
comparison.md and each pod's notes.md. Pure functions over the runs as ``results.load`` reads them."""

from __future__ import annotations

from collections.abc import Mapping

from gpuzombie.jsonout import dumps
from gpuzombie.lab.labrun import PodSubject
from gpuzombie.lab.records import RunRecord


def _seconds(value: float | None) -> str:
    return "—" if value is None else f"{value:.3f} s"


def _counts(run: RunRecord, point: str) -> tuple[int | str, int | str]:
    """(zombies, orphans) the host counted at ``point``; dashes where it was not observed."""
    obs = run.observed(point)
    return (obs.zombies, obs.orphans) if obs else ("—", "—")


def pods_md(pods: Mapping[str, RunRecord]) -> list[str]:
    """comparison.md's section for the pods run by ``gpuzombie lab pod``."""
    if not pods:
        return []
    lines = [
        "",
        "## Pods (gpuzombie lab pod)",
        "",
        "Manifests run on the lab's containerd as the kubelet runs them"
        + (
            " (`-kubernetes`: kubectl apply'd to a real single-node cluster, run and deleted by its kubelet)"
            if any(e.runtime == "kubernetes" for e in pods.values())
            else ""
        )
        + "; every image is the lab's (busybox with the host's directories), with an empty ENTRYPOINT.",
        "",
        "| run | PID 1 | grace | zombies / orphans before deletion | deletion → free | waited whole grace | "
        "grace waste (GiB·s) | preStop exit | left after deletion |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for key, e in pods.items():
        m, d = e.metrics, e.deletion
        zombies, orphans = _counts(e, "after-spawn")
        lines.append(
            f"| {key} | `{e.init}` | {d.grace_s} s | {zombies} / {orphans} | "
            f"{_seconds(m.release_latency_s)} | {'yes' if m.waited_whole_grace else 'no'} | "
            f"{m.grace_waste_gib_s:.2f} | {'—' if d.prestop_rc is None else d.prestop_rc} | "
            f"{len(d.leftovers)} |"
        )
    return lines


def notes_opening(title: str, e: RunRecord, *, holder: str, memory: str = "") -> list[str]:
    """A notes.md's first lines, a pod's and a scenario's: the title, the CPU stand-in's banner
    (``holder``: whose RSS stood in), the memory (``memory``: what held it) and the pod's command."""
    banner = [f"> **CPU STAND-IN**: no GPU was used; memory is the {holder} host RSS.", ""] if e.cpu_standin else []
    return [title, "", *banner, f"- memory: {e.memory} ({memory}sampled: {e.probe})", f"- pod: `{e.pod_command}`"]


def pod_notes(key: str, e: RunRecord, subject: PodSubject) -> str:
    """A pod's notes.md: what ran, what the lab did differently, what the deletion cost."""
    pod, m, d = subject.manifest, e.metrics, e.deletion
    lines = notes_opening(f"# {key}: {subject.title}", e, holder="pod's")
    lines += [
        f"- grace {d.grace_s} s (manifest: {pod.get('manifest_grace_s')} s) · QoS {pod.get('qos')} · "
        f"PID 1 of the main container: `{e.init}`",
        f"- command: {e.ran_as}",
        "",
        "## What the lab does differently from a node",
        "",
        *(f"- {n}" for n in pod.get("notes", [])),
        "",
        "## What happened",
        "",
    ]
    for point in ("after-spawn", "after-delete"):
        zombies, orphans = _counts(e, point)
        lines.append(f"- {point}: zombies {zombies}, orphans {orphans}")
    lines += [
        f"- deletion → memory free: {_seconds(m.release_latency_s)}; waited the whole grace: "
        + ("yes" if m.waited_whole_grace else "no"),
        f"- grace waste: {m.grace_waste_gib_s:.3f} GiB·s; processes left after deletion: {len(d.leftovers)}",
        "",
        "## Timeline (seconds since the lab started the pod)",
        "",
        "| t | event | detail |",
        "|---|---|---|",
    ]
    lines += [f"| {ev.t:.3f} | {ev.name} | {ev.detail} |" for ev in e.events]
    lines += ["", "## Numbers", "", "```json", dumps(m, indent=1), "```", ""]
    if d.prestop_log:
        lines += ["## preStop log", "", "```", d.prestop_log, "```", ""]
    return "\n".join(lines)


def pods_comparison_md(scenarios: Mapping[str, RunRecord]) -> str:
    """comparison.md of a folder with ``lab pod`` runs only: their provenance and the pods' table."""
    first = next(iter(scenarios.values()))
    lines = ["# gpuzombie lab pod: manifests run and deleted as the kubelet does, measured", ""]
    if first.cpu_standin:
        lines += ["> **CPU STAND-IN**: no GPU was used; memory is the pods' host RSS.", ""]
    prov = first.provenance
    gpu = ", ".join(f"{g['name']} ({g['memory_total_mib']} MiB)" for g in prov.get("gpus", [])) or "none"
    lines += [
        f"- machine: {prov.get('hostname')} ({prov.get('cpu')}, {prov.get('cpus')} CPUs) · kernel "
        f"{prov.get('kernel')} · GPU: {gpu} · driver: {prov.get('driver') or '—'}",
        "- each run's command and date:",
        *(f"  - {key}: {e.ran_as}" for key, e in scenarios.items()),
    ]
    lines += pods_md(scenarios)
    lines += [
        "",
        "Plots: [memory-timeline.png](memory-timeline.png); each run's folder has memory.png and notes.md.",
        "",
    ]
    return "\n".join(lines)
