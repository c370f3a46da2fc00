"""A hostile CRI runtime against the exporter: real grpcio servers on unix sockets (named
stand-ins: no real containerd can be made to send these replies) whose replies are over gRPC's
default 4 MiB, over our 16 MiB bound, carry terminal control characters in their error details,
or never come (--cri-timeout)."""

from __future__ import annotations

import dataclasses
import json
import re
import threading
from collections.abc import Iterator
from concurrent import futures
from contextlib import contextmanager

import pytest

pytest.importorskip("cri_api", reason="container-runtime-interface-api is in the 'node' extra")


import grpc
from cri_api.v1 import api_pb2 as pb
from cri_api.v1.api_pb2_grpc import RuntimeServiceServicer, add_RuntimeServiceServicer_to_server

from cri_standin import StandInRuntime
from gpuzombie.cli.main import main
from gpuzombie.gpu.nvml import GpuSnapshot
from gpuzombie.k8s.cri import MAX_REPLY_BYTES
from gpuzombie.k8s.names import RuntimeNames
from test_cri_names import CID, RECORDED, node  # noqa: F401  (node: the fake node fixture)

CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")


def _padded(count: int, pad: int) -> list[pb.Container]:
    """Containers of other pods, each with a ``pad``-byte label: bulk that pushes the reply's size."""
    return [
        pb.Container(id=f"{i:064x}", metadata=pb.ContainerMetadata(name="filler"), labels={"pad": "p" * pad})
        for i in range(1, count + 1)
    ]


class HugeRuntime(StandInRuntime):
    """The recorded node, plus ``filler`` containers in ListContainers' reply."""

    def __init__(self, filler: list[pb.Container]):
        super().__init__(RECORDED, [])
        self.filler = filler

    def ListContainers(self, request, context):
        reply = super().ListContainers(request, context)
        reply.containers.extend(self.filler)
        return reply


class AbortingRuntime(RuntimeServiceServicer):
    """Fails every call with details a terminal would act on (clear screen, bell, NUL)."""

    def ListPodSandbox(self, request, context):
        context.abort(grpc.StatusCode.INTERNAL, "evil\x1b[2J\x1b]0;owned\x07\x00tail")


class StalledRuntime(RuntimeServiceServicer):
    """Never answers until released."""

    def __init__(self):
        self.release = threading.Event()

    def ListPodSandbox(self, request, context):
        self.release.wait(60)
        return pb.ListPodSandboxResponse()


@contextmanager
def serve(path: str, servicer: RuntimeServiceServicer) -> Iterator[None]:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2), options=[("grpc.max_send_message_length", -1)])
    add_RuntimeServiceServicer_to_server(servicer, server)
    server.add_insecure_port(f"unix://{path}")
    server.start()
    try:
        yield
    finally:
        server.stop(0)


def test_a_reply_over_grpcs_4_mib_default_still_gives_every_name(tmp_path):
    """Issue 17 (7): 4 MiB was the limit, and a reply over it lost every name."""
    filler = _padded(20_000, 250)
    size = pb.ListContainersResponse(containers=filler).ByteSize()
    assert 4 * 1024 * 1024 < size < MAX_REPLY_BYTES, size
    sock = str(tmp_path / "cri.sock")
    with serve(sock, HugeRuntime(filler)):
        got = RuntimeNames(sock, timeout=30)([CID])
    assert got.warnings == ()
    assert (got.container(CID).pod, got.container(CID).container) == ("trainer-0", "worker")


def test_a_reply_over_our_bound_is_one_warning_and_ids(tmp_path):
    filler = _padded(50_000, 400)
    assert pb.ListContainersResponse(containers=filler).ByteSize() > MAX_REPLY_BYTES
    sock = str(tmp_path / "cri.sock")
    with serve(sock, HugeRuntime(filler)):
        got = RuntimeNames(sock, timeout=30)([CID])
    (warning,) = got.warnings
    assert "ListContainers" in warning and "shown by id" in warning and got.container(CID) is None


def _exporter_once(node, sock, *extra: str) -> list[str]:  # noqa: F811  (the fixture's value)
    root, replay = node
    argv = ["exporter", "--once", "--procfs", str(root), "--nvml-replay", str(replay), "--cri-socket", sock]
    return [*argv, "--pod-resources-socket", "/nonexistent", *extra]


def test_control_characters_in_a_grpc_error_never_reach_stderr(node, tmp_path, capsys):  # noqa: F811
    """Issue 17 (4): ESC, BEL and NUL from the runtime's error details reached the exporter's stderr."""
    sock = str(tmp_path / "cri.sock")
    with serve(sock, AbortingRuntime()):
        assert main(_exporter_once(node, sock)) == 0
    err = capsys.readouterr().err
    assert "evil" in err and "\\x1b[2J" in err and "\\x07" in err and "\\x00tail" in err, err
    assert not CONTROL.search(err), repr(err)


def test_the_exporter_gives_up_on_the_runtime_at_cri_timeout(node, tmp_path, capsys):  # noqa: F811
    """Issue 17 (7): the exporter had no --cri-timeout; the runtime here answers after 60 s."""
    sock = str(tmp_path / "cri.sock")
    stalled = StalledRuntime()
    with serve(sock, stalled):
        try:
            assert main(_exporter_once(node, sock, "--cri-timeout", "0.5")) == 0
        finally:
            stalled.release.set()
    captured = capsys.readouterr()
    assert "no answer in time (limit 0.5 s)" in captured.err
    assert "gpuzombie_zombies{" in captured.out  # the exposition, names or not


@pytest.mark.parametrize("value", ["0", "-1", "soon"])
def test_a_bad_cri_timeout_is_a_usage_error(value, capsys):
    assert main(["exporter", "--once", "--cri-timeout", value]) == 2
    assert "--cri-timeout" in capsys.readouterr().err


def test_names_that_differ_only_past_the_label_cap_stay_two_series(tmp_path, capsys):
    """Issue 17 (5): the cap came after grouping, so two names equal in their first 128 characters
    gave two identical series, and Prometheus kept one."""
    from prometheus_client.parser import text_string_to_metric_families

    from cri_standin import Recorded, standin_runtime
    from fakeproc import TREE_PIDNS, make_fake_proc, make_fake_root
    from test_exporter import container

    uid = "99999999-2222-3333-4444-555555555555"
    long_names = ["x" * 150 + "-first", "x" * 150 + "-second"]
    cids = ["d" * 64, "e" * 64]
    root = tmp_path / "proc"
    root.mkdir()
    make_fake_root(root)
    make_fake_proc(root, 1, ppid=0, comm="systemd", pidns=TREE_PIDNS)
    make_fake_proc(root, 50, ppid=1, comm="containerd-shim", pidns=TREE_PIDNS)
    for i, cid in enumerate(cids):
        base = 200 + 10 * i
        procs = [
            {"host": base, "local": 1, "ppid": 0, "comm": "sleep"},
            {"host": base + 1, "local": 2, "ppid": 1, "comm": "python3", "state": "Z", "cmdline": b""},
        ]
        container(root, 4026532900 + i, uid, cid, procs)
    replay = tmp_path / "nvml.json"
    replay.write_text(json.dumps(dataclasses.asdict(GpuSnapshot(available=False, reason="no GPU here"))))
    recorded = Recorded(listed={cid: (name, "trainer-0", "ml", uid) for cid, name in zip(cids, long_names)})
    sock = str(tmp_path / "cri.sock")
    with standin_runtime(sock, recorded):
        argv = ["exporter", "--once", "--procfs", str(root), "--cri-socket", sock]
        assert main([*argv, "--nvml-replay", str(replay), "--pod-resources-socket", "/nonexistent"]) == 0
    out = capsys.readouterr().out
    (zombies,) = [f for f in text_string_to_metric_families(out) if f.name == "gpuzombie_zombies"]
    served = sorted(s.labels["container"] for s in zombies.samples)
    assert len(served) == 2 and served[0] != served[1], served
    assert all(len(c) <= 128 and c.startswith("x" * 100) for c in served)
