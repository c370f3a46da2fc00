"""GPU tests: each keeps what it saw in its own folder (``$GPUZOMBIE_EVIDENCE/<test>``, else a temp dir)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest


@pytest.fixture
def evidence(request: pytest.FixtureRequest, tmp_path: Path) -> Path:
    root = os.environ.get("GPUZOMBIE_EVIDENCE")
    folder = Path(root) / request.node.name if root else tmp_path / "evidence"
    folder.mkdir(parents=True, exist_ok=True)
    return folder
