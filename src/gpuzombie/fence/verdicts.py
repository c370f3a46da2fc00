"""The fleet's verdict from Prometheus's HTTP API (``/api/v1/query``, ``/api/v1/query_range``):
each GPU's ``gpuzombie_gpu_handover_clean`` and the memory its holders keep
(``gpuzombie_gpu_held_memory_bytes``), the exporter's series (docs/handover.md, "On the node").

The clean streak comes from Prometheus too, not from memory: the verdict at each of the last N
evaluation times (a range query, step = the fence's interval), so a restarted fence knows it and the
rule needs no counter written into it (the fence may not update rules). A GPU instance under MIG is
left out: its DRA device is not matched by a UUID alone."""

from __future__ import annotations

import json
import urllib.error
import urllib.parse
import urllib.request
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpuzombie.errors import GpuzombieError
from gpuzombie.fence.decide import Verdicts
from gpuzombie.fence.model import GpuKey, Reading

CLEAN = "gpuzombie_gpu_handover_clean"
HELD = "gpuzombie_gpu_held_memory_bytes"
NODE_LABEL = "Hostname"
"""The node's name on the exporter's GPU series (its --node-name, the DaemonSet's spec.nodeName)."""
TIMEOUT_S = 10.0


class VerdictUnavailable(GpuzombieError):
    """Prometheus could not be asked, or did not answer a query: the fence changes nothing."""


def _series_key(metric: Mapping[str, str]) -> GpuKey | None:
    if metric.get("GPU_I_ID"):  # a MIG instance: see the module's docstring
        return None
    node, uuid = metric.get(NODE_LABEL), metric.get("UUID")
    return (node, uuid) if node and uuid else None


def _value(sample: Sequence[Any]) -> float:
    return float(sample[1])


def parse_readings(clean: Iterable[Mapping[str, Any]], held: Iterable[Mapping[str, Any]]) -> dict[GpuKey, Reading]:
    """Instant vectors of the two series into one reading a GPU; a GPU with no clean series has none."""
    holders: dict[GpuKey, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for series in held:
        key = _series_key(series["metric"])
        if key is not None and _value(series["value"]) > 0:
            holders[key][series["metric"].get("holder", "unknown")] += int(_value(series["value"]))
    readings = {}
    for series in clean:
        key = _series_key(series["metric"])
        if key is None:
            continue
        at, value = float(series["value"][0]), _value(series["value"])
        held_by = tuple(sorted(holders.get(key, {}).items(), key=lambda item: (-item[1], item[0])))
        readings[key] = Reading(key[0], key[1], clean=value == 1, held=held_by, at=at)
    return readings


def parse_streak(matrix: Iterable[Mapping[str, Any]], evaluations: int) -> frozenset[GpuKey]:
    """GPUs whose range result holds ``evaluations`` points, every one of them clean (1)."""
    points: dict[GpuKey, list[float]] = defaultdict(list)
    for series in matrix:
        key = _series_key(series["metric"])
        if key is not None:
            points[key] += [_value(v) for v in series["values"]]
    return frozenset(k for k, v in points.items() if len(v) >= evaluations and all(x == 1 for x in v))


_RE2_SPECIAL = frozenset("\\.+*?()|[]{}^$")


def uuid_matcher(uuids: Iterable[str]) -> str:
    """The body of a PromQL string for a ``=~`` matcher of exactly these UUIDs: RE2 (anchored by
    Prometheus) with its metacharacters escaped, then backslashes and quotes escaped for the string
    (PromQL refuses an unknown escape such as ``\\-``, which Python's re.escape writes)."""
    alternatives = ("".join("\\" + c if c in _RE2_SPECIAL else c for c in u) for u in sorted(set(uuids)))
    return "|".join(alternatives).replace("\\", "\\\\").replace('"', '\\"')


@dataclass(frozen=True)
class Prometheus:
    """Prometheus's HTTP API at ``base`` (http://host:9090)."""

    base: str
    timeout: float = TIMEOUT_S

    def _api(self, path: str, params: Mapping[str, str]) -> Any:
        url = f"{self.base.rstrip('/')}/api/v1/{path}"
        data = urllib.parse.urlencode(params).encode()  # POST: a long UUID matcher stays out of the URL
        request = urllib.request.Request(url, data=data, headers={"Content-Type": "application/x-www-form-urlencoded"})
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as response:
                body = json.load(response)
        except urllib.error.HTTPError as exc:
            try:
                error = json.loads(exc.read(4096)).get("error", exc.reason)
            except (OSError, ValueError, AttributeError):
                error = exc.reason
            raise VerdictUnavailable(f"Prometheus {url}: HTTP {exc.code}: {error}") from exc
        except (OSError, ValueError) as exc:
            raise VerdictUnavailable(f"Prometheus {url} unreachable: {exc}") from exc
        if not isinstance(body, dict) or body.get("status") != "success":
            error = body.get("error") if isinstance(body, dict) else body
            raise VerdictUnavailable(f"Prometheus {url}: {error}")
        return body["data"]

    def query(self, expr: str, at: float) -> list[dict[str, Any]]:
        return list(self._api("query", {"query": expr, "time": f"{at:.3f}"})["result"])

    def query_range(self, expr: str, start: float, end: float, step: float) -> list[dict[str, Any]]:
        params = {"query": expr, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": f"{step:g}"}
        return list(self._api("query_range", params)["result"])

    def verdicts(self, now: float, *, fenced: Iterable[str], evaluations: int, interval: float) -> Verdicts:
        """Every GPU's reading at ``now``, and which of the ``fenced`` UUIDs read clean at each of the
        last ``evaluations`` evaluation times."""
        readings = parse_readings(self.query(CLEAN, now), self.query(f"{HELD} > 0", now))
        matcher = uuid_matcher(fenced)
        streak: frozenset[GpuKey] = frozenset()
        if matcher:
            start = now - (evaluations - 1) * interval
            matrix = self.query_range(f'{CLEAN}{{UUID=~"{matcher}"}}', start, now, interval)
            streak = parse_streak(matrix, evaluations)
        return Verdicts(readings, streak)
