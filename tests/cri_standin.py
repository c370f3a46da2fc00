"""A stand-in CRI runtime: a real grpcio server on a unix socket serving recorded pods and
containers through the maintained ``runtime.v1`` servicer.

Named as a stand-in: it is used only where no real runtime can play the part, for the fake /proc
trees whose container ids no containerd made, and for faults a real containerd cannot be made to
show on cue (dying between two calls of one scan). Everything else runs on a real containerd.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator, Mapping, Sequence
from concurrent import futures
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import grpc
from cri_api.v1 import api_pb2 as pb
from cri_api.v1.api_pb2_grpc import RuntimeServiceServicer, add_RuntimeServiceServicer_to_server

from gpuzombie.k8s.labels import CONTAINER_NAME, POD_NAME, POD_NAMESPACE, POD_UID


@dataclass(frozen=True)
class Recorded:
    """What the stand-in knows: sandboxes (id, name, namespace, uid), listed containers and
    containers only ContainerStatus tells (id → name, pod name, namespace, uid)."""

    sandboxes: tuple[tuple[str, str, str, str], ...] = ()
    listed: Mapping[str, tuple[str, str, str, str]] = field(default_factory=dict)
    status_only: Mapping[str, tuple[str, str, str, str]] = field(default_factory=dict)


def _labels(container: str, pod: str, namespace: str, uid: str) -> dict[str, str]:
    return {POD_NAME: pod, POD_NAMESPACE: namespace, POD_UID: uid, CONTAINER_NAME: container}


class StandInRuntime(RuntimeServiceServicer):
    """Answers from ``Recorded``; logs each call; ``die_on`` SIGKILLs the whole server process
    when that method is called (a runtime killed mid-scan)."""

    def __init__(self, recorded: Recorded, calls: list[str], die_on: str | None = None):
        self.recorded, self.calls, self.die_on = recorded, calls, die_on

    def _log(self, entry: str) -> None:
        self.calls.append(entry)
        if self.die_on and entry.startswith(self.die_on):
            os.kill(os.getpid(), signal.SIGKILL)

    def ListPodSandbox(self, request, context):
        self._log("ListPodSandbox")
        return pb.ListPodSandboxResponse(
            items=[
                pb.PodSandbox(
                    id=sid,
                    metadata=pb.PodSandboxMetadata(name=name, namespace=ns, uid=uid),
                    state=pb.SANDBOX_READY,
                    labels={POD_NAME: name, POD_NAMESPACE: ns, POD_UID: uid},
                )
                for sid, name, ns, uid in self.recorded.sandboxes
            ]
        )

    def _container(self, cid: str, names: tuple[str, str, str, str]) -> pb.Container:
        return pb.Container(
            id=cid,
            metadata=pb.ContainerMetadata(name=names[0]),
            state=pb.CONTAINER_RUNNING,
            labels=_labels(*names),
        )

    def ListContainers(self, request, context):
        self._log("ListContainers")
        return pb.ListContainersResponse(containers=[self._container(c, n) for c, n in self.recorded.listed.items()])

    def ContainerStatus(self, request, context):
        self._log(f"ContainerStatus {request.container_id}")
        names = self.recorded.status_only.get(request.container_id)
        if names is None:
            context.abort(grpc.StatusCode.NOT_FOUND, f"container {request.container_id} not found")
        return pb.ContainerStatusResponse(
            status=pb.ContainerStatus(
                id=request.container_id,
                metadata=pb.ContainerMetadata(name=names[0]),
                state=pb.CONTAINER_RUNNING,
                labels=_labels(*names),
            )
        )


@contextmanager
def standin_runtime(socket_path: str, recorded: Recorded) -> Iterator[list[str]]:
    """Serve ``recorded`` on ``socket_path`` in this process for the block; yields the call log."""
    calls: list[str] = []
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    add_RuntimeServiceServicer_to_server(StandInRuntime(recorded, calls), server)
    server.add_insecure_port(f"unix://{socket_path}")
    server.start()
    try:
        yield calls
    finally:
        server.stop(0)


def main(argv: list[str]) -> None:
    """``python cri_standin.py SOCKET RECORDED.json [DIE_ON]``: serve until killed (another process,
    so that dying mid-scan kills a runtime, not the test)."""
    import json
    import threading

    with open(argv[1]) as f:
        doc = json.load(f)
    recorded = Recorded(
        sandboxes=tuple(tuple(s) for s in doc.get("sandboxes", ())),  # type: ignore[misc]
        listed={k: tuple(v) for k, v in doc.get("listed", {}).items()},  # type: ignore[misc]
        status_only={k: tuple(v) for k, v in doc.get("status_only", {}).items()},  # type: ignore[misc]
    )
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    add_RuntimeServiceServicer_to_server(StandInRuntime(recorded, [], argv[2] if len(argv) > 2 else None), server)
    server.add_insecure_port(f"unix://{argv[0]}")
    server.start()
    threading.Event().wait()


if __name__ == "__main__":
    import sys

    main(sys.argv[1:])


@contextmanager
def standin_kubelet(
    socket_path: str,
    pods: Mapping[tuple[str, str], Mapping[str, tuple[str, ...]]],
    dynamic: Mapping[tuple[str, str], Mapping[str, Sequence[Any]]] | None = None,
) -> Iterator[None]:
    """A stand-in kubelet PodResources server (real grpcio, the generated servicer): ``pods`` maps
    (namespace, pod) → container → its nvidia.com/gpu device ids, read at each ``List`` (a test
    deletes a pod from the kubelet by deleting it from a dict it passed); ``dynamic`` gives a
    pod's containers their DRA devices (``api_pb2.DynamicResource`` messages, as the kubelet's
    DRA manager fills them)."""
    from gpuzombie.k8s.podresources_v1 import api_pb2 as pr
    from gpuzombie.k8s.podresources_v1.api_pb2_grpc import (
        PodResourcesListerServicer,
        add_PodResourcesListerServicer_to_server,
    )

    def response() -> pr.ListPodResourcesResponse:
        return pr.ListPodResourcesResponse(
            pod_resources=[
                pr.PodResources(
                    name=name,
                    namespace=namespace,
                    containers=[
                        pr.ContainerResources(
                            name=container,
                            devices=[pr.ContainerDevices(resource_name="nvidia.com/gpu", device_ids=ids)],
                            dynamic_resources=(dynamic or {}).get((namespace, name), {}).get(container, ()),
                        )
                        for container, ids in containers.items()
                    ],
                )
                for (namespace, name), containers in list(pods.items())
            ]
        )

    class Lister(PodResourcesListerServicer):
        def List(self, request, context):
            return response()

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=1))
    add_PodResourcesListerServicer_to_server(Lister(), server)
    server.add_insecure_port(f"unix://{socket_path}")
    server.start()
    try:
        yield
    finally:
        server.stop(0)
