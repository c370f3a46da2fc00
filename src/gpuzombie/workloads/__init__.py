"""The original experiment's workloads as modules: ``parent`` (spawns workers, exits without wait()), ``worker``
(holds memory, ignores SIGTERM) and ``worker_fixed`` (SIGTERM handler that frees and exits).

They run inside a pod's image, so they use only the standard library (and torch when present).
"""
