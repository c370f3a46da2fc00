"""Which container and pod a process belongs to, from the lines of its /proc/<pid>/cgroup.

A pure parser: no filesystem, so every runtime × driver × cgroup version is tested on fixture lines.
What the kernel writes there depends on four things, and each leaves its mark on the path:

* cgroup version: v1 lines are ``N:controllers:/path``, the v2 line is ``0::/path``; a hybrid host
  has both (the v2 line then often says less than the v1 ones, so the most telling line wins);
* cgroup driver: ``systemd`` names units (``kubepods-burstable-pod<uid>.slice``, ``<prefix>-<id>.scope``,
  with ``-`` in the pod UID written as ``_``), ``cgroupfs`` plain directories (``kubepods/burstable/pod<uid>/<id>``);
* runtime: containerd ``cri-containerd-<id>.scope`` or a bare ``<id>``; CRI-O ``crio-<id>.scope``
  (its ``crio-conmon-<id>.scope`` monitor is no container); docker ``docker-<id>.scope`` or
  ``/docker/<id>``; podman ``libpod-<id>.scope`` or ``/libpod_parent/libpod-<id>`` (and the same under
  ``user@UID.service`` when rootless);
* QoS: Guaranteed pods sit directly under ``kubepods``, the others under ``burstable``/``besteffort``.

A reader in another cgroup namespace sees paths relative to its own root (``0::/../..``): the ``..``
parts are dropped and whatever names remain are still parsed; nothing left means no answer.

Nested trees (kind or k3s inside a pod, a kind node in docker) put a second kubepods tree below a
container: ``/kubepods/…/pod<outer>/<ctr>/kubepods/…/pod<inner>/<ctr2>``. The path is read from
its root and ends at the first container: the node's kubelet made the pod above it, anything below
is that container's own business (and below its own cgroup a container can name any pod it likes).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, replace
from functools import lru_cache

_ID = r"([0-9a-f]{64})"
_UID = r"([0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12}|[0-9a-f]{32})"

# (pattern for one path component, runtime, driver). Order matters only for readability: the
# patterns are mutually exclusive.
_CONTAINER_PATTERNS: tuple[tuple[re.Pattern[str], str, str], ...] = (
    (re.compile(rf"cri-containerd-{_ID}\.scope"), "containerd", "systemd"),
    (re.compile(rf"crio-{_ID}\.scope"), "cri-o", "systemd"),
    (re.compile(rf"crio-{_ID}"), "cri-o", "cgroupfs"),
    (re.compile(rf"docker-{_ID}\.scope"), "docker", "systemd"),
    (re.compile(rf"libpod-{_ID}\.scope"), "podman", "systemd"),
    (re.compile(rf"libpod-{_ID}"), "podman", "cgroupfs"),
    (re.compile(_ID), "containerd", "cgroupfs"),  # bare id; refined by its parent below
)
# Runtime helpers that live beside containers but are none: never report them as one.
_MONITOR = re.compile(r"(crio-conmon|libpod-conmon)-[0-9a-f]{64}(\.scope)?")
_SYSTEMD_POD = re.compile(rf"(?:.+-)?kubepods(?:-(besteffort|burstable))?-pod{_UID}\.slice")
_CGROUPFS_POD = re.compile(rf"pod{_UID}")
_QOS_DIRS = ("besteffort", "burstable")


@dataclass(frozen=True)
class ContainerRef:
    """Where a process sits: its container (if any) and its Kubernetes pod (if any)."""

    runtime: str | None
    """containerd, cri-o, docker, podman, or "unknown" (a bare id outside kubepods/docker)."""
    container_id: str | None
    """64 hex digits; None for a process in a pod's cgroup but in no container's."""
    pod_uid: str | None
    """The pod's UID with dashes (systemd's ``_`` converted back); None outside Kubernetes."""
    qos: str | None
    """guaranteed, burstable or besteffort; None outside Kubernetes."""
    cgroup_version: str
    """v1, v2 or hybrid: which kinds of lines the process's cgroup file had."""
    driver: str
    """systemd or cgroupfs: how the matching path was named."""
    cgroup_path: str
    """The path the answer came from, as the kernel wrote it."""

    @property
    def short_id(self) -> str | None:
        """The 13-character form ``crictl ps`` and ``docker ps`` show."""
        return self.container_id[:13] if self.container_id else None


def _normalise_uid(raw: str) -> str:
    return raw.replace("_", "-")


@lru_cache(maxsize=65536)
def parse_cgroup_path(path: str) -> ContainerRef | None:
    """One cgroup path to a ContainerRef (cgroup_version left as "v2"); None when it names nothing.

    Cached: on a node thousands of processes share a handful of container paths.
    """
    parts = [p for p in path.split("/") if p and p != ".."]
    runtime = container_id = pod_uid = qos = None
    driver: str | None = None
    in_kubepods = False
    for i, part in enumerate(parts):
        if part == "kubepods" or part.endswith(("kubepods.slice", "-kubepods")):
            in_kubepods = True
            continue
        if _MONITOR.fullmatch(part):
            return None
        m = _SYSTEMD_POD.fullmatch(part)
        if m and pod_uid is None:
            pod_uid, qos = _normalise_uid(m.group(2)), m.group(1) or "guaranteed"
            driver, in_kubepods = "systemd", True
            continue
        m = _CGROUPFS_POD.fullmatch(part)
        if m and in_kubepods and pod_uid is None:
            pod_uid = _normalise_uid(m.group(1))
            parent = parts[i - 1] if i else ""
            qos = parent if parent in _QOS_DIRS else "guaranteed"
            driver = driver or "cgroupfs"
            continue
        for pattern, rt, drv in _CONTAINER_PATTERNS:
            m = pattern.fullmatch(part)
            if m:
                container_id, runtime, driver = m.group(1), rt, drv
                break
        if container_id is not None:
            if runtime == "containerd" and driver == "cgroupfs":
                parent = parts[i - 1] if i else ""
                if parent == "docker":
                    runtime = "docker"
                elif not in_kubepods:
                    runtime = "unknown"
            break  # the outermost container: what is below it is not the node's (a nested tree)
    if container_id is None and pod_uid is None:
        return None
    return ContainerRef(
        runtime=runtime,
        container_id=container_id,
        pod_uid=pod_uid,
        qos=qos,
        cgroup_version="v2",
        driver=driver or "cgroupfs",
        cgroup_path=path,
    )


def cgroup_version(lines: Iterable[str]) -> str | None:
    """v1, v2 or hybrid, from which kinds of lines are present; None for no lines."""
    unified = legacy = False
    for line in lines:
        if line.startswith("0::"):
            unified = True
        elif line.strip():
            legacy = True
    if unified and legacy:
        return "hybrid"
    return "v2" if unified else "v1" if legacy else None


def cgroup_paths(lines: Iterable[str]) -> Iterator[str]:
    """The path of each ``hierarchy-id:controllers:path`` line, as written (a line of another form has none)."""
    for line in lines:
        fields = line.split(":", 2)
        if len(fields) == 3:
            yield fields[2]


def parse_cgroup_lines(lines: Iterable[str]) -> ContainerRef | None:
    """The lines of /proc/<pid>/cgroup to the container and pod they name; None for none.

    Each line is parsed; the one that says most (container and pod over container over pod) wins,
    the v1 lines being the telling ones on hybrid hosts whose v2 line is ``0::/``.
    """
    lines = [line for line in lines if line.strip()]
    best: ContainerRef | None = None
    best_score = -1
    for path in cgroup_paths(lines):
        ref = parse_cgroup_path(path.strip())
        if ref is None:
            continue
        score = (ref.container_id is not None) * 2 + (ref.pod_uid is not None)
        if score > best_score:
            best, best_score = ref, score
    if best is None:
        return None
    return replace(best, cgroup_version=cgroup_version(lines) or "v2")
