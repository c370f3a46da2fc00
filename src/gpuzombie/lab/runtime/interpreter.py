"""What a Python interpreter needs to start inside a container that mounts host paths read-only.

A venv holds only links to the interpreter it was made from (``sys.base_prefix``): a pyenv, uv or
conda Python lives outside ``/usr``, so mounting the venv alone leaves ``bin/python3`` a dangling
link in the container (``sh: …/bin/python3: not found``). The interpreter's own installation, every
directory its executable's symlink chain passes through and the real paths behind them are needed
too, each at the same path as on the host.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass

MAX_SYMLINK_HOPS = 40
"""The kernel's limit (``MAXSYMLINKS``): a longer chain is a loop."""


@dataclass(frozen=True)
class PythonLayout:
    """Where an interpreter and its environment live on the host."""

    executable: str
    prefixes: tuple[str, ...]
    """``sys.prefix`` (the venv), ``sys.base_prefix`` (the installation it links to) and their
    ``exec_prefix`` counterparts."""

    @classmethod
    def current(cls) -> PythonLayout:
        """This process's interpreter: the one the lab's workloads run with."""
        prefixes = (sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix)
        return cls(sys.executable, tuple(dict.fromkeys(prefixes)))


def symlink_chain(path: str) -> list[str]:
    """``path`` and every path its links lead through, to the real file (absolute, normalised)."""
    chain = [os.path.abspath(path)]
    for _ in range(MAX_SYMLINK_HOPS):
        try:
            target = os.readlink(chain[-1])
        except OSError:  # not a link (the end of the chain), or gone
            break
        chain.append(os.path.normpath(os.path.join(os.path.dirname(chain[-1]), target)))
    real = os.path.realpath(path)
    return list(dict.fromkeys([*chain, real]))


def interpreter_paths(layout: PythonLayout) -> list[str]:
    """Directories to mount for ``layout.executable`` to start: each prefix, the directory of each
    hop of the executable's symlink chain, and the real path of each (a prefix may be a link)."""
    paths = [*layout.prefixes, *(os.path.dirname(hop) for hop in symlink_chain(layout.executable))]
    return list(dict.fromkeys(p for path in paths for p in (os.path.abspath(path), os.path.realpath(path))))
