"""The preStop hook's options, written once: ``python3 -m gpuzombie.prestop`` (argparse: the zipapp
has the standard library only) and ``gpuzombie prestop`` (click) are both built from ``OPTIONS``,
and both hand ``run_hook`` one ``HookOptions``. Standard library only (the zipapp imports it).

Values from the environment are converted by the same functions on both sides, so a bad one is the
same usage error (exit 2) in both; a switch's words are click's (``BOOL_WORDS``).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum

from gpuzombie.proc.own import PROCFS

PRESTOP_TIMEOUT = 20.0
"""The original experiment's prestop.sh waited 20 s. Timeout + kill wait must fit the pod's grace period."""
DEFAULT_KILL_WAIT = 2.0
NVML_CHOICES = ("always", "undecided", "never")
BOOL_WORDS = {
    "1": True,
    "0": False,
    "yes": True,
    "no": False,
    "true": True,
    "false": False,
    "on": True,
    "off": False,
    "t": True,
    "f": False,
    "y": True,
    "n": False,
    "": False,
}
"""A switch's values in the environment, as click reads them (stripped, lower-cased)."""


def seconds(text: str | float) -> float:
    """A finite number of seconds >= 0 (NaN would pass a plain ``< 0`` check and make every
    deadline comparison false)."""
    value = float(text)
    if not (math.isfinite(value) and value >= 0):
        raise ValueError(f"{text!r} is not a finite number >= 0")
    return value


def switch(text: str) -> bool:
    """A switch's value from the environment (click's words)."""
    value = BOOL_WORDS.get(text.strip().lower())
    if value is None:
        raise ValueError(f"{text!r} is not one of {', '.join(sorted(w for w in BOOL_WORDS if w))}")
    return value


class Kind(Enum):
    VALUE = "value"
    """Takes a value, converted by ``convert`` (a string when None)."""
    FLAG = "flag"
    """``--name``: True when given."""
    SWITCH = "switch"
    """``--name/--no-name``."""


@dataclass(frozen=True)
class HookOption:
    flag: str
    """The option on the command line (a switch also takes ``--no-`` before the rest)."""
    kind: Kind
    help: str
    default: object = None
    envvar: str | None = None
    metavar: str | None = None
    convert: Callable[[str], object] | None = None
    choices: tuple[str, ...] = ()
    dest: str | None = None
    """The value's name in ``HookOptions`` when it is not the flag's (``--json``: ``as_json``)."""

    @property
    def name(self) -> str:
        return self.dest or self.flag.removeprefix("--").replace("-", "_")

    @property
    def negative_flag(self) -> str:
        return "--no-" + self.flag.removeprefix("--")

    def help_text(self) -> str:
        """The help line both parsers show (the default is shown by each parser its own way)."""
        return self.help + (f" Env: {self.envvar}." if self.envvar else "")


OPTIONS: tuple[HookOption, ...] = (
    HookOption(
        "--timeout",
        Kind.VALUE,
        "Seconds between SIGTERM and SIGKILL. With --kill-wait it must fit the pod's "
        "terminationGracePeriodSeconds (the hook's time counts against it).",
        default=PRESTOP_TIMEOUT,
        envvar="GPUZOMBIE_PRESTOP_TIMEOUT",
        metavar="S",
        convert=seconds,
    ),
    HookOption(
        "--kill-wait",
        Kind.VALUE,
        "Seconds to wait for processes to vanish after SIGKILL before calling them survivors.",
        default=DEFAULT_KILL_WAIT,
        metavar="S",
        convert=seconds,
    ),
    HookOption("--dry-run", Kind.FLAG, "List the targets; signal nothing, write nothing to PID 1's stdout."),
    HookOption("--no-orphans", Kind.FLAG, "Stop only GPU holders, not other orphans."),
    HookOption(
        "--nvml",
        Kind.VALUE,
        "Ask NVML always, only when the /proc fd scan could not read every process, or never.",
        default="always",
        choices=NVML_CHOICES,
    ),
    HookOption("--no-nvml", Kind.FLAG, "Never ask NVML: the same as --nvml never."),
    HookOption(
        "--same-cgroup",
        Kind.FLAG,
        "Only processes in this process's own cgroup (pods with shareProcessNamespace).",
    ),
    HookOption(
        "--cgroup",
        Kind.VALUE,
        "Only processes in this cgroup or below it, as /proc/<pid>/cgroup shows it. "
        "In the host PID namespace this or --container is required.",
        metavar="PATH",
    ),
    HookOption(
        "--container",
        Kind.VALUE,
        "Only this container's processes: its id, a prefix of 12+ hex digits, or runtime://<id>.",
        metavar="ID",
    ),
    HookOption(
        "--pid1-log",
        Kind.SWITCH,
        "Also write the log lines to /proc/1/fd/1, so they reach `kubectl logs`.",
        default=True,
        envvar="GPUZOMBIE_PRESTOP_PID1_LOG",
        convert=switch,
    ),
    HookOption("--json", Kind.FLAG, "Print JSON (schema gpuzombie.prestop/1, docs/prestop.md).", dest="as_json"),
    HookOption(
        "--procfs",
        Kind.VALUE,
        "procfs root to read: this PID namespace's own.",
        default=PROCFS,
        envvar="GPUZOMBIE_PROCFS",
        metavar="P",
    ),
)


@dataclass(frozen=True)
class HookOptions:
    """One run's options, however they were parsed (one field an entry of ``OPTIONS``)."""

    timeout: float = PRESTOP_TIMEOUT
    kill_wait: float = DEFAULT_KILL_WAIT
    dry_run: bool = False
    no_orphans: bool = False
    nvml: str = "always"
    no_nvml: bool = False
    same_cgroup: bool = False
    cgroup: str | None = None
    container: str | None = None
    pid1_log: bool = True
    as_json: bool = False
    procfs: str = PROCFS

    @property
    def nvml_when(self) -> str:
        """One of ``NVML_CHOICES``: ``--no-nvml`` is ``--nvml never``."""
        return "never" if self.no_nvml else self.nvml
