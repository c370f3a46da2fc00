"""`gpuzombie fence` at fleet scale: 1,000 nodes × 8 GPUs of ResourceSlices (gpu.nvidia.com's
layout: one slice a node, pool = node, devices gpu-0 … gpu-7 with a uuid attribute) stored in the real
API server of `gpuzombie cluster` (up at $GPUZOMBIE_CLUSTER_DIR; KUBECONFIG from `cluster env`), and
the API calls and wall time of one evaluation (`Fence.evaluate`) in four states:

- steady: every GPU clean, no rule;
- fence: 1 % of the GPUs (80, each on its own node) dirty, none fenced yet: a slice list for each
  of their nodes and a create each;
- fenced: the same 80 dirty and fenced (the rules listed, nothing to do);
- lift: the 80 clean for the streak: a delete each.

The verdicts come from an in-process stand-in of the Prometheus reading (its own cost is not the
question here: one instant query of 8,000 series); the API side is real. Each state is measured
--repeat times (the fence/lift pair re-made each time). Also timed: one full list of every slice
(what a fence without the per-node field selector would read).

    eval "$(.venv/bin/gpuzombie cluster env)"
    python3 benchmarks/bench_fence.py [--nodes 1000] [--gpus 8] [--dirty 80] [--repeat 5]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from gpuzombie.fence.controller import Fence, Settings
from gpuzombie.fence.decide import Limits, Verdicts
from gpuzombie.fence.model import RULES_PATH, SLICES_PATH, Reading
from gpuzombie.k8s.apiserver import ApiError, ApiServer

DRIVER = "gpu.nvidia.com"
LABEL = "gpuzombie.dev/bench"


def node(i: int) -> str:
    return f"bench-gpu-{i:04d}"


def uuid(n: int, g: int) -> str:
    return f"GPU-{n:08x}-0000-4000-8000-{g:012x}"


def resource_slice(i: int, gpus: int) -> dict:
    devices = [
        {
            "name": f"gpu-{g}",
            "attributes": {
                "type": {"string": "gpu"},
                "uuid": {"string": uuid(i, g)},
                "minor": {"int": g},
                "productName": {"string": "NVIDIA H200"},
            },
            "capacity": {"memory": {"value": "143771Mi"}},
        }
        for g in range(gpus)
    ]
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": f"{node(i)}-{DRIVER}", "labels": {LABEL: "true"}},
        "spec": {
            "driver": DRIVER,
            "nodeName": node(i),
            "pool": {"name": node(i), "generation": 1, "resourceSliceCount": 1},
            "devices": devices,
        },
    }


class StandinVerdicts:
    """STAND-IN for the Prometheus reading: the verdicts of the state being measured."""

    def __init__(self) -> None:
        self.now = Verdicts({})

    def verdicts(self, now: float, *, fenced: object, evaluations: int, interval: float) -> Verdicts:
        return self.now


def readings(nodes: int, gpus: int, dirty: set[int], at: float) -> dict:
    out = {}
    for n in range(nodes):
        for g in range(gpus):
            is_dirty = g == 0 and n in dirty
            held = (("stale", 2 << 30),) if is_dirty else ()
            out[node(n), uuid(n, g)] = Reading(node(n), uuid(n, g), clean=not is_dirty, held=held, at=at)
    return out


def populate(api_for, nodes: int, gpus: int) -> float:
    """Create the slices (8 connections at once); the seconds it took."""
    began = time.monotonic()

    def create(i: int) -> None:
        api = api_for()
        try:
            api.create(SLICES_PATH, resource_slice(i, gpus))
        except ApiError as exc:
            if exc.reason != "AlreadyExists":
                raise
        finally:
            api.close()

    with ThreadPoolExecutor(8) as pool:
        list(pool.map(create, range(nodes)))
    return time.monotonic() - began


def measure(fence: Fence, source: StandinVerdicts, verdicts: Verdicts) -> tuple[int, float, dict]:
    source.now = verdicts
    outcome = fence.evaluate()
    assert not outcome.errors, outcome.errors
    return outcome.api_calls, outcome.seconds, {"created": len(outcome.created), "deleted": len(outcome.deleted)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--dirty", type=int, default=80)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--keep", action="store_true", help="leave the slices in the API server")
    args = parser.parse_args()
    kubeconfig = os.environ.get("KUBECONFIG")
    if not kubeconfig:
        print('bench_fence: no KUBECONFIG: run eval "$(gpuzombie cluster env)" first', file=sys.stderr)
        return 2

    def api_for() -> ApiServer:
        return ApiServer.connect(kubeconfig)

    print(f"machine: {platform.node()} {platform.machine()}, {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}")
    print(f"date: {time.strftime('%Y-%m-%d %H:%M:%S UTC', time.gmtime())}")
    print(f"fleet: {args.nodes} nodes x {args.gpus} GPUs = {args.nodes * args.gpus} devices; {args.dirty} dirty")
    print(f"populate: {populate(api_for, args.nodes, args.gpus):.1f} s for {args.nodes} ResourceSlices")
    api = api_for()
    source = StandinVerdicts()
    settings = Settings(drivers=(DRIVER,), limits=Limits(max_devices=args.dirty, max_node_percent=50))
    fence = Fence(api, source, settings, log=lambda line: None)  # type: ignore[arg-type]
    step = max(1, args.nodes // args.dirty)
    dirty = {i * step for i in range(args.dirty)}
    at = time.time()
    clean_all = readings(args.nodes, args.gpus, set(), at)
    dirty_all = readings(args.nodes, args.gpus, dirty, at)
    states: dict[str, list[tuple[int, float, dict]]] = {"steady": [], "fence": [], "fenced": [], "lift": []}
    try:
        for _ in range(args.repeat):
            states["steady"].append(measure(fence, source, Verdicts(clean_all)))
            states["fence"].append(measure(fence, source, Verdicts(dirty_all)))
            states["fenced"].append(measure(fence, source, Verdicts(dirty_all)))
            streak = frozenset((node(n), uuid(n, 0)) for n in dirty)
            states["lift"].append(measure(fence, source, Verdicts(clean_all, streak)))
        began, calls = time.monotonic(), api.calls
        items = list(api.list(SLICES_PATH))
        full = (api.calls - calls, time.monotonic() - began, len(items))
    finally:
        for rule in list(api.list(RULES_PATH)):
            if rule["metadata"]["name"].startswith("gpuzombie-dirty-"):
                api.delete(f"{RULES_PATH}/{rule['metadata']['name']}", uid=rule["metadata"]["uid"])
        if not args.keep:
            api.request("DELETE", SLICES_PATH, query={"labelSelector": f"{LABEL}=true"})
    print(f"{'state':8} {'API calls':>9} {'median s':>9} {'min-max s':>15}  changes")
    report = {}
    for state, runs in states.items():
        seconds = [s for _, s, _ in runs]
        calls = sorted({c for c, _, _ in runs})
        changes = runs[0][2]
        print(
            f"{state:8} {'/'.join(map(str, calls)):>9} {statistics.median(seconds):9.3f} "
            f"{min(seconds):7.3f}-{max(seconds):.3f}  {json.dumps(changes)}"
        )
        report[state] = {
            "api_calls": calls,
            "median_s": statistics.median(seconds),
            "min_s": min(seconds),
            "max_s": max(seconds),
            **changes,
        }
    print(f"full list of every slice: {full[0]} calls, {full[1]:.3f} s, {full[2]} slices")
    report["full_slice_list"] = {"api_calls": full[0], "seconds": full[1], "slices": full[2]}
    print(json.dumps(report))
    return 0


if __name__ == "__main__":
    sys.exit(main())
