"""Issue 29's attacks on the stale verdict, measured against a source tree (docs/reliability.md's figures).

Each attack runs on real private containerds (``gpuzombie.lab.runtime.containerd``) with real
processes; the kubelet is the tests' stand-in PodResources server (``tests/cri_standin.py``),
found through ``GPUZOMBIE_POD_RESOURCES_SOCKET`` (a tree that does not read it ignores it). The
commands run as ``python -m gpuzombie`` with ``PYTHONPATH=<--src>``, every ``reap --yes`` with
``--pod-uid`` (other pods on this machine are never touched):

* second-runtime: the GPU pod in containerd A (the kubelet's), one unrelated pod in B;
  ``reap --yes --cri-socket B`` on the GPU pod, ``trace`` and ``exporter --once`` against B
  (``-no-kubelet``: the same with the kubelet's socket absent);
* nested-cgroupfs, nested-systemd: a process in a kubepods tree below the running GPU pod's container
  (that driver's layout); reap names the inner pod;
* pause-died: the GPU pod's pause killed (sandbox NOTREADY), its container running;
* static-pod: a stale pod with a 32-hex (static pod) UID, named by ``--pod-uid``.

Run (root, from the repository root): python3 scripts/stale_attacks.py --src SRC [--runs 3]
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import platform
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO / "src"), str(REPO / "tests")]

from cri_standin import standin_kubelet  # noqa: E402
from gpuzombie.k8s.cri import BindMount, ContainerSpec, SandboxSpec  # noqa: E402
from gpuzombie.lab.runtime.containerd import BUSYBOX_IMAGE, Containerd, private_containerd  # noqa: E402
from pidns import wait_until  # noqa: E402
from test_stale import HOLDER, alive, comm_of, holds_nvidia0, nested_survivor, pod_pids, start_survivor  # noqa: E402

Attack = Callable[[str, Containerd, dict, Path], dict]


def gpuzombie(src: str, *args: str, kubelet: str | None = None) -> subprocess.CompletedProcess[str]:
    """``python -m gpuzombie`` of ``src``; ``kubelet``: another PodResources socket than the stand-in's."""
    env = {**os.environ, "PYTHONPATH": src}
    if kubelet is not None:
        env["GPUZOMBIE_POD_RESOURCES_SOCKET"] = kubelet
    return subprocess.run(
        [sys.executable, "-m", "gpuzombie", *args], capture_output=True, text=True, timeout=120, env=env
    )


@contextlib.contextmanager
def gpu_pod(ctd: Containerd, kubelet: dict, tmp: Path) -> Iterator[tuple[SandboxSpec, int]]:
    """ml/trainer-0, run by the kubelet, its container holding a stand-in /dev/nvidia0."""
    device = tmp / "nvidia0"
    device.write_text("")
    with ctd.pod(SandboxSpec(name="trainer-0", namespace="ml")) as pod:
        cid = pod.start(
            ContainerSpec(
                name="cuda", image=BUSYBOX_IMAGE, command=HOLDER, mounts=(BindMount(str(device), "/dev/nvidia0"),)
            )
        )
        holder = ctd.client.container_pid(cid)
        wait_until(lambda: holds_nvidia0(holder))
        kubelet[("ml", "trainer-0")] = {"cuda": ("GPU-0000",)}
        try:
            yield pod.spec, holder
        finally:
            kubelet.clear()


def rows(doc: dict, pid: int) -> list[dict]:
    return [r for r in doc.get("rows", []) if r["pid"] == pid]


def trace_dirty(src: str, pid: int, *args: str, kubelet: str | None = None) -> str | None:
    done = gpuzombie(src, "trace", "--json", *args, kubelet=kubelet)
    try:
        found = rows(json.loads(done.stdout), pid)
    except ValueError:
        return f"exit {done.returncode}"
    return found[0]["dirty"] if found else "no row"


def second_runtime(src: str, ctd: Containerd, kubelet: dict, tmp: Path, *, kubelet_socket: str | None = None) -> dict:
    with (
        gpu_pod(ctd, kubelet, tmp) as (spec, holder),
        private_containerd() as other,
        other.pod(SandboxSpec(name="other-0", namespace="default")) as unrelated,
    ):
        unrelated.start(ContainerSpec(name="app", image=BUSYBOX_IMAGE, command=("sleep", "300")))
        victims = pod_pids(spec.uid)
        names = ", ".join(sorted({comm_of(p) or "?" for p in victims}))
        exporter = gpuzombie(src, "exporter", "--once", "--cri-socket", other.socket, kubelet=kubelet_socket)
        stale_series = [
            line
            for line in exporter.stdout.splitlines()
            if line.startswith("gpuzombie_dirty_gpu_holders{") and 'kind="stale"' in line and spec.uid in line
        ]
        trace = trace_dirty(src, holder, "--cri-socket", other.socket, kubelet=kubelet_socket)
        argv = ("--yes", "--no-nvml", "--timeout", "1", "--cri-socket", other.socket, "--pod-uid", spec.uid)
        reap = gpuzombie(src, "reap", *argv, kubelet=kubelet_socket)
        killed = [p for p in victims if not alive(p)]
        return {
            "reap_exit": reap.returncode,
            "killed": f"{len(killed)} of {len(victims)} ({names})",
            "trace_dirty": trace,
            "exporter_stale_series": len(stale_series),
            "reap_said": (reap.stderr.strip().splitlines() or [""])[-1][:160],
        }


def nested(driver: str) -> Attack:
    def attack(src: str, ctd: Containerd, kubelet: dict, tmp: Path) -> dict:
        with gpu_pod(ctd, kubelet, tmp) as (spec, holder), nested_survivor(driver, spec, holder) as (inner, survivor):
            trace = trace_dirty(src, survivor.pid, "--cri-socket", ctd.socket)
            argv = ("--yes", "--no-nvml", "--timeout", "1", "--cri-socket", ctd.socket, "--pod-uid", inner)
            reap = gpuzombie(src, "reap", *argv)
            return {
                "reap_exit": reap.returncode,
                "killed": f"{int(not alive(survivor.pid))} of 1",
                "trace_dirty": trace,
            }

    return attack


def pause_died(src: str, ctd: Containerd, kubelet: dict, tmp: Path) -> dict:
    from cri_api.v1 import api_pb2 as pb

    with gpu_pod(ctd, kubelet, tmp) as (spec, holder):
        (pause,) = [p for p in pod_pids(spec.uid) if comm_of(p) == "catatonit"]
        os.kill(pause, 9)
        wait_until(
            lambda: any(
                s.metadata.uid == spec.uid and s.state == pb.SANDBOX_NOTREADY for s in ctd.client.list_pod_sandboxes()
            )
        )
        trace = trace_dirty(src, holder, "--cri-socket", ctd.socket)
        reap = gpuzombie(
            src, "reap", "--yes", "--no-nvml", "--timeout", "1", "--cri-socket", ctd.socket, "--pod-uid", spec.uid
        )
        return {
            "reap_exit": reap.returncode,
            "killed": f"{int(not alive(holder))} of 1 (the workload)",
            "trace_dirty": trace,
        }


def static_pod(src: str, ctd: Containerd, kubelet: dict, tmp: Path) -> dict:
    spec = SandboxSpec(name="static-gpu-node1", namespace="kube-system", uid=uuid.uuid4().hex)
    ctd.start_pod(SandboxSpec(name="keeper-0", namespace="ml"))  # a runtime with no pod at all was refused
    kubelet[("ml", "keeper-0")] = {}
    doomed = ctd.start_pod(spec)
    survivor = start_survivor(spec)
    try:
        ctd.stop_pod(doomed)
        dry = gpuzombie(src, "reap", "--json", "--no-nvml", "--cri-socket", ctd.socket)  # a dry run signals nothing
        try:
            listed = spec.uid in {p["pod_uid"] for p in json.loads(dry.stdout)["stale_pods"]}
        except ValueError:
            listed = False
        reap = gpuzombie(
            src, "reap", "--yes", "--no-nvml", "--timeout", "1", "--cri-socket", ctd.socket, "--pod-uid", spec.uid
        )
        return {
            "listed_by_dry_run": listed,
            "reap_exit": reap.returncode,
            "ended": f"{int(not alive(survivor.pid))} of 1",
            "reap_said": (reap.stderr.strip().splitlines() or [""])[-1][:160],
        }
    finally:
        survivor.kill()
        survivor.wait()


def second_runtime_no_kubelet(src: str, ctd: Containerd, kubelet: dict, tmp: Path) -> dict:
    """The same, the kubelet's socket absent (no --trust-runtime-without-kubelet)."""
    return second_runtime(src, ctd, kubelet, tmp, kubelet_socket="/nonexistent/kubelet.sock")


ATTACKS: dict[str, Attack] = {
    "second-runtime": second_runtime,
    "second-runtime-no-kubelet": second_runtime_no_kubelet,
    "nested-cgroupfs": nested("cgroupfs"),
    "nested-systemd": nested("systemd"),
    "pause-died": pause_died,
    "static-pod": static_pod,
}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--src", required=True, help="the src/ directory of the tree to measure")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--only", choices=sorted(ATTACKS), action="append")
    args = parser.parse_args()
    rev = subprocess.run(["git", "-C", args.src, "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    print(
        f"# {datetime.datetime.now(datetime.UTC):%Y-%m-%d %H:%M} UTC, {platform.node()}, src {args.src} ({rev.stdout.strip()})"
    )
    print(f"# {' '.join(sys.argv)}")
    for name in args.only or ATTACKS:
        for run in range(1, args.runs + 1):
            with tempfile.TemporaryDirectory(prefix="stale-attacks-") as tmp:
                kubelet: dict = {}
                socket = f"{tmp}/kubelet.sock"
                os.environ["GPUZOMBIE_POD_RESOURCES_SOCKET"] = socket
                with standin_kubelet(socket, kubelet), private_containerd() as ctd:
                    result = ATTACKS[name](args.src, ctd, kubelet, Path(tmp))
            print(f"{name} run {run}: {json.dumps(result)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
