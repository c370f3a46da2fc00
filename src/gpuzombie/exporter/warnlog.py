"""Which of a scan's warnings are worth a log line: one when a kind of warning appears, one when it
clears (with the number of scans it lasted), and a reminder with that count when it has changed
over many scans, never one per scan. Under container churn the text of a warning changes on every
scan (its pids, ids and counts) while its kind does not: 2,653 lines over 884 scans before this.

Pure: the caller prints the lines. Every line is escaped (a warning can carry a runtime's text).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from gpuzombie.escape import escape

REMIND_AFTER_SCANS = 240
"""A warning that lasts but changes is logged again after this many scans (1 h at a 15 s interval)."""
_NUMBERS = re.compile(r"\b[0-9a-f]{8,}\b|\d+(?:\.\d+)?")
_LISTS = re.compile(r"#(?:, #)+")


def kind_of(line: str) -> str:
    """The warning without its numbers, ids and lists of them: what stays while the node churns."""
    return _LISTS.sub("#", _NUMBERS.sub("#", line))


@dataclass
class _Seen:
    last: str
    scans: int = 1
    scans_since_logged: int = 0
    changed: bool = False


class WarningLog:
    """Feed it each scan's warnings; it answers the lines to log for that scan."""

    def __init__(self, *, remind_after_scans: int = REMIND_AFTER_SCANS) -> None:
        self.remind_after_scans = remind_after_scans
        self._seen: dict[str, _Seen] = {}

    def lines(self, warnings: tuple[str, ...] | list[str]) -> list[str]:
        now: dict[str, str] = {}
        for line in warnings:
            now.setdefault(kind_of(line), line)
        out = []
        for kind, gone in list(self._seen.items()):
            if kind not in now:
                del self._seen[kind]
                out.append(f"warning cleared after {_scans(gone.scans)}: {escape(gone.last, 1000)}")
        for kind, line in now.items():
            seen = self._seen.get(kind)
            if seen is None:
                self._seen[kind] = _Seen(line)
                out.append(f"warning: {escape(line, 1000)}")
                continue
            seen.scans += 1
            seen.scans_since_logged += 1
            seen.changed |= line != seen.last
            seen.last = line
            if seen.changed and seen.scans_since_logged >= self.remind_after_scans:
                seen.scans_since_logged, seen.changed = 0, False
                out.append(f"warning (for {_scans(seen.scans)}, changing): {escape(line, 1000)}")
        return out


def _scans(n: int) -> str:
    return f"{n} scan" if n == 1 else f"{n} scans"
