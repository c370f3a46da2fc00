"""The lab's failures. Each is a ``GpuzombieError``: the CLI prints its one line and exits 2."""

from gpuzombie.errors import GpuzombieError


class LabError(GpuzombieError):
    """The lab could not make, run, measure or clean up a pod or its runtime."""


class PodError(LabError):
    """A pod could not be started, run or cleaned up (no PID 1 appeared, an init container failed,
    the kubelet would refuse a container, a volume is not allowed)."""


class ScenarioError(LabError):
    """A scenario could not run (its pod did not come up, a worker failed to hold memory...)."""
