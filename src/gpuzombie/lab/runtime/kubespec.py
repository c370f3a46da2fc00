"""The Pod object the lab hands the API server on the ``kubernetes`` runtime; pure, no side effects.

A scenario's one-container ``PodManifest`` (``scenarios.scenario_manifest``) becomes a Pod document
(``scenario_document``); a ``lab pod`` manifest stays the document it was. Either is then made
runnable on the cluster's node by ``node_document``, which changes only what a node without a
registry needs and says each change in words (the run's notes):

* every image is the lab's busybox, ``imagePullPolicy: Never`` (nothing is pulled);
* the host's system directories, the lab's Python, the project and the fast preStop hook and
  preflight gate are ``hostPath`` volumes mounted read-only at their own paths, as the containerd
  runtime bind-mounts them, and ``PATH``/``PYTHONPATH`` point at them (unless the manifest sets them);
* ``nvidia.com/gpu`` is taken out of the resources on the CPU stand-in (the node has no device plugin);
* seccomp ``RuntimeDefault`` where neither the pod nor the container names a profile, and
  ``NET_RAW`` dropped: the guards ``lab pod`` gives an untrusted manifest on containerd too;
* a manifest's ``hostPath`` mount the grant does not make writable is ``readOnly``.

Nothing of the webhook's: a manifest runs unpatched unless it was piped through ``webhook --patch``.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from gpuzombie.lab.manifest import LAB_GPU, PodManifest

VOLUME_PREFIX = "gpuzombie-lab-"
"""The lab's own hostPath volumes: ``gpuzombie-lab-0``, ... (a manifest's names never start so in
practice; a clash is the API server's one-line refusal)."""
HOOK_OUT_MOUNT = "/gpuzombie-hook"
"""Where a scenario's preStop wrapper writes the hook's stdout, stderr and exit code (a hostPath of
the run's): the kubelet keeps a successful hook's output to itself."""
LAB_LABEL = "gpuzombie.dev/lab-run"
"""On every pod the lab creates: the run that made it (``kubectl get pods -l gpuzombie.dev/lab-run``)."""
DROPPED = "NET_RAW"


@dataclass(frozen=True)
class HostMount:
    """A host path mounted read-only, at its own path unless ``target`` says (``hostPath`` type
    ``File`` for a file)."""

    path: str
    is_file: bool = False
    target: str | None = None

    @property
    def mount_path(self) -> str:
        return self.target or self.path


@dataclass(frozen=True)
class NodeParts:
    """What every container of a lab pod gets on the cluster's node."""

    image: str
    mounts: tuple[HostMount, ...]
    env: Mapping[str, str]
    """PATH (busybox first, then the lab's Python), HOME, PYTHONPATH with the project."""
    gpu: bool = False
    """False: the CPU stand-in; ``nvidia.com/gpu`` is taken out of every container's resources."""


def scenario_document(manifest: PodManifest, *, name: str) -> dict[str, Any]:
    """A scenario's ``PodManifest`` as the Pod object a person would write for it."""
    containers = []
    for c in manifest.containers:
        container: dict[str, Any] = {"name": c.name, "image": c.image, "command": list(c.argv)}
        if c.prestop is not None and c.prestop.command:
            container["lifecycle"] = {"preStop": {"exec": {"command": list(c.prestop.command)}}}
        if c.resources.gpus:
            container["resources"] = {"limits": {LAB_GPU: c.resources.gpus}}
        containers.append(container)
    spec: dict[str, Any] = {
        "terminationGracePeriodSeconds": manifest.grace_s,
        "automountServiceAccountToken": False,  # the workload never calls the API server
        "containers": containers,
    }
    if manifest.share_process_namespace:
        spec["shareProcessNamespace"] = True
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": manifest.namespace},
        "spec": spec,
    }


def capture_prestop(command: Sequence[str]) -> list[str]:
    """The hook ``command`` under a shell that keeps its stdout, stderr and exit code in
    ``HOOK_OUT_MOUNT`` (the hook itself, its options and its parent-less start are unchanged)."""
    out = HOOK_OUT_MOUNT
    script = f'"$@" >{out}/stdout 2>{out}/stderr; rc=$?; echo $rc >{out}/rc; exit $rc'
    return ["sh", "-c", script, "prestop", *command]


def _env_names(container: Mapping[str, Any]) -> set[str]:
    return {str(e.get("name")) for e in container.get("env") or () if isinstance(e, Mapping)}


def _drop_gpus(container: dict[str, Any]) -> bool:
    resources = container.get("resources") or {}
    dropped = False
    for kind in ("requests", "limits"):
        part = resources.get(kind)
        if isinstance(part, dict) and LAB_GPU in part:
            del part[LAB_GPU]
            dropped = True
    return dropped


def _has_seccomp(security: object) -> bool:
    return isinstance(security, Mapping) and security.get("seccompProfile") is not None


def _patch_container(
    c: dict[str, Any],
    kind: str,
    parts: NodeParts,
    read_only_volumes: Sequence[str],
    hook_out: str | None,
    pod_seccomp: bool,
) -> tuple[bool, bool]:
    """One container as the node runs it (``node_document``); whether its GPUs were dropped and
    whether its seccomp profile was set."""
    c["image"], c["imagePullPolicy"] = parts.image, "Never"
    mounts = c.setdefault("volumeMounts", [])
    for m in mounts:
        if m.get("name") in read_only_volumes:
            m["readOnly"] = True
    taken = {m.get("mountPath") for m in mounts}
    mounts += [
        {"name": f"{VOLUME_PREFIX}{i}", "mountPath": m.mount_path, "readOnly": True}
        for i, m in enumerate(parts.mounts)
        if m.mount_path not in taken
    ]
    names = _env_names(c)
    added = [{"name": k, "value": v} for k, v in parts.env.items() if k not in names]
    c["env"] = [*added, *(c.get("env") or [])]
    gpus_dropped = _drop_gpus(c) if not parts.gpu else False
    security = c.setdefault("securityContext", {})
    seccomp_set = not (pod_seccomp or _has_seccomp(security))
    if seccomp_set:
        security["seccompProfile"] = {"type": "RuntimeDefault"}
    caps = security.setdefault("capabilities", {})
    if DROPPED not in (caps.get("drop") or []):
        caps["drop"] = [*(caps.get("drop") or []), DROPPED]
    hook = (c.get("lifecycle") or {}).get("preStop", {}).get("exec") if kind == "containers" else None
    if hook_out is not None and hook and hook.get("command"):
        hook["command"] = capture_prestop(hook["command"])
        mounts.append({"name": f"{VOLUME_PREFIX}hook", "mountPath": HOOK_OUT_MOUNT})
    return gpus_dropped, seccomp_set


def node_document(
    document: Mapping[str, Any],
    parts: NodeParts,
    *,
    name: str,
    namespace: str,
    grace: int | None,
    run_label: str,
    read_only_volumes: Sequence[str] = (),
    hook_out: str | None = None,
) -> tuple[dict[str, Any], list[str]]:
    """``document`` as the cluster's node can run it, and each change the lab made, in words.

    ``read_only_volumes``: the manifest's hostPath volumes mounted read-only whatever their mounts
    say (no ``:rw`` grant); ``hook_out``: a host directory where a scenario's hook keeps its output
    (``capture_prestop``, mounted writable at ``HOOK_OUT_MOUNT``)."""
    doc = copy.deepcopy(dict(document))
    doc.pop("status", None)
    meta = doc.setdefault("metadata", {})
    meta.pop("generateName", None)
    meta["name"], meta["namespace"] = name, namespace
    meta.setdefault("labels", {})[LAB_LABEL] = run_label
    spec = doc.setdefault("spec", {})
    changes = [f"every image is {parts.image} (imagePullPolicy: Never; nothing is pulled)"]
    if grace is not None and spec.get("terminationGracePeriodSeconds") != grace:
        spec["terminationGracePeriodSeconds"] = grace
        changes.append(f"terminationGracePeriodSeconds: {grace} (--grace)")
    volumes = spec.setdefault("volumes", [])
    for i, m in enumerate(parts.mounts):
        host: dict[str, Any] = {"path": m.path}
        if m.is_file:
            host["type"] = "File"
        volumes.append({"name": f"{VOLUME_PREFIX}{i}", "hostPath": host})
    changes.append(
        "hostPath volumes, read-only at their own paths: "
        + ", ".join(m.path if m.target is None else f"{m.path} at {m.target}" for m in parts.mounts)
        + " (the host's directories, the lab's Python and the project, the hook and the gate)"
    )
    if hook_out is not None:
        volumes.append({"name": f"{VOLUME_PREFIX}hook", "hostPath": {"path": hook_out, "type": "Directory"}})
    pod_seccomp = _has_seccomp(spec.get("securityContext"))
    gpus_dropped = seccomp_set = False
    for kind in ("initContainers", "containers"):
        for c in spec.get(kind) or ():
            dropped, seccomp = _patch_container(c, kind, parts, read_only_volumes, hook_out, pod_seccomp)
            gpus_dropped, seccomp_set = gpus_dropped or dropped, seccomp_set or seccomp
    if read_only_volumes:
        changes.append("hostPath " + ", ".join(read_only_volumes) + " mounted read-only (no :rw grant)")
    changes.append("PATH and PYTHONPATH point at the lab's Python and the project (where the manifest sets neither)")
    if gpus_dropped:
        changes.append(f"{LAB_GPU} taken out of the resources (CPU stand-in: the node has no GPU device plugin)")
    if seccomp_set:
        changes.append("seccompProfile RuntimeDefault where neither the pod nor the container names one")
    changes.append(f"{DROPPED} dropped from every container's capabilities")
    if hook_out is not None:
        changes.append(
            f"the preStop hook runs under `sh -c` that keeps its stdout, stderr and exit code in {HOOK_OUT_MOUNT} "
            "(the kubelet discards a successful hook's output)"
        )
    return doc, changes
