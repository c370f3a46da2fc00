"""The explicit scope prestop needs in the host's PID namespace: a cgroup path or a container id.

In the host's namespace every process of the node is visible, and a cgroup can be shared by
unrelated sessions (a node shell's, another hostPID pod's): "my own cgroup" is no boundary there.
A scope names the workload on the command line instead; a process is in it when its
``/proc/<pid>/cgroup`` says so.
"""

from __future__ import annotations

import posixpath
import re
from dataclasses import dataclass

from gpuzombie.errors import GpuzombieError
from gpuzombie.exitcodes import ExitStatus
from gpuzombie.k8s.cgroup import cgroup_paths, parse_cgroup_lines
from gpuzombie.proc.procfs import ProcessInfo

_CONTAINER_ID = re.compile(r"(?:[a-z0-9.-]+://)?([0-9a-f]{12,64})")
"""A container id or a unique prefix of it (``crictl ps`` shows 13 digits), optionally as the pod
status writes it (``containerd://<id>``)."""


def _usage(message: str) -> GpuzombieError:
    return GpuzombieError(message, ExitStatus.ERROR)


@dataclass(frozen=True)
class Scope:
    """Processes in a cgroup (or below it) and/or in one container; both given means both must hold."""

    cgroup: str | None = None
    """A cgroup path as /proc/<pid>/cgroup shows it (``/kubepods.slice/...``)."""
    container: str | None = None
    """A container id, or a prefix of at least 12 hex digits."""

    @classmethod
    def from_options(cls, cgroup: str | None, container: str | None) -> Scope | None:
        """Validate the command line's ``--cgroup`` / ``--container``; None when neither was given."""
        if cgroup is None and container is None:
            return None
        path = None
        if cgroup is not None:
            if not cgroup.startswith("/") or cgroup.startswith("/sys/fs/cgroup"):
                raise _usage(
                    f"--cgroup {cgroup!r}: give the path as /proc/<pid>/cgroup shows it, e.g. /kubepods.slice/…"
                )
            if ".." in cgroup.split("/"):
                raise _usage(f"--cgroup {cgroup!r}: '..' is not allowed")
            path = posixpath.normpath(cgroup)
            if path == "/":
                raise _usage("--cgroup /: the root cgroup holds every process; name a narrower one")
        cid = None
        if container is not None:
            m = _CONTAINER_ID.fullmatch(container.strip().lower())
            if m is None:
                raise _usage(f"--container {container!r}: expected 12 to 64 hex digits (optionally runtime://<id>)")
            cid = m.group(1)
        return cls(cgroup=path, container=cid)

    def contains(self, proc: ProcessInfo) -> bool | None:
        """In the scope? None when its cgroup could not be read (then nobody can tell)."""
        if not proc.cgroup:
            return None if proc.unread("cgroup") else False
        return self.contains_cgroup(proc.cgroup)

    def contains_cgroup(self, lines: tuple[str, ...]) -> bool:
        """Do these ``/proc/<pid>/cgroup`` lines put a process in the scope?"""
        cgroup = self.cgroup
        if cgroup is not None and not any(p == cgroup or p.startswith(cgroup + "/") for p in cgroup_paths(lines)):
            return False
        if self.container is not None:
            ref = parse_cgroup_lines(lines)
            if ref is None or ref.container_id is None or not ref.container_id.startswith(self.container):
                return False
        return True

    def describe(self) -> str:
        parts = [f"cgroup {self.cgroup}"] if self.cgroup else []
        parts += [f"container {self.container}"] if self.container else []
        return " and ".join(parts)
