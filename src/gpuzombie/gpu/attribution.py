"""Map the pids NVML reports to processes, and account for every MiB on each GPU.

NVML's pids are ambiguous. Called from the host they are host pids. Called inside a PID namespace,
driver 580.159 gave the namespace's own pids and hid other namespaces' processes (DEVICE-FACTS), while
the original experiment's containers and many public reports got host pids there. So a pid is judged per case:

* reader in the root PID namespace: NVML pid == procfs pid; absent means the process is gone;
* reader in a child namespace: a local process with that pid that holds ``/dev/nvidia*`` is it;
  otherwise the pid may be a host pid of a local process, mapped only when the evidence is
  unambiguous (one unmatched NVML pid, one unmatched fd holder; or a unique name match), else
  "unresolved" — never "orphaned" on a guess.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import Enum
from typing import TypedDict

from gpuzombie.gpu.nvml import GpuDevice, GpuProcess, GpuSnapshot, MigInstance
from gpuzombie.jsonout import IN_MIB
from gpuzombie.proc.pidns import reader_in_root_pidns
from gpuzombie.proc.procfs import ProcessInfo, ProcessTable
from gpuzombie.units import MIB

DEFAULT_GHOST_THRESHOLD = 64 * MIB


class ProcessVerdict(str, Enum):
    """What the process NVML names as a GPU memory holder is, as this reader sees it."""

    LIVE = "live"
    ZOMBIE = "zombie"
    GONE = "gone"
    """No such process: memory attributed to a dead pid (the original experiment's "orphaned context")."""
    UNRESOLVED = "unresolved"
    """Cannot tell from here: say so rather than guess."""


@dataclass(frozen=True)
class ReaderView:
    """Where the reader stands relative to the pids it sees."""

    in_root_pidns: bool
    """True when this process is in the root (host) PID namespace, so NVML pids are procfs pids."""
    own_pid: int | None = None
    """The reader's pid in the procfs it reads; left out of fd holders (NVML itself opens them)."""


def current_view() -> ReaderView:
    """The running process's own view, from the real /proc/self (not an injected procfs)."""
    return ReaderView(in_root_pidns=reader_in_root_pidns(), own_pid=os.getpid())


@dataclass(frozen=True)
class GpuProcessRef:
    """One NVML process entry, attributed."""

    gpu_index: int
    gpu_uuid: str
    nvml_pid: int
    used_memory: int | None
    kind: str
    verdict: ProcessVerdict
    local_pid: int | None
    """The pid inside the process's own PID namespace (what ``ps`` in its container shows)."""
    host_pid: int | None
    """The pid in the outermost namespace visible here (host pid when reading the host's /proc)."""
    comm: str | None
    evidence: str
    reader_pid: int | None = None
    """The pid in the procfs that was read (None when no process there is it)."""
    mig: MigInstance | None = None
    """The MIG GPU instance NVML lists it on (None without MIG)."""


@dataclass(frozen=True)
class FdHolder:
    """A live process holding /dev/nvidia* file descriptors."""

    pid: int
    local_pid: int
    comm: str
    state: str
    devices: tuple[str, ...]
    listed_by_nvml: bool


@dataclass(frozen=True)
class GhostMemory:
    """Memory on one GPU that no listed process accounts for."""

    gpu_index: int
    gpu_uuid: str
    used: int = field(metadata=IN_MIB)
    baseline: int = field(metadata=IN_MIB)
    baseline_source: str
    process_memory: int = field(metadata=IN_MIB)
    unexplained: int = field(metadata=IN_MIB)
    flagged: bool
    likely_causes: tuple[str, ...]
    verdict: str = "ok"
    """"ok" (within the threshold), "ghost" (flagged), or "cannot_tell": over the threshold inside a
    PID namespace with no local evidence, where other namespaces' processes are invisible, or where
    NVML would not list the device's processes (a MIG GPU read as a whole)."""
    mig: MigInstance | None = None
    """The MIG GPU instance accounted for (None: the whole GPU)."""


@dataclass(frozen=True)
class Attribution:
    processes: tuple[GpuProcessRef, ...]
    fd_holders: tuple[FdHolder, ...]
    ghosts: tuple[GhostMemory, ...]


class _OnGpu(TypedDict):
    """Which GPU (or MIG instance of it) a record is about."""

    gpu_index: int
    gpu_uuid: str
    mig: MigInstance | None


def _on_gpu(device: GpuDevice) -> _OnGpu:
    """The fields every record of one device starts from (a process entry, its ghost memory)."""
    return _OnGpu(gpu_index=device.index, gpu_uuid=device.uuid, mig=device.mig)


def _ref(
    device: GpuDevice,
    nvml_pid: int,
    used: int | None,
    kind: str,
    verdict: ProcessVerdict,
    proc: ProcessInfo | None,
    evidence: str,
    host_pid: int | None = None,
    view: ReaderView | None = None,
) -> GpuProcessRef:
    if host_pid is None and proc is not None and (view is None or view.in_root_pidns):
        # Only a reader in the root namespace sees host pids; inside a container the outermost
        # pid it can see is its own namespace's, so the host pid stays unknown unless NVML gave it.
        host_pid = proc.nspid[0]
    return GpuProcessRef(
        **_on_gpu(device),
        nvml_pid=nvml_pid,
        used_memory=used,
        kind=kind,
        verdict=verdict,
        local_pid=proc.innermost_pid if proc else None,
        host_pid=host_pid,
        comm=proc.comm if proc else None,
        evidence=evidence,
        reader_pid=proc.pid if proc else None,
    )


def _state_verdict(proc: ProcessInfo) -> ProcessVerdict:
    return ProcessVerdict.ZOMBIE if proc.is_zombie else ProcessVerdict.LIVE


def _name_matches(nvml_name: str | None, proc: ProcessInfo) -> bool:
    if not nvml_name:
        return False
    base = os.path.basename(nvml_name)
    return base == proc.comm or any(os.path.basename(arg) == base for arg in proc.cmdline[:2])


def _direct(device: GpuDevice, gp: GpuProcess, proc: ProcessInfo | None, view: ReaderView) -> GpuProcessRef | None:
    """An NVML entry attributed by its pid alone; None when only pairing can tell (a host pid seen
    from inside a container)."""
    if proc is None:
        if not view.in_root_pidns:
            return None
        why = "no such pid in the root namespace's /proc"
        return _ref(device, gp.pid, gp.used_memory, gp.kind, ProcessVerdict.GONE, None, why, host_pid=gp.pid)
    if view.in_root_pidns:
        why = "NVML pid is a host pid"
    elif proc.nvidia_fds or proc.is_zombie:
        why = "local pid of a process holding /dev/nvidia*"
    elif proc.access_denied and _name_matches(gp.name, proc):
        # Not root: another user's fds are unreadable, but pid and NVML's name agree.
        why = f"local pid; its fds are unreadable here, NVML name {gp.name!r} matches"
    else:
        return None
    return _ref(device, gp.pid, gp.used_memory, gp.kind, _state_verdict(proc), proc, why, view=view)


_Pending = tuple[GpuDevice, GpuProcess]


def _pair(
    pending: list[_Pending], candidates: list[ProcessInfo]
) -> tuple[dict[int, tuple[ProcessInfo, str]], list[int], list[ProcessInfo]]:
    """Unmatched NVML pids paired with unmatched /dev/nvidia* holders by name, else the only one
    with the only one; and the pids and holders left unpaired."""
    unmatched_pids = sorted({gp.pid for _, gp in pending})
    mapping: dict[int, tuple[ProcessInfo, str]] = {}
    for pid in unmatched_pids:
        name = next((gp.name for _, gp in pending if gp.pid == pid and gp.name), None)
        by_name = [c for c in candidates if _name_matches(name, c)]
        if len(by_name) == 1:
            mapping[pid] = (by_name[0], f"NVML name {name!r} matches one local fd holder")
    rest_pids = [p for p in unmatched_pids if p not in mapping]
    rest_cands = [c for c in candidates if all(c is not m for m, _ in mapping.values())]
    if len(rest_pids) == 1 and len(rest_cands) == 1:
        mapping[rest_pids[0]] = (
            rest_cands[0],
            "the only unmatched NVML pid and the only unmatched /dev/nvidia* holder (NVML gave a host pid)",
        )
    return mapping, rest_pids, rest_cands


def _unresolved(rest_pids: list[int], rest_cands: list[ProcessInfo]) -> str:
    """Why an NVML pid seen from inside a container could not be paired."""
    if not rest_cands:
        return (
            "not visible in this PID namespace and no unmatched local /dev/nvidia* "
            "holder: a host pid of a process outside this namespace, or a dead one"
        )
    holders_text = ", ".join(str(c.innermost_pid) for c in rest_cands)
    paired = (
        " (as many holders as unmatched NVML pids: all alive and accounted for, pairing unknown)"
        if len(rest_cands) == len(rest_pids)
        else ""
    )
    return f"likely a host pid; {len(rest_cands)} local /dev/nvidia* holders could be it ({holders_text}){paired}"


def attribute_processes(table: ProcessTable, gpus: GpuSnapshot, view: ReaderView) -> tuple[GpuProcessRef, ...]:
    """Attribute every NVML process entry to a process of ``table``, or say why not."""
    refs: list[GpuProcessRef | None] = []
    pending: list[_Pending] = []
    for device in gpus.devices:
        for gp in device.processes:
            ref = _direct(device, gp, table.get(gp.pid), view)
            refs.append(ref)
            if ref is None:
                pending.append((device, gp))
    if not pending:
        return tuple(r for r in refs if r is not None)
    matched_local = {r.local_pid for r in refs if r is not None}
    holders = [p for p in table if p.nvidia_fds and not p.is_zombie and p.pid != view.own_pid]
    mapping, rest_pids, rest_cands = _pair(pending, [p for p in holders if p.innermost_pid not in matched_local])
    out: list[GpuProcessRef] = []
    pending_iter = iter(pending)
    for ref in refs:
        if ref is not None:
            out.append(ref)
            continue
        device, gp = next(pending_iter)
        if gp.pid in mapping:
            proc, why = mapping[gp.pid]
            out.append(_ref(device, gp.pid, gp.used_memory, gp.kind, _state_verdict(proc), proc, why, host_pid=gp.pid))
        else:
            why = _unresolved(rest_pids, rest_cands)
            out.append(
                _ref(device, gp.pid, gp.used_memory, gp.kind, ProcessVerdict.UNRESOLVED, None, why, host_pid=None)
            )
    return tuple(out)


def fd_holders(table: ProcessTable, refs: Iterable[GpuProcessRef], view: ReaderView) -> tuple[FdHolder, ...]:
    """Every process holding /dev/nvidia* fds, marked with whether NVML lists it anywhere."""
    listed = {r.reader_pid for r in refs if r.verdict in (ProcessVerdict.LIVE, ProcessVerdict.ZOMBIE)}
    return tuple(
        FdHolder(
            **p.named(),
            state=p.state,
            devices=p.nvidia_fds,
            listed_by_nvml=p.pid in listed,
        )
        for p in table
        if p.nvidia_fds and p.pid != view.own_pid
    )


def ghost_memory(
    device: GpuDevice,
    refs: Iterable[GpuProcessRef],
    holders: Iterable[FdHolder],
    view: ReaderView,
    *,
    baseline: int | None = None,
    threshold: int = DEFAULT_GHOST_THRESHOLD,
    peer_devices: Iterable[int] = (),
) -> GhostMemory:
    """used − baseline − Σ process memory, with the likely causes the evidence supports.

    The baseline is the driver's reservation when NVML reports it (615 MiB on an idle H200, driver
    580), else ``baseline`` (a caller's calibration), else 0.
    """
    if device.memory_reserved is not None and baseline is None:
        base, source = device.memory_reserved, "NVML reserved (driver reservation)"
    else:
        base, source = baseline or 0, "given baseline" if baseline else "none (driver reports no reservation)"
    unexplained = max(0, device.memory_used - base - device.process_memory)
    local: list[str] = []  # causes this reader can see for itself
    mine = [r for r in refs if r.gpu_index == device.index and r.mig == device.mig]
    if any(r.verdict is ProcessVerdict.GONE for r in mine):
        local.append("memory attributed to pids that no longer exist (orphaned context)")
    # /dev/nvidiactl and /dev/nvidia-uvm are opened by any NVML client (nvidia-smi, exporters);
    # only this GPU's node held by an unlisted process hints at a context NVML hides.
    unlisted = [h for h in holders if not h.listed_by_nvml and device.device_node in h.devices]
    if unlisted:
        local.append(
            f"processes hold {device.device_node} but NVML lists none of them (contexts NVML "
            "does not report): " + ", ".join(f"{h.pid} ({h.comm})" for h in unlisted[:5])
        )
    if any(h.state == "D" for h in holders):
        local.append("a /dev/nvidia* holder is in D state (stuck in the driver)")
    peers = list(peer_devices)
    if not mine and peers:
        local.append(
            "peer context of a multi-GPU process listed on GPU "
            + ", ".join(str(i) for i in peers)
            + " (e.g. an NCCL rank whose peer died)"
        )
    causes = list(local)
    if not view.in_root_pidns:
        causes.append(
            "processes of other PID namespaces are invisible from inside this one: their "
            "memory counts here without a listed process (not proof of a ghost)"
        )
    elif not causes:
        causes.append(
            "no process accounts for it: a context the driver has not freed, or a process NVML does not report"
        )
    if unexplained <= threshold:
        verdict, causes = "ok", []
    elif not device.processes_read:
        verdict, causes = "cannot_tell", [_unlisted_reason(device)]
    elif view.in_root_pidns or local:
        verdict = "ghost"
    else:
        verdict = "cannot_tell"
    return GhostMemory(
        **_on_gpu(device),
        used=device.memory_used,
        baseline=base,
        baseline_source=source,
        process_memory=device.process_memory,
        unexplained=unexplained,
        flagged=verdict == "ghost",
        likely_causes=tuple(causes),
        verdict=verdict,
    )


def _unlisted_reason(device: GpuDevice) -> str:
    if device.mig_mode and device.mig is None:
        return (
            "MIG mode is on and no GPU instance could be read: NVML lists a MIG GPU's processes per "
            "instance (the whole GPU's only to a privileged caller), so an empty list proves nothing"
        )
    return "NVML would not list this GPU's processes: memory without a listed process proves nothing"


def attribute(
    table: ProcessTable,
    gpus: GpuSnapshot,
    view: ReaderView,
    *,
    baseline: int | None = None,
    threshold: int = DEFAULT_GHOST_THRESHOLD,
) -> Attribution:
    """Everything the observe and trace reports need about GPUs, in one pass."""
    refs = attribute_processes(table, gpus, view)
    holders = fd_holders(table, refs, view)
    devices_with_procs = {r.gpu_index for r in refs}
    ghosts = tuple(
        ghost_memory(
            d,
            refs,
            holders,
            view,
            baseline=baseline,
            threshold=threshold,
            peer_devices=sorted(devices_with_procs - {d.index}),
        )
        for d in gpus.devices
    )
    return Attribution(processes=refs, fd_holders=holders, ghosts=ghosts)
