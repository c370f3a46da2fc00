"""One evaluation of the fence, and the loop that repeats it: the rules listed from the API server
(its only state), the verdicts read from Prometheus, the devices of the nodes in question read from
their ResourceSlices, ``decide``, then the creates and deletes (none in a dry run).

Fails safe: when Prometheus cannot be read nothing is changed (one log line when that starts and one
when it ends; ``gpuzombie_fence_verdicts_available`` 0); a rule whose GPU has no verdict series is
kept. A create refused as AlreadyExists (another replica, or a pass before a restart) is the rule
wanted; a delete refused by its uid precondition (the rule made again by someone) leaves it alone."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from prometheus_client import CollectorRegistry, Counter, Gauge

from gpuzombie.fence.decide import HeldBack, Limits, Plan, decide, nodes_to_map, summary
from gpuzombie.fence.model import RULES_PATH, SLICES_PATH, Device, Rule, parse_rule, slice_devices
from gpuzombie.fence.verdicts import Prometheus, VerdictUnavailable
from gpuzombie.k8s.apiserver import ApiError, ApiServer

Log = Callable[[str], None]


@dataclass(frozen=True)
class Settings:
    drivers: tuple[str, ...]
    """The DRA drivers whose devices are GPUs to fence (gpu.nvidia.com)."""
    limits: Limits
    clean_evaluations: int = 3
    interval: float = 15.0
    dry_run: bool = False


@dataclass(frozen=True)
class Outcome:
    """What one evaluation saw, decided and did."""

    plan: Plan | None
    """None when the verdicts could not be read (nothing was changed)."""
    created: tuple[str, ...] = ()
    deleted: tuple[str, ...] = ()
    errors: tuple[str, ...] = ()
    skipped: str | None = None
    api_calls: int = 0
    seconds: float = 0.0
    dry_run: bool = False
    rules: tuple[dict, ...] = field(default=())
    """The rules created (or, in a dry run, that would be)."""


class Metrics:
    """The fence's own series, on its /metrics."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.available = Gauge(
            "gpuzombie_fence_verdicts_available",
            "1 when the last evaluation could read the verdicts from Prometheus; 0: nothing was changed",
            registry=registry,
        )
        self.rules = Gauge(
            "gpuzombie_fence_rules", "DeviceTaintRules of the fence's after the last evaluation", registry=registry
        )
        self.limited = Gauge(
            "gpuzombie_fence_limited_gpus", "Dirty GPUs left unfenced because a limit was reached", registry=registry
        )
        self.unmapped = Gauge(
            "gpuzombie_fence_unmapped_gpus",
            "Dirty GPUs with no device of the watched DRA drivers (not fenced)",
            registry=registry,
        )
        self.missing = Gauge(
            "gpuzombie_fence_missing_verdicts",
            "Fenced GPUs without a verdict series now (their rule kept: never untainted on missing data)",
            registry=registry,
        )
        self.evaluations = Counter(
            "gpuzombie_fence_evaluations",
            "Evaluations, by outcome (ok, skipped, error)",
            ["outcome"],
            registry=registry,
        )
        self.changes = Counter(
            "gpuzombie_fence_rule_changes", "Rules created and deleted", ["action"], registry=registry
        )
        for outcome in ("ok", "skipped", "error"):
            self.evaluations.labels(outcome)
        for action in ("create", "delete"):
            self.changes.labels(action)

    def record(self, outcome: Outcome) -> None:
        self.available.set(0 if outcome.skipped else 1)
        kind = "skipped" if outcome.skipped else ("error" if outcome.errors else "ok")
        self.evaluations.labels(kind).inc()
        if outcome.plan is None or outcome.dry_run:
            return
        plan = outcome.plan
        self.rules.set(len(plan.keep) + len(outcome.created))
        self.limited.set(len(plan.limited))
        self.unmapped.set(len(plan.unmapped))
        self.missing.set(len(plan.missing))
        self.changes.labels("create").inc(len(outcome.created))
        self.changes.labels("delete").inc(len(outcome.deleted))


def list_rules(api: ApiServer) -> list[Rule]:
    """Every DeviceTaintRule (others' too: they are counted, never touched)."""
    return [parse_rule(obj) for obj in api.list(RULES_PATH)]


def node_devices(api: ApiServer, nodes: Iterable[str], drivers: Sequence[str]) -> dict[str, list[Device]]:
    """The devices of the watched drivers on each node, from its ResourceSlices (a field selector each)."""
    found: dict[str, list[Device]] = {}
    for node in sorted(nodes):
        devices: list[Device] = []
        for resource_slice in api.list(SLICES_PATH, field_selector=f"spec.nodeName={node}"):
            devices += [d for d in slice_devices(resource_slice) if d.driver in drivers]
        found[node] = devices
    return found


class Fence:
    """The fence's evaluation against one API server and one Prometheus."""

    def __init__(
        self,
        api: ApiServer,
        prometheus: Prometheus,
        settings: Settings,
        *,
        log: Log,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.api, self.prometheus, self.settings = api, prometheus, settings
        self.log, self.clock = log, clock
        self._blind_since: float | None = None
        self._said_limited: frozenset[tuple[str, str]] = frozenset()
        """The GPUs whose "not fenced" line was logged: said once while they stay held back."""

    def evaluate(self) -> Outcome:
        """One pass; raises ApiError when the API server cannot list the rules (nothing decided)."""
        began, calls = time.monotonic(), self.api.calls
        rules = list_rules(self.api)
        fenced = [r.uuid for r in rules if r.own]
        try:
            verdicts = self.prometheus.verdicts(
                self.clock(),
                fenced=fenced,
                evaluations=self.settings.clean_evaluations,
                interval=self.settings.interval,
            )
        except VerdictUnavailable as exc:
            if self._blind_since is None:
                self._blind_since = time.monotonic()
                self.log(f"verdicts unavailable, changing nothing until they are back: {exc}")
            return Outcome(None, skipped=str(exc), api_calls=self.api.calls - calls, seconds=time.monotonic() - began)
        if self._blind_since is not None:
            self.log(f"verdicts back after {time.monotonic() - self._blind_since:.0f} s")
            self._blind_since = None
        plan = decide(
            verdicts,
            rules,
            node_devices(self.api, nodes_to_map(verdicts, rules), self.settings.drivers),
            self.settings.limits,
        )
        return self._apply(plan, began, calls)

    def _apply(self, plan: Plan, began: float, calls: int) -> Outcome:
        created, deleted, errors = [], [], []
        objects = tuple(c.rule() for c in plan.create)
        if not self.settings.dry_run:
            # Deletes first: the limits counted their places as free. A delete that failed keeps its
            # place, and as many creates wait for the next evaluation.
            stuck = 0
            for rule in plan.delete:
                try:
                    self.api.delete(f"{RULES_PATH}/{rule.name}", uid=rule.uid)
                except ApiError as exc:
                    if exc.http_status not in (404, 409):  # gone already, or no longer the rule we listed
                        errors.append(f"delete {rule.name}: {exc}")
                        stuck += 1
                    continue
                deleted.append(rule.name)
                self.log(
                    f"lifted rule {rule.name} (node {rule.node}, {rule.uuid}): clean at "
                    f"{self.settings.clean_evaluations} evaluation(s) in a row"
                )
            for create, obj in list(zip(plan.create, objects))[: len(plan.create) - stuck]:
                try:
                    self.api.create(RULES_PATH, obj)
                except ApiError as exc:
                    if exc.reason != "AlreadyExists":
                        errors.append(f"create {create.name}: {exc}")
                        continue
                created.append(create.name)
                self.log(
                    f"fenced {create.device.driver}/{create.device.pool}/{create.device.name} "
                    f"(node {create.reading.node}, {create.reading.uuid}, {create.reading.held_bytes // 2**20} MiB "
                    f"held by {create.reading.holder}): rule {create.name}"
                )
        for line in errors:
            self.log(f"error: {line}")
        for held in plan.limited:
            if held.reading.key not in self._said_limited:
                self.log(f"not fenced: node {held.reading.node} {held.reading.uuid}: {held.why}")
        self._said_limited = frozenset(h.reading.key for h in plan.limited)
        return Outcome(
            plan,
            created=tuple(created),
            deleted=tuple(deleted),
            errors=tuple(errors),
            api_calls=self.api.calls - calls,
            seconds=time.monotonic() - began,
            dry_run=self.settings.dry_run,
            rules=objects,
        )

    def run(self, stop: threading.Event, metrics: Metrics) -> None:
        """Evaluate every ``interval`` seconds until ``stop`` is set; an API error is logged and counted."""
        while not stop.is_set():
            began = time.monotonic()
            try:
                outcome = self.evaluate()
            except ApiError as exc:
                self.log(f"error: {exc}")
                outcome = Outcome(None, errors=(str(exc),))
                metrics.evaluations.labels("error").inc()
            else:
                metrics.record(outcome)
            stop.wait(max(0.0, self.settings.interval - (time.monotonic() - began)))


def report(outcome: Outcome) -> dict:
    """The JSON form of one evaluation (schema gpuzombie.fence/1)."""
    plan = outcome.plan
    return {
        "schema": "gpuzombie.fence/1",
        "dry_run": outcome.dry_run,
        "verdicts_available": outcome.skipped is None,
        "skipped": outcome.skipped,
        "counts": summary(plan) if plan else None,
        "create": [c.name for c in plan.create] if plan else [],
        "delete": [r.name for r in plan.delete] if plan else [],
        "created": list(outcome.created),
        "deleted": list(outcome.deleted),
        "limited": [_held(h) for h in plan.limited] if plan else [],
        "unmapped": [_held(h) for h in plan.unmapped] if plan else [],
        "missing": [{"rule": r.name, "node": r.node, "uuid": r.uuid} for r in plan.missing] if plan else [],
        "errors": list(outcome.errors),
        "api_calls": outcome.api_calls,
        "seconds": round(outcome.seconds, 4),
        "rules": list(outcome.rules),
    }


def _held(held: HeldBack) -> dict:
    return {"node": held.reading.node, "uuid": held.reading.uuid, "why": held.why}
