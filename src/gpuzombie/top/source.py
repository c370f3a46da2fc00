"""Where ``gpuzombie top``'s frames come from: one ``trace.scan.scan_node`` per refresh, with the
backends kept across refreshes (NVML initialised once, the CRI names cached, the processes known
from the last refresh read again cheaply (``proc.procfs.ProcessCache``), the D-state and stopping
timers running), turned into the view model."""

from __future__ import annotations

import time
from collections.abc import Callable

from gpuzombie.gpu.attribution import DEFAULT_GHOST_THRESHOLD, ReaderView
from gpuzombie.gpu.dstate import DStateTracker
from gpuzombie.gpu.nvml import NvmlBackend
from gpuzombie.k8s.liveness import RuntimePods
from gpuzombie.k8s.owner import NamesLookup
from gpuzombie.k8s.podresources import PodResources
from gpuzombie.proc.procfs import ProcessCache, Procfs
from gpuzombie.top.model import NodeView, StoppingTracker, build_view
from gpuzombie.trace.model import PodsLookup
from gpuzombie.trace.scan import scan_node


class NodeSource:
    """Call it for a fresh frame. Raises OSError or ValueError when the procfs cannot be read."""

    def __init__(
        self,
        *,
        procfs: Procfs,
        nvml: NvmlBackend,
        view: ReaderView,
        names: NamesLookup,
        resources: Callable[[], PodResources],
        pods: PodsLookup | None,
        node_name: str = "",
        baseline: int | None = None,
        threshold: int = DEFAULT_GHOST_THRESHOLD,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.procfs = procfs
        self._nvml, self._view, self._names, self._resources, self._pods = nvml, view, names, resources, pods
        self._node_name, self._baseline, self._threshold, self._clock = node_name, baseline, threshold, clock
        self._dstate = DStateTracker()
        self._cache = ProcessCache()
        self._stopping = StoppingTracker()
        self.last_pods: RuntimePods | None = None
        """The runtime's answer of the last refresh (what a reap from top is checked against)."""

    def __call__(self) -> NodeView:
        seen: list[RuntimePods] = []

        def pods() -> RuntimePods:
            assert self._pods is not None
            seen.append(self._pods())
            return seen[-1]

        scan = scan_node(
            procfs=self.procfs,
            nvml=self._nvml,
            view=self._view,
            names=self._names,
            resources=self._resources,
            now=self._clock(),
            baseline=self._baseline,
            threshold=self._threshold,
            node_name=self._node_name,
            dstate=self._dstate,
            pods=pods if self._pods is not None else None,
            cache=self._cache,
        )
        self.last_pods = seen[-1] if seen else None
        return build_view(scan, pods=self.last_pods, stopping=self._stopping)
