"""gpuzombie: zombies, orphans, ghost GPU memory and grace-period waste of GPU workloads.

The library is importable without the CLI: ``gpuzombie.proc`` reads /proc, ``gpuzombie.gpu``
talks to NVML, and the feature packages (observe, trace, lab, prestop, graceful) build on them.
"""

__version__ = "0.1.0"
