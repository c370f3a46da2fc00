"""The chart on the real kubelet with the H200 (issue 37, run by `scripts/device/kube_gpu.sh chart`, as
root, with the cluster up and its environment exported; PYTHONPATH=src).

1. ``helm install`` of charts/gpuzombie into namespace gpuzombie: the exporter DaemonSet (under the
   RuntimeClass ``nvidia``: NVIDIA's container runtime in CDI mode gives it NVML, as the GPU
   Operator's runtime gives dcgm-exporter) and the webhook Deployment, its TLS from a Secret made here
   and its CA as ``webhook.caBundle`` (the chart's path without cert-manager).
2. ``deploy/pod-nofix.yaml`` run by ``lab pod --runtime kubernetes`` with nothing piped through
   ``webhook --patch``: the API server calls the registered webhook, whose patch the live pod shows;
   deleted with ``kubectl delete pod``; the DaemonSet's exporter read while it holds its GPU.
3. The handover (REPEAT times): pod A (a GPU pod) and a host torch worker joined to a leaf cgroup
   below A's pod cgroup (a process that sits in the pod without being its container's), then
   ``kubectl delete pod A`` and pod B, which asks for the gate (``gpuzombie.dev/preflight: "true"``,
   injected by the registered webhook), applied at once. In pairs: first the kubelet alone for
   KUBELET_CHANCE_S after A is gone from the API (then ``gpuzombie reap --yes``), then reap at once
   (the kubelet may still end it first: the record says who did). Measured on CLOCK_BOOTTIME: the holder's exit (its waitpid), B's workload process
   start (/proc/<pid>/stat), NVML listing B's worker; the gate's log as ``kubectl logs`` shows it.

Writes OUT/chart.json and the raw files beside it. DEVICE=cpu: steps 1 and 2 on the CPU stand-in
(no NVML, no RuntimeClass), a dry run of the script.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

from gpuzombie.cluster.layout import Layout
from gpuzombie.cluster.pki import CertRequest, make_pki
from gpuzombie.gpu.nvml import default_backend, read_gpus
from gpuzombie.k8s.cgroup import cgroup_paths
from gpuzombie.proc.own import PROCFS
from gpuzombie.proc.pidfd import read_start_and_state

OUT = Path(sys.argv[1])
REPO = Path(__file__).resolve().parents[2]
DEVICE = os.environ.get("DEVICE", "cuda")
GRACE = os.environ.get("GRACE", "30")
REPEAT = int(os.environ.get("REPEAT", "3"))
HANDOVER_REPEAT = int(os.environ.get("HANDOVER_REPEAT", "2"))
SIZE_MIB = int(os.environ.get("SIZE_MIB", "2048"))
STEPS = os.environ.get("STEPS", "install,exporter,webhook,handover").split(",")
NAMESPACE = "gpuzombie"
WORKLOADS = "ml-train"
IMAGE = "localhost/gpu-zombie/gpuzombie-node:0.1.0"
BUSYBOX = "localhost/gpuzombie/busybox:static"
LAYOUT = Layout.from_env()
NVML = default_backend()
GPU = DEVICE == "cuda"
RECORD: dict[str, Any] = {"device": DEVICE, "steps": STEPS}
T = TypeVar("T")


def boottime() -> float:
    return time.clock_gettime(time.CLOCK_BOOTTIME)


def log(line: str) -> None:
    print(f"== {time.strftime('%H:%M:%S')} {line}", flush=True)


def save(name: str, text: str) -> None:
    (OUT / name).write_text(text)


def kubectl(*args: str, stdin: str | None = None, check: bool = True, timeout: float = 120) -> str:
    argv = [sys.executable, "-m", "gpuzombie", "cluster", "kubectl", "--", *args]
    done = subprocess.run(argv, input=stdin, capture_output=True, text=True, timeout=timeout)
    if check and done.returncode != 0:
        raise RuntimeError(f"kubectl {' '.join(args)}: {done.stderr.strip()[-600:]}")
    return done.stdout


def get(*args: str) -> dict[str, Any]:
    text = kubectl("get", *args, "-o", "json", check=False)
    return json.loads(text) if text.strip() else {}


def apply(document: dict[str, Any]) -> str:
    return kubectl("apply", "-f", "-", stdin=json.dumps(document))


def helm(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    argv = ["helm", *args, "--kubeconfig", str(LAYOUT.kubeconfig("admin"))]
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout)


def wait_for(what: str, check: Callable[[], T | None], timeout: float = 120, interval: float = 0.2) -> T:
    """``check()``'s first truthy answer, polled; a RuntimeError naming ``what`` after ``timeout``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = check()
        if got:
            return got
        time.sleep(interval)
    raise RuntimeError(f"timed out after {timeout:.0f} s waiting for {what}")


# --- 1. helm install ---------------------------------------------------------------------------


def values(ca_pem: bytes) -> dict[str, Any]:
    return {
        "exporter": {
            "cri": {"socket": str(LAYOUT.containerd_socket)},
            "podResourcesDir": str(LAYOUT.kubelet_root / "pod-resources"),
            "cdiDir": str(LAYOUT.cdi_specs),
        },
        "runtimeClassName": "nvidia" if GPU else "",
        "webhook": {
            "enabled": True,
            "replicas": 1,
            "certManager": {"enabled": False},
            "secretName": "webhook-tls",
            "caBundle": base64.b64encode(ca_pem).decode(),
        },
    }


def install() -> None:
    for namespace in (NAMESPACE, WORKLOADS):
        kubectl("create", "namespace", namespace, check=False)
    kubectl("label", "namespace", NAMESPACE, "pod-security.kubernetes.io/enforce=privileged", "--overwrite")
    kubectl("label", "node", "--all", "nvidia.com/gpu.present=true", "--overwrite")  # what GPU feature discovery sets
    pki = make_pki(
        Path(tempfile.mkdtemp(prefix="webhook-pki-")),
        [CertRequest("server", "gpuzombie-webhook", dns_names=("gpuzombie-webhook.gpuzombie.svc",), server=True)],
    )
    secret = {
        "apiVersion": "v1",
        "kind": "Secret",
        "type": "kubernetes.io/tls",
        "metadata": {"name": "webhook-tls", "namespace": NAMESPACE},
        "data": {
            "tls.crt": base64.b64encode(pki.cert("server").read_bytes()).decode(),
            "tls.key": base64.b64encode(pki.key("server").read_bytes()).decode(),
        },
    }
    apply(secret)
    with tempfile.NamedTemporaryFile("w", suffix=".json") as f:
        json.dump(values(pki.ca.read_bytes()), f)
        f.flush()
        began = time.monotonic()
        done = helm("install", NAMESPACE, str(REPO / "charts" / "gpuzombie"), "-n", NAMESPACE, "--wait",
                    "--timeout=90s", "--values", f.name)  # fmt: skip
    took = time.monotonic() - began
    save("helm-install.log", done.stdout + done.stderr)
    save("helm-manifest.yaml", helm("get", "manifest", NAMESPACE, "-n", NAMESPACE).stdout)
    save("chart-pods.txt", kubectl("get", "pods", "-A", "-o", "wide", check=False))
    RECORD["install"] = {"rc": done.returncode, "seconds": round(took, 3)}
    log(f"helm install rc={done.returncode} in {took:.1f} s")
    if done.returncode != 0:
        save("chart-describe.txt", kubectl("describe", "pods", "-n", NAMESPACE, check=False))
        raise RuntimeError("helm install failed: " + done.stderr.strip()[-400:])


# --- 2. the exporter and the webhook ------------------------------------------------------------


def agent_pod() -> dict[str, Any]:
    pods = get("pods", "-n", NAMESPACE, "-l", "app.kubernetes.io/name=gpuzombie").get("items", [])
    return next(p for p in pods if not p["metadata"].get("deletionTimestamp"))


def scrape() -> str:
    ip = agent_pod()["status"]["podIP"]
    with urllib.request.urlopen(f"http://{ip}:9844/metrics", timeout=15) as reply:
        return reply.read().decode()


def series(text: str, *prefixes: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith(prefixes)]


def exporter() -> None:
    text = scrape()
    save("exporter-idle.prom", text)
    RECORD["exporter_idle"] = series(
        text, "gpuzombie_gpu_", "gpuzombie_nvml", "gpuzombie_scan_", "gpuzombie_build_info"
    )[:40]
    log(f"exporter: {len(text.splitlines())} lines; {len(series(text, 'gpuzombie_gpu_memory'))} GPU memory series")


def webhook() -> None:
    """pod-nofix through the registered webhook, REPEAT times; the exporter read while it holds."""
    argv = [sys.executable, "-m", "gpuzombie", "lab", "pod", str(REPO / "deploy" / "pod-nofix.yaml"), "--runtime",
            "kubernetes", "--grace", GRACE, "--device", DEVICE, "--repeat", str(REPEAT), "--json", "--out",
            str(OUT / "webhook-labpod")]  # fmt: skip
    log("lab pod deploy/pod-nofix.yaml, the webhook registered in the API server, nothing piped")
    with open(OUT / "webhook-labpod.log", "w") as err:
        process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=err, text=True)
        live: dict[str, Any] = {}
        scraped = ""

        def watch() -> None:
            nonlocal live, scraped
            pod = wait_for("pod-nofix to run", lambda: _running("gpu-zombie-test", "gpu-zombie-nofix"), timeout=240)
            live = pod
            time.sleep(4)  # a scan or two of the agent (its cache: minIntervalSeconds)
            with contextlib.suppress(Exception):
                scraped = scrape()

        watcher = threading.Thread(target=watch, daemon=True)
        watcher.start()
        out, _ = process.communicate(timeout=REPEAT * (int(GRACE) + 120) + 60)
        watcher.join(timeout=5)
    save("webhook-labpod.jsonl", out)
    save("webhook-live-pod.json", json.dumps(live, indent=1))
    save("exporter-pod-nofix.prom", scraped)
    runs = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    spec = live.get("spec", {})
    RECORD["webhook"] = {
        "rc": process.returncode,
        "patched_by_api_server": {
            "annotations": {
                k: v for k, v in live.get("metadata", {}).get("annotations", {}).items() if "gpuzombie" in k
            },
            "shareProcessNamespace": spec.get("shareProcessNamespace"),
            "initContainers": [c["name"] for c in spec.get("initContainers", [])],
        },
        "runs": [_release(run) for run in runs],
        "exporter_while_held": series(
            scraped,
            "gpuzombie_gpu_process",
            "gpuzombie_gpu_memory_used",
            "gpuzombie_gpu_handover_clean",
            "gpuzombie_pid1",
        ),
    }
    log(f"webhook: rc={process.returncode} {json.dumps(RECORD['webhook'])[:600]}")


def _running(namespace: str, name: str) -> dict[str, Any] | None:
    pod = get("pod", name, "-n", namespace)
    statuses = pod.get("status", {}).get("containerStatuses", [])
    return pod if statuses and all("running" in s.get("state", {}) for s in statuses) else None


def _release(run: dict[str, Any]) -> dict[str, Any]:
    metrics = run.get("metrics", {})
    keep = ("release_latency_s", "grace_waste_gib_s", "waited_whole_grace", "held_at_delete_mib")
    return {"init": run.get("init"), **{k: metrics.get(k) for k in keep}}


# --- 3. the handover ---------------------------------------------------------------------------


def pod_a(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": WORKLOADS,
            "annotations": {"gpuzombie.dev/inject": "false"},
            "labels": {"gpuzombie.dev/inject": "false"},
        },
        "spec": {
            "terminationGracePeriodSeconds": 2,
            "containers": [
                {
                    "name": "a",
                    "image": BUSYBOX,
                    "imagePullPolicy": "Never",
                    "command": ["sleep", "3600"],
                    "resources": {"limits": {"nvidia.com/gpu": 1}},
                }
            ],
        },
    }


def pod_b(name: str) -> dict[str, Any]:
    """As a team writes it, asking for the gate; under RuntimeClass nvidia (NVML for the gate, the CUDA
    driver for the workload through CDI); the workload is the project's worker on the ctypes backend
    (the node image has no torch), its source mounted from the host."""
    worker = ["python3", "-m", "gpuzombie.workloads.worker_fixed", "--size-mib", str(SIZE_MIB), "--device", "cuda",
              "--backend", "ctypes"]  # fmt: skip
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": WORKLOADS, "annotations": {"gpuzombie.dev/preflight": "true"}},
        "spec": {
            "runtimeClassName": "nvidia",
            "terminationGracePeriodSeconds": 5,
            "shareProcessNamespace": True,
            "containers": [
                {
                    "name": "train",
                    "image": IMAGE,
                    "imagePullPolicy": "Never",
                    "command": worker,
                    "env": [{"name": "PYTHONPATH", "value": "/opt/gz-src"}, {"name": "PYTHONUNBUFFERED", "value": "1"}],
                    "resources": {"limits": {"nvidia.com/gpu": 1}},
                    "volumeMounts": [{"name": "src", "mountPath": "/opt/gz-src", "readOnly": True}],
                }
            ],
            "volumes": [{"name": "src", "hostPath": {"path": str(REPO / "src"), "type": "Directory"}}],
        },
    }


def container_pid(pod: dict[str, Any]) -> int:
    """The host pid of the pod's first container, from the node's containerd (CRI)."""
    from gpuzombie.k8s.cri import RuntimeClient

    cid = pod["status"]["containerStatuses"][0]["containerID"].split("://", 1)[1]
    with RuntimeClient(str(LAYOUT.containerd_socket)) as client:
        return client.container_pid(cid)


def pod_cgroup(pid: int) -> Path:
    """The pod cgroup of a container's process: its cgroup v2 path's parent (the GPU machine is v2 only)."""
    (path,) = cgroup_paths(x for x in Path(f"/proc/{pid}/cgroup").read_text().splitlines() if x.startswith("0::"))
    return Path("/sys/fs/cgroup" + path).parent


@contextlib.contextmanager
def holder_in(cgroup: Path) -> Iterator[subprocess.Popen[bytes]]:
    """A host torch worker (SIGTERM frees and exits: worker_fixed) moved into a leaf cgroup of its own
    below pod A's, holding SIZE_MIB once NVML lists it."""
    leaf = cgroup / "stale"
    leaf.mkdir(exist_ok=True)
    argv = [sys.executable, "-m", "gpuzombie.workloads.worker_fixed", "--size-mib", str(SIZE_MIB), "--device", DEVICE]
    process = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        (leaf / "cgroup.procs").write_text(str(process.pid))
        wait_for("the holder on the GPU", lambda: process.pid in gpu_pids(), timeout=60)
        yield process
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def gpu_pids() -> set[int]:
    pids: set[int] = set()
    for gpu in read_gpus(NVML).devices:
        pids.update(p.pid for p in gpu.processes)
    return pids


def proc_start(pid: int) -> float:
    """When ``pid`` started, in seconds since boot (CLOCK_BOOTTIME's scale)."""
    got = read_start_and_state(PROCFS, pid)
    if got is None:
        raise RuntimeError(f"pid {pid} is gone: no start time")
    return got[0] / os.sysconf("SC_CLK_TCK")


def workload_pid(uid: str) -> int | None:
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        with contextlib.suppress(OSError):
            cmdline = Path(f"/proc/{entry}/cmdline").read_bytes()
            if b"--backend\0ctypes" in cmdline and f"pod{uid}" in Path(f"/proc/{entry}/cgroup").read_text():
                return int(entry)
    return None


def reap_once(t0: float) -> dict[str, Any] | None:
    done = subprocess.run(
        [sys.executable, "-m", "gpuzombie", "reap", "--yes", "--json", "--timeout", "1",
         "--cri-socket", str(LAYOUT.containerd_socket),
         "--pod-resources-socket", str(LAYOUT.kubelet_root / "pod-resources" / "kubelet.sock")],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    try:
        return {"at_s": round(boottime() - t0, 3), "rc": done.returncode, "json": json.loads(done.stdout)}
    except ValueError:
        return None


def handover_once(n: int, reap_after_s: float) -> dict[str, Any]:
    """One handover; ``gpuzombie reap --yes`` runs from ``reap_after_s`` after A is gone from the API
    until the holder is gone (the kubelet may end it first)."""
    a, b = f"handover-a-{n}", f"handover-b-{n}"
    apply(pod_a(a))
    pod = wait_for(f"pod {a} to run", lambda: _running(WORKLOADS, a), timeout=90)
    run: dict[str, Any] = {"run": n, "reap_after_s": reap_after_s}
    with holder_in(pod_cgroup(container_pid(pod))) as holder:
        ended: dict[str, float] = {}

        def waiter() -> None:
            holder.wait()
            ended["at"] = boottime()

        threading.Thread(target=waiter, daemon=True).start()
        t0 = boottime()
        kubectl("delete", "pod", a, "-n", WORKLOADS, "--wait=false")
        apply(pod_b(b))
        wait_for(f"{a} gone from the API", lambda: not get("pod", a, "-n", WORKLOADS), timeout=60, interval=0.05)
        gone = boottime()
        run["a_gone_from_api_s"] = round(gone - t0, 3)
        reaps: list[dict[str, Any]] = []
        while "at" not in ended and boottime() - gone < reap_after_s + 60:
            if boottime() - gone >= reap_after_s:
                reaped = reap_once(t0)
                if reaped is not None:
                    reaps.append(reaped)
            time.sleep(0.2)
        wait_for("the holder to exit", lambda: "at" in ended, timeout=90, interval=0.01)
        run["holder_exit_s"] = round(ended["at"] - t0, 3)
        run["holder_returncode"] = holder.returncode
        run["reaped_by"] = _reaper(reaps, holder.pid)
        run["reap_calls"] = [{"at_s": r["at_s"], "rc": r["rc"]} for r in reaps]
        save(f"handover-{n}-reap.json", json.dumps(reaps, indent=1))
    live = wait_for(f"pod {b} to run", lambda: _running(WORKLOADS, b), timeout=120)
    uid = live["metadata"]["uid"]
    pid = wait_for("B's workload process", lambda: workload_pid(uid), timeout=30, interval=0.05)
    run["b_workload_start_s"] = round(proc_start(pid) - t0, 3)
    run["free_to_b_running_s"] = round(proc_start(pid) - ended["at"], 3)
    listed = wait_for("NVML to list B's worker", lambda: pid in gpu_pids() and boottime(), timeout=60, interval=0.02)
    run["free_to_b_on_gpu_s"] = round(listed - ended["at"], 3)
    run["gate"] = [c["name"] for c in live["spec"].get("initContainers", [])]
    gate_log = kubectl("logs", b, "-n", WORKLOADS, "-c", "gpuzombie-preflight", check=False)
    save(f"handover-{n}-gate.log", gate_log)
    run["gate_polls"] = len([x for x in gate_log.splitlines() if x.startswith("preflight")])
    run["gate_last"] = gate_log.strip().splitlines()[-1:] if gate_log.strip() else []
    kubectl("delete", "pod", b, "-n", WORKLOADS, "--wait=true", "--timeout=60s", check=False)
    log(f"handover {n}: {json.dumps(run)}")
    return run


def _reaper(reaps: list[dict[str, Any]], pid: int) -> str:
    """Who ended the holder: reap where a call named it among a stale pod's holders, else the kubelet."""
    named = any(pid in pod.get("holders", []) for r in reaps for pod in r["json"].get("stale_pods", []))
    return "gpuzombie reap" if named else "the kubelet (removing the pod's cgroup)"


KUBELET_CHANCE_S = 20.0
"""How long the kubelet alone gets to end the holder before reap runs, in the first run of each pair."""


def handover() -> None:
    """Alternately the kubelet alone (reap only after KUBELET_CHANCE_S) and reap at once; the pods of a failed run are removed, and
    the runs stop there (the GPU may still be held)."""
    runs: list[dict[str, Any]] = []
    RECORD["handover"] = runs
    for n in range(1, HANDOVER_REPEAT + 1):
        for number, reap_after in ((n, KUBELET_CHANCE_S), (100 + n, 0.0)):
            try:
                runs.append(handover_once(number, reap_after))
            finally:
                for name in (f"handover-a-{number}", f"handover-b-{number}"):
                    kubectl("delete", "pod", name, "-n", WORKLOADS, "--ignore-not-found", "--wait=true",
                            "--timeout=60s", check=False)  # fmt: skip


def main() -> int:
    OUT.mkdir(parents=True, exist_ok=True)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    steps = {"install": install, "exporter": exporter, "webhook": webhook, "handover": handover}
    rc = 0
    try:
        for step in STEPS:
            if step == "handover" and not GPU:
                log("handover: cuda only (the gate needs NVML through the nvidia RuntimeClass)")
                continue
            if "install" in RECORD.get("errors", {}):  # every later step needs the chart's pods
                log(f"{step}: skipped (the chart did not install)")
                continue
            try:
                steps[step]()
            except Exception as exc:  # noqa: BLE001 (one line per failed step; the others still run)
                RECORD.setdefault("errors", {})[step] = f"{type(exc).__name__}: {exc}"
                log(f"{step} failed: {type(exc).__name__}: {exc}")
                rc = 1
    finally:
        save("chart.json", json.dumps(RECORD, indent=1))
    return rc


if __name__ == "__main__":
    sys.exit(main())
