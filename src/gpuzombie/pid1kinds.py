"""What a program is as PID 1, by its name: the one table that ``observe`` (a live PID 1) and
``admission`` (a pod spec's argv) both read, so ``check`` and ``observe`` call a program the same."""

from __future__ import annotations

import posixpath
from enum import Enum


class Pid1Kind(str, Enum):
    INIT = "init"
    """A reaping init that starts exactly one child (tini, dumb-init, catatonit, docker-init, argoexec)."""
    SUPERVISOR = "supervisor"
    """A reaping init that starts many children (systemd, s6-svscan, runit, supervisord, init)."""
    PAUSE = "pause"
    """Kubernetes' pause container: reaps, starts nothing (shared process namespace)."""
    NON_FORKING = "non_forking"
    """A program that never forks or waits after its exec (sleep, tail -f): reaps nothing."""
    SHELL = "shell"
    """A shell: reaps only while it waits for its own jobs, forwards no SIGTERM to them."""
    PROGRAM = "program"
    """Anything else (python, java, node, ...): reaps nothing it did not start."""
    UNKNOWN = "unknown"
    """PID 1 could not be read (observe), or the argv does not show it (admission)."""


SHELLS = frozenset({"sh", "bash", "dash", "ash", "zsh", "ksh", "mksh", "busybox"})
"""Shells, by basename (``busybox`` as ``busybox sh``)."""

KINDS: dict[str, Pid1Kind] = {
    # argoexec: Argo's ``emissary`` before every main container (k8s.podspec.templates.ARGO_EXECUTOR).
    **dict.fromkeys(("tini", "tini-static", "dumb-init", "catatonit", "docker-init", "argoexec"), Pid1Kind.INIT),
    # init: ``/init`` (s6-overlay), ``/dev/init`` (podman, docker --init), a distribution's ``/sbin/init``.
    **dict.fromkeys(
        ("systemd", "init", "s6-svscan", "runit", "runit-init", "runsvdir", "supervisord", "openrc-init", "my_init"),
        Pid1Kind.SUPERVISOR,
    ),
    "pause": Pid1Kind.PAUSE,
    **dict.fromkeys(("sleep", "tail"), Pid1Kind.NON_FORKING),
    **dict.fromkeys(SHELLS, Pid1Kind.SHELL),
}
"""Every program named by its basename; any other is a ``PROGRAM``."""

REAPING_KINDS = frozenset({Pid1Kind.INIT, Pid1Kind.SUPERVISOR, Pid1Kind.PAUSE})
"""The kinds that reap every zombie re-parented to them."""


def kind_of(program: str) -> Pid1Kind:
    """The kind of ``program`` (a path or a name) as PID 1, by its basename."""
    return KINDS.get(posixpath.basename(program), Pid1Kind.PROGRAM)
