"""`gpuzombie top` against a real containerd through its CRI socket and a stand-in kubelet
(test_stale's fixtures): the running pod's holder and the survivor of a removed pod under their
names, the survivor's pod marked STALE, and ``r`` + ``y`` reaping it through reap's pidfd path
while the running pod's holder is left alone."""

from __future__ import annotations

import asyncio
import os

import pytest

pytest.importorskip("cri_api", reason="container-runtime-interface-api is in the 'node' extra")
pytest.importorskip("textual", reason="textual is in the 'top' extra")

from containerd_fixture import needs_containerd
from gpuzombie.gpu.attribution import current_view
from gpuzombie.gpu.nvml import FakeNvml, GpuSnapshot
from gpuzombie.k8s.liveness import PodLister
from gpuzombie.k8s.names import RuntimeNames
from gpuzombie.k8s.podresources import list_pod_resources
from gpuzombie.proc.procfs import Procfs
from gpuzombie.top.actions import reap_pod, signal_process
from gpuzombie.top.app import Actions, Confirm, TopApp
from gpuzombie.top.source import NodeSource
from pidns import wait_until
from test_stale import alive, kubelet, pods  # noqa: F401 (fixtures)

pytestmark = needs_containerd


def test_a_stale_pod_is_marked_and_reaped_from_top_and_a_running_one_is_not(containerd, pods, kubelet):  # noqa: F811
    doomed = pods["doomed"]
    survivor, holder = pods["survivor"].pid, pods["holder"]
    del kubelet["ml", "gone-0"]
    containerd.stop_pod(doomed)
    socket = containerd.socket
    kubelet_socket = os.environ["GPUZOMBIE_POD_RESOURCES_SOCKET"]
    nvml = FakeNvml(GpuSnapshot(available=False, reason="no GPU on this machine"))
    names = RuntimeNames(socket)
    with PodLister(socket, kubelet_socket=kubelet_socket) as lister:
        source = NodeSource(
            procfs=Procfs("/proc"),
            nvml=nvml,
            view=current_view(),
            names=names,
            resources=lambda: list_pod_resources(kubelet_socket),
            pods=lister,
        )
        actions = Actions(
            signal=lambda proc, sig: signal_process("/proc", proc, sig),
            reap=lambda pod: reap_pod(pod, procfs=Procfs("/proc"), pods=lister, names=names, nvml=None),
        )

        async def drive() -> None:
            app = TopApp(source, interval=3600, actions=actions)
            async with app.run_test(size=(200, 50)) as pilot:
                await app.workers.wait_for_complete()
                await pilot.pause()
                shown = {p.key: p for p, _ in app.rows.values() if p}
                running, gone = shown[pods["running"].spec.uid], shown[doomed.spec.uid]
                assert (running.label, running.containers, running.runtime_state, running.dirty) == (
                    "ml/trainer-0",
                    ("cuda",),
                    "running",
                    None,
                )
                assert (gone.runtime_state, gone.dirty) == ("not_listed", "stale")
                assert [p.pid for p in gone.processes] == [survivor]
                row = next(k for k, (p, proc) in app.rows.items() if p is gone and proc is None)
                table = app.query_one("#table")
                table.move_cursor(row=table.get_row_index(row))
                await pilot.press("r")
                await pilot.pause()
                assert isinstance(app.screen, Confirm) and doomed.spec.uid in app.screen.question
                await pilot.press("y")
                await pilot.pause()
                await app.workers.wait_for_complete()
                await pilot.pause()
                assert app.status.startswith("OK: 1 stale pod(s), 1 process(es) ended"), app.status

        asyncio.run(drive())
    wait_until(lambda: not alive(survivor))
    assert alive(holder)
