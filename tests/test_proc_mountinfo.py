"""mountinfo read whole: the kernel hands it over a page of records per read, so one read of a busy
node's stopped at 4 KiB (``cluster down`` then missed the kubelet's bind mount of its root)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

from markers import needs_root

SRC = str(Path(__file__).resolve().parents[1] / "src")


@needs_root
def test_mountinfo_past_a_page_is_read_to_its_end(tmp_path: Path) -> None:
    script = textwrap.dedent(
        f"""
        mount --make-rprivate /
        for i in $(seq 60); do mkdir -p {tmp_path}/m$i; mount -t tmpfs gz-test {tmp_path}/m$i; done
        exec {sys.executable} -c '
        from gpuzombie.proc.own import mount_points_under
        from gpuzombie.proc.read import read_text
        whole = open("/proc/self/mountinfo").read()
        assert len(whole) > 8192, len(whole)
        assert read_text("/proc/self/mountinfo", "mountinfo") == whole
        assert len(mount_points_under("{tmp_path}")) == 60
        '
        """
    )
    done = subprocess.run(
        ["unshare", "--mount", "sh", "-c", script],
        env={"PYTHONPATH": SRC, "PATH": "/usr/sbin:/usr/bin:/sbin:/bin"},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
