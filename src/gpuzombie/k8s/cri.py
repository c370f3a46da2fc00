"""Container and pod names from the CRI, through ``crictl``, when it is there; never required.

Two calls answer for the whole node (``crictl ps -a -o json`` and ``crictl pods -o json``), and one
``crictl inspect -o json <id>...`` for ids they did not list, instead of the seed's ``inspect`` per
container. All calls share one deadline: a crictl that hangs (a dead runtime socket) is killed with
its process group and the caller gets ids only plus a warning, never a stuck node agent.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

DEFAULT_TIMEOUT = 5.0
MAX_SINGLE_INSPECTS = 16
POD_NAME = "io.kubernetes.pod.name"
POD_NAMESPACE = "io.kubernetes.pod.namespace"
POD_UID = "io.kubernetes.pod.uid"
CONTAINER_NAME = "io.kubernetes.container.name"


@dataclass(frozen=True)
class ContainerNames:
    """What the runtime says about one container (or pod sandbox, named "POD")."""

    container_id: str
    container: str | None
    pod: str | None
    namespace: str | None
    pod_uid: str | None
    state: str | None


@dataclass(frozen=True)
class PodNames:
    pod_uid: str
    pod: str
    namespace: str | None


@dataclass(frozen=True)
class CriNames:
    """Every name the runtime gave, keyed by full container id and by pod UID."""

    source: str | None
    containers: Mapping[str, ContainerNames] = field(default_factory=dict)
    pods: Mapping[str, PodNames] = field(default_factory=dict)
    warnings: tuple[str, ...] = ()

    def container(self, container_id: str | None) -> ContainerNames | None:
        return self.containers.get(container_id) if container_id else None

    def pod(self, pod_uid: str | None) -> PodNames | None:
        return self.pods.get(pod_uid) if pod_uid else None


class CrictlFailed(Exception):
    """One crictl call failed or ran out of time; the message is one line."""


def _run(argv: list[str], deadline: float) -> str:
    remaining = deadline - time.monotonic()
    if remaining <= 0:
        raise CrictlFailed(f"no time left for {' '.join(argv[1:3])}")
    try:
        proc = subprocess.Popen(
            argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, start_new_session=True
        )
    except OSError as exc:
        raise CrictlFailed(f"cannot run {argv[0]}: {exc.strerror}") from exc
    try:
        out, err = proc.communicate(timeout=remaining)
    except subprocess.TimeoutExpired:
        # Its own session: kill what it started too, or a child holding the pipe keeps us waiting.
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.communicate()
        raise CrictlFailed(f"'{' '.join(argv[1:3])}' timed out") from None
    if proc.returncode != 0:
        first = (err.decode(errors="replace").strip().splitlines() or [""])[0][:200]
        raise CrictlFailed(f"'{' '.join(argv[1:3])}' exited {proc.returncode}: {first}")
    return out.decode(errors="replace")


def _json_documents(text: str) -> list[Any]:
    """crictl prints one JSON document per inspected id (newer versions: one list)."""
    decoder = json.JSONDecoder()
    docs: list[Any] = []
    i = 0
    while True:
        while i < len(text) and text[i].isspace():
            i += 1
        if i >= len(text):
            return docs
        doc, i = decoder.raw_decode(text, i)
        docs.extend(doc if isinstance(doc, list) else [doc])


def _container(item: Mapping[str, Any]) -> ContainerNames:
    labels = item.get("labels") or {}
    meta = item.get("metadata") or {}
    return ContainerNames(
        container_id=item.get("id", ""),
        container=labels.get(CONTAINER_NAME) or meta.get("name"),
        pod=labels.get(POD_NAME),
        namespace=labels.get(POD_NAMESPACE),
        pod_uid=labels.get(POD_UID),
        state=item.get("state"),
    )


def parse_ps(text: str) -> list[ContainerNames]:
    """``crictl ps -a -o json``."""
    return [_container(c) for c in json.loads(text).get("containers") or ()]


def parse_pods(text: str) -> tuple[list[PodNames], list[ContainerNames]]:
    """``crictl pods -o json``: the pods, and their sandboxes as containers named "POD"."""
    pods, sandboxes = [], []
    for item in json.loads(text).get("items") or ():
        meta = item.get("metadata") or {}
        uid, name, ns = meta.get("uid"), meta.get("name"), meta.get("namespace")
        if uid and name:
            pods.append(PodNames(pod_uid=uid, pod=name, namespace=ns))
        sandboxes.append(
            ContainerNames(
                container_id=item.get("id", ""),
                container="POD",
                pod=name,
                namespace=ns,
                pod_uid=uid,
                state=item.get("state"),
            )
        )
    return pods, sandboxes


def parse_inspect(text: str) -> list[ContainerNames]:
    """``crictl inspect -o json ID...``: the ``status`` part of each document."""
    return [_container(d.get("status") or {}) for d in _json_documents(text) if isinstance(d, dict)]


def _inspect(exe: str, ids: list[str], deadline: float, warnings: list[str]) -> list[ContainerNames]:
    """Ids ``ps -a`` did not list (created since, or not the CRI's): one call for all; if one id
    is unknown crictl fails them all, so then one call each, at most MAX_SINGLE_INSPECTS."""
    try:
        return parse_inspect(_run([exe, "inspect", "-o", "json", *ids], deadline))
    except CrictlFailed as exc:
        if len(ids) == 1:
            warnings.append(f"crictl: {exc}")
            return []
    found: list[ContainerNames] = []
    unknown = []
    for cid in ids[:MAX_SINGLE_INSPECTS]:
        try:
            found.extend(parse_inspect(_run([exe, "inspect", "-o", "json", cid], deadline)))
        except CrictlFailed:
            unknown.append(cid[:13])
    if unknown or len(ids) > MAX_SINGLE_INSPECTS:
        warnings.append(
            f"crictl: {len(ids) - len(found)} container(s) unknown to the CRI runtime "
            f"(e.g. {', '.join(unknown[:3])}): shown by id"
        )
    return found


def find_crictl(path: str | None) -> str | None:
    return path if path else shutil.which("crictl")


def lookup(crictl: str | None, container_ids: Iterable[str], *, timeout: float = DEFAULT_TIMEOUT) -> CriNames:
    """Names for ``container_ids`` (and every pod) from ``crictl``; ids only plus a warning on failure."""
    exe = find_crictl(crictl)
    if exe is None:
        return CriNames(source=None, warnings=("crictl not found: pods and containers shown by id",))
    deadline = time.monotonic() + timeout
    containers: dict[str, ContainerNames] = {}
    pods: dict[str, PodNames] = {}
    warnings: list[str] = []
    wanted = sorted(set(container_ids))
    try:
        for c in parse_ps(_run([exe, "ps", "-a", "-o", "json"], deadline)):
            containers[c.container_id] = c
        pod_list, sandboxes = parse_pods(_run([exe, "pods", "-o", "json"], deadline))
        pods.update((p.pod_uid, p) for p in pod_list)
        for s in sandboxes:
            containers.setdefault(s.container_id, s)
        missing = [cid for cid in wanted if cid not in containers]
        if missing:
            containers.update((c.container_id, c) for c in _inspect(exe, missing, deadline, warnings))
    except CrictlFailed as exc:
        warnings.append(f"crictl: {exc}; showing ids for what it did not name (limit {timeout:g} s)")
    except (ValueError, AttributeError) as exc:
        warnings.append(f"crictl: unreadable output ({exc}); showing ids")
    return CriNames(source=exe, containers=containers, pods=pods, warnings=tuple(warnings))
