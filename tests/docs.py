"""The documentation the tests run or compare against: README.md and the pages in docs/."""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def doc(name: str) -> str:
    """``README`` or a page of docs/ (``"trace"`` is docs/trace.md), as text."""
    path = REPO / "README.md" if name == "README" else REPO / "docs" / f"{name}.md"
    return path.read_text()


def section(text: str, heading: str) -> str:
    """From the line that starts with ``heading`` to the next heading of the same level (or the end)."""
    start = text.index(heading)
    level = heading[: len(heading) - len(heading.lstrip("#"))]
    end = text.find(f"\n{level} ", start + 1)
    return text[start : end if end != -1 else None]
