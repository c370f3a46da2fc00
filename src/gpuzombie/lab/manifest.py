"""The Pod manifest subset ``gpuzombie lab pod`` runs, parsed into plain data; pure, no side effects.

Every field of the manifest is one of three kinds, and nothing is skipped silently:

* applied: containers and init containers (command, args, env values), emptyDir (also medium
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

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

GPU_RESOURCES = ("nvidia.com/gpu",)
"""The GPU resources the lab maps to its GPU devices (the webhook also knows MIG and AMD)."""
QUANTITY = re.compile(r"^([0-9]+(?:\.[0-9]+)?)(Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E|m)?$")
SUFFIX = {
    "Ki": 2**10,
    "Mi": 2**20,
    "Gi": 2**30,
    "Ti": 2**40,
    "Pi": 2**50,
    "Ei": 2**60,
    "k": 10**3,
    "M": 10**6,
    "G": 10**9,
    "T": 10**12,
    "P": 10**15,
    "E": 10**18,
    "m": 1e-3,
}
DEFAULT_GRACE_S = 30
DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
DNS1123_LABEL_MAX = 63
DNS1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
DNS1123_SUBDOMAIN_MAX = 253
"""The API server's name rules (k8s.io/apimachinery validation ``IsDNS1123Label`` and
``IsDNS1123Subdomain``): a namespace, a container and a volume name is a label, a pod name a
subdomain. The lab checks them before anything is made, because the names become paths (the pod's
log directory, each container's log file, each emptyDir's directory)."""
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


class ManifestError(ValueError):
    """The manifest is not a Pod the lab can run; the message names the field."""


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
class PreStop:
    command: tuple[str, ...] = ()
    """exec: run in the container (ExecSync)."""
    sleep_s: int | None = None
    """sleep: the kubelet itself waits (no process in the container)."""


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
    name: str
    image: str
    argv: tuple[str, ...]
    """``command + args`` (the lab's image has no ENTRYPOINT)."""
    command_given: bool
    env: tuple[tuple[str, str], ...] = ()
    mounts: tuple[Mount, ...] = ()
    prestop: PreStop | None = None
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


def parse_quantity(value: object, where: str) -> float:
    """A Kubernetes quantity (``2Gi``, ``250m``, ``1``) as a number of base units."""
    m = QUANTITY.match(str(value).strip())
    if m is None or isinstance(value, bool):
        raise ManifestError(f"{where}: {value!r} is not a quantity the lab understands")
    return float(m.group(1)) * SUFFIX.get(m.group(2) or "", 1)


def dns_label(value: object, where: str) -> str:
    """``value`` if it is a DNS-1123 label (a namespace, container or volume name)."""
    if not isinstance(value, str) or len(value) > DNS1123_LABEL_MAX or not DNS1123_LABEL.match(value):
        raise ManifestError(
            f"{where}: {value!r} is not a DNS-1123 label (at most {DNS1123_LABEL_MAX} lower-case letters, "
            "digits and '-', starting and ending with a letter or digit), as the API server requires"
        )
    return value


def dns_subdomain(value: object, where: str) -> str:
    """``value`` if it is a DNS-1123 subdomain (a pod name)."""
    if not isinstance(value, str) or len(value) > DNS1123_SUBDOMAIN_MAX or not DNS1123_SUBDOMAIN.match(value):
        raise ManifestError(
            f"{where}: {value!r} is not a DNS-1123 subdomain (at most {DNS1123_SUBDOMAIN_MAX} lower-case "
            "letters, digits, '-' and '.', each part starting and ending with a letter or digit), as the "
            "API server requires"
        )
    return value


def _mapping(value: object, where: str) -> Mapping[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ManifestError(f"{where}: expected a mapping, got {type(value).__name__}")
    return value


def _list(value: object, where: str) -> Sequence[Any]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise ManifestError(f"{where}: expected a list, got {type(value).__name__}")
    return value


def _strings(value: object, where: str) -> tuple[str, ...]:
    items = _list(value, where)
    if not all(isinstance(s, (str, int, float)) and not isinstance(s, bool) for s in items):
        raise ManifestError(f"{where}: expected a list of strings")
    return tuple(str(s) for s in items)


def _int(value: object, where: str, minimum: int = 0) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ManifestError(f"{where}: expected an integer >= {minimum}, got {value!r}")
    return value


def _bool(value: object, where: str) -> bool:
    if not isinstance(value, bool):
        raise ManifestError(f"{where}: expected true or false, got {value!r}")
    return value


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
    profile = _mapping(data, where)
    _check_keys(profile, where, {"type"}, set(), seen)
    kind = profile.get("type")
    if kind not in SECCOMP_TYPES:
        raise ManifestError(
            f"{where}.type: {kind!r} not supported by gpuzombie lab pod ({' or '.join(SECCOMP_TYPES)}; "
            "a lab node has no Localhost profiles)"
        )
    return str(kind)


def _security(data: object, where: str, inherited: Security, seen: list[str]) -> Security:
    sc = _mapping(data, where)
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
    caps = _mapping(sc.get("capabilities"), f"{where}.capabilities")
    _check_keys(caps, f"{where}.capabilities", {"drop"}, set(), seen)
    return Security(
        run_as_user=_int(sc["runAsUser"], f"{where}.runAsUser") if "runAsUser" in sc else inherited.run_as_user,
        run_as_group=_int(sc["runAsGroup"], f"{where}.runAsGroup") if "runAsGroup" in sc else inherited.run_as_group,
        run_as_non_root=_bool(sc["runAsNonRoot"], f"{where}.runAsNonRoot")
        if "runAsNonRoot" in sc
        else inherited.run_as_non_root,
        read_only_root=_bool(sc.get("readOnlyRootFilesystem", False), f"{where}.readOnlyRootFilesystem"),
        no_new_privs=sc.get("allowPrivilegeEscalation") is False,
        drop_capabilities=_strings(caps.get("drop"), f"{where}.capabilities.drop"),
        seccomp=_seccomp(sc.get("seccompProfile"), f"{where}.seccompProfile", inherited.seccomp, seen),
    )


def _pod_security(data: object, seen: list[str]) -> Security:
    sc = _mapping(data, "spec.securityContext")
    _check_keys(sc, "spec.securityContext", {"runAsUser", "runAsGroup", "runAsNonRoot", "seccompProfile"}, set(), seen)
    return _security(sc, "spec.securityContext", Security(), seen)


def _resources(data: object, where: str, seen: list[str]) -> Resources:
    res = _mapping(data, where)
    _check_keys(res, where, {"requests", "limits"}, set(), seen)
    values: dict[str, dict[str, float]] = {}
    for kind in ("requests", "limits"):
        part = _mapping(res.get(kind), f"{where}.{kind}")
        for name, qty in part.items():
            if name not in ("cpu", "memory", *GPU_RESOURCES):
                raise ManifestError(f"{where}.{kind}.{name}: not supported by gpuzombie lab pod")
            values.setdefault(kind, {})[name] = parse_quantity(qty, f"{where}.{kind}.{name}")
    req, lim = values.get("requests", {}), values.get("limits", {})
    gpus = max(int(req.get(g, 0) or lim.get(g, 0)) for g in GPU_RESOURCES)

    def mem(v: float | None) -> int | None:
        return None if v is None else int(v)

    return Resources(
        cpu_request=req.get("cpu"),
        cpu_limit=lim.get("cpu"),
        memory_request=mem(req.get("memory")),
        memory_limit=mem(lim.get("memory")),
        gpus=gpus,
    )


def _prestop(data: object, where: str, seen: list[str]) -> PreStop | None:
    lifecycle = _mapping(data, where)
    _check_keys(lifecycle, where, {"preStop"}, set(), seen)
    if "preStop" not in lifecycle:
        return None
    hook = _mapping(lifecycle["preStop"], f"{where}.preStop")
    _check_keys(hook, f"{where}.preStop", {"exec", "sleep"}, set(), seen)
    if len(hook) != 1:
        raise ManifestError(f"{where}.preStop: exactly one of exec and sleep")
    if "exec" in hook:
        ex = _mapping(hook["exec"], f"{where}.preStop.exec")
        _check_keys(ex, f"{where}.preStop.exec", {"command"}, set(), seen)
        command = _strings(ex.get("command"), f"{where}.preStop.exec.command")
        if not command:
            raise ManifestError(f"{where}.preStop.exec.command: empty")
        return PreStop(command=command)
    sleep = _mapping(hook["sleep"], f"{where}.preStop.sleep")
    _check_keys(sleep, f"{where}.preStop.sleep", {"seconds"}, set(), seen)
    return PreStop(sleep_s=_int(sleep.get("seconds"), f"{where}.preStop.sleep.seconds"))


def _env(data: object, where: str, seen: list[str]) -> tuple[tuple[str, str], ...]:
    out = []
    for i, item in enumerate(_list(data, where)):
        entry = _mapping(item, f"{where}[{i}]")
        _check_keys(entry, f"{where}[{i}]", {"name", "value"}, set(), seen)
        if not isinstance(entry.get("name"), str):
            raise ManifestError(f"{where}[{i}].name: missing")
        out.append((entry["name"], str(entry.get("value", ""))))
    return tuple(out)


def _mounts(data: object, where: str, volumes: set[str], seen: list[str]) -> tuple[Mount, ...]:
    out = []
    for i, item in enumerate(_list(data, where)):
        m = _mapping(item, f"{where}[{i}]")
        _check_keys(m, f"{where}[{i}]", {"name", "mountPath", "readOnly"}, set(), seen)
        name, path = m.get("name"), m.get("mountPath")
        if name not in volumes:
            raise ManifestError(f"{where}[{i}].name: no volume named {name!r}")
        if not isinstance(path, str) or not path.startswith("/"):
            raise ManifestError(f"{where}[{i}].mountPath: an absolute path is needed")
        out.append(Mount(str(name), path, _bool(m.get("readOnly", False), f"{where}[{i}].readOnly")))
    return tuple(out)


def _container(
    data: object, where: str, volumes: set[str], pod_security: Security, seen: list[str], init: bool
) -> Container:
    c = _mapping(data, where)
    applied = {"name", "image", "command", "args", "env", "volumeMounts", "resources", "securityContext"}
    if not init:
        applied.add("lifecycle")
    _check_keys(c, where, applied, NO_EFFECT["container"], seen)
    name = dns_label(c.get("name"), f"{where}.name")
    command = _strings(c.get("command"), f"{where}.command")
    args = _strings(c.get("args"), f"{where}.args")
    if not command and not args:
        raise ManifestError(
            f"{where}: neither command nor args: the image's ENTRYPOINT/CMD would run, and the lab's image has none"
        )
    return Container(
        name=name,
        image=str(c.get("image", "")),
        argv=command + args,
        command_given=bool(command),
        env=_env(c.get("env"), f"{where}.env", seen),
        mounts=_mounts(c.get("volumeMounts"), f"{where}.volumeMounts", volumes, seen),
        prestop=_prestop(c.get("lifecycle"), f"{where}.lifecycle", seen) if not init else None,
        resources=_resources(c.get("resources"), f"{where}.resources", seen),
        security=_security(c.get("securityContext"), f"{where}.securityContext", pod_security, seen),
    )


def _volume(data: object, where: str, seen: list[str]) -> Volume:
    v = _mapping(data, where)
    name = dns_label(v.get("name"), f"{where}.name")
    _check_keys(v, where, {"name", "emptyDir", "hostPath"}, set(), seen)
    if "emptyDir" in v:
        ed = _mapping(v["emptyDir"], f"{where}.emptyDir")
        _check_keys(ed, f"{where}.emptyDir", {"medium", "sizeLimit"}, set(), seen)
        medium = ed.get("medium", "")
        if medium not in ("", "Memory"):
            raise ManifestError(f'{where}.emptyDir.medium: {medium!r} not supported ("" or Memory)')
        size = int(parse_quantity(ed["sizeLimit"], f"{where}.emptyDir.sizeLimit")) if "sizeLimit" in ed else None
        return Volume(name, "emptyDir", memory=medium == "Memory", size_limit=size)
    if "hostPath" in v:
        hp = _mapping(v["hostPath"], f"{where}.hostPath")
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
    top = _mapping(doc, "the manifest")
    if top.get("kind") != "Pod" or top.get("apiVersion") != "v1":
        raise ManifestError(
            f"kind: gpuzombie lab pod runs a v1 Pod, not {top.get('apiVersion')}/{top.get('kind')} "
            "(take the pod template out of a workload)"
        )
    seen: list[str] = []
    _check_keys(top, "", {"apiVersion", "kind", "metadata", "spec"}, {"status"}, seen)
    meta = _mapping(top.get("metadata"), "metadata")
    _check_keys(meta, "metadata", {"name", "namespace"}, NO_EFFECT["metadata"], seen)
    spec = _mapping(top.get("spec"), "spec")
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
        _volume(v, f"spec.volumes[{i}]", seen) for i, v in enumerate(_list(spec.get("volumes"), "spec.volumes"))
    )
    names = {v.name for v in volumes}
    if len(names) != len(volumes):
        raise ManifestError("spec.volumes: two volumes with one name")
    pod_security = _pod_security(spec.get("securityContext"), seen)
    inits = tuple(
        _container(c, f"spec.initContainers[{i}]", names, pod_security, seen, init=True)
        for i, c in enumerate(_list(spec.get("initContainers"), "spec.initContainers"))
    )
    containers = tuple(
        _container(c, f"spec.containers[{i}]", names, pod_security, seen, init=False)
        for i, c in enumerate(_list(spec.get("containers"), "spec.containers"))
    )
    if not containers:
        raise ManifestError("spec.containers: a pod needs at least one container")
    all_names = [c.name for c in (*inits, *containers)]
    if len(set(all_names)) != len(all_names):
        raise ManifestError("spec.containers: two containers with one name")
    if meta.get("name"):
        name = dns_subdomain(meta["name"], "metadata.name")
    else:
        name = dns_subdomain(f"{meta.get('generateName') or 'pod-'}lab", "metadata.generateName")
    namespace = dns_label(meta.get("namespace") or "default", "metadata.namespace")
    annotations = {str(k): str(v) for k, v in _mapping(meta.get("annotations"), "metadata.annotations").items()}
    grace = spec.get("terminationGracePeriodSeconds", DEFAULT_GRACE_S)
    return PodManifest(
        name=name,
        namespace=namespace,
        annotations=annotations,
        grace_s=_int(grace, "spec.terminationGracePeriodSeconds"),
        share_process_namespace=_bool(spec.get("shareProcessNamespace", False), "spec.shareProcessNamespace"),
        init_containers=inits,
        containers=containers,
        volumes=volumes,
        no_effect=tuple(dict.fromkeys(s.lstrip(".") for s in seen)),
    )


def pick_pod(documents: Sequence[object]) -> object:
    """The one Pod among parsed YAML documents (empty ones dropped, ``kind: List`` opened)."""
    docs: list[object] = []
    for doc in documents:
        if isinstance(doc, Mapping) and doc.get("kind") == "List":
            docs.extend(_list(doc.get("items"), "items"))
        elif doc is not None:
            docs.append(doc)
    if len(docs) != 1:
        raise ManifestError(f"the input: gpuzombie lab pod runs one Pod, the input has {len(docs)} objects")
    return docs[0]
