"""The README's library example runs as written (documentation that is tested)."""

from __future__ import annotations

import re
import subprocess
import sys

from docs import doc, section


def test_library_example_runs():
    code = re.search(r"```python\n(.*?)```", section(doc("README"), "## Library"), re.S).group(1)
    code += "\nprint(type(report).__name__, len(table) > 0)\n"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["Attribution", "True"]
