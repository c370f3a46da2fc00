"""The chart's node image for the single-node cluster, assembled from this machine's files the
lab's way (no registry, no image builder): Debian's python3 with its standard library and the shared
libraries it loads, the node requirements pinned with hashes (docker/node-requirements.txt) and
gpuzombie without what docker/node-excludes.txt leaves out, Debian's tini-static, the preStop and
preflight zipapps at /opt/gpuzombie, the NRI plugin (go/nri, built), busybox for a shell. The contents the Dockerfile's ``node``
target gives (docs/cluster.md "The image"), under the chart's default name; the one difference is
its base (Debian 12's python3 3.11, where the Dockerfile takes python:3.12-slim).

Cached in ~/.cache/gpuzombie/images under a key of the source tree and requirements: a second
``cluster up --node-image`` imports it in seconds."""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from gpuzombie.cluster.build import BuildError, NriSource, Progress, cache_root, ensure_nri_plugin
from gpuzombie.lab.runtime.containerd import ImageSpec, busybox_image, write_image_archive

SYSTEM_PYTHON = "/usr/bin/python3"
SITE_IN_IMAGE = "/usr/local/lib/python3.11/dist-packages"
"""Where Debian's python3 looks for packages a root pip installed: the image's one site directory."""
STDLIB_LEFT_OUT = (
    "test",
    "idlelib",
    "tkinter",
    "turtledemo",
    "ensurepip",
    "lib2to3",
    "pydoc_data",
    "config-3.11-x86_64-linux-gnu",
)
GPUZOMBIE_ENTRY = "#!/usr/bin/python3\nimport sys\nfrom gpuzombie.cli.main import main\nsys.exit(main())\n"


def repo_root() -> Path:
    return Path(__file__).resolve().parents[3]


def node_image_name(repo: Path) -> str:
    """The chart's default image: localhost/gpu-zombie/gpuzombie-node:<appVersion> (Chart.yaml)."""
    chart = (repo / "charts" / "gpuzombie" / "Chart.yaml").read_text()
    match = re.search(r'^appVersion:\s*"?([^"\s]+)"?', chart, re.M)
    if not match:
        raise BuildError("charts/gpuzombie/Chart.yaml has no appVersion")
    return f"localhost/gpu-zombie/gpuzombie-node:{match.group(1)}"


def _key(repo: Path) -> str:
    digest = hashlib.sha256()
    for path in sorted(
        [
            *(repo / "src" / "gpuzombie").rglob("*.py"),
            repo / "pyproject.toml",
            *(repo / "docker").glob("node-*.txt"),
            *NriSource(repo / "go" / "nri").keyed_files(),
        ]
    ):
        digest.update(str(path.relative_to(repo)).encode() + b"\0" + path.read_bytes())
    digest.update(Path(__file__).read_bytes())
    return digest.hexdigest()[:20]


def _shared_libraries(paths: list[str]) -> set[str]:
    """What the dynamic loader maps for each ELF file in ``paths`` (ldd), with the loader itself."""
    found = {"/lib64/ld-linux-x86-64.so.2"}
    for path in paths:
        done = subprocess.run(["ldd", path], capture_output=True, text=True, timeout=30, check=False)
        for line in done.stdout.splitlines():
            match = re.search(r"(?:=>\s*)?(/\S+)\s+\(0x", line)
            if match:
                found.add(match.group(1))
    return found


def _pip_site(repo: Path, site: Path, progress: Progress) -> None:
    """The node requirements (with their hashes) and gpuzombie itself into ``site``."""
    pip = [sys.executable, "-m", "pip", "install", "--quiet", "--no-compile", "--target", str(site)]
    progress("node image: the node requirements (pip, pinned with hashes)")
    for argv in (
        [*pip, "--require-hashes", "--only-binary=:all:", "-r", str(repo / "docker" / "node-requirements.txt")],
        [*pip, "--no-deps", str(repo)],
    ):
        done = subprocess.run(argv, capture_output=True, text=True, timeout=900, check=False)
        if done.returncode != 0:
            raise BuildError(f"node image: pip failed: {' '.join(done.stderr.split())[-300:]}")
    excludes = repo / "docker" / "node-excludes.txt"
    for line in excludes.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            target = site / "gpuzombie" / line.strip()
            if target.is_dir():
                shutil.rmtree(target)
            else:
                target.unlink(missing_ok=True)


def _tree(host: Path, image: str, skip: tuple[str, ...] = ()) -> dict[str, str]:
    files = {}
    for top, dirs, names in os.walk(host):
        dirs[:] = [d for d in dirs if d not in skip and d != "__pycache__"]
        for name in names:
            path = Path(top) / name
            if path.is_file():
                files[image.rstrip("/") + "/" + str(path.relative_to(host))] = str(path.resolve())
    return files


def node_image_spec(repo: Path, work: Path, progress: Progress) -> ImageSpec:
    python = os.path.realpath(SYSTEM_PYTHON)
    if not os.path.isfile(python):
        raise BuildError(f"node image: no {SYSTEM_PYTHON} (Debian: apt-get install python3)")
    site = work / "site"
    _pip_site(repo, site, progress)
    zipapps = work / "opt"
    for app in ("prestop", "preflight"):
        argv = [sys.executable, "-m", "gpuzombie.prestop.zipapp", "--app", app, str(zipapps / f"{app}.pyz")]
        done = subprocess.run(
            argv,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
            env=dict(os.environ, PYTHONPATH=str(repo / "src")),
        )
        if done.returncode != 0:
            raise BuildError(f"node image: the {app} zipapp: {done.stderr.strip()[-200:]}")
    entry = work / "gpuzombie"
    entry.write_text(GPUZOMBIE_ENTRY)
    entry.chmod(0o755)
    stdlib = Path(python).parent.parent / "lib" / Path(python).name
    files = {
        **busybox_image().files,
        "usr/bin/python3.11": python,
        **_tree(stdlib, "usr/lib/python3.11", STDLIB_LEFT_OUT),
        **_tree(site, SITE_IN_IMAGE.lstrip("/")),
        "usr/local/bin/gpuzombie": str(entry),
        "opt/gpuzombie/prestop.pyz": str(zipapps / "prestop.pyz"),
        "opt/gpuzombie/preflight.pyz": str(zipapps / "preflight.pyz"),
        "usr/local/bin/gpuzombie-nri": str(ensure_nri_plugin(progress)),  # static (CGO_ENABLED=0)
    }
    for tini in ("/usr/bin/tini-static", "/usr/bin/tini"):
        if not os.path.isfile(tini):
            raise BuildError(f"node image: no {tini} (Debian: apt-get install tini)")
        files[tini.lstrip("/")] = tini
    elves = [python, *(host for image, host in files.items() if image.endswith(".so") or ".so." in image)]
    for library in _shared_libraries(elves):
        files.setdefault(library.lstrip("/"), os.path.realpath(library))
    return ImageSpec(
        name=node_image_name(repo),
        files=files,
        symlinks={**busybox_image().symlinks, "usr/bin/python3": "python3.11", "usr/bin/python": "python3.11"},
        cmd=("gpuzombie", "exporter", "--listen", "0.0.0.0:9844"),
        env=("PYTHONUNBUFFERED=1", "GPUZOMBIE_PROCFS=/host/proc"),
    )


def node_image_archive(progress: Progress, repo: Path | None = None) -> tuple[str, Path]:
    """(image name, docker-archive path) of the node image, built once per source tree."""
    repo = repo or repo_root()
    if not (repo / "docker" / "node-requirements.txt").is_file():
        raise BuildError(f"node image: {repo} is not the gpuzombie clone")
    directory = cache_root().parent / "images" / _key(repo)
    archive = directory / "node.tar"
    name = node_image_name(repo)
    if archive.is_file():
        return name, archive
    work = directory / "work"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    spec = node_image_spec(repo, work, progress)
    progress(f"node image: {len(spec.files)} files into {name}")
    partial = archive.with_suffix(".partial")
    write_image_archive(spec, partial)
    partial.rename(archive)
    shutil.rmtree(work, ignore_errors=True)
    return name, archive
