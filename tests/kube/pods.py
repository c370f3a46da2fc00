"""Pods for the tests on the real kubelet: busybox with this machine's Python mounted read-only by
hostPath at the same paths (/usr, /lib, /lib64: Debian's python3 and the libraries it loads, as the
lab's runtime mounts them, lab/runtime/cri.py), so a "training image" runs python3 without a
registry; and a worker that holds a stand-in /dev/nvidia0 and says who sent it SIGTERM."""

from __future__ import annotations

import copy
import json
import os
import time
from pathlib import Path
from typing import Any

from kube.api import Api, wait_for

BUSYBOX = "localhost/gpuzombie/busybox:static"
HOST_PYTHON_DIRS = ("/usr", "/lib", "/lib64")
"""What Debian's /usr/bin/python3 needs (lab/runtime/cri.py's HOST_DIRS less /opt)."""
GPU = "nvidia.com/gpu"

WORKER = r"""
import json, os, signal, sys, time
# A STAND-IN GPU holder: a regular file at /dev/nvidia0 in the container's own /dev, held open (what
# makes the preStop hook, reap and the exporter count a process a GPU holder).
open("/dev/nvidia0", "a").close()
fd = os.open("/dev/nvidia0", os.O_RDWR)
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
evidence = os.environ["EVIDENCE"]
with open(evidence + ".ready", "w") as f:
    f.write(str(os.getpid()))
info = signal.sigwaitinfo({signal.SIGTERM})
try:
    with open(f"/proc/{info.si_pid}/cmdline", "rb") as f:
        sender = f.read().replace(b"\0", b" ").decode().strip()
except OSError as exc:
    sender = f"? {exc}"
with open(evidence + ".tmp", "w") as f:
    json.dump({"at": time.time(), "sender_pid": info.si_pid, "sender": sender}, f)
os.replace(evidence + ".tmp", evidence)
if os.environ.get("IGNORE_SIGTERM"):
    while True:
        time.sleep(1)
"""
"""Blocks SIGTERM and waits for it with sigwaitinfo, so it knows the sender (si_pid), writes when
and from whom it came to $EVIDENCE, then exits (or, with IGNORE_SIGTERM, goes on: only a SIGKILL
ends it)."""
S1_WORKER = ["sh", "-c", 'python3 -c "$WORKER" & exec sleep infinity']
"""S1: the worker in the background, `sleep` as PID 1 (which reaps nothing and passes no SIGTERM on)."""


def gpu_pod(
    name: str,
    namespace: str,
    evidence_dir: Path,
    *,
    annotations: dict[str, str] | None = None,
    ignore_sigterm: bool = False,
    grace: int = 30,
) -> dict[str, Any]:
    """One GPU container running S1 with the worker; the host's Python by hostPath, read-only;
    ``evidence_dir`` (host) at /evidence, where the worker writes."""
    env = [{"name": "WORKER", "value": WORKER}, {"name": "EVIDENCE", "value": f"/evidence/{name}.json"}]
    if ignore_sigterm:
        env.append({"name": "IGNORE_SIGTERM", "value": "1"})
    host = [(d.strip("/"), d) for d in HOST_PYTHON_DIRS]
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": namespace, "annotations": dict(annotations or {})},
        "spec": {
            "terminationGracePeriodSeconds": grace,
            "volumes": [{"name": n, "hostPath": {"path": p}} for n, p in host]
            + [{"name": "evidence", "hostPath": {"path": str(evidence_dir)}}],
            "containers": [
                {
                    "name": "train",
                    "image": BUSYBOX,
                    "command": S1_WORKER,
                    "env": env,
                    "resources": {"limits": {GPU: "1"}},
                    "volumeMounts": [{"name": n, "mountPath": p, "readOnly": True} for n, p in host]
                    + [{"name": "evidence", "mountPath": "/evidence"}],
                }
            ],
        },
    }


def kubectl_apply(kube: Any, obj: dict[str, Any]) -> str:
    """`kubectl apply -f -` of ``obj`` with the real kubectl: its stderr (admission warnings)."""
    return kube.kubectl("apply", "-f", "-", input_text=json.dumps(obj)).stderr


def evidence_dir(tmp: Path) -> Path:
    """A host directory the pods write to (pytest's tmp dirs are 0700)."""
    tmp.mkdir(parents=True, exist_ok=True)
    os.chmod(tmp, 0o777)
    return tmp


def read_evidence(directory: Path, name: str) -> dict[str, Any] | None:
    path = directory / f"{name}.json"
    return json.loads(path.read_text()) if path.exists() else None


def wait_ready(api: Api, pod: dict[str, Any], timeout: float = 180) -> dict[str, Any]:
    """The pod once Ready (its worker has written its .ready file too, where it has one)."""
    path = f"/api/v1/namespaces/{pod['metadata']['namespace']}/pods/{pod['metadata']['name']}"

    def ready() -> dict[str, Any] | None:
        got = api.call("GET", path).body
        conditions = {c["type"]: c["status"] for c in got.get("status", {}).get("conditions", [])}
        return got if conditions.get("Ready") == "True" else None

    return wait_for(f"pod {pod['metadata']['name']} Ready", ready, timeout=timeout)


def delete_and_wait(api: Api, pod: dict[str, Any], timeout: float = 180) -> float:
    """Delete as `kubectl delete` does (the pod's own grace) and wait until the object is gone;
    the seconds that took."""
    path = f"/api/v1/namespaces/{pod['metadata']['namespace']}/pods/{pod['metadata']['name']}"
    began = time.monotonic()
    reply = api.call("DELETE", path)
    assert reply.ok or reply.status == 404, reply.body
    wait_for(f"pod {pod['metadata']['name']} gone", lambda: api.call("GET", path).status == 404, timeout=timeout)
    return time.monotonic() - began


def host_pids(uid: str) -> dict[int, str]:
    """pid -> command line of every live process in the cgroup of pod ``uid`` (host /proc)."""
    found = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/cgroup") as f:
                if f"pod{uid}" not in f.read():
                    continue
            with open(f"/proc/{name}/cmdline", "rb") as f:
                found[int(name)] = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            continue
    return found


def resubmitted(pod: dict[str, Any]) -> dict[str, Any]:
    """An API server's pod as a client would send it again (no uid, times, status)."""
    pod = copy.deepcopy(pod)
    for key in ("uid", "creationTimestamp", "resourceVersion", "generation", "managedFields"):
        pod["metadata"].pop(key, None)
    pod.pop("status", None)
    return pod
