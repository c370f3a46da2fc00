"""What an argv makes PID 1, read from the spec only (Kubernetes' argv rule): ``command`` set -> it
replaces the image's ENTRYPOINT and ``args`` (or nothing) follow; ``command`` empty -> the image's
ENTRYPOINT runs, which admission cannot see without a registry lookup, so PID 1 is "cannot tell",
never guessed. A shell is followed through its ``-c`` script (``exec``, bash's exec of a plain last
command) to a bounded depth."""

from __future__ import annotations

import posixpath
import re
from collections.abc import Sequence
from dataclasses import dataclass

from gpuzombie.admission.shell import lex_script, shell_script
from gpuzombie.k8s.podspec.model import Container
from gpuzombie.pid1kinds import Pid1Kind, kind_of

MAX_SCRIPT_CHARS = 64 * 1024
"""A ``sh -c`` script longer than this is not read: PID 1 is "cannot tell", said so. Inline scripts
are a few hundred characters; a long one belongs in a ConfigMap, and reading one is work an
AdmissionReview's sender chooses."""
MAX_EXEC_DEPTH = 4
"""``sh -c 'exec sh -c "exec ..."'`` is followed this deep, no deeper ("cannot tell" past it)."""


@dataclass(frozen=True)
class Pid1:
    """What a known argv makes PID 1, and whether it starts work in the background."""

    kind: Pid1Kind
    program: str | None = None
    background: bool = False
    script: str | None = None
    unread: str | None = None
    """Why the argv was not read to the end (a script over MAX_SCRIPT_CHARS, exec nested too deep):
    then the kind is UNKNOWN."""
    traps_term: bool = False
    """The shell traps SIGTERM with an action and ends in ``wait``: it exits on SIGTERM."""
    via: str | None = None
    """How a shell became ``program``: ``exec``, or the shell (``bash``) that execs its last command."""
    plain_last: bool = False
    """A shell's ``-c`` script ends in a plain command (no job, trap or redirection): what busybox's
    sh and bash exec in place of themselves, and dash does not."""


def container_pid1(c: Container) -> Pid1:
    """What the container's argv makes PID 1 (UNKNOWN without ``command``: the image's ENTRYPOINT runs)."""
    return analyse_argv(c.words) if c.argv_known else Pid1(Pid1Kind.UNKNOWN)


def _command_words(command: Sequence[str]) -> list[str]:
    """A simple command without its leading ``NAME=value`` assignments."""
    words = list(command)
    while words and re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", words[0]):
        words.pop(0)
    return words


def _exec_target(command: Sequence[str]) -> list[str] | None:
    """What ``exec [-a NAME] [-cl] PROGRAM ...`` runs, or None (not an exec, or exec alone)."""
    words = _command_words(command)
    if words[:1] != ["exec"]:
        return None
    rest = words[1:]
    while rest and rest[0].startswith("-"):
        rest = rest[2:] if rest[0] == "-a" else rest[1:]
        if rest[:1] == ["--"]:
            rest = rest[1:]
            break
    return rest or None


def _traps_term(commands: Sequence[Sequence[str]]) -> bool:
    """A ``trap ACTION ... TERM`` with a non-empty action, and the script ends in ``wait``: the
    shell's handler runs on SIGTERM (``trap '' TERM`` ignores it: not this)."""
    trapped = any(
        c[:1] == ("trap",)
        and len(c) > 2
        and c[1].strip() not in ("", "-")
        and any(s.upper() in ("TERM", "SIGTERM", "15") for s in c[2:])
        for c in commands
    )
    return trapped and bool(commands) and commands[-1][:1] == ("wait",)


def analyse_argv(words: Sequence[str], depth: int = 0) -> Pid1:
    """What ``words`` run as PID 1 make of it: an init, sleep, a shell that stays PID 1, a program;
    UNKNOWN (with ``unread`` saying why) for a script too long or an exec chain too deep to read."""
    if not words:
        return Pid1(Pid1Kind.UNKNOWN)
    base = posixpath.basename(words[0])
    kind = kind_of(base)
    if kind is not Pid1Kind.SHELL:
        return Pid1(kind, base)
    script = shell_script(words)
    if script is None:
        return Pid1(Pid1Kind.SHELL, base)
    if len(script) > MAX_SCRIPT_CHARS:
        unread = f"its {base} -c script is {len(script)} characters, over the {MAX_SCRIPT_CHARS} read"
        return Pid1(Pid1Kind.UNKNOWN, base, unread=unread)
    if depth >= MAX_EXEC_DEPTH:
        return Pid1(Pid1Kind.UNKNOWN, base, unread=f"its shells exec shells over {MAX_EXEC_DEPTH} deep")
    read = lex_script(script)
    last = list(read.commands[-1]) if read.commands else []
    target = _exec_target(last)
    via = "exec"
    traps = any(c[:1] == ("trap",) for c in read.commands)
    if target is None and base == "bash" and read.last_plain and not read.background and not traps and last:
        target, via = _command_words(last) or None, base
    if target is not None:  # the shell becomes the last program
        inner = analyse_argv(target, depth + 1)
        return Pid1(inner.kind, inner.program, read.background, script, inner.unread, inner.traps_term, via)
    plain_last = read.last_plain and not read.background and not traps and bool(last)
    return Pid1(
        Pid1Kind.SHELL, base, read.background, script, traps_term=_traps_term(read.commands), plain_last=plain_last
    )
