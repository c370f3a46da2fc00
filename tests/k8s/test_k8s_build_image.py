"""scripts/build-image.sh's smoke test names the real cause of a failure (issue 26 (1): runc could not
start any container in this sandbox, and the script said the image lacked /usr/bin/tini-static).

Real podman, real images made here from busybox-static (`podman import`), each missing one thing more
than the last: one with neither tini-static nor python3, one with tini-static only, and an image
that does not exist (podman cannot start it: its own error is the cause named)."""

from __future__ import annotations

import os
import shutil
import subprocess
import tarfile
import uuid
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "scripts" / "build-image.sh"
BUSYBOX = Path("/bin/busybox")
TINI_STATIC = Path("/usr/bin/tini-static")

pytestmark = [
    pytest.mark.skipif(shutil.which("podman") is None, reason="podman is not installed (make image installs it)"),
    pytest.mark.skipif(os.geteuid() != 0, reason="podman's images here are root's"),
    pytest.mark.skipif(not BUSYBOX.is_file(), reason="busybox-static is not installed (make debian)"),
    pytest.mark.slow,
    pytest.mark.timeout(300),
]


def _image(tmp: Path, *, tini: bool) -> str:
    """A busybox rootfs (sh, test) imported as an image; with Debian's tini-static when asked."""
    name = f"localhost/gz-smoke-test:{uuid.uuid4().hex[:12]}"
    archive = tmp / "rootfs.tar"
    with tarfile.open(archive, "w") as tar:
        tar.add(BUSYBOX, "bin/busybox")
        for applet in ("sh", "test"):
            link = tarfile.TarInfo(f"bin/{applet}")
            link.type, link.linkname = tarfile.SYMTYPE, "busybox"
            tar.addfile(link)
        if tini:
            tar.add(TINI_STATIC, "usr/bin/tini-static")
    subprocess.run(["podman", "import", str(archive), name], check=True, capture_output=True, timeout=120)
    return name


def _check(image: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(SCRIPT), "--check", image], capture_output=True, text=True, timeout=240, check=False)


@pytest.fixture
def images(tmp_path):
    made: list[str] = []

    def make(*, tini: bool) -> str:
        made.append(_image(tmp_path, tini=tini))
        return made[-1]

    yield make
    for name in made:
        subprocess.run(["podman", "rmi", "-f", name], capture_output=True, timeout=120, check=False)


def test_each_failure_of_the_smoke_test_names_its_cause(images):
    done = _check(images(tini=False))
    assert done.returncode == 1 and "lacks an executable /usr/bin/tini-static" in done.stderr, done.stderr
    if TINI_STATIC.is_file():
        done = _check(images(tini=True))
        assert done.returncode == 1 and "/opt/gpuzombie/prestop.pyz --help fails" in done.stderr, done.stderr
        assert "tini-static" not in done.stderr
    missing = "localhost/gz-smoke-test:absent"
    done = _check(missing)
    assert done.returncode == 1, done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert line.startswith(f"build-image: podman cannot start a container of {missing} here: ") and "Error" in line
    assert "lacks" not in line
