"""`gpuzombie top`'s view model and --once on a fake node (fake /proc of many pods, fake NVML): the
groups per GPU, pods and processes, sorting and filtering, the marks only gpuzombie knows (PID 1
that reaps nothing, zombies, stale, D state, a pod the runtime calls stopped), NVML absent, hostile
names, and the CLI's one-line errors. Needs no Textual (test_top_app.py drives the full screen)."""

from __future__ import annotations

import dataclasses
import json
import re
import sys

import pytest

from docs import doc
from fakeproc import TREE_PIDNS, make_fake_proc
from gpuzombie.cli.main import main
from gpuzombie.gpu.attribution import ReaderView
from gpuzombie.gpu.nvml import FakeNvml, GpuDevice, GpuSnapshot
from gpuzombie.k8s.liveness import RuntimePods
from gpuzombie.k8s.names import ContainerNames, CriNames
from gpuzombie.k8s.podresources import PodResources
from gpuzombie.proc.procfs import Procfs
from gpuzombie.top.model import HOST, StoppingTracker, arrange, build_view, namespaces_of
from gpuzombie.top.render import render_text
from gpuzombie.top.source import NodeSource
from gpuzombie.trace.scan import scan_node
from gpuzombie.units import MIB
from topnode import FakeNode, build_fake_node, container_id, pod_uid, worker_pid

HOSTILE_POD = "[bold]evil[/bold]\x1b[2J"


@pytest.fixture
def node(tmp_path) -> FakeNode:
    node = build_fake_node(tmp_path, pods=12, per_pod=4, host=20, gpus=4)
    # A host process holding /dev/nvidia0 that NVML does not list (an agent, a stuck tool).
    make_fake_proc(
        node.proc, 900, ppid=1, comm="nvidia-smi", cmdline=b"nvidia-smi\0-l\0", fds=("/dev/nvidia0",), pidns=TREE_PIDNS
    )
    return node


def source(node: FakeNode, *, nvml=None, pods=None, names=None) -> NodeSource:
    return NodeSource(
        procfs=Procfs(str(node.proc)),
        nvml=nvml or node.nvml(),
        view=ReaderView(in_root_pidns=True),
        names=names or node.names,
        resources=lambda: PodResources(source=None),
        pods=pods,
        node_name="gpu-node-1",
    )


def pod_of(view, name):
    return next(p for g in view.groups for p in g.pods if p.pod == name)


def test_each_gpu_lists_the_pods_holding_it_with_their_processes(node):
    view = source(node)()
    assert [g.key for g in view.groups] == ["0", "1", "2", "3", HOST]
    gpu0 = view.groups[0]
    assert {p.pod for p in gpu0.pods} == {"train-0", "train-4", "train-8"}
    assert gpu0.memory is not None and gpu0.memory.process_memory == (2000 + 2004 + 2008) * MIB
    assert gpu0.handover == "in use"
    train0 = pod_of(view, "train-0")
    assert (train0.namespace, train0.containers, train0.gpu_memory) == ("team-a", ("worker",), 2000 * MIB)
    assert train0.pid1 == "sleep (non_forking)" and train0.reaps is False
    assert train0.zombies == 1 and train0.grace_risk == "pid1_drops_sigterm"
    assert [(p.nspid, p.depth, p.state) for p in train0.processes] == [
        (1, 0, "S"),
        (2, 1, "S"),
        (3, 2, "S"),
        (4, 2, "Z"),
    ]
    assert train0.processes[1].gpu_memory == 2000 * MIB and train0.processes[1].command == "python3 train.py --gpu"
    train1 = pod_of(view, "train-1")
    assert train1.pid1 == "tini (init)" and train1.reaps is True and train1.zombies == 0
    assert view.pods == 12 and view.nvml == "ok (driver 580.159.04)"


def test_host_processes_holding_gpus_are_their_own_group(node):
    host = source(node)().groups[-1]
    assert host.key == HOST and host.memory is None
    (pseudo,) = host.pods
    assert [(p.pid, p.comm, p.gpus) for p in pseudo.processes] == [(900, "nvidia-smi", (0,))]


def test_sorting_and_filtering_are_pure_functions_of_the_frame(node):
    view = source(node)()
    by = {s: [p.pod for p in arrange(view, sort=s).groups[0].pods] for s in ("memory", "zombies", "name")}
    assert by["memory"] == ["train-8", "train-4", "train-0"]  # 2008, 2004, 2000 MiB
    assert by["zombies"][0] == "train-0"  # a zombie and an orphan under a sleep PID 1
    assert by["name"] == ["train-8", "train-0", "train-4"]  # infra/, team-a/, team-b/
    assert namespaces_of(view) == ("infra", "team-a", "team-b")
    team_a = arrange(view, namespace="team-a")
    assert {p.namespace for g in team_a.groups for p in g.pods} == {"team-a"}
    assert [g.key for g in team_a.groups] == ["0", "1", "2", "3"]  # GPUs stay, the empty host group goes
    assert [p.pod for g in arrange(view, text="train-1").groups for p in g.pods] == ["train-1", "train-10", "train-11"]
    assert [p.pod for g in arrange(view, text=str(worker_pid(5))).groups for p in g.pods] == ["train-5"]
    with pytest.raises(ValueError, match="sort by one of"):
        arrange(view, sort="cpu")


def test_stopped_pods_stale_holders_and_time_since_stopping(node):
    stopped = pod_uid(3)
    answer = RuntimePods(
        source="fake", ready=frozenset(pod_uid(i) for i in range(12)) - {stopped}, not_ready=frozenset({stopped})
    )
    now = [100.0]
    scan = scan_node(
        procfs=Procfs(str(node.proc)),
        nvml=node.nvml(),
        view=ReaderView(in_root_pidns=True),
        names=node.names,
        resources=lambda: PodResources(source=None),
        pods=lambda: answer,
    )
    tracker = StoppingTracker(clock=lambda: now[0])
    first = build_view(scan, pods=answer, stopping=tracker)
    now[0] = 142.0
    later = build_view(scan, pods=answer, stopping=tracker)
    pod = pod_of(later, "train-3")
    assert (pod.runtime_state, pod.dirty, pod_of(first, "train-3").stopping_s, pod.stopping_s) == (
        "not_ready",
        "stale",
        0.0,
        42.0,
    )
    assert pod_of(later, "train-2").runtime_state == "running" and pod_of(later, "train-2").stopping_s is None
    assert next(g for g in later.groups if g.key == "3").handover == "dirty"
    assert "STALE" in render_text(later) and "not_ready 42s" in render_text(later)


def test_a_d_state_gpu_holder_is_named_with_its_age(node):
    stat = node.proc / str(worker_pid(1)) / "stat"
    stat.write_text(stat.read_text().replace(" S ", " D ", 1))
    top = source(node)
    top()
    pod = pod_of(top(), "train-1")
    assert pod.d_state == 1 and pod.d_state_max_s is not None and pod.d_state_max_s >= 0
    assert pod.processes[1].d_state_s == pod.d_state_max_s


def test_without_nvml_the_holders_still_show_under_their_device_node(node):
    view = source(node, nvml=FakeNvml(GpuSnapshot(available=False, reason="NVML Shared Library Not Found")))()
    assert view.nvml.startswith("absent (NVML Shared Library Not Found)")
    assert [g.key for g in view.groups] == ["0", "1", "2", "3", HOST]
    assert view.groups[0].memory is None and "NVML not read" in view.groups[0].title
    assert {p.pod for p in view.groups[0].pods} == {"train-0", "train-4", "train-8"}


def test_each_gpu_says_whether_it_is_clean_to_hand_out_as_preflight_judges_it(node):
    """handover.verdict.judge on each GPU's NVML reading: the driver's reservation alone is clean; a
    listed process is in use; memory held with none listed is dirty; no NVML is never clean."""
    busy = node.nvml().snapshot
    idle = GpuDevice(4, "GPU-0004", "NVIDIA H200", 140 * 1024 * MIB, 615 * MIB, 0, 615 * MIB)
    ghost = dataclasses.replace(idle, index=5, uuid="GPU-0005", memory_used=(615 + 900) * MIB)
    nvml = FakeNvml(dataclasses.replace(busy, devices=(*busy.devices, idle, ghost)))
    view = source(node, nvml=nvml)()
    by_key = {g.key: g for g in view.groups}
    assert (by_key["0"].handover, by_key["4"].handover, by_key["5"].handover) == ("in use", "clean", "dirty")
    assert by_key["0"].handover_reason == "3 process(es) listed, 6012 MiB held"
    assert by_key["4"].handover_reason == "0 MiB held, within 16 MiB"
    assert "900 MiB held with no process listed" in by_key["5"].handover_reason
    text = render_text(arrange(view), width=250)
    assert "clean to hand out (0 MiB held, within 16 MiB)" in text
    blind = source(node, nvml=FakeNvml(GpuSnapshot(available=False, reason="NVML Shared Library Not Found")))()
    assert {(g.handover, g.handover_reason) for g in blind.groups if g.key != HOST} == {
        ("cannot tell", "cannot read the GPU: NVML Shared Library Not Found")
    }


def test_what_a_container_controls_is_escaped_and_never_markup(node):
    cmdline = node.proc / str(worker_pid(2)) / "cmdline"
    cmdline.write_bytes(b"python3\0\x1b]0;owned\x07[red]x[/red]\0")

    def names(ids) -> CriNames:
        found = node.names(ids)
        cid = container_id(2)
        if cid in found.containers:
            c = found.containers[cid]
            found.containers[cid] = ContainerNames(cid, c.container, HOSTILE_POD, c.namespace, c.pod_uid, c.state)
        return found

    view = source(node, names=names)()
    text = render_text(view, expanded=None, width=200)
    assert "[bold]evil[/bold]\\x1b[2J" in text and "\x1b" not in text
    assert "\\x1b]0;owned\\x07[red]x[/red]" in text


def test_once_prints_a_frame_and_json_without_textual(node, tmp_path, capsys, monkeypatch):
    monkeypatch.setitem(sys.modules, "textual", None)  # as on the node image: --once needs no Textual
    replay = tmp_path / "nvml.json"
    replay.write_text(json.dumps(dataclasses.asdict(node.nvml().snapshot)))
    argv = [
        "top",
        "--once",
        "--procfs",
        str(node.proc),
        "--nvml-replay",
        str(replay),
        "--cri-socket",
        str(tmp_path / "none.sock"),
    ]
    assert main([*argv, "--tree", "--sort", "name", "--width", "200"]) == 0
    out = capsys.readouterr().out
    assert "GPU 0 NVIDIA H200 GPU-0000" in out and "python3 train.py --gpu" in out and "(host processes)" in out
    assert main([*argv, "--json", "--filter", pod_uid(8)]) == 0  # no runtime here: pods go by UID
    doc = json.loads(capsys.readouterr().out)
    assert doc["schema"] == "gpuzombie.top/1"
    assert [(p["key"], p["gpu_memory_mib"]) for g in doc["groups"] for p in g["pods"]] == [(pod_uid(8), 2008.0)]


def test_full_screen_without_textual_says_how_to_install_it(node, capsys, monkeypatch):
    import gpuzombie.top

    for name in [m for m in sys.modules if m == "textual" or m.startswith("textual.")] or ["textual"]:
        monkeypatch.setitem(sys.modules, name, None)  # as if never installed, though another test loaded it
    monkeypatch.delitem(sys.modules, "gpuzombie.top.app", raising=False)
    monkeypatch.delattr(gpuzombie.top, "app", raising=False)
    assert main(["top", "--procfs", str(node.proc)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and ".venv/bin/pip install -e '.[top]'" in err, err


@pytest.mark.parametrize(
    "argv",
    [["--json"], ["--tree"], ["--once", "--allow-actions"], ["--once", "--sort", "cpu"], ["--once", "--interval", "0"]],
)
def test_bad_options_are_one_line_exit_2(node, argv, capsys):
    assert main(["top", "--procfs", str(node.proc), *argv]) == 2
    assert "Traceback" not in capsys.readouterr().err


def test_an_unreadable_procfs_is_one_line_exit_2(tmp_path, capsys):
    assert main(["top", "--once", "--procfs", str(tmp_path / "nope")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "nope" in err


@pytest.mark.parametrize("ns_link", [True, False])
def test_a_zombie_whose_cgroup_reads_empty_stays_in_its_pod(node, ns_link):
    """A zombie's cgroup reads empty on a real kernel: its PID namespace, or else its parent, says whose it is."""
    zombie = node.proc / str(100_000 + 5 * 100 + 4)  # train-5's zombie helper (local pid 4)
    (zombie / "cgroup").write_text("")
    if not ns_link:
        (zombie / "ns" / "pid").unlink()
    view = source(node)()
    pod = pod_of(view, "train-5")
    assert [(p.nspid, p.state) for p in pod.processes][-1] == (4, "Z")
    assert pod.zombies == (1 if ns_link else 0)  # the namespace survey needs the link; the tree does not
    assert [p.pid for p in view.groups[-1].pods[0].processes] == [900]  # the host group: the host holder alone


def test_each_mig_instance_is_its_own_group_as_trace_accounts_it(tmp_path):
    pytest.importorskip("prometheus_client", reason="test_mig's node is imported with the exporter extra")
    import fake_pynvml as nv
    from gpuzombie.gpu.nvml import PynvmlBackend
    from test_mig import build_node, machine

    proc = build_node(tmp_path / "proc")
    node = FakeNode(proc, pods=0, per_pod=0, gpus=2)
    view = source(
        node, nvml=PynvmlBackend(nv.module(machine(extra=2 * 1024 * MIB))), names=lambda ids: CriNames(source=None)
    )()
    assert [g.key for g in view.groups] == ["0/mig1", "0/mig2", "1", HOST]
    gi1, gi2 = view.groups[:2]
    assert "GPU 0 MIG 1g.18gb (GI 1)" in gi1.title and (gi1.handover, gi2.handover) == ("dirty", "clean")
    (host,) = view.groups[-1].pods
    assert [(p.pid, p.gpu_memory) for p in host.processes] == [(4242, 10 * 1024 * MIB), (5151, 2000 * MIB)]


def test_every_flag_the_doc_names_is_real(capsys):
    page = doc("top")
    assert main(["top", "--help"]) == 0
    help_text = capsys.readouterr().out
    commands = re.findall(r"gpuzombie top([^`\n]*(?:\n {10,}[^`\n]*)*)", page)
    assert len(commands) >= 3
    for flags in commands:
        for flag in re.findall(r"--[a-z-]+", flags):
            assert flag in help_text, flag
