"""The NRI plugin (go/nri) and the webhook on the same pods: every pod of tests/policy_cases.py (the
webhook tests' cases and the fleet corpus's pod templates), each container as containerd's NRI
hands it to the plugin, beside the argv the webhook's fix gives it.

Two files are written from here (``python tests/nri_cases.py``), and tests/test_nri.py fails when
either is not what this module makes now:

- ``go/nri/contract.json``: the webhook's constants the plugin embeds (its inits, tini's path and
  flags, its annotations, its mount, the namespaces it never touches);
- ``tests/fixtures/nri/decisions.json``: the cases, read by go/nri's own ``go test`` and, through
  the plugin binary's ``decide``, by tests/test_nri.py.

How a pod becomes what NRI shows (containerd's CRI plugin builds the OCI spec, then asks NRI):
argv is ``command + args``, or the image's ENTRYPOINT and CMD where ``command`` is unset (a stand-in
image, ENTRYPOINT_ARGV); ``hostPID`` gives no PID namespace, ``shareProcessNamespace`` the pod's
(a path); a GPU is what the node gives a container that asks for one (NRI sees no resources): the
NVIDIA device plugin's ``NVIDIA_VISIBLE_DEVICES``, AMD's ``/dev/kfd``, a DRA claim's CDI device.
The GPU request itself is read by podspec, the webhook's reader, so which containers ask for a GPU
is the webhook's decision in both."""

from __future__ import annotations

import json
import pathlib
import sys
from collections.abc import Mapping
from typing import Any

from gpuzombie import pid1kinds
from gpuzombie.admission import mutate, rules
from gpuzombie.k8s.podspec.gpus import GpuForm, GpuRequest
from gpuzombie.k8s.podspec.model import Container
from policy_cases import RELEASE_NAMESPACE, admission_cases, fleet_cases

REPO = pathlib.Path(__file__).resolve().parents[1]
CONTRACT = REPO / "go" / "nri" / "contract.json"
DECISIONS = REPO / "tests" / "fixtures" / "nri" / "decisions.json"
ENTRYPOINT_ARGV = ["/image/entrypoint.sh"]
CMD_ARGV = ["image-cmd"]
"""The stand-in image's ENTRYPOINT and CMD, for a container without ``command``: unknown at
admission, read from the image by containerd."""
SHARE = "the webhook cannot read the image's ENTRYPOINT at admission and shares the pod's process namespace; the plugin sees the argv containerd resolved and runs it under tini"
SHELL = "the webhook reads the shell script (exec tini / exec dumb-init); the plugin reads argv[0] alone, as the MutatingAdmissionPolicy does, and puts tini before the shell (the inner init then runs as tini's child, reaping too)"
NAME = "the webhook adds an init container, which a container named gpuzombie-install would clash with; the plugin adds none"
WINDOWS = "a Windows pod never reaches a Linux node's containerd: NRI does not see it"
DIFFERENCES = {
    "argv: sh -c 'exec tini ...'": SHELL,
    "argv: bash -c 'exec dumb-init ...'": SHELL,
    "a container named gpuzombie-install": NAME,
    "windows": WINDOWS,
    "windows by nodeSelector": WINDOWS,
    "windows by node affinity": WINDOWS,
}
"""The pods on which the plugin's argv differs from the webhook's, and why (docs/admission.md);
beside them, SHARE: each GPU container without ``command`` where the webhook's fix is
``shareProcessNamespace``."""


POLICY = mutate.Policy(skip_namespaces=mutate.ALWAYS_SKIPPED_NAMESPACES | {RELEASE_NAMESPACE})
"""The webhook as the chart runs it: its own release's namespace left out too."""


def contract() -> dict[str, Any]:
    """What go/nri/contract.json must hold."""
    return {
        "inits": sorted(name for name, kind in pid1kinds.KINDS.items() if kind in pid1kinds.REAPING_KINDS),
        "tini": mutate.TINI,
        "tini_flags": list(mutate.TINI_FLAGS),
        "mount": mutate.MOUNT,
        "inject": mutate.INJECT,
        "injected": mutate.INJECTED,
        "skip_namespaces": sorted(mutate.ALWAYS_SKIPPED_NAMESPACES),
    }


def _node_gives(gpus: tuple[GpuRequest, ...]) -> dict[str, Any]:
    """The NRI fields the node fills for a container's GPUs (the device plugins' and DRA's)."""
    view: dict[str, Any] = {"env": [], "devices": [], "cdi": []}
    for gpu in gpus:
        if gpu.resource.form in (GpuForm.DRA, GpuForm.DRA_ASSUMED):
            view["cdi"].append({"name": "k8s.gpu.nvidia.com/claim=5f0e1c7a-9b2d-4c1e-8a77-3d2f6b1e9c40-gpu-0"})
        elif gpu.resource.vendor == "amd":
            view["devices"].append({"path": "/dev/kfd", "type": "c"})
        else:
            view["env"].append("NVIDIA_VISIBLE_DEVICES=GPU-5a6c3c1e-0d1b-4b7e-9f5e-2b8f6c0c4a11")
    return view


def nri_container(pod: Mapping[str, Any], c: Container) -> dict[str, Any]:
    """The container as containerd's NRI gives it to a plugin (api.Container's JSON fields)."""
    spec = pod["spec"]
    argv = [*c.command, *(c.args or ())] if c.command else [*ENTRYPOINT_ARGV, *(c.args or CMD_ARGV)]
    given = _node_gives(c.gpus)
    namespaces = [{"type": "mount"}, {"type": "network", "path": "/var/run/netns/cni-0"}]
    if spec.get("hostPID") is not True:
        namespaces.append(
            {"type": "pid", "path": "/proc/4242/ns/pid"} if spec.get("shareProcessNamespace") else {"type": "pid"}
        )
    mounts = c.raw.get("volumeMounts") if isinstance(c.raw.get("volumeMounts"), list) else []
    out: dict[str, Any] = {
        "name": c.name,
        "args": argv,
        "env": [*(f"{k}={v}" for k, v in c.env.items()), *given["env"]],
        "mounts": [{"destination": m["mountPath"], "type": "bind"} for m in mounts if isinstance(m, Mapping)],
        "linux": {"namespaces": namespaces, "devices": given["devices"]},
    }
    if given["cdi"]:
        out["CDI_devices"] = given["cdi"]
    return out


def nri_pod(pod: Mapping[str, Any]) -> dict[str, Any]:
    meta = pod.get("metadata") or {}
    return {
        "name": meta.get("name", "train-0"),
        "namespace": meta.get("namespace", "default"),
        "annotations": dict(meta.get("annotations") or {}),
    }


def _webhook_argvs(pod: Mapping[str, Any], done: mutate.Mutation) -> dict[str, list[str] | None]:
    """Per container (``containers/train``), the argv the webhook's fix runs it with (None: the
    container is as it was)."""
    fixed = mutate.patched(pod, done.ops)["spec"]
    out: dict[str, list[str] | None] = {}
    for field in ("initContainers", "containers"):
        before = {c["name"]: c for c in pod["spec"].get(field) or []}
        for c in fixed.get(field) or []:
            if c["name"] not in before:
                continue  # the webhook's own (gpuzombie-install, the gate)
            old = before[c["name"]]
            changed = c.get("command") != old.get("command")
            out[f"{field}/{c['name']}"] = [*c["command"], *(c.get("args") or [])] if changed else None
    return out


def cases() -> list[dict[str, Any]]:
    """One row per container of every pod: its NRI view, the webhook's argv, why the plugin's differs."""
    pods = admission_cases() | fleet_cases()[0]
    rows = []
    for name, pod in pods.items():
        meta = pod.get("metadata") or {}
        spec = rules.read(pod["spec"], annotations=meta.get("annotations") or {})
        done = mutate.mutate(pod, meta.get("namespace"), POLICY)
        webhook = _webhook_argvs(pod, done)
        for c in spec.init_containers + spec.containers:
            key = f"{c.kind.field}/{c.name}"
            shared = "shareProcessNamespace" in done.actions and c.gpu and not c.argv_known
            rows.append(
                {
                    "case": name,
                    "container": key,
                    "pod": nri_pod(pod),
                    "nri": nri_container(pod, c),
                    "webhook": webhook.get(key),
                    "differs": SHARE if shared else DIFFERENCES.get(name),
                }
            )
    return rows


def decisions() -> dict[str, Any]:
    """What tests/fixtures/nri/decisions.json must hold."""
    return {"skip_namespaces": [RELEASE_NAMESPACE], "cases": cases()}


def dumped(data: Any) -> str:
    return json.dumps(data, indent=1, sort_keys=True) + "\n"


if __name__ == "__main__":
    CONTRACT.write_text(dumped(contract()))
    DECISIONS.parent.mkdir(parents=True, exist_ok=True)
    DECISIONS.write_text(dumped(decisions()))
    sys.stdout.write(f"wrote {CONTRACT} and {DECISIONS}\n")
