"""The Pod manifest subset ``gpuzombie lab pod`` runs, parsed into plain data; pure, no side effects.

The pod spec is read by ``k8s.podspec.model`` in its strict mode (the same reader as the admission rules');
this module says which fields the lab applies and turns the spec into what the lab runs.

Every field of the manifest is one of three kinds, and nothing is skipped silently:

* applied: containers and init containers (command, args, env values and ``spec.nodeName`` from
  the downward API: this host's name), emptyDir (also medium
  Memory, with sizeLimit) and hostPath volumes, volumeMounts (readOnly), shareProcessNamespace,
  ``lifecycle.preStop`` exec and sleep, terminationGracePeriodSeconds, the securityContext fields a
  runtime enforces (runAsUser, runAsGroup, runAsNonRoot, readOnlyRootFilesystem,
  allowPrivilegeEscalation, capabilities.drop, privileged: false, seccompProfile RuntimeDefault and
  Unconfined), cpu and memory resources (the
  container's cgroup limits and the pod's QoS class), GPU resources (the lab's GPU devices);
* accepted with no effect on one node without a registry or scheduler (``NO_EFFECT``): pull
  settings, scheduling, labels and the like: listed in the output;
* anything else: ``ManifestError`` naming the field (the CLI's one-line refusal, exit 2).

Images are not pulled: every image is the lab's (a busybox rootfs with the host's directories), and
its ENTRYPOINT is empty, so a container's argv is ``command + args``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from gpuzombie.k8s.podspec import loader, model
from gpuzombie.k8s.podspec.fields import (
    ManifestError,
    boolean,
    dns_label,
    dns_subdomain,
    integer,
    mapping,
    parse_quantity,
    sequence,
    strings,
)
from gpuzombie.k8s.podspec.gpus import gpu_resource

LAB_GPU = "nvidia.com/gpu"
"""The GPU resource the lab maps to its GPU devices (``k8s.podspec.gpus.gpu_resource`` knows the others:
MIG, shared and AMD GPUs, which a lab node cannot give)."""
SECCOMP_TYPES = ("RuntimeDefault", "Unconfined")
"""The seccompProfile types the lab applies (a Localhost profile would be a file on the node)."""

NO_EFFECT = {
    "metadata": {
        "labels",
        "annotations",
        "generateName",
        "uid",
        "resourceVersion",
        "creationTimestamp",
        "ownerReferences",
        "finalizers",
        "managedFields",
        "generation",
    },
    "spec": {
        "imagePullSecrets",
        "nodeSelector",
        "nodeName",
        "tolerations",
        "affinity",
        "priorityClassName",
        "priority",
        "preemptionPolicy",
        "schedulerName",
        "serviceAccountName",
        "serviceAccount",
        "automountServiceAccountToken",
        "dnsPolicy",
        "enableServiceLinks",
        "restartPolicy",
        "topologySpreadConstraints",
    },
    "container": {
        "imagePullPolicy",
        "terminationMessagePath",
        "terminationMessagePolicy",
        "ports",
        "livenessProbe",
        "readinessProbe",
        "startupProbe",
    },
}
"""Accepted, and listed in the output as without effect: a lab node pulls nothing, schedules
nothing, restarts nothing, and runs no probe (a probe never stops a pod being deleted)."""


@dataclass(frozen=True)
class Volume:
    name: str
    kind: str
    """``emptyDir`` or ``hostPath``."""
    memory: bool = False
    """emptyDir medium Memory: a tmpfs."""
    size_limit: int | None = None
    host_path: str | None = None
    host_type: str = ""


@dataclass(frozen=True)
class Mount:
    volume: str
    path: str
    read_only: bool = False


@dataclass(frozen=True)
class Resources:
    cpu_request: float | None = None
    cpu_limit: float | None = None
    memory_request: int | None = None
    memory_limit: int | None = None
    gpus: int = 0


@dataclass(frozen=True)
class Security:
    run_as_user: int | None = None
    run_as_group: int | None = None
    run_as_non_root: bool = False
    read_only_root: bool = False
    no_new_privs: bool = False
    drop_capabilities: tuple[str, ...] = ()
    seccomp: str = "RuntimeDefault"
    """``seccompProfile.type``; RuntimeDefault when neither the pod nor the container names one, as
    a kubelet with ``seccompDefault: true`` does (the kubelet's own default, off, sends Unconfined):
    a lab runs manifests it was handed, so it filters unless a manifest asks for Unconfined."""


@dataclass(frozen=True)
class Container:
    """A container as the lab runs it: ``k8s.podspec.model.Container`` (the manifest's words) with its mounts
    resolved, its security context inherited from the pod's and its quantities in numbers."""

    name: str
    image: str
    argv: tuple[str, ...]
    """``command + args`` (the lab's image has no ENTRYPOINT)."""
    command_given: bool
    env: tuple[tuple[str, str], ...] = ()
    mounts: tuple[Mount, ...] = ()
    prestop: model.PreStop | None = None
    resources: Resources = field(default_factory=Resources)
    security: Security = field(default_factory=Security)


@dataclass(frozen=True)
class PodManifest:
    name: str
    namespace: str
    annotations: Mapping[str, str]
    grace_s: int
    share_process_namespace: bool
    init_containers: tuple[Container, ...]
    containers: tuple[Container, ...]
    volumes: tuple[Volume, ...]
    no_effect: tuple[str, ...]
    """Fields present and accepted without effect, as paths (``spec.imagePullSecrets``)."""

    @property
    def qos(self) -> str:
        """The pod's QoS class (the kubelet's cgroup parent): Guaranteed when every container has
        cpu and memory limits equal to their requests, BestEffort with none at all."""
        res = [c.resources for c in (*self.init_containers, *self.containers)]
        if all(
            r.cpu_limit is not None
            and r.memory_limit is not None
            and r.cpu_request in (None, r.cpu_limit)
            and r.memory_request in (None, r.memory_limit)
            for r in res
        ):
            return "guaranteed"
        if all(r.cpu_request is r.cpu_limit is r.memory_request is r.memory_limit is None for r in res):
            return "besteffort"
        return "burstable"


def _check_keys(data: Mapping[str, Any], where: str, applied: set[str], no_effect: set[str], seen: list[str]) -> None:
    """Refuse the first field that is neither applied nor known to have no effect; note the latter."""
    for key in data:
        if key in applied:
            continue
        if key in no_effect:
            seen.append(f"{where}.{key}")
            continue
        raise ManifestError(f"{where}.{key}: not supported by gpuzombie lab pod")


def _seccomp(data: object, where: str, inherited: str, seen: list[str]) -> str:
    if data is None:
        return inherited
    profile = mapping(data, where)
    _check_keys(profile, where, {"type"}, set(), seen)
    kind = profile.get("type")
    if kind not in SECCOMP_TYPES:
        raise ManifestError(
            f"{where}.type: {kind!r} not supported by gpuzombie lab pod ({' or '.join(SECCOMP_TYPES)}; "
            "a lab node has no Localhost profiles)"
        )
    return str(kind)


def _security(data: object, where: str, inherited: Security, seen: list[str]) -> Security:
    sc = mapping(data, where)
    _check_keys(
        sc,
        where,
        {
            "runAsUser",
            "runAsGroup",
            "runAsNonRoot",
            "readOnlyRootFilesystem",
            "allowPrivilegeEscalation",
            "capabilities",
            "privileged",
            "seccompProfile",
        },
        set(),
        seen,
    )
    if sc.get("privileged") is True:
        raise ManifestError(f"{where}.privileged: true is not supported by gpuzombie lab pod")
    caps = mapping(sc.get("capabilities"), f"{where}.capabilities")
    _check_keys(caps, f"{where}.capabilities", {"drop"}, set(), seen)
    return Security(
        run_as_user=integer(sc["runAsUser"], f"{where}.runAsUser") if "runAsUser" in sc else inherited.run_as_user,
        run_as_group=integer(sc["runAsGroup"], f"{where}.runAsGroup") if "runAsGroup" in sc else inherited.run_as_group,
        run_as_non_root=boolean(sc["runAsNonRoot"], f"{where}.runAsNonRoot")
        if "runAsNonRoot" in sc
        else inherited.run_as_non_root,
        read_only_root=boolean(sc.get("readOnlyRootFilesystem", False), f"{where}.readOnlyRootFilesystem"),
        no_new_privs=sc.get("allowPrivilegeEscalation") is False,
        drop_capabilities=strings(caps.get("drop"), f"{where}.capabilities.drop"),
        seccomp=_seccomp(sc.get("seccompProfile"), f"{where}.seccompProfile", inherited.seccomp, seen),
    )


def _pod_security(data: object, seen: list[str]) -> Security:
    sc = mapping(data, "spec.securityContext")
    _check_keys(sc, "spec.securityContext", {"runAsUser", "runAsGroup", "runAsNonRoot", "seccompProfile"}, set(), seen)
    return _security(sc, "spec.securityContext", Security(), seen)


def _resources(data: object, where: str, seen: list[str]) -> Resources:
    res = mapping(data, where)
    _check_keys(res, where, {"requests", "limits"}, set(), seen)
    values: dict[str, dict[str, float]] = {}
    for kind in ("requests", "limits"):
        part = mapping(res.get(kind), f"{where}.{kind}")
        for name, qty in part.items():
            if name not in ("cpu", "memory", LAB_GPU):
                other_gpu = " (a GPU the lab cannot give: it maps nvidia.com/gpu)" if gpu_resource(name) else ""
                raise ManifestError(f"{where}.{kind}.{name}: not supported by gpuzombie lab pod{other_gpu}")
            values.setdefault(kind, {})[name] = parse_quantity(qty, f"{where}.{kind}.{name}")
    req, lim = values.get("requests", {}), values.get("limits", {})
    gpus = int(req.get(LAB_GPU, 0) or lim.get(LAB_GPU, 0))

    def mem(v: float | None) -> int | None:
        return None if v is None else int(v)

    return Resources(
        cpu_request=req.get("cpu"),
        cpu_limit=lim.get("cpu"),
        memory_request=mem(req.get("memory")),
        memory_limit=mem(lim.get("memory")),
        gpus=gpus,
    )


LIFECYCLE_APPLIED: Mapping[str, Any] = {"preStop": {"exec": {"command": {}}, "sleep": {"seconds": {}}}}
"""The lifecycle fields the lab applies, nested as they nest (``k8s.podspec.model`` reads their values)."""


def _check_tree(data: object, where: str, applied: Mapping[str, Any], seen: list[str]) -> None:
    """``_check_keys`` down a tree of maps, ``applied`` giving each level's fields."""
    if not applied or not isinstance(data, Mapping):
        return
    _check_keys(data, where, set(applied), set(), seen)
    for key, value in data.items():
        _check_tree(value, f"{where}.{key}", applied[key], seen)


NODE_FIELD = "spec.nodeName"
"""The one downward-API field the lab gives (the webhook's preflight gate names the node with it):
this host's name, the lab node's."""


def _check_env(data: object, where: str, seen: list[str]) -> None:
    for i, item in enumerate(sequence(data, where)):
        here = f"{where}[{i}]"
        entry = mapping(item, here)
        _check_keys(entry, here, {"name", "value", "valueFrom"}, set(), seen)
        if "valueFrom" in entry:
            source = mapping(entry["valueFrom"], f"{here}.valueFrom")
            _check_keys(source, f"{here}.valueFrom", {"fieldRef"}, set(), seen)
            ref = mapping(source["fieldRef"], f"{here}.valueFrom.fieldRef")
            _check_keys(ref, f"{here}.valueFrom.fieldRef", {"fieldPath", "apiVersion"}, set(), seen)
            if ref.get("fieldPath") != NODE_FIELD:
                raise ManifestError(
                    f"{here}.valueFrom.fieldRef.fieldPath: {ref.get('fieldPath')!r} not supported by gpuzombie "
                    f"lab pod (only {NODE_FIELD})"
                )


def _node_fields(data: object, node: str) -> dict[str, str]:
    """The variables set from ``spec.nodeName`` (checked by ``_check_env``)."""
    return {
        item["name"]: node
        for item in sequence(data, "env")
        if isinstance(item, Mapping) and isinstance(item.get("name"), str) and "valueFrom" in item
    }


def _mounts(data: object, where: str, volumes: set[str], seen: list[str]) -> tuple[Mount, ...]:
    out = []
    for i, item in enumerate(sequence(data, where)):
        m = mapping(item, f"{where}[{i}]")
        _check_keys(m, f"{where}[{i}]", {"name", "mountPath", "readOnly"}, set(), seen)
        name, path = m.get("name"), m.get("mountPath")
        if name not in volumes:
            raise ManifestError(f"{where}[{i}].name: no volume named {name!r}")
        if not isinstance(path, str) or not path.startswith("/"):
            raise ManifestError(f"{where}[{i}].mountPath: an absolute path is needed")
        out.append(Mount(str(name), path, boolean(m.get("readOnly", False), f"{where}[{i}].readOnly")))
    return tuple(out)


CONTAINER_APPLIED = {"name", "image", "command", "args", "env", "volumeMounts", "resources", "securityContext"}


def _check_container(data: object, where: str, seen: list[str], init: bool) -> None:
    """Refuse the container fields the lab does not apply (an init container takes no lifecycle)."""
    c = mapping(data, where)
    _check_keys(c, where, CONTAINER_APPLIED | (set() if init else {"lifecycle"}), NO_EFFECT["container"], seen)
    _check_env(c.get("env"), f"{where}.env", seen)
    _check_tree(c.get("lifecycle"), f"{where}.lifecycle", LIFECYCLE_APPLIED, seen)


def _container(c: model.Container, volumes: set[str], pod_security: Security, seen: list[str]) -> Container:
    """The container as the lab runs it, out of its strictly read spec (fields checked already)."""
    where = c.where
    argv = c.words
    if not argv:
        raise ManifestError(
            f"{where}: neither command nor args: the image's ENTRYPOINT/CMD would run, and the lab's image has none"
        )
    return Container(
        name=c.name,
        image=str(c.raw.get("image", "")),
        argv=argv,
        command_given=c.argv_known,
        env=tuple({**c.env, **_node_fields(c.raw.get("env"), os.uname().nodename)}.items()),
        mounts=_mounts(c.raw.get("volumeMounts"), f"{where}.volumeMounts", volumes, seen),
        prestop=c.prestop,
        resources=_resources(c.raw.get("resources"), f"{where}.resources", seen),
        security=_security(c.raw.get("securityContext"), f"{where}.securityContext", pod_security, seen),
    )


def _volume(data: object, where: str, seen: list[str]) -> Volume:
    v = mapping(data, where)
    name = dns_label(v.get("name"), f"{where}.name")
    _check_keys(v, where, {"name", "emptyDir", "hostPath"}, set(), seen)
    if "emptyDir" in v:
        ed = mapping(v["emptyDir"], f"{where}.emptyDir")
        _check_keys(ed, f"{where}.emptyDir", {"medium", "sizeLimit"}, set(), seen)
        medium = ed.get("medium", "")
        if medium not in ("", "Memory"):
            raise ManifestError(f'{where}.emptyDir.medium: {medium!r} not supported ("" or Memory)')
        size = int(parse_quantity(ed["sizeLimit"], f"{where}.emptyDir.sizeLimit")) if "sizeLimit" in ed else None
        return Volume(name, "emptyDir", memory=medium == "Memory", size_limit=size)
    if "hostPath" in v:
        hp = mapping(v["hostPath"], f"{where}.hostPath")
        _check_keys(hp, f"{where}.hostPath", {"path", "type"}, set(), seen)
        path, kind = hp.get("path"), hp.get("type", "")
        if not isinstance(path, str) or not path.startswith("/"):
            raise ManifestError(f"{where}.hostPath.path: an absolute path is needed")
        if kind not in ("", "Directory", "DirectoryOrCreate", "File"):
            raise ManifestError(f"{where}.hostPath.type: {kind!r} not supported")
        return Volume(name, "hostPath", host_path=path, host_type=kind)
    raise ManifestError(f"{where}: a volume of another type than emptyDir or hostPath is not supported")


def parse_pod(doc: object) -> PodManifest:
    """One Pod object (a parsed YAML document) as the lab runs it; ManifestError names what it cannot."""
    top = mapping(doc, "the manifest")
    if top.get("kind") != "Pod" or top.get("apiVersion") != "v1":
        raise ManifestError(
            f"kind: gpuzombie lab pod runs a v1 Pod, not {top.get('apiVersion')}/{top.get('kind')} "
            "(take the pod template out of a workload)"
        )
    seen: list[str] = []
    _check_keys(top, "", {"apiVersion", "kind", "metadata", "spec"}, {"status"}, seen)
    meta = mapping(top.get("metadata"), "metadata")
    _check_keys(meta, "metadata", {"name", "namespace"}, NO_EFFECT["metadata"], seen)
    spec = mapping(top.get("spec"), "spec")
    applied = {
        "containers",
        "initContainers",
        "volumes",
        "shareProcessNamespace",
        "terminationGracePeriodSeconds",
        "securityContext",
    }
    _check_keys(spec, "spec", applied, NO_EFFECT["spec"], seen)
    volumes = tuple(
        _volume(v, f"spec.volumes[{i}]", seen) for i, v in enumerate(sequence(spec.get("volumes"), "spec.volumes"))
    )
    names = {v.name for v in volumes}
    if len(names) != len(volumes):
        raise ManifestError("spec.volumes: two volumes with one name")
    pod_security = _pod_security(spec.get("securityContext"), seen)
    for listed, init in (("initContainers", True), ("containers", False)):
        for i, raw in enumerate(sequence(spec.get(listed), f"spec.{listed}")):
            _check_container(raw, f"spec.{listed}[{i}]", seen, init)
    pod = model.read_pod_spec(spec, strict=True)
    inits = tuple(_container(c, names, pod_security, seen) for c in pod.init_containers)
    containers = tuple(_container(c, names, pod_security, seen) for c in pod.containers)
    if not containers:
        raise ManifestError("spec.containers: a pod needs at least one container")
    if meta.get("name"):
        name = dns_subdomain(meta["name"], "metadata.name")
    else:
        name = dns_subdomain(f"{meta.get('generateName') or 'pod-'}lab", "metadata.generateName")
    namespace = dns_label(meta.get("namespace") or "default", "metadata.namespace")
    annotations = {str(k): str(v) for k, v in mapping(meta.get("annotations"), "metadata.annotations").items()}
    return PodManifest(
        name=name,
        namespace=namespace,
        annotations=annotations,
        grace_s=pod.grace_seconds,
        share_process_namespace=pod.share_process_namespace,
        init_containers=inits,
        containers=containers,
        volumes=volumes,
        no_effect=tuple(dict.fromkeys(s.lstrip(".") for s in seen)),
    )


def pick_pod(documents: Sequence[object]) -> object:
    """The one Pod among parsed YAML documents (empty ones dropped, ``kind: List`` opened)."""
    read = [loader.Document(i, doc, None) for i, doc in enumerate(documents) if doc is not None]
    found = [o.data for o in loader.objects(read)]
    if len(found) != 1:
        raise ManifestError(f"the input: gpuzombie lab pod runs one Pod, the input has {len(found)} objects")
    return found[0]


def load_pod(text: str) -> object:
    """The one Pod of a YAML (or JSON) text, as parsed data; ManifestError for anything else."""
    return pick_pod([d.data for d in loader.load_documents(text)])
