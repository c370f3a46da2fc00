"""The multi-call Kubernetes binary (``go/kube``), containerd 2's three commands
(``go/containerd``) and the NRI plugin (``go/nri``): built with the Go toolchain from the pinned modules, stripped, and cached
outside the tree under a key of everything that decides their bytes (go.mod, go.sum, main.go, the
Go version, the flags), so that a second ``cluster up`` costs seconds."""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar, Self

from gpuzombie.errors import GpuzombieError

KUBE_BINARY_ENV = "GPUZOMBIE_KUBE_BINARY"
"""A prebuilt multi-call binary to use as is (the GPU machine, which has no Go toolchain)."""
COMPONENTS = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kubelet", "kubectl", "kube-proxy")
_MODULE_FILES = ("go.mod", "go.sum")
"""What pins a Go module's dependencies: in every cache key."""
_KEYED_FILES = (*_MODULE_FILES, "main.go")
BUILD_TIMEOUT_S = 3600.0

Progress = Callable[[str], None]


def _progress_every() -> float:
    """Seconds between progress lines: a terminal's line is rewritten often; a CI log gets one in 30 s."""
    return 2.0 if sys.stderr.isatty() else 30.0


class BuildError(GpuzombieError):
    """The binary could not be found or built; one line."""


def _module_directory(name: str) -> Path:
    """go/<name> of the clone this package runs from, or the directory GPUZOMBIE_<NAME>_SOURCE names."""
    env = f"GPUZOMBIE_{name.upper().replace('-', '_')}_SOURCE"
    given = os.environ.get(env)
    directory = Path(given) if given else Path(__file__).resolve().parents[3] / "go" / name
    if not (directory / "go.mod").is_file():
        raise BuildError(f"no go/{name} module at {directory}: the build needs the gpuzombie clone (or {env})")
    return directory


def _required_version(directory: Path, module: str) -> str:
    """The release of ``module`` that ``directory``'s go.mod requires."""
    match = re.search(rf"^\s*(?:require\s+)?{re.escape(module)}\s+(v\S+)", (directory / "go.mod").read_text(), re.M)
    if not match:
        raise BuildError(f"{directory / 'go.mod'} requires no {module} release")
    return match.group(1)


@dataclass(frozen=True)
class _GoSource:
    """A module of go/ that a binary is built from, found as ``_module_directory`` finds one."""

    directory: Path
    NAME: ClassVar[str]
    """go/<NAME>."""

    @classmethod
    def locate(cls) -> Self:
        return cls(_module_directory(cls.NAME))


@dataclass(frozen=True)
class KubeSource(_GoSource):
    """The Go module that builds the binary, and the release it pins."""

    NAME = "kube"

    @property
    def kubernetes_version(self) -> str:
        """The k8s.io/kubernetes release go.mod requires (``v1.37.2``)."""
        return _required_version(self.directory, "k8s.io/kubernetes")

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
        return _cache_key([self.directory / n for n in _KEYED_FILES], f"{go_version}\0{self.ldflags()}")


def _cache_key(files: list[Path], settings: str) -> str:
    """A cache directory's name: the files' names and bytes, then the toolchain and flags."""
    digest = hashlib.sha256()
    for path in files:
        digest.update(path.name.encode() + b"\0" + path.read_bytes() + b"\0")
    digest.update(settings.encode())
    return digest.hexdigest()[:20]


def _prebuilt(env: str) -> Path | None:
    """The executable ``env`` names, or None when it is unset."""
    given = os.environ.get(env)
    if given and not os.access(given, os.X_OK):
        raise BuildError(f"{env}={given} is not an executable file")
    return Path(given) if given else None


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


def _list_deps(go: str, directory: Path, env: dict[str, str], *args: str) -> str | None:
    """``go list -deps`` of ``args`` (flags, then packages) in ``directory``; None when it fails: a
    progress total is a nicety, never a reason to stop the build."""
    done = subprocess.run(
        [go, "list", "-deps", *args],
        cwd=directory,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    return done.stdout if done.returncode == 0 else None


def _dependency_count(go: str, directory: Path, env: dict[str, str]) -> int:
    """How many packages the build compiles when nothing is cached (the progress line's total)."""
    listed = _list_deps(go, directory, env, "-f", "{{if not .Standard}}x{{end}}", ".")
    return listed.count("x") if listed is not None else 0


def build(source: KubeSource, output: Path, progress: Progress, *, timeout: float = BUILD_TIMEOUT_S) -> None:
    """``go build`` the binary into ``output`` (atomically), reporting the packages compiled."""
    _build_main(
        source.directory, source.ldflags(), output, f"building kube {source.kubernetes_version}", progress, timeout
    )


def _build_main(directory: Path, ldflags: str, output: Path, label: str, progress: Progress, timeout: float) -> None:
    """``go build`` the main package of ``directory`` into ``output``, whole or not at all."""
    go = go_binary()
    env = dict(os.environ, CGO_ENABLED="0", GOFLAGS="-mod=readonly -buildvcs=false")
    total = _dependency_count(go, directory, env)
    output.parent.mkdir(parents=True, exist_ok=True)
    partial = output.with_suffix(".partial")
    argv = [go, "build", "-v", "-trimpath", "-ldflags", ldflags, "-o", str(partial), "."]
    try:
        _go_build(argv, directory, env, total, label, progress, timeout)
    except BuildError:
        partial.unlink(missing_ok=True)
        raise
    partial.rename(output)


def _go_build(
    argv: list[str],
    cwd: Path,
    env: dict[str, str],
    total: int,
    label: str,
    progress: Progress,
    timeout: float,
    *,
    compiled_before: int = 0,
) -> int:
    """Run one ``go build -v``, a progress line every 2 s counting the packages it compiles; the
    count (with ``compiled_before``) is returned, a failure raised with go's last lines."""
    started = time.monotonic()
    process = subprocess.Popen(argv, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    assert process.stderr is not None
    compiled, errors = compiled_before, []
    last = 0.0
    for line in process.stderr:
        line = line.rstrip()
        if re.fullmatch(r"[\w.\-/~]+", line):  # -v names each package as it is compiled
            compiled += 1
        else:
            errors.append(line)
        now = time.monotonic()
        if now - last >= _progress_every() or compiled == total:
            last = now
            of = f"/{total}" if total else ""
            progress(f"{label}: {compiled}{of} packages, {now - started:.0f} s")
        if now - started > timeout:
            process.kill()
            process.wait()
            raise BuildError(f"go build ran past {timeout:.0f} s")
    if process.wait() != 0:
        raise BuildError(f"go build failed: {' | '.join(errors[-3:])[-400:]}")
    return compiled


def ensure_binary(progress: Progress) -> Path:
    """The multi-call binary: the one named by GPUZOMBIE_KUBE_BINARY, the cached build, or a new
    build (minutes, cold) cached for the next call."""
    prebuilt = _prebuilt(KUBE_BINARY_ENV)
    if prebuilt:
        return prebuilt
    source = KubeSource.locate()
    go = go_binary()
    binary = cache_root() / source.cache_key(go_version(go)) / "kube"
    if binary.is_file():
        return binary
    build(source, binary, progress)
    return binary


# --- containerd 2 (go/containerd) ------------------------------------------------------------------

CONTAINERD_BINARIES_ENV = "GPUZOMBIE_CONTAINERD_BINARIES"
"""A directory of prebuilt containerd, containerd-shim-runc-v2 and ctr to use as they are."""
CONTAINERD_MODULE = "github.com/containerd/containerd/v2"
CONTAINERD_COMMANDS = ("containerd", "containerd-shim-runc-v2", "ctr")
"""Three binaries, not one multi-call: the shim re-executes itself (os.Executable) to daemonize."""
_CONTAINERD_TAGS = "urfave_cli_no_docs"
_SHIM_TAGS = "urfave_cli_no_docs,no_grpc"
"""As containerd's Makefile builds them: no generated CLI docs; the shim without gRPC (ttrpc only)."""


@dataclass(frozen=True)
class ContainerdSource(_GoSource):
    """The Go module that builds the unmodified upstream containerd commands, and its release."""

    NAME = "containerd"

    @property
    def version(self) -> str:
        """The containerd release go.mod requires (``v2.4.2``)."""
        return _required_version(self.directory, CONTAINERD_MODULE)

    def ldflags(self) -> str:
        return f"-s -w -X {CONTAINERD_MODULE}/version.Version={self.version}"

    def cache_key(self, go_version: str) -> str:
        files = [self.directory / n for n in _MODULE_FILES]
        return _cache_key(files, f"{go_version}\0{self.ldflags()}\0{_CONTAINERD_TAGS}\0{_SHIM_TAGS}")


def containerd_cache_root() -> Path:
    return cache_root().parent / "containerd"


def _package_paths(go: str, directory: Path, env: dict[str, str], tags: str, packages: list[str]) -> set[str]:
    """Every package the build of ``packages`` compiles when nothing is cached, the standard
    library's included (with -trimpath an empty GOCACHE compiles it too, and -v names it)."""
    listed = _list_deps(go, directory, env, "-tags", tags, "-f", "{{.ImportPath}}", *packages)
    return set(listed.split()) if listed is not None else set()


def build_containerd(
    source: ContainerdSource, output: Path, progress: Progress, *, timeout: float = BUILD_TIMEOUT_S
) -> None:
    """``go build`` the three commands into the directory ``output`` (made whole or not at all)."""
    go = go_binary()
    env = dict(os.environ, CGO_ENABLED="0", GOFLAGS="-mod=readonly -buildvcs=false")
    main = [f"{CONTAINERD_MODULE}/cmd/{c}" for c in ("containerd", "ctr")]
    shim = [f"{CONTAINERD_MODULE}/cmd/containerd-shim-runc-v2"]
    total = len(
        _package_paths(go, source.directory, env, _CONTAINERD_TAGS, main)
        | _package_paths(go, source.directory, env, _SHIM_TAGS, shim)
    )
    partial = output.with_name(output.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    label = f"building containerd {source.version}"
    began = time.monotonic()
    try:
        compiled = 0
        for tags, packages in ((_CONTAINERD_TAGS, main), (_SHIM_TAGS, shim)):
            argv = [go, "build", "-v", "-trimpath", "-tags", tags, "-ldflags", source.ldflags(), "-o", f"{partial}/"]
            left = timeout - (time.monotonic() - began)
            compiled = _go_build(
                [*argv, *packages], source.directory, env, total, label, progress, left, compiled_before=compiled
            )
        missing = [c for c in CONTAINERD_COMMANDS if not (partial / c).is_file()]
        if missing:
            raise BuildError(f"go build made no {', '.join(missing)}")
    except BuildError:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    shutil.rmtree(output, ignore_errors=True)
    partial.rename(output)


def ensure_containerd(progress: Progress) -> Path:
    """The directory of containerd 2's three binaries: the one named by
    GPUZOMBIE_CONTAINERD_BINARIES, the cached build, or a new build (minutes, cold) cached."""
    prebuilt = os.environ.get(CONTAINERD_BINARIES_ENV)
    if prebuilt:
        missing = [c for c in CONTAINERD_COMMANDS if not os.access(os.path.join(prebuilt, c), os.X_OK)]
        if missing:
            raise BuildError(f"{CONTAINERD_BINARIES_ENV}={prebuilt} has no executable {', '.join(missing)}")
        return Path(prebuilt)
    source = ContainerdSource.locate()
    go = go_binary()
    directory = containerd_cache_root() / source.cache_key(go_version(go))
    if all((directory / c).is_file() for c in CONTAINERD_COMMANDS):
        return directory
    build_containerd(source, directory, progress)
    return directory


# --- the NRI plugin (go/nri) -----------------------------------------------------------------------

NRI_PLUGIN_ENV = "GPUZOMBIE_NRI_PLUGIN"
"""A prebuilt gpuzombie-nri to use as is."""
NRI_PLUGIN = "gpuzombie-nri"
_NRI_LDFLAGS = "-s -w"


@dataclass(frozen=True)
class NriSource(_GoSource):
    """The Go module of the NRI plugin: its go.mod, go.sum, Go files and the contract it embeds."""

    NAME = "nri"

    def keyed_files(self) -> list[Path]:
        sources = [p for p in self.directory.glob("*.go") if not p.name.endswith("_test.go")]
        return sorted([*(self.directory / n for n in _MODULE_FILES), self.directory / "contract.json", *sources])

    def cache_key(self, go_version: str) -> str:
        return _cache_key(self.keyed_files(), f"{go_version}\0{_NRI_LDFLAGS}")


def ensure_nri_plugin(progress: Progress) -> Path:
    """The plugin binary: the one named by GPUZOMBIE_NRI_PLUGIN, the cached build, or a new build
    (about a minute cold: NRI's stub, ttrpc, protobuf) cached in ~/.cache/gpuzombie/nri."""
    prebuilt = _prebuilt(NRI_PLUGIN_ENV)
    if prebuilt:
        return prebuilt
    source = NriSource.locate()
    go = go_binary()
    binary = cache_root().parent / "nri" / source.cache_key(go_version(go)) / NRI_PLUGIN
    if binary.is_file():
        return binary
    _build_main(source.directory, _NRI_LDFLAGS, binary, f"building {NRI_PLUGIN}", progress, BUILD_TIMEOUT_S)
    return binary


# --- tools of a module of their own (go/<name>: `tool` directives) --------------------------------

TOOL_BUILD_TIMEOUT_S = 1800.0


@dataclass(frozen=True)
class GoTool:
    """An unmodified upstream command named in a ``tool`` directive of ``go/<module>``'s go.mod,
    built stripped as its own Makefile builds it (``ldflags``) and cached under a key of go.mod,
    go.sum, the Go version and the flags."""

    module: str
    """The directory under go/ (kube-state-metrics, dra-example-driver)."""
    package: str
    """The command's import path."""
    binary: str
    ldflags: str = "-s -w"

    @property
    def directory(self) -> Path:
        return _module_directory(self.module)

    def required(self, module: str) -> str:
        """The release of ``module`` the tool's go.mod requires."""
        return _required_version(self.directory, module)

    def cache_key(self, go_version: str) -> str:
        return _cache_key([self.directory / n for n in _MODULE_FILES], f"{go_version}\0{self.ldflags}")


def ensure_tool(tool: GoTool, *, timeout: float = TOOL_BUILD_TIMEOUT_S) -> Path:
    """The tool's binary: cached, or built (minutes, cold) and cached for the next call."""
    go = go_binary()
    binary = cache_root().parent / tool.module / tool.cache_key(go_version(go)) / tool.binary
    if binary.is_file():
        return binary
    binary.parent.mkdir(parents=True, exist_ok=True)
    partial = binary.with_suffix(".partial")
    try:
        done = subprocess.run(
            [go, "build", "-trimpath", "-ldflags", tool.ldflags, "-o", str(partial), tool.package],
            cwd=tool.directory,
            env=dict(os.environ, CGO_ENABLED="0", GOFLAGS="-mod=readonly -buildvcs=false"),
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        raise BuildError(f"go build {tool.package} ran past {timeout:.0f} s") from exc
    if done.returncode != 0:
        raise BuildError(f"go build {tool.package} failed: {done.stderr.strip()[-400:]}")
    partial.rename(binary)
    return binary


DRA_EXAMPLE_DRIVER = GoTool(
    "dra-example-driver", "sigs.k8s.io/dra-example-driver/cmd/dra-example-kubeletplugin", "dra-example-kubeletplugin"
)
"""The DRA example driver's kubelet plugin (mock GPUs, no hardware): tests/kube/test_fence_kubernetes.py."""
