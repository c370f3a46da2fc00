"""`gpuzombie reap` on the real kubelet's pods, with `gpuzombie cluster env` exported (the kubelet's
PodResources socket and its containerd's CRI): a holder that outlived a real pod deletion is stale,
and a live pod's processes, a GPU holder among them, are never touched.

What the real kubelet showed first: it ends a leftover itself. When it removes a deleted pod's
cgroup (syncTerminatedPod, the pod container manager's Destroy) it SIGKILLs every process still in
it, so a holder that can be killed does not outlive the deletion by more than a few seconds, reap or
not. What outlives it is a holder SIGKILL cannot end: one stuck in the driver (state D). Its STAND-IN
here is a task frozen by the cgroup v1 freezer (state D, SIGKILL pending until thawed), as
tests/test_stale.py uses; the pod then stays in the API (Failed, deletionTimestamp set) until its
cgroup can go, while the kubelet no longer runs it (PodResources lists active pods only) and its
sandbox is gone: stale. The GPU holder itself holds a regular file at /dev/nvidia0 on a private /dev."""

from __future__ import annotations

import contextlib
import glob
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kube import pods
from kube.api import Api, wait_for

NAMESPACE = "reap-test"
FREEZER = "/sys/fs/cgroup/freezer"
KUBELET_KILLS_WITHIN_S = 60.0
"""The deletion finished -> the leftover gone: 0-3 s here (the kubelet's pod cleanup after the
volumes are unmounted); a margin for a loaded node."""


def _pod(name: str, command: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {
            "terminationGracePeriodSeconds": 1,
            "containers": [{"name": "c", "image": pods.BUSYBOX, "command": ["sh", "-c", command]}],
        },
    }


def pod_cgroups(uid: str) -> list[str]:
    """The pod's own cgroup in each v1 hierarchy the kubelet manages (not the unified one of a hybrid
    host: joining it there would hide nothing from the kubelet's v1 walk, nor add anything)."""
    instance = os.environ.get("GPUZOMBIE_CLUSTER_INSTANCE", "0")
    found = glob.glob(f"/sys/fs/cgroup/*/gpuzombie-cluster{instance}/kubepods/*/pod{uid}")
    return sorted(g for g in found if not g.startswith("/sys/fs/cgroup/unified/"))


@contextlib.contextmanager
def holder_in(groups: list[str]) -> Iterator[subprocess.Popen[bytes]]:
    """A host process that joins ``groups`` (a pod's cgroups) holding a stand-in /dev/nvidia0, as
    a worker stuck outside its container sits; killed at the end."""
    join = " && ".join(f"echo $$ > {g}/cgroup.procs" for g in groups)
    private = "mount -t tmpfs -o mode=755 stale-dev /dev && touch /dev/nvidia0 && exec 3</dev/nvidia0"
    process = subprocess.Popen(
        ["unshare", "--mount", "sh", "-c", f"{private} && {join} && exec sleep 3600"], start_new_session=True
    )
    try:
        wait_for("the holder in the pod's cgroups", lambda: _in_groups(process.pid, groups), timeout=30, interval=0.1)
        yield process
    finally:
        if process.poll() is None:
            process.kill()
        process.wait()


def _in_groups(pid: int, groups: list[str]) -> bool:
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
        text = Path(f"/proc/{pid}/cgroup").read_text()
    except OSError:
        return False
    holds = any(os.readlink(f"/proc/{pid}/fd/{fd}") == "/dev/nvidia0" for fd in fds if _link(pid, fd))
    return holds and all(g.split("/kubepods/", 1)[1] in text for g in groups)


def _link(pid: int, fd: str) -> bool:
    try:
        os.readlink(f"/proc/{pid}/fd/{fd}")
    except OSError:
        return False
    return True


def reap(kube, *args: str) -> tuple[int, dict[str, Any]]:
    done = subprocess.run(
        [sys.executable, "-m", "gpuzombie", "reap", "--json", "--no-nvml", *args],
        env=kube.node_env(),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    return done.returncode, json.loads(done.stdout)


def start_time(pid: int) -> str | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except OSError:
        return None


@pytest.fixture
def live(kube, api: Api) -> Iterator[dict[str, Any]]:
    """A running pod whose PID 1 holds a stand-in /dev/nvidia0 of its own: a live GPU holder."""
    api.ensure_namespace(NAMESPACE)
    pod = _pod("live", "touch /dev/nvidia0 && exec 3<>/dev/nvidia0 && exec sleep 3600")
    reply = api.create(f"/api/v1/namespaces/{NAMESPACE}/pods", pod)
    assert reply.ok, reply.body
    try:
        yield pods.wait_ready(api, pod)
    finally:
        pods.delete_and_wait(api, pod)


@pytest.fixture
def doomed(kube, api: Api) -> dict[str, Any]:
    api.ensure_namespace(NAMESPACE)
    pod = _pod("doomed", "exec sleep 3600")
    reply = api.create(f"/api/v1/namespaces/{NAMESPACE}/pods", pod)
    assert reply.ok, reply.body
    return pods.wait_ready(api, pod)


def test_the_kubelet_itself_kills_a_killable_leftover_of_a_deleted_pod(kube, api: Api, doomed):
    uid = doomed["metadata"]["uid"]
    with holder_in(pod_cgroups(uid)) as holder:
        pods.delete_and_wait(api, doomed)
        finished = time.monotonic()
        wait_for("the kubelet to end the leftover", lambda: holder.poll() is not None, timeout=KUBELET_KILLS_WITHIN_S)
        assert holder.returncode == -9  # SIGKILL: the kubelet's cgroup cleanup, nobody else signals it
        assert time.monotonic() - finished < KUBELET_KILLS_WITHIN_S


@pytest.mark.skipif(not os.path.isdir(FREEZER), reason="needs the cgroup v1 freezer (a frozen task is in state D)")
def test_a_holder_that_outlived_a_real_deletion_is_stale_and_a_live_pod_is_never_touched(kube, api: Api, live, doomed):
    uid, live_uid = doomed["metadata"]["uid"], live["metadata"]["uid"]
    live_pids = {pid: start_time(pid) for pid in pods.host_pids(live_uid)}
    assert live_pids
    groups = pod_cgroups(uid)
    frozen = next(g for g in groups if g.startswith(FREEZER)) + "/stuck"
    os.mkdir(frozen)
    path = f"/api/v1/namespaces/{NAMESPACE}/pods/doomed"
    try:
        with holder_in([*(g for g in groups if not g.startswith(FREEZER)), frozen]) as holder:
            Path(frozen, "freezer.state").write_text("FROZEN")
            wait_for(
                "the holder in state D",
                lambda: Path(f"/proc/{holder.pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "D",
            )
            reply = api.call("DELETE", path)
            assert reply.ok, reply.body

            def judged_stale() -> dict[str, Any] | None:
                code, doc = reap(kube)
                stale = {p["pod_uid"]: p for p in doc["stale_pods"]}
                return doc if code == 1 and uid in stale else None

            doc = wait_for("reap to call the pod stale", judged_stale, timeout=120)
            (stale,) = doc["stale_pods"]  # the live pod is not a candidate
            assert stale["pod_uid"] == uid and stale["holders"] == [holder.pid]
            assert "outlived its pod" in stale["reason"]
            obj = api.call("GET", path).body  # the kubelet cannot remove its cgroup: the object stays
            assert obj["metadata"].get("deletionTimestamp") and obj["status"]["phase"] in ("Failed", "Succeeded")

            code, doc = reap(kube, "--yes", "--timeout", "1", "--kill-wait", "1")
            results = {r["target"]["pid"]: r for r in doc["results"]}
            assert set(results) == {holder.pid}
            assert results[holder.pid]["outcome"] == "not_killable_d_state" and code == 1
            assert {pid: start_time(pid) for pid in live_pids} == live_pids  # every live process untouched
            status = api.call("GET", f"/api/v1/namespaces/{NAMESPACE}/pods/live").body["status"]
            assert status["phase"] == "Running" and status["containerStatuses"][0]["restartCount"] == 0

            Path(frozen, "freezer.state").write_text("THAWED")  # "the driver lets it go"
            wait_for("the holder gone", lambda: holder.poll() is not None, timeout=60)
            # reap's SIGTERM and the SIGKILLs (reap's, the kubelet's) were all pending while it was
            # frozen: whichever the kernel delivers first on the thaw ends it (seen: both)
            assert holder.returncode in (-signal.SIGTERM, -signal.SIGKILL)
        wait_for("the pod's deletion to finish", lambda: api.call("GET", path).status == 404, timeout=120)
    finally:
        with contextlib.suppress(OSError):
            Path(frozen, "freezer.state").write_text("THAWED")
        with contextlib.suppress(OSError):
            os.rmdir(frozen)
