"""Shell words as a POSIX shell reads them: the script of ``sh -c`` and its commands, quotes, jobs
and redirections, in one linear pass. Pure: nothing here runs a shell."""

from __future__ import annotations

import posixpath
from collections.abc import Sequence
from dataclasses import dataclass

from gpuzombie.pid1kinds import SHELLS

_OPTION_ARGUMENT = frozenset({"-o", "+o", "-O", "+O", "--rcfile", "--init-file"})


def shell_script(words: Sequence[str]) -> str | None:
    """The script of ``sh [-opts] -c [--] SCRIPT ...`` (``-ec``, ``-o pipefail -c``, ``bash -c --
    SCRIPT`` as KubeRay writes it); None for ``sh file``."""
    rest = list(words[1:])
    if rest and posixpath.basename(words[0]) == "busybox" and rest[0] in SHELLS:
        rest = rest[1:]
    command_string, i = False, 0
    while i < len(rest):
        word = rest[i]
        if word == "--" or word == "-":
            i += 1
            break
        if word in _OPTION_ARGUMENT:
            i += 2
            continue
        if word.startswith("--"):
            i += 1
            continue
        if not word.startswith(("-", "+")) or len(word) < 2:
            break
        command_string = command_string or (word[0] == "-" and "c" in word[1:])
        i += 1
    return rest[i] if command_string and i < len(rest) else None


@dataclass(frozen=True)
class Script:
    """A ``sh -c`` script as a shell reads it: its simple commands in order (words unquoted),
    whether any runs in the background (an unquoted ``&``), and whether it is one simple command."""

    commands: tuple[tuple[str, ...], ...]
    background: bool
    last_plain: bool
    """The last command is a simple one with no redirection, not in a pipeline, not a job: what
    bash (5.1 on; 5.2.15 and busybox 1.35 measured) execs in place of itself when no trap is set."""


_BREAKS = " \t\n;&|()'\"\\`#<>"


class _Lexer:
    """One pass of ``lex_script``: the commands and words read so far, and the one being read."""

    def __init__(self, script: str) -> None:
        self.script, self.n = script, len(script)
        self.commands: list[tuple[str, ...]] = []
        self.words: list[str] = []
        self.word: list[str] | None = None
        self.background = False
        self.plains: list[bool] = []  # per command: no redirection, not in a pipeline, not in a subshell
        self.plain = True  # the command being read

    def end_word(self) -> None:
        if self.word is not None:
            self.words.append("".join(self.word))
        self.word = None

    def end_command(self, next_plain: bool = True) -> None:
        self.end_word()
        if self.words:
            self.commands.append(tuple(self.words))
            self.plains.append(self.plain and next_plain)  # a pipe's left side is in the pipeline too
        self.plain = next_plain
        self.words.clear()

    def add(self, piece: str) -> None:
        if self.word is None:
            self.word = []
        self.word.append(piece)

    def quoted(self, i: int, quote: str) -> int:
        """A quoted piece from ``i`` (its opening quote) added to the word; the index after it."""
        script, n = self.script, self.n
        if quote == "'":
            close = script.find("'", i + 1)
            close = n if close < 0 else close
            self.add(script[i + 1 : close])
            return close + 1
        j, piece = i + 1, []
        while j < n and script[j] != quote:
            if script[j] == "\\" and j + 1 < n and script[j + 1] in '\\"$`':
                j += 1
            piece.append(script[j])
            j += 1
        self.add("".join(piece))
        return j + 1

    def ampersand(self, i: int) -> int:
        """``&&``, a redirection's ``&`` (``&>``, ``2>&1``) or a job's; the index after it."""
        script = self.script
        if script.startswith("&&", i):
            i += 1
        elif script.startswith("&>", i) or (i and script[i - 1] in "<>"):  # &> file, 2>&1
            self.plain = False
            self.add("&")
            return i + 1
        else:
            self.background = True
        self.end_command()
        return i + 1

    def bare(self, i: int) -> int:
        """An unquoted piece of a word from ``i``; the index after it."""
        j = i
        while j < self.n and self.script[j] not in _BREAKS:
            j += 1
        j = max(j, i + 1)
        if self.script[i] in "<>":
            self.plain = False
        self.add(self.script[i:j])
        return j

    def read(self) -> Script:
        script, n, i = self.script, self.n, 0
        while i < n:
            ch = script[i]
            if ch in " \t":
                self.end_word()
            elif ch == "#" and self.word is None:
                newline = script.find("\n", i)
                i = n if newline < 0 else newline
                continue
            elif ch in "\n;()":
                self.end_command(ch not in "()")
            elif ch == "&":
                i = self.ampersand(i)
                continue
            elif ch == "|":
                pipe = not script.startswith("||", i)
                i += not pipe
                self.end_command(not pipe)
            elif ch in "'\"`":
                i = self.quoted(i, ch)
                continue
            elif ch == "\\":
                if i + 1 < n and script[i + 1] != "\n":
                    self.add(script[i + 1])
                i += 2
                continue
            else:
                i = self.bare(i)
                continue
            i += 1
        self.end_command()
        return Script(tuple(self.commands), self.background, bool(self.plains) and self.plains[-1])


def lex_script(script: str) -> Script:
    """``script`` split as a POSIX shell splits it into commands and words: quotes (``'&'`` is a
    word, not a job), backslashes, comments, ``&&``/``||``/``|``/``;``/newline, a job's ``&``, a
    redirection's ``>&``/``&>``. One pass, linear in the script's length (each quote is closed by
    one ``str.find`` or one scan). Here-documents and ``case`` are read as words: what matters is
    the job control and the last command."""
    return _Lexer(script).read()
