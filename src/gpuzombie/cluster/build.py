"""The multi-call Kubernetes binary (``go/kube``): built with the Go toolchain from the pinned
modules, stripped, and cached outside the tree under a key of everything that decides its bytes
(go.mod, go.sum, main.go, the Go version, the flags), so that a second ``cluster up`` costs seconds."""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from gpuzombie.errors import GpuzombieError

KUBE_SOURCE_ENV = "GPUZOMBIE_KUBE_SOURCE"
KUBE_BINARY_ENV = "GPUZOMBIE_KUBE_BINARY"
"""A prebuilt multi-call binary to use as is (the GPU machine, which has no Go toolchain)."""
COMPONENTS = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubelet", "kubectl", "kube-proxy")
_KEYED_FILES = ("go.mod", "go.sum", "main.go")
BUILD_TIMEOUT_S = 3600.0

Progress = Callable[[str], None]


class BuildError(GpuzombieError):
    """The binary could not be found or built; one line."""


@dataclass(frozen=True)
class KubeSource:
    """The Go module that builds the binary, and the release it pins."""

    directory: Path

    @classmethod
    def locate(cls) -> KubeSource:
        env = os.environ.get(KUBE_SOURCE_ENV)
        directory = Path(env) if env else Path(__file__).resolve().parents[3] / "go" / "kube"
        if not (directory / "go.mod").is_file():
            raise BuildError(
                f"no go/kube module at {directory}: cluster build needs the gpuzombie clone (or {KUBE_SOURCE_ENV})"
            )
        return cls(directory)

    @property
    def kubernetes_version(self) -> str:
        """The k8s.io/kubernetes release go.mod requires (``v1.37.2``)."""
        match = re.search(
            r"^\s*(?:require\s+)?k8s\.io/kubernetes\s+(v\S+)", (self.directory / "go.mod").read_text(), re.M
        )
        if not match:
            raise BuildError(f"{self.directory / 'go.mod'} requires no k8s.io/kubernetes release")
        return match.group(1)

    def ldflags(self) -> str:
        version = self.kubernetes_version
        major, minor = version.lstrip("v").split(".")[:2]
        stamps = {
            "k8s.io/component-base/version.gitVersion": version,
            "k8s.io/component-base/version.gitMajor": major,
            "k8s.io/component-base/version.gitMinor": minor,
            "k8s.io/component-base/version.gitTreeState": "clean",
            "k8s.io/client-go/pkg/version.gitVersion": version,
        }
        return " ".join(["-s", "-w", *(f"-X {k}={v}" for k, v in stamps.items())])

    def cache_key(self, go_version: str) -> str:
        digest = hashlib.sha256()
        for name in _KEYED_FILES:
            digest.update(name.encode() + b"\0" + (self.directory / name).read_bytes() + b"\0")
        digest.update(go_version.encode() + b"\0" + self.ldflags().encode())
        return digest.hexdigest()[:20]


def cache_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "gpuzombie" / "kube"


def go_binary() -> str:
    found = shutil.which("go") or next(
        (p for p in ("/usr/local/go/bin/go", "/usr/lib/go/bin/go") if os.path.isfile(p)), None
    )
    if not found:
        raise BuildError("no Go toolchain (go) on PATH: install Go 1.26 or set " + KUBE_BINARY_ENV)
    return found


def go_version(go: str) -> str:
    done = subprocess.run([go, "env", "GOVERSION"], capture_output=True, text=True, timeout=60, check=False)
    if done.returncode != 0:
        raise BuildError(f"go env GOVERSION failed: {done.stderr.strip()[-200:]}")
    return done.stdout.strip()


def _dependency_count(go: str, source: KubeSource, env: dict[str, str]) -> int:
    """How many packages the build compiles when nothing is cached (the progress line's total)."""
    done = subprocess.run(
        [go, "list", "-deps", "-f", "{{if not .Standard}}x{{end}}", "."],
        cwd=source.directory,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    return done.stdout.count("x") if done.returncode == 0 else 0


def build(source: KubeSource, output: Path, progress: Progress, *, timeout: float = BUILD_TIMEOUT_S) -> None:
    """``go build`` the binary into ``output`` (atomically), reporting the packages compiled."""
    go = go_binary()
    env = dict(os.environ, CGO_ENABLED="0", GOFLAGS="-mod=readonly -buildvcs=false")
    total = _dependency_count(go, source, env)
    output.parent.mkdir(parents=True, exist_ok=True)
    partial = output.with_suffix(".partial")
    argv = [go, "build", "-v", "-trimpath", "-ldflags", source.ldflags(), "-o", str(partial), "."]
    started = time.monotonic()
    process = subprocess.Popen(
        argv, cwd=source.directory, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )
    assert process.stderr is not None
    compiled, errors = 0, []
    last = 0.0
    for line in process.stderr:
        line = line.rstrip()
        if re.fullmatch(r"[\w.\-/~]+", line):  # -v names each package as it is compiled
            compiled += 1
        else:
            errors.append(line)
        now = time.monotonic()
        if now - last >= 2 or compiled == total:
            last = now
            of = f"/{total}" if total else ""
            progress(f"building kube {source.kubernetes_version}: {compiled}{of} packages, {now - started:.0f} s")
        if now - started > timeout:
            process.kill()
            raise BuildError(f"go build ran past {timeout:.0f} s")
    if process.wait() != 0:
        partial.unlink(missing_ok=True)
        raise BuildError(f"go build failed: {' | '.join(errors[-3:])[-400:]}")
    partial.rename(output)


def ensure_binary(progress: Progress) -> Path:
    """The multi-call binary: the one named by GPUZOMBIE_KUBE_BINARY, the cached build, or a new
    build (minutes, cold) cached for the next call."""
    prebuilt = os.environ.get(KUBE_BINARY_ENV)
    if prebuilt:
        if not os.access(prebuilt, os.X_OK):
            raise BuildError(f"{KUBE_BINARY_ENV}={prebuilt} is not an executable file")
        return Path(prebuilt)
    source = KubeSource.locate()
    go = go_binary()
    binary = cache_root() / source.cache_key(go_version(go)) / "kube"
    if binary.is_file():
        return binary
    build(source, binary, progress)
    return binary
