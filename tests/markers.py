"""Skip markers shared by test files.

Import them from here rather than from ``conftest``: with a second conftest.py in a subfolder,
``from markers import ...`` resolves to whichever was imported first and fails at random.
"""

from __future__ import annotations

import os
import shutil

import pytest

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="needs root for PID namespaces")
needs_tini = pytest.mark.skipif(shutil.which("tini") is None, reason="tini not installed")
