"""observe on fake /proc trees with recorded NVML snapshots: the attribution cases real hardware
gives (host pids, namespace-local pids, hidden namespaces, dead pids, the idle reservation, an NCCL
peer context), and the CLI's bad-input paths."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from fakeproc import make_fake_proc, make_fake_root
from gpufakes import gpu_device, gpu_process
from gpuzombie.cli.main import main
from gpuzombie.gpu.attribution import ReaderView
from gpuzombie.gpu.nvml import FakeNvml, GpuDevice, GpuSnapshot
from gpuzombie.observe import observe, render_text
from gpuzombie.proc.procfs import Procfs
from gpuzombie.units import MIB

HOST = ReaderView(in_root_pidns=True)
INSIDE = ReaderView(in_root_pidns=False)
NOW = 1700000000 + 100.0
WORKER_FDS = ("/dev/nvidia0", "/dev/nvidiactl", "/dev/nvidia-uvm")


def h200(index=0, *, used_mib=615, reserved_mib=615, processes=()):
    """An H200 as NVML reports it (driver 580.159): idle = 615 MiB used, all of it reserved."""
    return gpu_device(
        index,
        total=143771 * MIB,
        used=used_mib * MIB,
        reserved=None if reserved_mib is None else reserved_mib * MIB,
        processes=processes,
    )


def worker(pid, mib=2658, name="python3"):
    return gpu_process(pid, mib=mib, name=name)


def run(tmp_path, devices, view, **kwargs):
    gpus = GpuSnapshot(available=True, driver_version="580.159.04", devices=tuple(devices))
    return observe(Procfs(str(tmp_path)), FakeNvml(gpus), view, now=NOW, is_root=True, **kwargs)


@pytest.fixture
def proc(tmp_path):
    make_fake_root(tmp_path)
    return tmp_path


def test_host_pid_mode_live_worker(proc):
    make_fake_proc(proc, 1, ppid=0, comm="systemd", cmdline=b"/sbin/init\0")
    make_fake_proc(proc, 532, ppid=1, fds=WORKER_FDS, cmdline=b"python3\0worker.py\0")
    report = run(proc, [h200(used_mib=3281, processes=[worker(532)])], HOST)
    (ref,) = report.attribution.processes
    assert (ref.verdict.value, ref.host_pid, ref.local_pid) == ("live", 532, 532)
    (ghost,) = report.attribution.ghosts
    assert ghost.unexplained == 8 * MIB and ghost.verdict == "ok"  # measured: 3281 - 615 - 2658
    assert report.pid1.kind.value == "supervisor" and report.orphans == ()
    assert report.summary.healthy and report.exit_status == 0


def test_namespace_mode_nvml_gives_local_pids(proc):
    """driver 580.159 inside a namespace: NVML returns the namespace's own pids (DEVICE-FACTS)."""
    make_fake_proc(proc, 1, ppid=0, comm="sleep", cmdline=b"sleep\0infinity\0")
    make_fake_proc(proc, 2, ppid=1, state="Z", cmdline=b"")
    make_fake_proc(proc, 3, ppid=1, fds=WORKER_FDS)
    report = run(proc, [h200(used_mib=3281, processes=[worker(3)])], INSIDE)
    (ref,) = report.attribution.processes
    assert (ref.verdict.value, ref.local_pid, ref.host_pid) == ("live", 3, None)
    assert report.orphaned_contexts == ()  # the seed's false "ORPHANED" must not happen
    assert report.summary.zombies == 1 and report.summary.orphans == 1
    assert report.attribution.fd_holders[0].listed_by_nvml


def test_namespace_mode_local_pid_with_unreadable_fds(proc, monkeypatch):
    """Not root: the worker's fd directory is unreadable, NVML's name agrees with the local pid."""
    make_fake_proc(proc, 1, ppid=0, comm="sleep", cmdline=b"sleep\0infinity\0")
    make_fake_proc(proc, 3, ppid=1, uid=1000)
    real_open = os.open

    def deny_fd_dir(path, *args, **kwargs):  # the kernel refuses the opendir of /proc/<pid>/fd
        if str(path).endswith("/3/fd"):
            raise PermissionError(13, "Permission denied")
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(os, "open", deny_fd_dir)  # root cannot be denied for real
    report = run(proc, [h200(used_mib=3281, processes=[worker(3)])], INSIDE)
    (ref,) = report.attribution.processes
    assert ref.verdict.value == "live" and ref.local_pid == 3 and "unreadable" in ref.evidence
    assert report.view.access_denied == 1


def test_namespace_mode_host_pid_mapped_to_unique_fd_holder(proc):
    """The seed's case: torch in a container, NVML hands out host pid 532 for local pid 3."""
    make_fake_proc(proc, 1, ppid=0, comm="sleep", cmdline=b"sleep\0infinity\0")
    make_fake_proc(proc, 3, ppid=1, fds=WORKER_FDS)
    make_fake_proc(proc, 4, ppid=1, comm="bash", cmdline=b"bash\0")  # no GPU fds: not a candidate
    report = run(proc, [h200(used_mib=3281, processes=[worker(532)])], INSIDE)
    (ref,) = report.attribution.processes
    assert (ref.verdict.value, ref.local_pid, ref.host_pid, ref.nvml_pid) == ("live", 3, 532, 532)
    assert "host pid" in ref.evidence or "matches one local fd holder" in ref.evidence
    assert report.summary.orphaned_contexts == 0


def test_namespace_mode_host_pid_with_two_holders_cannot_tell(proc):
    make_fake_proc(proc, 1, ppid=0, comm="sleep", cmdline=b"sleep\0infinity\0")
    make_fake_proc(proc, 3, ppid=1, fds=WORKER_FDS)
    make_fake_proc(proc, 4, ppid=1, fds=WORKER_FDS)
    report = run(proc, [h200(used_mib=3281, processes=[worker(532)])], INSIDE)
    (ref,) = report.attribution.processes
    assert ref.verdict.value == "unresolved" and ref.local_pid is None
    assert "2 local /dev/nvidia* holders could be it (3, 4)" in ref.evidence
    assert report.summary.orphaned_contexts == 0
    data = report.to_dict()
    assert data["gpu_processes"][0]["verdict"] == "unresolved"


def test_gone_pid_in_root_namespace_is_an_orphaned_context(proc):
    make_fake_proc(proc, 1, ppid=0, comm="systemd", cmdline=b"/lib/systemd/systemd\0")
    report = run(proc, [h200(used_mib=3281, processes=[worker(999)])], HOST)
    (ctx,) = report.orphaned_contexts
    assert ctx.verdict.value == "gone" and ctx.host_pid == 999
    assert report.summary.orphaned_contexts == 1 and report.exit_status == 1
    assert "ORPHANED CONTEXT: GPU 0 pid 999" in render_text(report)


def test_idle_reservation_is_not_a_ghost(proc):
    make_fake_proc(proc, 1, ppid=0, comm="tini", cmdline=b"tini\0--\0sleep\0infinity\0")
    report = run(proc, [h200()], HOST)
    (ghost,) = report.attribution.ghosts
    assert ghost.baseline == 615 * MIB and ghost.unexplained == 0 and not ghost.flagged
    assert report.summary.healthy
    # a driver without the v2 reservation: the caller's baseline does the same job
    no_v2 = run(proc, [h200(reserved_mib=None)], HOST, baseline=615 * MIB)
    assert not no_v2.attribution.ghosts[0].flagged
    assert run(proc, [h200(reserved_mib=None)], HOST).attribution.ghosts[0].flagged


def test_nccl_peer_context_is_a_ghost_with_its_cause(proc):
    """Measured on 2×H200: rank 0 killed, rank 1 hangs on GPU1, GPU0 keeps 906 MiB with no process."""
    make_fake_proc(proc, 1, ppid=0, comm="systemd", cmdline=b"/sbin/init\0")
    make_fake_proc(proc, 601, ppid=1, fds=("/dev/nvidia0", "/dev/nvidia1", "/dev/nvidiactl"))
    report = run(proc, [h200(0, used_mib=906), h200(1, used_mib=3498 + 615, processes=[worker(601, 3498)])], HOST)
    gpu0, gpu1 = report.attribution.ghosts
    assert gpu0.unexplained == 291 * MIB and gpu0.flagged and gpu0.verdict == "ghost"
    assert any("peer context of a multi-GPU process listed on GPU 1" in c for c in gpu0.likely_causes)
    assert not gpu1.flagged
    assert report.summary.ghost_gpus == 1 and report.exit_status == 1
    data = report.to_dict()
    assert data["ghosts"][0]["unexplained_mib"] == 291.0 and data["summary"]["ghost_gpus"] == 1


def test_other_namespaces_memory_is_not_called_a_ghost_inside(proc):
    """Measured: another container's 2.6 GB process is not listed at all from inside a namespace."""
    make_fake_proc(proc, 1, ppid=0, comm="tini", cmdline=b"tini\0--\0python3\0")
    report = run(proc, [h200(used_mib=615 + 2667)], INSIDE)
    (ghost,) = report.attribution.ghosts
    assert ghost.verdict == "cannot_tell" and not ghost.flagged
    assert any("invisible" in c for c in ghost.likely_causes)
    assert report.summary.healthy


def test_orphan_evidence_dead_group_leader_and_cannot_tell(proc):
    """A shell as PID 1 gives no evidence itself; a dead process-group leader does."""
    make_fake_proc(proc, 1, ppid=0, comm="bash", cmdline=b"/bin/bash\0")
    make_fake_proc(proc, 7, ppid=1, comm="worker", pgid=5, sid=1)  # group leader 5 is gone
    make_fake_proc(proc, 8, ppid=1, comm="daemon", pgid=8, sid=8)  # its own leader: no evidence
    report = run(proc, [], HOST)
    by_pid = {o.pid: o for o in report.orphans}
    assert by_pid[7].verdict == "orphan" and "process-group leader (pid 5) has exited" in by_pid[7].evidence[0]
    assert by_pid[8].verdict == "cannot_tell" and by_pid[8].evidence == ()
    assert report.summary.orphans == 1
    assert report.pid1.kind.value == "shell" and not report.pid1.is_reaping_init


def test_zombie_of_a_live_parent_no_init_can_reap(proc):
    make_fake_proc(proc, 1, ppid=0, comm="tini", cmdline=b"/usr/bin/tini\0--\0python3\0train.py\0")
    make_fake_proc(proc, 2, ppid=1, cmdline=b"python3\0train.py\0", starttime=1001)
    make_fake_proc(proc, 9, ppid=2, state="Z", cmdline=b"", starttime=1500)
    report = run(proc, [], HOST)
    (zombie,) = report.zombies
    assert zombie.ppid == 2 and "no init can reap it" in zombie.reaped_by
    assert report.orphans == ()  # pid 2 is tini's one child


def test_catatonit_in_pause_mode_starts_no_child_so_every_child_is_an_orphan(proc):
    """S5's pause (issue 35 (7)): `catatonit -P` was read as a single-child init, so after the
    kill -9 the surviving re-parented worker passed for its own child, and observe said no orphan
    where the lab's host count said one."""
    make_fake_proc(proc, 1, ppid=0, comm="catatonit", cmdline=b"/usr/bin/catatonit\0-P\0")
    make_fake_proc(proc, 2, ppid=0, comm="sleep", cmdline=b"sleep\0infinity\0", starttime=1001)
    make_fake_proc(proc, 5, ppid=1, comm="python3", cmdline=b"python3\0worker.py\0", starttime=1100)
    report = run(proc, [], HOST)
    assert report.pid1.kind.value == "pause" and report.pid1.is_reaping_init
    assert [(o.pid, o.verdict) for o in report.orphans] == [(5, "orphan")]


def test_catatonit_as_an_init_keeps_its_one_child(proc):
    make_fake_proc(proc, 1, ppid=0, comm="catatonit", cmdline=b"/usr/bin/catatonit\0--\0python3\0train.py\0")
    make_fake_proc(proc, 2, ppid=1, comm="python3", cmdline=b"python3\0train.py\0", starttime=1001)
    report = run(proc, [], HOST)
    assert report.pid1.kind.value == "init" and report.orphans == ()


def test_observer_chain_is_not_a_finding(proc):
    make_fake_proc(proc, 1, ppid=0, comm="sleep", cmdline=b"sleep\0infinity\0")
    make_fake_proc(proc, 40, ppid=0, comm="sh", cmdline=b"sh\0")
    make_fake_proc(proc, 41, ppid=40, comm="python3")
    make_fake_proc(proc, 42, ppid=1, comm="sleep", cmdline=b"sleep\0300\0")
    report = run(proc, [], ReaderView(in_root_pidns=False, own_pid=41))
    assert report.view.excluded_pids == (41, 40)
    assert [o.pid for o in report.orphans] == [42]


def test_json_schema_top_level(proc):
    make_fake_proc(proc, 1, ppid=0, comm="sleep", cmdline=b"sleep\0infinity\0")
    data = json.loads(json.dumps(run(proc, [h200()], INSIDE).to_dict()))
    assert list(data) == [
        "schema",
        "taken_at",
        "view",
        "pid1",
        "processes",
        "zombies",
        "orphans",
        "gpu",
        "gpu_processes",
        "fd_holders",
        "ghosts",
        "orphaned_contexts",
        "d_state_holders",
        "summary",
    ]
    assert set(data["summary"]) == {
        "zombies",
        "orphans",
        "orphaned_contexts",
        "ghost_gpus",
        "gpu_processes",
        "incomplete",
        "access_denied",
        "unverified",
        "d_state_holders",
        "healthy",
    }
    assert data["gpu"]["available"] is True and data["gpu"]["devices"][0]["memory_reserved_mib"] == 615.0


# --- the CLI ---------------------------------------------------------------------------------


def test_cli_replays_nvml_and_reads_fake_procfs(proc, tmp_path_factory, capsys):
    """A container's tree read from outside (a fake one here) is judged as a namespace: NVML pids are
    local, and GPU 0's 291 MiB is an NCCL peer context of the local rank listed on GPU 1."""
    make_fake_proc(proc, 1, ppid=0, comm="tini", cmdline=b"/usr/bin/tini\0--\0torchrun\0")
    make_fake_proc(proc, 7, ppid=1, fds=("/dev/nvidia0", "/dev/nvidia1", "/dev/nvidiactl"))
    snap = tmp_path_factory.mktemp("nvml") / "snap.json"
    gpu = {"name": "H200", "memory_total": 1000 * MIB, "memory_reserved": 615 * MIB}
    snap.write_text(
        json.dumps(
            {
                "available": True,
                "devices": [
                    {
                        **gpu,
                        "index": 0,
                        "uuid": "GPU-0",
                        "memory_used": 906 * MIB,
                        "memory_free": 94 * MIB,
                        "processes": [],
                    },
                    {
                        **gpu,
                        "index": 1,
                        "uuid": "GPU-1",
                        "memory_used": 4113 * MIB,
                        "memory_free": 0,
                        "processes": [{"pid": 7, "used_memory": 3498 * MIB, "kind": "compute", "name": "python3"}],
                    },
                ],
            }
        )
    )
    rc = main(["observe", "--procfs", str(proc), "--json", "--nvml-replay", str(snap)])
    data = json.loads(capsys.readouterr().out)
    assert data["view"]["in_root_pidns"] is False and data["view"]["own_pid"] is None
    assert data["gpu_processes"][0]["local_pid"] == 7 and data["gpu_processes"][0]["verdict"] == "live"
    assert rc == 1 and data["summary"]["ghost_gpus"] == 1 and data["ghosts"][0]["verdict"] == "ghost"
    rc = main(["observe", "--procfs", str(proc), "--nvml-replay", str(snap), "--ghost-threshold-mib", "300"])
    assert rc == 0 and "[8] Orphaned contexts and ghost memory" in capsys.readouterr().out
    rc = main(["observe", "--procfs", str(proc), "--json", "--text-to-stderr", "--nvml-replay", str(snap)])
    both = capsys.readouterr()
    summary = json.loads(both.out)["summary"]  # stdout stays the JSON alone
    assert rc == 1 and both.err.startswith("gpuzombie observe — ") and "[8] Orphaned contexts" in both.err
    assert f"summary: {summary['zombies']} zombies, {summary['orphans']} orphans," in both.err
    assert both.err.endswith("1 GPUs with ghost memory -> FINDINGS\n")


def test_cli_unreadable_procfs_is_one_line_exit_2(tmp_path, capsys):
    rc = main(["observe", "--procfs", str(tmp_path / "missing")])
    err = capsys.readouterr().err
    assert rc == 2 and err.count("\n") == 1 and "cannot read procfs" in err


@pytest.mark.parametrize(
    "args",
    [
        ["observe", "--bogus"],
        ["observe", "--procfs", "/nonexistent/proc"],
        ["observe", "--baseline-mib", "lots"],
        ["observe", "--text-to-stderr"],
    ],
)
def test_cli_bad_input_real_entry_point(args):
    result = subprocess.run([sys.executable, "-m", "gpuzombie", *args], capture_output=True, text=True, timeout=30)
    assert result.returncode == 2
    assert result.stdout == "" and result.stderr.count("\n") == 1, result.stderr
    assert "Traceback" not in result.stderr


def test_not_root_reports_what_it_can_read_and_says_so():
    """A forked child drops to uid 65534 (its imports done), then observes the real /proc."""
    from gpuzombie.gpu.nvml import NO_GPU

    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never return into pytest
        try:
            os.close(read_end)
            os.setgroups([])
            os.setresgid(65534, 65534, 65534)
            os.setresuid(65534, 65534, 65534)
            report = observe(Procfs("/proc"), FakeNvml(NO_GPU))
            os.write(write_end, json.dumps(report.to_dict()["view"]).encode())
        finally:
            os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end) as f:
        view = json.loads(f.read())
    os.waitpid(pid, 0)
    assert view["is_root"] is False and view["processes_seen"] > 1
    assert view["access_denied"] > 0
    assert view["warnings"][0].startswith("not root:")


def test_broken_nvml_is_a_reason_not_a_crash(proc):
    class Broken:
        def read(self):
            raise RuntimeError("driver/library version mismatch")

    make_fake_proc(proc, 1, ppid=0, comm="tini", cmdline=b"tini\0")
    report = observe(Procfs(str(proc)), Broken(), HOST, now=NOW, is_root=True)
    assert report.gpu.available is False and "version mismatch" in report.gpu.reason
    assert "no GPU/NVML: NVML failed: RuntimeError: driver/library version mismatch" in render_text(report)


def test_unlisted_holder_of_this_gpus_node_is_a_cause(proc):
    """A process holds /dev/nvidia1 (minor 1 = GPU index 0 here) but NVML lists nothing: named as a cause."""
    make_fake_proc(proc, 1, ppid=0, comm="systemd", cmdline=b"/sbin/init\0")
    make_fake_proc(proc, 50, ppid=1, comm="hidden", fds=("/dev/nvidia1", "/dev/nvidiactl"))
    make_fake_proc(proc, 51, ppid=1, comm="nvidia-smi", fds=("/dev/nvidiactl",))
    gpu = GpuDevice(**{**h200(used_mib=1615).__dict__, "minor_number": 1})
    (ghost,) = run(proc, [gpu], HOST).attribution.ghosts
    assert ghost.flagged and any("hold /dev/nvidia1" in c and "50 (hidden)" in c for c in ghost.likely_causes)
    assert not any("nvidia-smi" in c for c in ghost.likely_causes)
