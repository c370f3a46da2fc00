"""The full-screen `gpuzombie top`, driven by Textual's headless pilot: on a fake node of many pods
(keys: sorting, filters, the tree, help; the read-only refusal; a terminal too small), and on real
processes in a real PID namespace whose cgroup is a pod's: the confirmation names the process and
``y`` signals that process through its pidfd (``n`` signals nothing)."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import re
import shutil
import signal
import threading
import uuid
from pathlib import Path

import psutil
import pytest

pytest.importorskip("textual", reason="textual is in the 'top' extra")

from docs import doc
from gpuzombie.gpu.attribution import ReaderView, current_view
from gpuzombie.gpu.nvml import FakeNvml, GpuSnapshot
from gpuzombie.k8s.names import CriNames
from gpuzombie.k8s.podresources import PodResources
from gpuzombie.proc.procfs import Procfs
from gpuzombie.top.actions import READ_ONLY, signal_process
from gpuzombie.top.app import HELP, Actions, Confirm, Help, TopApp
from gpuzombie.top.model import ProcessLine
from gpuzombie.top.source import NodeSource
from markers import needs_root
from pidns import PidNamespace, wait_until
from topnode import build_fake_node, worker_pid

PIDS_CGROUP = Path("/sys/fs/cgroup/pids")


def fake_source(tmp_path) -> NodeSource:
    node = build_fake_node(tmp_path, pods=12, per_pod=4, host=20, gpus=4)
    return NodeSource(
        procfs=Procfs(str(node.proc)),
        nvml=node.nvml(),
        view=ReaderView(in_root_pidns=True),
        names=node.names,
        resources=lambda: PodResources(source=None),
        pods=None,
        node_name="gpu-node-1",
    )


async def loaded(app: TopApp, pilot) -> None:
    await app.workers.wait_for_complete()
    await pilot.pause()


def pods_shown(app: TopApp, group: str = "0") -> list[str]:
    return [pod.pod for key, (pod, proc) in app.rows.items() if key.startswith(f"p:{group}:") and pod]


def processes_shown(app: TopApp) -> list[int]:
    return [proc.pid for pod, proc in app.rows.values() if proc]


async def press(pilot, *keys: str) -> None:
    await pilot.press(*keys)
    await pilot.pause()


def select(app: TopApp, key: str) -> None:
    table = app.query_one("#table")
    table.move_cursor(row=table.get_row_index(key))


def test_keys_sort_filter_expand_and_help_on_a_node_of_many_pods(tmp_path):
    async def drive() -> None:
        app = TopApp(fake_source(tmp_path), interval=3600)
        async with app.run_test(size=(160, 50)) as pilot:
            await loaded(app, pilot)
            assert pods_shown(app) == ["train-8", "train-4", "train-0"]  # by GPU memory
            await press(pilot, "z")
            assert pods_shown(app)[0] == "train-0"  # its zombie and orphan
            await press(pilot, "n")
            assert pods_shown(app) == ["train-8", "train-0", "train-4"]  # infra/, team-a/, team-b/
            await press(pilot, "slash", *"train-1", "enter")
            assert [p for g in ("1", "2", "3") for p in pods_shown(app, g)] == ["train-1", "train-10", "train-11"]
            assert pods_shown(app) == []
            await press(pilot, "escape")
            assert len(pods_shown(app)) == 3
            await press(pilot, "N")
            assert app.namespace == "infra" and {p.namespace for p, _ in app.rows.values() if p} == {"infra"}
            await press(pilot, "N", "N", "N")
            assert app.namespace == ""
            assert processes_shown(app) == []
            await press(pilot, "t")
            assert len(processes_shown(app)) == 12 * 4
            await press(pilot, "t")
            select(app, next(k for k in app.rows if k.startswith("p:0:")))
            await press(pilot, "enter")
            assert len(processes_shown(app)) == 4
            await press(pilot, "h")
            assert isinstance(app.screen, Help)
            await press(pilot, "escape")
            assert not isinstance(app.screen, Help)

    asyncio.run(drive())


def test_a_node_of_hundreds_of_pods_shows_every_one_and_filters_them(tmp_path):
    """300 pods on 8 GPUs (the issue's "hundreds of pods"): every pod a row under its GPU, the
    namespace filter and the tree over all of them."""
    node = build_fake_node(tmp_path, pods=300, per_pod=3, host=50, gpus=8)
    source = NodeSource(
        procfs=Procfs(str(node.proc)),
        nvml=node.nvml(),
        view=ReaderView(in_root_pidns=True),
        names=node.names,
        resources=lambda: PodResources(source=None),
        pods=None,
    )

    async def drive() -> None:
        app = TopApp(source, interval=3600)
        async with app.run_test(size=(200, 60)) as pilot:
            await loaded(app, pilot)
            shown = [p.pod for p, x in app.rows.values() if p and x is None]
            assert len(shown) == 300 and len(set(shown)) == 300
            assert [len(pods_shown(app, str(g))) for g in range(8)] == [38, 38, 38, 38, 37, 37, 37, 37]
            await press(pilot, "N")
            assert {p.namespace for p, _ in app.rows.values() if p} == {"infra"}
            assert len({p.pod for p, _ in app.rows.values() if p}) == 100
            await press(pilot, "N", "N", "N", "t")
            assert len(processes_shown(app)) == 300 * 3

    asyncio.run(drive())


def test_read_only_refuses_every_action_without_asking(tmp_path):
    async def drive() -> None:
        app = TopApp(fake_source(tmp_path), interval=3600)
        async with app.run_test(size=(160, 50)) as pilot:
            await loaded(app, pilot)
            await press(pilot, "t")
            select(app, next(k for k in app.rows if k.startswith("x:")))
            for key in ("k", "K", "r"):
                await press(pilot, key)
                assert app.status == READ_ONLY and not isinstance(app.screen, Confirm)

    asyncio.run(drive())


def test_a_terminal_too_small_gets_a_message_not_a_garbled_table(tmp_path):
    async def drive() -> None:
        app = TopApp(fake_source(tmp_path), interval=3600)
        async with app.run_test(size=(40, 8)) as pilot:
            await loaded(app, pilot)
            small = app.query_one("#small")
            assert small.display and not app.query_one("#table").display
            assert "terminal too small (40x8): top needs 60x10" in str(small.render())
            await pilot.resize_terminal(120, 30)
            await pilot.pause()
            assert not small.display and app.query_one("#table").display
            await pilot.resize_terminal(20, 3)
            await pilot.pause()
            assert small.display and "(20x3)" in str(small.render())

    asyncio.run(drive())


@pytest.fixture
def pod_cgroup():
    """A cgroup named as the kubelet names a pod's container (systemd driver), in the v1 pids
    hierarchy this machine has (or v2's root): processes in it are that pod's, for top as for trace."""
    uid = str(uuid.uuid4())
    cid = uuid.uuid4().hex * 2
    root = PIDS_CGROUP if PIDS_CGROUP.is_dir() else Path("/sys/fs/cgroup")
    pod = (
        root / "kubepods.slice" / "kubepods-besteffort.slice" / f"kubepods-besteffort-pod{uid.replace('-', '_')}.slice"
    )
    path = pod / f"cri-containerd-{cid}.scope"
    path.mkdir(parents=True)
    yield uid, path
    for d in (path, pod):
        wait_until(lambda d=d: not d.exists() or not (d / "cgroup.procs").read_text().strip())
        d.rmdir()
    for d in (pod.parent, pod.parent.parent):
        if not any(c.is_dir() for c in d.iterdir()):
            d.rmdir()


def real_source() -> NodeSource:
    return NodeSource(
        procfs=Procfs("/proc"),
        nvml=FakeNvml(GpuSnapshot(available=False, reason="no GPU on this machine")),
        view=current_view(),
        names=lambda ids: CriNames(source=None),
        resources=lambda: PodResources(source=None),
        pods=None,
    )


@needs_root
@pytest.mark.skipif(shutil.which("unshare") is None, reason="needs unshare")
def test_confirmation_names_the_process_and_signals_it_through_its_pidfd(pod_cgroup):
    uid, cgroup = pod_cgroup
    sent: list[tuple[int, str]] = []

    def send(proc, sig):
        sent.append((proc.pid, sig.name))
        return signal_process("/proc", proc, sig)

    with PidNamespace("sh", "-c", "sleep 300 & sleep 301 & wait", cgroup=cgroup) as ns:
        first, second = wait_until(lambda: len(ns.children()) == 2 and sorted(c.pid for c in ns.children()))

        async def drive() -> None:
            app = TopApp(real_source(), interval=3600, actions=Actions(signal=send, reap=lambda pod: "unused"))
            async with app.run_test(size=(160, 50)) as pilot:
                await loaded(app, pilot)
                await press(pilot, "t")
                keys = {proc.pid: key for key, (pod, proc) in app.rows.items() if proc and pod and pod.key == uid}
                assert set(keys) == {ns.pid1, first, second}
                select(app, keys[first])
                await press(pilot, "k")
                assert isinstance(app.screen, Confirm)
                question = app.screen.question
                assert f"Send SIGTERM to pid {first} (nspid 2, sleep, state S)" in question and "sleep 300" in question
                await press(pilot, "n")  # cancelled: nothing sent
                assert sent == [] and psutil.pid_exists(first) and "cancelled" in app.status
                select(app, keys[second])
                await press(pilot, "k", "y")
                assert sent == [(second, "SIGTERM")]
                assert app.status == f"sent SIGTERM to pid {second} (sleep) through its pidfd"

        asyncio.run(drive())
        wait_until(lambda: not psutil.pid_exists(second) or psutil.Process(second).status() == psutil.STATUS_ZOMBIE)
        assert psutil.Process(first).status() != psutil.STATUS_ZOMBIE  # the one not confirmed lives on
        os.kill(ns.pid1, 0)


@needs_root
def test_a_process_whose_pid_was_reused_or_that_exited_is_not_signalled():
    """What is pinned is the frame's (pid, start time): another start time at that pid is another
    process, refused by name, and so is one that exited since the frame."""
    child = psutil.Popen(["sleep", "300"])
    start = Procfs("/proc").snapshot([child.pid], now=0.0).processes[child.pid].start_ticks
    earlier = ProcessLine(child.pid, child.pid, os.getpid(), start - 1, "S", "sleep", "sleep 300", "", 0, (), 0.0)
    assert (
        signal_process("/proc", earlier, signal.SIGKILL)
        == f"pid {child.pid} not signalled: its pid now names another process"
    )
    assert child.is_running() and child.status() != psutil.STATUS_ZOMBIE
    child.kill()
    child.wait()
    same = dataclasses.replace(earlier, start_ticks=start)
    assert signal_process("/proc", same, signal.SIGKILL) == f"pid {child.pid} not signalled: it has exited"


def test_the_docs_keys_are_the_apps():
    bound = {key for binding in TopApp.BINDINGS for key in binding.key.split(",")}
    names = {"slash": "/", "question_mark": "?", "enter": "Enter", "escape": "Esc"}
    keys = set(re.findall(r"`([^`]+)`", "".join(re.findall(r"^\| (.*?) \|", doc("top"), re.MULTILINE)[1:])))
    assert keys == {names.get(k, k) for k in bound} - {"Esc"}
    for key in keys - {"Enter"}:
        assert key in HELP, key


def test_a_refresh_with_the_same_rows_updates_the_cells_that_changed(tmp_path):
    source = fake_source(tmp_path)
    worker = Path(source.procfs.root) / str(worker_pid(4)) / "stat"

    async def drive() -> None:
        app = TopApp(source, interval=3600)
        async with app.run_test(size=(160, 50)) as pilot:
            await loaded(app, pilot)
            table = app.query_one("#table")
            key = next(k for k, (p, x) in app.rows.items() if p and p.pod == "train-4" and x is None)
            assert str(table.get_cell(key, "D-STATE")) == ""
            worker.write_text(worker.read_text().replace(" S ", " D ", 1))
            app.refresh_view()
            await loaded(app, pilot)
            assert str(table.get_cell(key, "D-STATE")).startswith("1 for ")
            assert table.get_row_index(key) == 2  # the same row, updated in place

    asyncio.run(drive())


def test_a_slow_scan_is_never_run_twice_at_once_and_one_more_follows_it(tmp_path):
    """Refreshes asked for while a scan waits (a runtime at its timeout) run one after it, never beside
    it: two at once would share the source's trackers and process cache."""
    source = fake_source(tmp_path)
    release = threading.Event()
    running, most, calls = [0], [0], []
    guard = threading.Lock()

    def slow():
        with guard:
            running[0] += 1
            most[0] = max(most[0], running[0])
            calls.append(1)
        try:
            release.wait(30)
            return source()
        finally:
            with guard:
                running[0] -= 1

    async def drive() -> None:
        app = TopApp(slow, interval=3600)
        async with app.run_test(size=(160, 50)) as pilot:
            await pilot.pause()
            app.refresh_view()
            app.refresh_view()
            await pilot.pause()
            release.set()
            await loaded(app, pilot)
            assert (most[0], len(calls)) == (1, 2)
            assert pods_shown(app) == ["train-8", "train-4", "train-0"]

    asyncio.run(drive())


def test_a_scan_that_fails_is_one_line_and_the_last_frame_stays(tmp_path):
    source = fake_source(tmp_path)
    calls = []

    def flaky():
        calls.append(1)
        if len(calls) > 1:
            raise FileNotFoundError(2, "No such file or directory", "/host/proc/stat")
        return source()

    async def drive() -> None:
        app = TopApp(flaky, interval=3600)
        async with app.run_test(size=(160, 50)) as pilot:
            await loaded(app, pilot)
            shown = dict(app.rows)
            app.refresh_view()
            await loaded(app, pilot)
            assert app.status.startswith("scan failed: [Errno 2] No such file or directory")
            assert app.rows.keys() == shown.keys() and app.is_running

    asyncio.run(drive())
