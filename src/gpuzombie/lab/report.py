"""Render a lab run from results.json: comparison.md (the original experiment's final table, measured), each
scenario's notes.md, and the memory-over-time plots. ``gpuzombie lab report DIR`` calls ``build``."""

from __future__ import annotations

import statistics
import textwrap
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gpuzombie.jsonout import dumps, to_jsonable
from gpuzombie.lab.events import Event
from gpuzombie.lab.labrun import PodSubject, Scenario, ScenarioSubject
from gpuzombie.lab.nccl.summary import NcclSummary
from gpuzombie.lab.observation import Observation
from gpuzombie.lab.podreport import notes_opening, pod_notes, pods_comparison_md, pods_md
from gpuzombie.lab.records import LabResults, RunRecord
from gpuzombie.lab.results import load

BASE = ("s1-nofix", "s2-tini", "s3-tini-prestop", "s4-fullfix")
SHARE_PID = "s5-sharepid"
HEADINGS = {
    "s1-nofix": "S1 No Fix",
    "s2-tini": "S2 tini only",
    "s3-tini-prestop": "S3 tini + preStop",
    "s4-fullfix": "S4 Full Fix",
    SHARE_PID: "S5 shareProcessNamespace",
}
PROMPT_SHARE = 0.25
"""Memory freed within this share of the grace is "at once" for the user; held longer, it is the
the original experiment's waste (its 30 s against its 0 s)."""
MARKED_EVENTS = {
    "spawn": "spawn",
    "parent-exit": "parent exit",
    "kill-9": "kill -9",
    "delete": "delete",
    "prestop-start": "preStop",
    "prestop-end": "preStop end",
    "sigterm": "TERM",
    "sigkill": "KILL",
    "pod-exit": "gone",
    "memory-released": "free",
}
"""The events the plots mark, with their short labels (long ones ran into the next panel)."""
TITLE_WIDTH = 120
"""Characters per title line of a 9-inch plot at 8 pt: a lab pod run's long name wraps, never cut."""
LABEL_HEADROOM = 1.3
"""The y-axis ends this far above the largest memory held: room for the event labels (on a white
ground, so a label over the line stays legible), not twice the data (4 GiB drew on 0–9,000 MiB)."""


def format_seconds(value: float | None) -> str:
    return "—" if value is None else f"{value:.3f} s"


# Each row: the original experiment's value per scenario, whether that value means "yes" for the row's
# question, and how to read our answer (text, yes/no) from a scenario's entry.
Row = tuple[str, Sequence[str], Sequence[bool], Callable[[RunRecord], tuple[str, bool]]]


def _zombies(e: RunRecord) -> tuple[str, bool]:
    z = _count(e.observed("after-kill"), "zombies", 0)
    return (f"❌ {z} zombie(s) after kill -9, never reaped" if z else "✅ reaped (0 zombies after kill -9)", z > 0)


def _orphans(e: RunRecord) -> tuple[str, bool]:
    o = _count(e.observed("after-spawn"), "orphans", 0)
    if not o:
        return "✅ none", False
    if isinstance(e.subject, ScenarioSubject) and e.subject.victim_reaped:
        return f"⚠️ {o} (PPID = PID 1), reaped after kill -9", True
    return f"❌ {o} (PPID = PID 1), never reaped", True


def _freed_promptly(e: RunRecord) -> bool:
    """Good for the user: the memory was free within a quarter of the grace after the deletion."""
    m = e.metrics
    return m.release_latency_s is not None and m.release_latency_s < PROMPT_SHARE * m.grace_s


def _mark(good: bool) -> str:
    return "✅" if good else "❌"


def _sigterm(e: RunRecord) -> tuple[str, bool]:
    outcomes, m = e.deletion.outcomes, e.metrics
    if "exited_after_sigterm" in outcomes:
        return "✅ graceful: exited on preStop's SIGTERM", True
    if "exited_after_sigkill" in outcomes:
        t = e.config.prestop_timeout
        return f"❌ SIG_IGN: killed by preStop's SIGKILL fallback after {t:g} s", False
    rc = e.deletion.prestop_rc
    if m.waited_whole_grace and rc is not None:
        return f"❌ preStop did not finish within the grace (exit {rc}): SIGKILL at the grace's end", False
    if m.waited_whole_grace and e.init == "sleep":
        return (
            "❌ SIG_IGN; PID 1 (sleep) has no handler, so the kernel drops SIGTERM: SIGKILL at the grace's end",
            False,
        )
    if m.waited_whole_grace:
        return f"❌ SIG_IGN; PID 1 ({e.init}) outlived SIGTERM: SIGKILL at the grace's end", False
    # The workers ignored SIGTERM (bad), but the pod ended at once (good for the user): handled.
    if e.init == "pause":
        return (
            "⚠️ SIG_IGN, but the container's main process (sleep) exited on SIGTERM and the runtime "
            "killed the rest of the container",
            False,
        )
    return f"⚠️ SIG_IGN, but PID 1 ({e.init}) exited on SIGTERM and the kernel killed the namespace", False


def _kill9(e: RunRecord) -> tuple[str, bool]:
    t = e.metrics.kill9_to_free_s
    ctx = _summary(e.observed("after-kill")).get("orphaned_contexts")
    what = "RSS" if e.cpu_standin else "GPU memory"
    text = f"✅ none: {what} freed {format_seconds(t)} after kill -9" if t is not None else f"❌ {what} not freed"
    if ctx:
        text = f"❌ observe: {ctx} orphaned context(s); " + text[2:]
    return text, t is None or bool(ctx)


def _hold_time(e: RunRecord) -> tuple[str, bool]:
    m = e.metrics
    if m.release_latency_s is None:
        return "❌ still held at the end", True
    whole = m.waited_whole_grace or m.release_latency_s >= 0.9 * m.grace_s
    text = f"{_mark(_freed_promptly(e))} {format_seconds(m.release_latency_s)}" + (" (whole grace)" if whole else "")
    return text, whole


def _after_delete(e: RunRecord) -> tuple[str, bool]:
    """Whether the memory came back at all (no ghost): how long it took is the row above."""
    freed = e.metrics.released_at_s is not None
    return ("✅ all freed, none left held" if freed else "❌ still held at the end"), freed


def _waste(e: RunRecord) -> tuple[str, bool]:
    wasted = not _freed_promptly(e)
    return f"{_mark(not wasted)} {e.metrics.grace_waste_gib_s:.2f}", wasted


def _reboot(e: RunRecord) -> tuple[str, bool]:
    left = e.deletion.leftovers
    freed = e.metrics.released_at_s is not None
    return ("✅ not needed" if freed and not left else f"❌ {len(left)} process(es) left"), bool(left) or not freed


ROWS: tuple[Row, ...] = (
    ("Zombies reaped", ("❌ occur (1–10)", "✅ tini reaps", "✅", "✅"), (True, False, False, False), _zombies),
    (
        "Orphans left",
        ("❌ occur (PPID=1)", "⚠️ occur, tini reaps", "⚠️ occur, reaped", "✅ none (handler cleans up)"),
        (True, True, True, False),
        _orphans,
    ),
    (
        "SIGTERM handling",
        ("❌ SIG_IGN", "❌ SIG_IGN", "❌ but preStop tries cleanup", "✅ graceful"),
        (False, False, False, True),
        _sigterm,
    ),
    (
        "Orphaned CUDA ctx after kill -9",
        ("✅ none (driver frees)", "same (expected)", "same (expected)", "N/A"),
        (False, False, False, False),
        _kill9,
    ),
    (
        "How long the memory is held after pod deletion",
        ("30 s (whole grace)", "30 s (no handler)", "30 s (worker ignores)", "0 s ⭐"),
        (True, True, True, False),
        _hold_time,
    ),
    (
        "Memory after pod deletion",
        ("✅ freed (after SIGKILL)", "✅ freed", "✅ freed", "✅ freed at once"),
        (True, True, True, True),
        _after_delete,
    ),
    (
        "Grace waste (GiB·s)",
        ("≈74 per worker (740 with 10 workers)", "as S1 (expected)", "as S1 (expected)", "0"),
        (True, True, True, False),
        _waste,
    ),
    ("Node reboot needed", ("✅ not needed", "✅ not needed", "✅ not needed", "✅ not needed"), (False,) * 4, _reboot),
)


def _cell(
    entry: RunRecord | None,
    original: str | None,
    original_yes: bool | None,
    read: Callable[[RunRecord], tuple[str, bool]],
) -> str:
    """Our measurement; the original experiment's value beside it where it disagrees (S5: it never
    tried it). The rendered text calls that experiment "the seed", as the README does."""
    if entry is None:
        return f"not run (seed: {original})"
    text, yes = read(entry)
    return text if original is None or yes == original_yes else f"{text}<br>**seed expected: {original}**"


def main_entries(scenarios: Mapping[str, RunRecord]) -> dict[str, RunRecord | None]:
    """The main table's columns: the original experiment's four (each run or not), and S5 where it ran."""
    found = {
        k: next((e for r in ("", "-containerd", "-kubernetes") if (e := scenarios.get(f"{k}{r}"))), None)
        for k in (*BASE, SHARE_PID)
    }
    if found[SHARE_PID] is None:
        del found[SHARE_PID]
    return found


MEASURED: tuple[tuple[str, Callable[[RunRecord], str]], ...] = (
    ("PID 1", lambda e: f"`{e.init}`"),
    ("memory held at deletion (MiB)", lambda e: f"{e.metrics.held_at_delete_mib:.0f}"),
    ("deletion → memory free", lambda e: format_seconds(e.metrics.release_latency_s)),
    ("deletion → pod gone", lambda e: format_seconds(e.metrics.pod_exit_after_delete_s)),
    ("SIGKILL at grace end → free", lambda e: format_seconds(e.metrics.sigkill_to_free_s)),
    ("kill -9 of a worker → its memory free", lambda e: format_seconds(e.metrics.kill9_to_free_s)),
    (
        "deletion → free, × (kill -9 → free)",
        lambda e: "—" if e.metrics.release_over_kill9 is None else f"{e.metrics.release_over_kill9:.1f}×",
    ),
    (
        "preStop exit code / outcomes",
        lambda e: (
            "—"
            if e.deletion.prestop_rc is None
            else f"{e.deletion.prestop_rc}: {', '.join(e.deletion.outcomes) or 'no target'}"
        ),
    ),
    ("deletion → preStop hook running", lambda e: format_seconds(e.deletion.prestop_started_after_delete_s)),
    (
        "preStop SIGTERM → target gone",
        lambda e: ", ".join(format_seconds(o.exited_after_s) for o in e.deletion.prestop_outcomes or ()) or "—",
    ),
    ("pod exit code (unshare, or the container's)", lambda e: str(e.deletion.pod_exit_code)),
    (
        "zombies spawn / kill / delete",
        lambda e: " / ".join(
            str(_count(e.observed(p), "zombies", "—")) for p in ("after-spawn", "after-kill", "after-delete")
        ),
    ),
    ("observe summary after kill", lambda e: _observe_summary(e.observed("after-kill"))),
    ("processes left after deletion", lambda e: str(len(e.deletion.leftovers))),
    (
        "sampler: samples, mean interval, CPU",
        lambda e: f"{e.sampler.count}, {e.sampler.mean_interval_ms} ms, {e.sampler.cpu_percent_of_one_core}% of a core",
    ),
)

"""The rows of "Measured only": our numbers the seed had no value for."""


def _header_md(
    data: LabResults, columns: dict[str, RunRecord | None], first: RunRecord | None, prov: Mapping[str, Any]
) -> list[str]:
    """The title, the machine and the command, and the main table's heading."""
    scenarios = data.runs
    title = "the seed's four scenarios" + (" and S5 (shareProcessNamespace)" if SHARE_PID in columns else "")
    lines = [f"# Comparison: {title}, measured", ""]
    if first is not None and first.cpu_standin:
        lines += [
            '> **CPU STAND-IN**: no GPU was used. "Memory" below is host memory (RSS) of the',
            "> workers, standing in for GPU memory; the process and signal behaviour is real.",
            "",
        ]
    gpu = ", ".join(f"{g['name']} ({g['memory_total_mib']} MiB)" for g in prov.get("gpus", [])) or "none"
    lines += [
        (
            f"- date: {prov.get('date_utc')} · machine: {prov.get('hostname')} ({prov.get('cpu')}, "
            f"{prov.get('cpus')} CPUs) · kernel: {prov.get('kernel')} · cgroup {prov.get('cgroup')}"
        ),
        f"- GPU: {gpu} · driver: {prov.get('driver') or '—'} · torch: {prov.get('torch') or '—'}",
        f"- command: `{prov.get('command')}`",
    ]
    commands: dict[str, list[str]] = {}
    for key, e in scenarios.items():
        commands.setdefault(str(e.provenance.get("command")), []).append(key)
    if len(commands) > 1:
        lines.append("- runs merged here, each with its own command:")
        lines += [f"  - `{cmd}`: {', '.join(keys)}" for cmd, keys in commands.items()]
    if first is not None and isinstance(first.subject, ScenarioSubject):
        c = first.config
        lines.append(
            f"- grace {c.grace:g} s · {c.workers} worker(s) alive at deletion "
            f"(+1 killed with kill -9) · {c.size_mib} MiB each · memory: {first.memory}"
        )
    lines += [
        "",
        (
            "Cells show our measurement; where it disagrees with the seed's value the seed's is "
            "beside it in bold (the seed measured S1 and expected S2–S4; it never tried S5). Symbols, "
            "in our cells and in the seed's alike, say what is good for the user: ✅ the good outcome "
            f"(memory free within {PROMPT_SHARE:.0%} of the grace, nothing left), ❌ the bad one (memory "
            "held longer, zombies never reaped), ⚠️ it happened but was handled."
        ),
        "",
        "| | " + " | ".join(HEADINGS[k] for k in columns) + " |",
        "|---|" + "---|" * len(columns),
    ]
    return lines


def _variants_md(data: LabResults) -> list[str]:
    """The runs that vary a scenario (another PID 1, backend, uid)."""
    scenarios = data.runs
    lines: list[str] = []
    variants = [k for k, e in data.scenario_runs.items() if _is_variant(e)]
    if variants:
        lines += [
            "",
            "## Variants",
            "",
            (
                "| run | PID 1 | workers | memory | uid | zombies after kill | "
                "deletion → free | waited whole grace | grace waste (GiB·s) | kill -9 → free |"
            ),
            "|---|---|---|---|---|---|---|---|---|---|",
        ]
        for k in variants:
            e = scenarios[k]
            m, c = e.metrics, e.config
            lines.append(
                f"| {k} | `{e.init}` | {c.workers} | {c.backend} | {c.uid or '—'} | "
                f"{_count(e.observed('after-kill'), 'zombies', None)} | {format_seconds(m.release_latency_s)} | "
                f"{'yes' if m.waited_whole_grace else 'no'} | {m.grace_waste_gib_s:.2f} | "
                f"{format_seconds(m.kill9_to_free_s)} |"
            )
    return lines


def _nccl_md(nccl: NcclSummary | None) -> list[str]:
    """The NCCL section: its table, or its summary as JSON."""
    lines: list[str] = []
    if nccl is not None:
        lines += [
            "",
            "## NCCL",
            "",
            (
                "From `gpuzombie lab run --scenario nccl` (its files: "
                "[nccl/comparison.md](nccl/comparison.md), nccl/results.json):"
            ),
            "",
        ]
        if nccl.table_md:
            lines.append(nccl.table_md.rstrip())
        else:
            lines += ["```json", dumps(nccl, indent=1)[:6000], "```"]
    return lines


def comparison_md(data: LabResults) -> str:
    scenarios = data.runs
    if scenarios and not data.scenario_runs:
        return pods_comparison_md(scenarios)
    columns = main_entries(scenarios)
    base = list(columns.values())
    first = next((e for e in base if e), None) or next(iter(scenarios.values()), None)
    # Runs of the same kind merge into one results.json: describe the main table's own run.
    prov = (first.provenance if first else None) or data.provenance
    lines = _header_md(data, columns, first, prov)
    for label, original, original_yes, read in ROWS:
        cells = [_cell(e, s, y, read) for e, s, y in zip(base, (*original, None), (*original_yes, None))]
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    nccl = data.nccl
    s5_cell = " — |" if SHARE_PID in columns else ""
    lines.append(
        "| NCCL hang: GPU memory held | not run here (the seed measured 5.7 GB held until the pod was "
        "deleted, on its 4×A100 node) | not run (seed expected: same) | not run (seed expected: preStop "
        "cannot end the hang) | not run (seed expected: NCCL_ASYNC + destroy_process_group frees it) |" + s5_cell
        if nccl is None
        else "| NCCL hang: GPU memory held | see [NCCL](#nccl) | | | |" + s5_cell
    )
    lines += ["", "## Measured only", "", "| | " + " | ".join(columns) + " |", "|---|" + "---|" * len(columns)]
    for label, fn in MEASURED:
        lines.append(f"| {label} | " + " | ".join(fn(e) if e else "—" for e in base) + " |")
    lines += spread_md(scenarios)
    lines += _variants_md(data)
    lines += pods_md(data.pod_runs)
    lines += _nccl_md(nccl)
    lines += [
        "",
        (
            "Plots: [memory-timeline.png](memory-timeline.png) (memory held around each deletion, "
            "events marked); each scenario's folder has its own memory.png and notes.md."
        ),
        "",
    ]
    return "\n".join(lines)


def _count(obs: Observation | None, what: str, missing: Any) -> Any:
    """The host's count of zombies or orphans at an observation (``missing`` where there was none)."""
    return missing if obs is None else getattr(obs, what)


def _summary(obs: Observation | None) -> Mapping[str, Any]:
    """observe's own JSON summary at an observation (what the pod's observe printed), or nothing."""
    return (obs.observe_summary if obs else None) or {}


def _observe_summary(obs: Observation | None) -> str:
    s = _summary(obs)
    if not s:
        return (obs.observe_error if obs else None) or "—"
    return f"zombies {s.get('zombies')}, orphans {s.get('orphans')}, orphaned ctx {s.get('orphaned_contexts')}"


def _is_variant(e: RunRecord) -> bool:
    """A scenario's run outside the main table and the runtimes table: another init, uid, backend..."""
    return e.variant not in SPREAD_SCENARIOS and e.attempt == 1


SPREAD_SCENARIOS = (*BASE, SHARE_PID, "s4-fullfix-fasthook")
TIMINGS = (
    ("deletion → free", "release_latency_s", "s"),
    ("kill -9 → free", "kill9_to_free_s", "s"),
    ("grace waste", "grace_waste_gib_s", "GiB·s"),
)
WHY_RUNTIMES_DIFFER = {
    "release_latency_s": (
        "the deletion's path differs: on containerd SIGTERM and the SIGKILL at the grace's end come from "
        "the runc shim (StopContainer), a preStop hook starts through ExecSync (runc exec: a new process "
        "joined to the container's namespaces and cgroup) and the kubelet gives StopContainer at least "
        "2 s after a hook; on namespaces the lab signals PID 1 itself and enters the pod with nsenter"
    ),
    "kill9_to_free_s": (
        "kill -9 is the same kernel path on both; a difference here is the reaping (and, on a GPU, the "
        "driver's teardown) racing the 10 ms sampler, not the runtime"
    ),
    "grace_waste_gib_s": "it is memory × time held after the deletion: it follows deletion → free",
}
WHY_KUBERNETES_DIFFERS = {
    "release_latency_s": (
        "on kubernetes the deletion goes through the API server: kubectl delete sets the deletionTimestamp, "
        "the kubelet's watch delivers it to the pod's worker, which runs the preStop hook (an exec through "
        "the API server's path into containerd) and only then StopContainer; the kubelet counts the grace "
        "from its own start of the kill, not from the request, so a pod that waits the whole grace is "
        "SIGKILLed that much later"
    ),
    "kill9_to_free_s": WHY_RUNTIMES_DIFFER["kill9_to_free_s"],
    "grace_waste_gib_s": WHY_RUNTIMES_DIFFER["grace_waste_gib_s"],
}
RUNTIME_PAIRS = (("namespaces", "containerd"), ("containerd", "kubernetes"), ("namespaces", "kubernetes"))


@dataclass(frozen=True)
class Spread:
    median: float
    low: float
    high: float
    n: int

    def __str__(self) -> str:
        if self.n == 1:
            return f"{self.median:.3f}"
        return f"{self.median:.3f} ({self.low:.3f}–{self.high:.3f})"

    def apart_from(self, other: Spread) -> bool:
        """The two ranges do not overlap, and by more than 10 ms (or 1 % of the larger)."""
        gap = max(self.low - other.high, other.low - self.high)
        return gap > max(0.01, 0.01 * max(self.high, other.high))


def spread(entries: Sequence[RunRecord], metric: str) -> Spread | None:
    values = [v for e in entries if (v := getattr(e.metrics, metric)) is not None]
    if not values:
        return None
    return Spread(statistics.median(values), min(values), max(values), len(values))


def runtime_groups(scenarios: Mapping[str, RunRecord]) -> dict[tuple[str, str], list[RunRecord]]:
    """(scenario, runtime) → its runs, for the five scenarios."""
    groups: dict[tuple[str, str], list[RunRecord]] = {}
    for e in scenarios.values():
        if e.variant in SPREAD_SCENARIOS:
            groups.setdefault((e.variant, e.runtime), []).append(e)
    return groups


def spread_md(scenarios: Mapping[str, RunRecord]) -> list[str]:
    """Each scenario on each runtime: median (min–max) over the repetitions, and every difference
    between the runtimes larger than the spread, with its cause."""
    groups = runtime_groups(scenarios)
    if not groups or (len(groups) <= len(SPREAD_SCENARIOS) and all(len(v) == 1 for v in groups.values())):
        return []  # one run of each scenario on one runtime: the tables above say it all
    kube = " `kubernetes`: real Pods, created and deleted through the API server, run and stopped by the kubelet."
    lines = [
        "",
        "## Runtimes and spread",
        "",
        "Median (min–max) over the repetitions; `namespaces`: PID namespaces made by the lab; "
        "`containerd`: real CRI pods (sandbox, container, the kubelet's calls)."
        + (kube if any(runtime == "kubernetes" for _name, runtime in groups) else "")
        + " S5 is S1's workload with "
        "`shareProcessNamespace: true` (the pod's pause, `catatonit -P`, is PID 1; no tini).",
        "",
        "| scenario | runtime | runs | "
        + " | ".join(f"{label} ({unit})" for label, _m, unit in TIMINGS)
        + " | zombies after kill -9 | whole grace waited |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for (name, runtime), entries in sorted(groups.items()):
        cells = [str(spread(entries, metric) or "—") for _label, metric, _unit in TIMINGS]
        zombies = ", ".join(str(_count(e.observed("after-kill"), "zombies", "—")) for e in entries)
        waited = sum(1 for e in entries if e.metrics.waited_whole_grace)
        lines.append(
            f"| {name} | {runtime} | {len(entries)} | "
            + " | ".join(cells)
            + f" | {zombies} | {waited}/{len(entries)} |"
        )
    lines += _differences(groups)
    return lines


def _differences(groups: Mapping[tuple[str, str], list[RunRecord]]) -> list[str]:
    runtimes = {runtime for _name, runtime in groups}
    pairs = [(a, b) for a, b in RUNTIME_PAIRS if a in runtimes and b in runtimes]
    if not pairs:
        return []
    found = []
    for a_name, b_name in pairs:
        why = WHY_KUBERNETES_DIFFERS if b_name == "kubernetes" else WHY_RUNTIMES_DIFFER
        for name in SPREAD_SCENARIOS:
            ours, theirs = groups.get((name, a_name)), groups.get((name, b_name))
            if not ours or not theirs:
                continue
            for label, metric, unit in TIMINGS:
                a, b = spread(ours, metric), spread(theirs, metric)
                if a and b and a.apart_from(b):
                    found.append(f"- **{name}, {label}**: {a_name} {a} {unit} vs {b_name} {b} {unit}: " + why[metric])
    together = "both runtimes" if len(runtimes) == 2 else "the runtimes"
    return [
        "",
        "Differences between the runtimes larger than the spread (ranges apart by more than 10 ms or 1 %):",
        "",
        *(found or [f"- none: {together} gave the same timings within their spread"]),
    ]


def notes_for(key: str, e: RunRecord) -> str:
    """A run's notes.md: a scenario's, or (``lab pod``) its manifest's pod's."""
    if isinstance(e.subject, PodSubject):
        return pod_notes(key, e, e.subject)
    return scenario_notes(key, e, e.subject.scenario)


def scenario_notes(key: str, e: RunRecord, scenario: Scenario) -> str:
    """A scenario's notes.md: what happened beside what the original experiment found."""
    m, c, d = e.metrics, e.config, e.deletion
    number = scenario.number
    title = f"# {key}: scenario {number}, {scenario.title}"
    lines = notes_opening(title, e, holder="workers'", memory=f"{c.size_mib} MiB per worker, ")
    lines += [
        f"- grace {c.grace:g} s; preStop: "
        + (
            f"`gpuzombie prestop --timeout {c.prestop_timeout:g} --kill-wait {c.prestop_kill_wait:g}`"
            if scenario.prestop
            else "none"
        ),
        f"- command: {e.ran_as}",
        "",
        "## What happened",
        "",
    ]
    for label, original, original_yes, read in ROWS:
        text, yes = read(e)
        idx = number - 1
        original_known = idx < len(original)  # S5 is ours: the original experiment never tried shareProcessNamespace
        differs = (
            "" if not original_known or yes == original_yes[idx] else f" — **differs from the seed ({original[idx]})**"
        )
        lines.append(f"- {label}: {text}{differs}")
    lines += ["", "## Timeline (seconds since the pod started)", "", "| t | event | detail |", "|---|---|---|"]
    lines += [f"| {ev.t:.3f} | {ev.name} | {ev.detail} |" for ev in e.events]
    lines += ["", "## Numbers", "", "```json", dumps(m, indent=1), "```", "", f"Sampler: {to_jsonable(e.sampler)}", ""]
    if d.prestop_log:
        lines += ["## preStop log", "", "```", d.prestop_log, "```", ""]
    if e.init != "sleep" and not scenario.prestop and not m.waited_whole_grace:
        lines += [
            "## Why the grace was not used up",
            "",
            (
                f"SIGTERM went to PID 1 ({e.init}), which forwarded it to its child (`sleep`); the "
                "child died, the init exited with it, and the kernel SIGKILLs every process of a PID "
                "namespace whose init exits, the SIGTERM-ignoring workers included. The seed "
                "expected the whole grace here; an init whose main child survives SIGTERM (or a "
                "worker that is the main process) would use it up."
            ),
            "",
        ]
    return "\n".join(lines)


def _mark_events(ax: Any, events: Sequence[Event], shift: float = 0.0) -> None:
    """A dotted line per event inside the axis; events closer than 1 % of it share one label,
    and labels in the right fifth are drawn leftwards so none runs off the figure."""
    lo, hi = ax.get_xlim()
    ymax = ax.get_ylim()[1]
    groups: list[tuple[float, list[str]]] = []
    for ev in events:
        x = ev.t - shift
        if ev.name not in MARKED_EVENTS or not lo <= x <= hi:
            continue
        ax.axvline(x, color="tab:red" if ev.name in ("sigkill", "kill-9") else "grey", linestyle=":", linewidth=0.8)
        if groups and x - groups[-1][0] < 0.01 * (hi - lo):
            groups[-1][1].append(MARKED_EVENTS[ev.name])
        else:
            groups.append((x, [MARKED_EVENTS[ev.name]]))
    for x, names in groups:
        right_edge = x > lo + 0.8 * (hi - lo)
        ax.text(
            x,
            ymax * 0.97,
            " + ".join(names),
            rotation=90,
            fontsize=6,
            va="top",
            ha="right" if right_edge else "left",
            bbox={"facecolor": "white", "edgecolor": "none", "alpha": 0.7, "pad": 0.5},
        )


def _shade_waste(ax: Any, e: RunRecord, shift: float = 0.0) -> None:
    """Shade the memory held from the deletion until it was free: the grace waste (GiB·s)."""
    delete = e.deletion.requested_at
    released = e.metrics.released_at_s
    end = released if released is not None else (e.samples.t or (delete,))[-1]
    pairs = [(t, held) for t, held in zip(e.samples.t, e.samples.held_mib, strict=True) if delete <= t <= end]
    if pairs:
        ax.fill_between(
            [t - shift for t, _ in pairs],
            [held for _, held in pairs],
            step="post",
            color="tab:orange",
            alpha=0.35,
        )


def _waste_title(e: RunRecord) -> str:
    return f"grace waste {e.metrics.grace_waste_gib_s:.2f} GiB·s (shaded)"


def _draw_memory(ax: Any, e: RunRecord, shift: float, xlim: tuple[float, float] | None = None) -> None:
    """The memory held, its waste shaded, the events marked (inside ``xlim`` when given)."""
    ax.plot([t - shift for t in e.samples.t], e.samples.held_mib, linewidth=1, drawstyle="steps-post")
    ax.set_ylim(bottom=0, top=max(e.samples.held_mib or (1,)) * LABEL_HEADROOM + 1)
    if xlim is not None:
        ax.set_xlim(*xlim)
    _shade_waste(ax, e, shift)
    _mark_events(ax, e.events, shift=shift)


def timeline_range(scenarios: Mapping[str, RunRecord]) -> tuple[float, float]:
    """One time axis for every scenario (seconds since its deletion): from just before the
    earliest kill -9 to the latest sample, so 30 s of S1 and 0.1 s of S2 read on one scale."""
    starts, ends = [], []
    for e in scenarios.values():
        delete = e.deletion.requested_at
        kill9 = next((ev.t for ev in e.events if ev.name == "kill-9"), delete)
        starts.append(kill9 - delete)
        ends.append((e.samples.t or (delete,))[-1] - delete)
    lo, hi = min(starts, default=0.0), max(ends, default=1.0)
    pad = 0.02 * (hi - lo) + 0.05
    return lo - pad, hi + pad


def plots(data: LabResults, out_dir: Path) -> list[Path]:
    """memory.png per scenario and memory-timeline.png (every run on one time scale, 0 = deletion)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return []
    written: list[Path] = []
    scenarios = data.runs
    for key, e in scenarios.items():
        fig, ax = plt.subplots(figsize=(9, 3.2))
        _draw_memory(ax, e, shift=0.0)
        ax.set_xlabel("seconds since the pod started")
        ax.set_ylabel("memory held (MiB)")
        ax.set_title(textwrap.fill(f"{key}: {e.memory}; {_waste_title(e)}", TITLE_WIDTH), fontsize=8)
        fig.tight_layout()
        path = out_dir / key / "memory.png"
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)
    firsts = {k: e for k, e in scenarios.items() if e.attempt == 1}  # one panel per group
    if firsts:
        xlim = timeline_range(firsts)
        fig, axes = plt.subplots(len(firsts), 1, figsize=(10, 2.2 * len(firsts) + 0.8), squeeze=False, sharex=True)
        for ax, (key, e) in zip(axes[:, 0], firsts.items(), strict=True):
            _draw_memory(ax, e, shift=e.deletion.requested_at, xlim=xlim)
            ax.set_ylabel("MiB", fontsize=7)
            ax.set_title(f"{key}: {_waste_title(e)}", fontsize=8, loc="left")
        axes[-1, 0].set_xlabel("seconds since the deletion request (one scale for every scenario)")
        first = next(iter(firsts.values()))
        fig.suptitle(f"memory held per scenario, grace waste shaded: {first.memory}", fontsize=9)
        fig.tight_layout(rect=(0, 0, 1, 0.99))
        path = out_dir / "memory-timeline.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        written.append(path)
    return written


def build(out_dir: Path) -> list[Path]:
    """Rebuild comparison.md, every notes.md and the plots from results.json."""
    data = load(out_dir)
    written = [out_dir / "comparison.md"]
    written[0].write_text(comparison_md(data))
    for key, e in data.runs.items():
        path = out_dir / key / "notes.md"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(notes_for(key, e))
        written.append(path)
    return written + plots(data, out_dir)
