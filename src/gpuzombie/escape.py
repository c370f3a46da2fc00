"""The one escape for text a process controls (comm, cmdline, cgroup paths, names a runtime gives):
no control character reaches a terminal, a log line or a metric label, and no text is unbounded.

A newline in a cmdline must not forge a line of a report (``summary: ... -> HEALTHY``); a terminal
escape must not rewrite the screen; a bidi override must not reorder what is read.
"""

from __future__ import annotations

import hashlib
import re

DEFAULT_LIMIT = 200
LABEL_LIMIT = 128
"""Metric label values: long enough for a pod name (63) plus a namespace, bounded for the TSDB."""

_UNSAFE = re.compile(r"[\\\x00-\x1f\x7f-\x9f\u061c\u200b-\u200f\u2028-\u202e\u2060-\u2069\ufeff]")


def _escaped(match: re.Match[str]) -> str:
    char = match.group()
    if char == "\\":
        return "\\\\"
    code = ord(char)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


def escape(text: str, limit: int = DEFAULT_LIMIT) -> str:
    """``text`` with control and invisible formatting characters written as ``\\xNN``/``\\uNNNN``
    (and ``\\`` as ``\\\\``), cut to ``limit`` characters with a trailing ``…``."""
    if len(text) > limit * 6:  # no escape is longer than 6 characters: never escape what is cut
        text = text[: limit * 6]
    safe = _UNSAFE.sub(_escaped, text)
    return safe if len(safe) <= limit else safe[: limit - 1] + "…"


_DIGEST = 12
"""Hex digits of the SHA-256 of the full value that end a capped label value (48 bits)."""


def label_value(text: str) -> str:
    """``text`` escaped for a metric label, at most LABEL_LIMIT characters. A longer value keeps
    its first characters, ``…~`` and a digest of the whole value, so two values that differ only
    past the cap stay two series (Prometheus drops one of two identical ones)."""
    if len(text) <= LABEL_LIMIT:
        safe = _UNSAFE.sub(_escaped, text)
        capped_form = len(safe) == LABEL_LIMIT and safe[-_DIGEST - 2 : -_DIGEST] == "…~"
        if len(safe) <= LABEL_LIMIT and not capped_form:  # one that looks capped is capped too
            return safe
    digest = hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:_DIGEST]
    return escape(text, LABEL_LIMIT - _DIGEST - 1) + "~" + digest
