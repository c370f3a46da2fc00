"""The fence's decision, pure: the verdicts, the rules that exist and the devices of the nodes in
question in; the rules to create and to delete out, with what was held back and why.

- A dirty GPU whose DRA device has no rule of the fence's gets one, unless a limit says no: at most
  ``max_devices`` rules in all, at most ``max_node_percent`` % of a node's devices (rounded down).
- A rule of the fence's goes only when its GPU read clean at each of the last ``clean_evaluations``
  evaluations (``Verdicts.clean_streak``); a GPU without a verdict now keeps its rule: never untaint
  on missing data.
- Rules the fence did not make are never in the plan."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from gpuzombie.fence.model import Device, GpuKey, Reading, Rule, render_rule, rule_name


@dataclass(frozen=True)
class Limits:
    max_devices: int | None = None
    """Rules of the fence's at once, cluster-wide."""
    max_node_percent: float | None = None
    """Of a node's devices (of the watched drivers), fenced at once."""


@dataclass(frozen=True)
class Verdicts:
    """What the metrics said at one evaluation."""

    readings: Mapping[GpuKey, Reading]
    clean_streak: frozenset[GpuKey] = frozenset()
    """GPUs that read clean at each of the last N evaluations (N: the fence's --clean-evaluations)."""


@dataclass(frozen=True)
class Create:
    device: Device
    reading: Reading

    @property
    def name(self) -> str:
        return rule_name(self.device)

    def rule(self) -> dict:
        return render_rule(self.device, self.reading)


@dataclass(frozen=True)
class HeldBack:
    """A dirty GPU left unfenced: at a limit, or with no DRA device to taint."""

    reading: Reading
    why: str
    device: Device | None = None


@dataclass(frozen=True)
class Plan:
    create: tuple[Create, ...] = ()
    delete: tuple[Rule, ...] = ()
    keep: tuple[Rule, ...] = ()
    limited: tuple[HeldBack, ...] = ()
    """Dirty GPUs a limit kept unfenced: what the fence alerts on."""
    unmapped: tuple[HeldBack, ...] = ()
    """Dirty GPUs with no device of the watched drivers (no DRA, or not a full GPU)."""
    missing: tuple[Rule, ...] = ()
    """Rules kept because their GPU has no verdict now (the exporter, or its series, gone)."""
    foreign_rules: int = field(default=0)
    """Rules of others that were listed (never touched)."""


def nodes_to_map(verdicts: Verdicts, rules: Sequence[Rule]) -> set[str]:
    """Nodes whose devices the decision needs: those with a dirty GPU that no rule of the fence's covers."""
    fenced = {r.key for r in rules if r.own}
    return {r.node for r in verdicts.readings.values() if r.dirty and r.key not in fenced}


def decide(
    verdicts: Verdicts,
    rules: Sequence[Rule],
    devices: Mapping[str, Sequence[Device]],
    limits: Limits,
) -> Plan:
    """The plan for one evaluation (``devices``: by node, for at least ``nodes_to_map``'s nodes)."""
    own = [r for r in rules if r.own]
    delete = tuple(r for r in own if r.key in verdicts.clean_streak)
    keep = tuple(r for r in own if r.key not in verdicts.clean_streak)
    missing = tuple(r for r in keep if r.key not in verdicts.readings)
    fenced_gpus = {r.key for r in own}
    fenced_devices = {(r.driver, r.pool, r.device) for r in own}
    total = len(keep)
    per_node = Counter(r.node for r in keep)
    create: list[Create] = []
    limited: list[HeldBack] = []
    unmapped: list[HeldBack] = []
    for reading in sorted(verdicts.readings.values(), key=lambda r: r.key):
        if not reading.dirty or reading.key in fenced_gpus:
            continue
        node_devices = devices.get(reading.node, ())
        device = next((d for d in node_devices if d.uuid == reading.uuid), None)
        if device is None:
            unmapped.append(HeldBack(reading, f"no DRA device on node {reading.node} has uuid {reading.uuid}"))
            continue
        if device.ref in fenced_devices:
            continue
        why = _over_limit(limits, total, per_node[reading.node], len(node_devices), reading.node)
        if why:
            limited.append(HeldBack(reading, why, device))
            continue
        create.append(Create(device, reading))
        fenced_devices.add(device.ref)
        total += 1
        per_node[reading.node] += 1
    return Plan(
        create=tuple(create),
        delete=delete,
        keep=keep,
        limited=tuple(limited),
        unmapped=tuple(unmapped),
        missing=missing,
        foreign_rules=len(rules) - len(own),
    )


def _over_limit(limits: Limits, total: int, on_node: int, node_devices: int, node: str) -> str | None:
    if limits.max_devices is not None and total >= limits.max_devices:
        return f"at the limit of {limits.max_devices} fenced devices in all"
    if limits.max_node_percent is not None:
        allowed = math.floor(node_devices * limits.max_node_percent / 100 + 1e-9)
        if on_node >= allowed:
            return (
                f"at the limit of {limits.max_node_percent:g} % of node {node}'s {node_devices} devices "
                f"({allowed} fenced at most)"
            )
    return None


def summary(plan: Plan) -> dict[str, int]:
    """The counts a log line and the metrics show."""
    return {
        "create": len(plan.create),
        "delete": len(plan.delete),
        "keep": len(plan.keep),
        "limited": len(plan.limited),
        "unmapped": len(plan.unmapped),
        "missing": len(plan.missing),
        "foreign_rules": plan.foreign_rules,
    }
