"""The multi-call Kubernetes binary (go/kube): its build cold, with the Go build cache warm, and
from gpuzombie's own cache; its size raw and compressed (what the GPU machine's 64 MiB carry limit
allows). Cold means an empty GOCACHE (the module cache, downloaded once, is kept and its download
timed apart with --download); each build is timed in wall seconds and in CPU seconds (user + sys of
the go processes: steadier than wall time on a shared, loaded machine).

    python3 benchmarks/bench_kube_build.py [--cold] [--download] [--repeat 3]

Prints one line a measurement and the ratios cold/warm; results/benchmarks/bench-kube-build.log
holds a run with the machine, the date and the load beside it.
"""

from __future__ import annotations

import argparse
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from gpuzombie.cluster.build import KubeSource, build, cache_root, ensure_binary, go_binary, go_version

COMPRESSORS = {
    "xz -6": ["xz", "-6", "-T0", "-c"],
    "xz -9e": ["xz", "-9e", "-T0", "-c"],
    "zstd -19": ["zstd", "-19", "-T0", "-c"],
    "gzip -9": ["gzip", "-9", "-c"],
}


def timed(run: object) -> tuple[float, float]:
    """(wall s, CPU s of the children) of ``run()``."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    began = time.monotonic()
    run()  # type: ignore[operator]
    wall = time.monotonic() - began
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def quiet(_: str) -> None:
    pass


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--cold", action="store_true", help="also build with an empty GOCACHE (~11 min on 2 cores)")
    ap.add_argument("--download", action="store_true", help="also time the module download into an empty GOMODCACHE")
    ap.add_argument("--repeat", type=int, default=3, help="warm builds to time (default 3)")
    args = ap.parse_args()
    source = KubeSource.locate()
    go = go_binary()
    print(
        f"# {platform.node()} {os.cpu_count()} cores, {go_version(go)}, k8s {source.kubernetes_version}, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}"
    )
    print(f"# load average at start: {os.getloadavg()}")
    results: dict[str, list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="kube-bench-") as tmp:
        if args.download:
            env = dict(os.environ, GOMODCACHE=f"{tmp}/mod", GOFLAGS="-mod=mod")
            wall, cpu = timed(
                lambda: subprocess.run(
                    [go, "mod", "download"], cwd=source.directory, env=env, check=True, capture_output=True
                )
            )
            size = sum(f.stat().st_size for f in Path(f"{tmp}/mod/cache/download").rglob("*.zip"))
            print(
                f"module download (empty GOMODCACHE): {wall:.1f} s wall, {cpu:.1f} s CPU, {size / 2**20:.0f} MiB of zips"
            )
            subprocess.run([go, "clean", "-modcache"], env=env, check=False, capture_output=True)
        if args.cold:
            out = Path(tmp) / "cold" / "kube"
            os.environ["GOCACHE"] = f"{tmp}/gocache"
            wall, cpu = timed(lambda: build(source, out, quiet))
            del os.environ["GOCACHE"]
            results["cold"] = [wall]
            print(f"cold build (empty GOCACHE): {wall:.1f} s wall, {cpu:.1f} s CPU")
        for i in range(args.repeat):
            out = Path(tmp) / f"warm{i}" / "kube"
            wall, cpu = timed(lambda out=out: build(source, out, quiet))
            results.setdefault("warm", []).append(wall)
            print(f"warm Go cache, no binary (run {i + 1}): {wall:.1f} s wall, {cpu:.1f} s CPU")
        for i in range(args.repeat):
            wall, _ = timed(lambda: ensure_binary(quiet))
            results.setdefault("cached", []).append(wall)
            print(f"gpuzombie's cache hit (run {i + 1}): {wall:.2f} s wall")
        binary = ensure_binary(quiet)
        raw = binary.stat().st_size
        print(f"binary: {binary} {raw / 2**20:.1f} MiB raw (stripped, CGO_ENABLED=0)")
        for name, argv in COMPRESSORS.items():
            if not shutil.which(argv[0]):
                continue
            target = Path(tmp) / "packed"
            began = time.monotonic()
            with open(target, "wb") as f:
                subprocess.run([*argv, str(binary)], stdout=f, check=True)
            took = time.monotonic() - began
            print(
                f"  {name}: {target.stat().st_size / 2**20:.1f} MiB ({target.stat().st_size / raw:.0%}), {took:.0f} s"
            )
    warm = statistics.median(results["warm"]) if results.get("warm") else None
    if warm:
        print(f"warm build median {warm:.1f} s (min-max {min(results['warm']):.1f}-{max(results['warm']):.1f})")
    if results.get("cold") and warm:
        print(
            f"cold / warm: {results['cold'][0] / warm:.0f}x; cold / cache hit: {results['cold'][0] / statistics.median(results['cached']):.0f}x"
        )
    print(f"cache root: {cache_root()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
