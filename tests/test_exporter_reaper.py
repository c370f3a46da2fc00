"""``exporter --reap-stale-after D`` (issue 25 item 3): a real private containerd, a real survivor of a
removed pod (a process in the pod's cgroup holding a stand-in /dev/nvidia0, tests/test_stale.py's),
a running pod's holder beside it, and the kubelet's PodResources stand-in (no kubelet runs here).

The reaper's clock is the test's (the exporter's monotonic clock, injected), so "after D and not
before" is exact without waiting D. On this machine other runtimes' pods (other tests') look stale
to the private containerd, so the reaper is kept to the test's pod (``only``); the CLI tests run it
only where nothing can be stale (no kubelet to agree)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from types import SimpleNamespace

import pytest

pytest.importorskip("prometheus_client", reason="prometheus-client is in the 'exporter' extra")
pytest.importorskip("cri_api", reason="container-runtime-interface-api is in the 'node' extra")

from prometheus_client import CollectorRegistry

import test_stale
from containerd_fixture import needs_containerd
from gpuzombie.cli.main import main
from gpuzombie.errors import GpuzombieError
from gpuzombie.exporter import NodeCollector, PrometheusExporter, StaleReaper, parse_listen, scan_node
from gpuzombie.gpu.attribution import current_view
from gpuzombie.gpu.nvml import NO_GPU, FakeNvml
from gpuzombie.k8s.liveness import PodLister
from gpuzombie.k8s.names import RuntimeNames
from gpuzombie.k8s.podresources import list_pod_resources
from gpuzombie.proc.procfs import Procfs
from gpuzombie.reap import run_reap
from test_daemonset_capabilities import TENANT_UID, _agent, chart_capabilities
from test_exporter import scrape
from test_stale import alive, start_survivor

kubelet, pods = test_stale.kubelet, test_stale.pods  # the stand-in kubelet and the stale pod's fixtures

D = 60.0


class Agent:
    """The exporter's collector and reaper wired as the CLI wires them, on the test's clock."""

    def __init__(self, socket: str, kubelet_socket: str, only: frozenset[str]) -> None:
        self.now = 0.0
        self.lines: list[str] = []
        lister = PodLister(socket, kubelet_socket=kubelet_socket)
        self.reap_lister = PodLister(socket, kubelet_socket=kubelet_socket)
        names = RuntimeNames(socket)

        def scan():
            return scan_node(
                procfs=Procfs("/proc"),
                nvml=FakeNvml(NO_GPU),
                view=current_view(),
                names=names,
                resources=lambda: list_pod_resources(kubelet_socket),
                pods=lister,
            )

        def reap(uids, on_event):
            return run_reap(pods=self.reap_lister, names=names, only=uids, dry_run=False, timeout=2, on_event=on_event)

        self.reaper = StaleReaper(D, reap, log=self.lines.append, clock=lambda: self.now, only=only)
        self.collector = NodeCollector(scan, min_interval=0, clock=lambda: self.now, on_result=self.reaper.observe)
        self.listers = (lister, self.reap_lister)

    def at(self, t: float):
        """A scan at ``t`` seconds, then whatever reap is due."""
        self.now = t
        assert self.collector.latest().scan is not None
        return self.reaper.reap_due()

    def close(self) -> None:
        for lister in self.listers:
            lister.close()


@needs_containerd
def test_a_stale_holder_is_reaped_after_d_and_not_before_and_a_running_pod_never(containerd, pods, kubelet):
    doomed, survivor, holder = pods["doomed"], pods["survivor"], pods["holder"]
    del kubelet["ml", "gone-0"]
    containerd.stop_pod(doomed)
    agent = Agent(containerd.socket, os.environ["GPUZOMBIE_POD_RESOURCES_SOCKET"], frozenset({doomed.spec.uid}))
    registry = CollectorRegistry()
    registry.register(agent.reaper)
    exporter = PrometheusExporter(registry, listen=parse_listen("127.0.0.1:0"))
    url = f"http://127.0.0.1:{exporter.start().port}/metrics"
    try:
        assert agent.at(0) is None and agent.at(59.9) is None  # stale, not yet for D
        assert alive(survivor.pid)

        # The kubelet runs a pod the runtime has no sandbox of: nothing can be judged, the clock restarts.
        kubelet["ml", "elsewhere-0"] = {}
        assert agent.at(30 + D) is None
        del kubelet["ml", "elsewhere-0"]
        assert agent.at(31 + D) is None and agent.at(30 + 2 * D) is None  # stale again since 31 + D
        assert alive(survivor.pid)

        # Due, but when the reap asks again the runtime and kubelet disagree: refused, nothing signalled.
        agent.now = 31 + 2 * D
        agent.collector.latest()
        kubelet["ml", "elsewhere-0"] = {}
        assert agent.reaper.reap_due() is None and agent.reaper.refusals == 1
        assert any(line.startswith("reap refused, nothing signalled: refusing to reap") for line in agent.lines)
        assert alive(survivor.pid)
        del kubelet["ml", "elsewhere-0"]

        assert agent.at(30 + 3 * D) is None  # the refused attempt restarted its clock
        report = agent.at(31 + 3 * D)
        assert report is not None and [r.target.pid for r in report.results] == [survivor.pid]
        survivor.wait(timeout=10)
        assert alive(holder)  # the running pod's GPU holder, untouched
        assert f"reaped pid {survivor.pid} (sleep): exited_after_sigterm" in agent.lines
        assert any(line.startswith(f"reap: SIGTERM -> pid {survivor.pid}") for line in agent.lines), agent.lines
        m = scrape(url)
        assert m["gpuzombie_reaped_processes_total"][(("outcome", "exited_after_sigterm"),)] == 1
        assert m["gpuzombie_reaped_processes_total"][(("outcome", "not_killable_d_state"),)] == 0
        assert m["gpuzombie_reap_refusals_total"] == {(): 1.0}
        assert agent.at(31 + 5 * D) is None  # nothing stale left
    finally:
        exporter.stop()
        agent.close()


def serve(*args: str, env: dict[str, str]) -> tuple[subprocess.Popen[str], str, str]:
    """``gpuzombie exporter`` as a subprocess on a free loopback port; its /metrics URL once serving,
    and what it logged until then."""
    argv = [sys.executable, "-m", "gpuzombie", "exporter", "--listen", "127.0.0.1:0", "--min-interval", "0", *args]
    proc = subprocess.Popen(argv, stderr=subprocess.PIPE, text=True, env=env)
    assert proc.stderr is not None
    logged = ""
    for line in proc.stderr:
        logged += line
        if "serving http://" in line:
            return proc, line.split("serving ", 1)[1].split()[0].rstrip(","), logged
    raise AssertionError(f"exporter did not serve (exit {proc.wait()})")


def stop(proc: subprocess.Popen[str]) -> str:
    proc.send_signal(signal.SIGTERM)
    assert proc.stderr is not None
    rest = proc.stderr.read()
    assert proc.wait(timeout=30) == 0
    return rest


@needs_containerd
@pytest.mark.parametrize("flag", [(), ("--reap-stale-after", "1s")], ids=["off", "on-without-kubelet"])
def test_the_cli_signals_nothing_with_the_flag_off_or_without_the_kubelets_agreement(flag, containerd, pods, kubelet):
    """The stale survivor outlives many scans: with the flag off nothing reaps (and no counter is
    served); with it on and no kubelet to agree, no pod is ever stale, so none is due."""
    doomed, survivor = pods["doomed"], pods["survivor"]
    del kubelet["ml", "gone-0"]
    containerd.stop_pod(doomed)
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(sys.path),
        "GPUZOMBIE_CRI_SOCKET": containerd.socket,
        "GPUZOMBIE_POD_RESOURCES_SOCKET": os.environ["GPUZOMBIE_POD_RESOURCES_SOCKET"] if not flag else "/nonexistent",
    }
    proc, url, log = serve(*flag, env=env)
    try:
        deadline = time.monotonic() + 4  # the reaper's loop scans every second: 3 or more scans
        while time.monotonic() < deadline:
            m = scrape(url)
            time.sleep(0.5)
    finally:
        log += stop(proc)
    assert alive(survivor.pid)
    if flag:
        assert m["gpuzombie_reaped_processes_total"][(("outcome", "exited_after_sigterm"),)] == 0
        assert m["gpuzombie_reap_refusals_total"] == {(): 0.0}
        assert m["gpuzombie_dirty_gpu_check"][(("kind", "stale"),)] == 0
        assert "reaping pods stale for 1 s or more" in log and "reaping stale pod" not in log
    else:
        assert "gpuzombie_reaped_processes_total" not in m
        assert m["gpuzombie_dirty_gpu_check"][(("kind", "stale"),)] == 1  # it did see the stale pod
        assert any(
            dict(k).get("pod_uid") == doomed.spec.uid and dict(k)["kind"] == "stale"
            for k in m["gpuzombie_dirty_gpu_holders"]
        )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("--reap-stale-after", "0s"), "is no duration of 1 s or more"),
        (("--reap-stale-after", "ten minutes"), "is no duration of 1 s or more"),
        (("--reap-stale-after", "10m", "--once"), "--reap-stale-after times stale pods across scans: not with --once"),
        (("--reap-stale-after", "10m"), "is not a mounted proc filesystem"),  # refused at the start, not when due
    ],
)
def test_a_bad_reap_stale_after_is_one_line_exit_2(args, message, tmp_path, capsys):
    from fakeproc import make_fake_root

    root = tmp_path / "proc"
    root.mkdir()
    make_fake_root(root)
    assert main(["exporter", "--procfs", str(root), *args]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1, err


def test_reap_stale_after_is_off_by_default_and_in_the_help(capsys):
    assert main(["exporter", "--help"]) == 0
    text = capsys.readouterr().out
    assert "--reap-stale-after D" in text and "Off unless given" in text


TENANT_SURVIVOR = test_stale.SURVIVOR.replace(
    "os.execvp(", f"os.setgid({TENANT_UID})\nos.setgroups([])\nos.setuid({TENANT_UID})\nos.execvp("
)
"""The survivor, become the tenant's uid once it joined the pod's cgroup and opened the device."""


@needs_containerd
@pytest.mark.skipif(not shutil.which("setpriv"), reason="needs setpriv (util-linux)")
@pytest.mark.parametrize("reaping", [False, True], ids=["chart-default", "chart-with-reapStaleAfter"])
def test_signalling_another_uids_stale_process_needs_the_kill_capability(
    reaping, containerd, pods, kubelet, monkeypatch
):
    """Why the chart adds KILL with exporter.reapStaleAfter: reap as the DaemonSet runs it (uid 0,
    host PID namespace, only the chart's capabilities) ends a root survivor either way, a uid-1000
    one only with KILL; without it the signal is refused, counted, and the process left alive."""
    doomed, root_survivor = pods["doomed"], pods["survivor"]
    monkeypatch.setattr(test_stale, "SURVIVOR", TENANT_SURVIVOR)
    tenant = start_survivor(doomed.spec)
    pods["more"].append(tenant)  # the fixture kills it if the reap did not
    del kubelet["ml", "gone-0"]
    containerd.stop_pod(doomed)
    argv = ("reap", "--yes", "--json", "--no-nvml", "--cri-socket", containerd.socket, "--timeout", "1")
    done = _agent(
        chart_capabilities(reaping=reaping),
        sys.executable,
        "-m",
        "gpuzombie",
        *argv,
        "--kill-wait",
        "1",
        "--pod-uid",
        doomed.spec.uid,
    )
    outcomes = {r["target"]["pid"]: r["outcome"] for r in json.loads(done.stdout)["results"]}
    assert outcomes[root_survivor.pid] == "exited_after_sigterm", done.stderr
    if reaping:
        assert outcomes[tenant.pid] == "exited_after_sigterm" and done.returncode == 0, done.stderr
    else:
        assert outcomes[tenant.pid] == "permission_denied" and done.returncode == 1, done.stderr
        assert alive(tenant.pid)


def test_a_failed_scan_restarts_every_clock_and_a_reap_is_tried_again_only_after_another_d():
    """The clock logic alone, on recorded results (a scan as the little stale_pod_uids reads of it): a
    scan that failed breaks the continuity like one where the pod is not stale; after an attempt the
    pod waits another D."""
    from gpuzombie.exporter import ScanResult

    row = SimpleNamespace(dirty="stale", pod_uid="uid-a", pid=4242)
    stale_scan = SimpleNamespace(trace=SimpleNamespace(checks=SimpleNamespace(stale=True), rows=[row]))
    now = [0.0]
    asked: list[frozenset[str]] = []

    def reap(uids, on_event):
        asked.append(uids)
        raise GpuzombieError("refusing to reap: test")

    reaper = StaleReaper(D, reap, log=lambda line: None, clock=lambda: now[0])
    for t, scan in ((0, stale_scan), (30, None), (31, stale_scan)):
        reaper.observe(ScanResult(t, t, scan, None if scan else "OSError: gone"))
    now[0] = 31 + D - 0.1
    assert reaper.reap_due() is None and asked == []  # stale since 31, not since 0
    now[0] = 31 + D
    assert reaper.reap_due() is None and asked == [frozenset({"uid-a"})] and reaper.refusals == 1
    reaper.observe(ScanResult(now[0] + 1, 0, stale_scan, None))
    now[0] = 31 + 2 * D - 0.1
    assert reaper.reap_due() is None and len(asked) == 1  # the attempt restarted its clock
    now[0] = 31 + 2 * D
    reaper.reap_due()
    assert len(asked) == 2
