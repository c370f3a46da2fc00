"""Benchmark: what the NRI plugin (go/nri) costs each container start, with it and without, side by side.

On a running cluster on containerd 2 (``GPUZOMBIE_CLUSTER_RUNTIME=containerd2 gpuzombie cluster up``;
``$GPUZOMBIE_CLUSTER_DIR`` and ``$GPUZOMBIE_CLUSTER_INSTANCE`` as for every cluster command), --rounds
times in alternating order: --pods pods of one GPU container each (busybox ``sleep``, the device
plugin's ``NVIDIA_VISIBLE_DEVICES`` as the stand-in GPU: what the plugin acts on) applied one after
the other through the API server and the kubelet, once with the plugin connected to containerd's NRI socket
(every container then runs under tini, bind-mounted) and once with no plugin. Per container, from
containerd's own log: CreateContainer (request to reply: the plugin's CreateContainer runs inside
it, the mount and the new argv are applied in it) and StartContainer. Prints the machine, the date
and this command, each time's median, p90 and min-max per mode, the difference and the ratio.

Run (root): python3 benchmarks/bench_nri.py [--pods 15] [--rounds 4]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import re
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent / "src"), str(HERE.parent / "tests")]

from gpuzombie.cluster.layout import Layout
from kube import nri
from kube.conftest import Kube

_START = re.compile(r'time="([^"]+)" level=info msg="StartContainer for \\"(\w+)\\""')
_STARTED = re.compile(r'time="([^"]+)" level=info msg="StartContainer for \\"(\w+)\\" returns successfully"')
_ID = re.compile(r'for name:\\"([^\\]+)\\" returns container id \\"(\w+)\\"')


def _kube() -> Kube:
    layout = Layout.from_env()
    if layout.runtime != "containerd2":
        raise SystemExit("bench_nri: GPUZOMBIE_CLUSTER_RUNTIME=containerd2 (NRI needs containerd 2)")
    if not (layout.root / "state.json").is_file():
        raise SystemExit(f"bench_nri: no cluster at {layout.root} (gpuzombie cluster up)")
    kubeconfig = layout.admin_kubeconfig
    return Kube(layout.root, kubeconfig, dict(os.environ, KUBECONFIG=str(kubeconfig)))


def _pod(name: str) -> dict:
    container = {
        "name": name,
        "image": nri.BUSYBOX,
        "imagePullPolicy": "Never",
        "args": ["sleep", "3600"],
        "env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": nri.STANDIN_DEVICES}],
    }
    meta = {"name": name, "namespace": "default"}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": meta, "spec": {"containers": [container]}}


def _batch(kube: Kube, names: list[str]) -> None:
    """One pod after the other, each Ready before the next is applied (so each CreateContainer is
    timed alone, not queued behind the others'), then all deleted (no grace)."""
    for name in names:
        kube.kubectl("apply", "-f", "-", input_text=json.dumps(_pod(name)))
        kube.kubectl("wait", "--for=condition=Ready", f"pod/{name}", "-n", "default", "--timeout=120s", timeout=150)
    pods = [f"pod/{n}" for n in names]
    kube.kubectl("delete", *pods, "-n", "default", "--grace-period=0", "--force", "--wait=true", timeout=330)


def _start_seconds(log: str, names: set[str]) -> dict[str, float]:
    """StartContainer, request to reply, for the containers named in ``names``."""
    ids = {m.group(2): m.group(1) for m in _ID.finditer(log) if m.group(1) in names}
    began, took = {}, {}
    for line in log.splitlines():
        if done := _STARTED.search(line):
            if done.group(2) in ids and done.group(2) in began:
                took[ids[done.group(2)]] = nri.log_time(done.group(1)) - began[done.group(2)]
        elif start := _START.search(line):
            began[start.group(2)] = nri.log_time(start.group(1))
    return took


def _spread(seconds: list[float]) -> str:
    ms = sorted(s * 1000 for s in seconds)
    p90 = ms[min(len(ms) - 1, int(0.9 * len(ms)))]
    return f"median {statistics.median(ms):7.2f} ms, p90 {p90:7.2f}, min-max {ms[0]:.2f}-{ms[-1]:.2f} (n={len(ms)})"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pods", type=int, default=15)
    ap.add_argument("--rounds", type=int, default=4)
    args = ap.parse_args()
    kube = _kube()
    status = json.loads(kube.cli("cluster", "status", "--json").stdout)
    print(f"machine: {platform.node()} {platform.machine()}, {os.cpu_count()} CPUs, Linux {platform.release()}")
    print(
        f"runtime: containerd {status['containerd_version']}, Kubernetes {status['kubernetes_version']} (gpuzombie cluster)"
    )
    print(f"date: {datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC")
    print(f"command: python3 benchmarks/bench_nri.py --pods {args.pods} --rounds {args.rounds}")
    print(f"load average before: {os.getloadavg()[0]:.1f}", flush=True)
    names: dict[str, list[str]] = {"with": [], "without": []}
    with tempfile.TemporaryDirectory(prefix="bench-nri-") as work:
        for r in range(args.rounds):
            order = ["with", "without"] if r % 2 == 0 else ["without", "with"]
            for mode in order:
                batch = [f"nri-{mode}-{r}-{i}" for i in range(args.pods)]
                plugin = nri.start_plugin(kube, Path(work) / f"{mode}-{r}") if mode == "with" else None
                began = time.monotonic()
                try:
                    _batch(kube, batch)
                    if plugin is not None:  # each container ran under tini, not only the plugin's cost
                        fixed = plugin.log_text().count("PID 1 is tini")
                        assert fixed == len(batch), f"{fixed} of {len(batch)} containers put under tini"
                finally:
                    if plugin is not None:
                        plugin.stop()
                print(
                    f"round {r + 1}, {mode} the plugin: {args.pods} pods Ready in {time.monotonic() - began:.1f} s",
                    flush=True,
                )
                names[mode] += batch
    log = nri.containerd_log(kube)
    create = {m: {n: t for n in names[m] for t in nri.create_container_seconds(log, n)} for m in names}
    start = {m: _start_seconds(log, set(names[m])) for m in names}
    both = {m: [create[m][n] + start[m][n] for n in names[m] if n in create[m] and n in start[m]] for m in names}
    print(f"per container, {args.rounds} rounds of {args.pods} pods each way, from containerd's log:")
    for what, times in (
        ("CreateContainer", {m: list(create[m].values()) for m in names}),
        ("StartContainer", {m: list(start[m].values()) for m in names}),
        ("create + start", both),
    ):
        for mode in ("without", "with"):
            print(f"  {what:15} {mode:7} the plugin: {_spread(times[mode])}")
        ratio = statistics.median(times["with"]) / statistics.median(times["without"])
        delta = (statistics.median(times["with"]) - statistics.median(times["without"])) * 1000
        print(f"  {what:15} ratio with/without (medians): {ratio:.2f}x ({delta:+.2f} ms)")
    print(f"load average after: {os.getloadavg()[0]:.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
