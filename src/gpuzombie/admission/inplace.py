"""``gpuzombie webhook --patch --in-place``: manifests read from the tree they were given and their
fix written back into it, as a GitOps bot runs it on pull requests whose files it does not trust.

- **The tree.** A path inside the working directory belongs to the working directory's tree; a
  path outside it is taken as written up to its directory (a directory argument: itself). Below
  that, no symbolic link is followed, neither the file nor a directory on its way: each directory
  is opened with ``O_NOFOLLOW`` from its parent's descriptor, the file too. A link is skipped, named
  with why; so a pull request that adds ``x.yaml -> /etc/kubernetes/manifests/y.yaml`` (or
  ``d -> /etc/kubernetes``) never has a file outside the checkout read or written. A link whose
  target is read in the same run under its own name (a file given or walked, a directory under
  the one walked) is ``covered``: nothing is left unfixed by skipping it.
- **Only regular files** are opened (a FIFO or a device is skipped, never opened), and read as
  bytes, so CRLF line ends come back as they were.
- **Written as it was.** A file is replaced by one written beside it (a hidden temporary name in the
  same directory) with its owner, group and mode, flushed to disk, then renamed over it. A file
  is not written, and named with why, when it is read-only (no write bit, or not writable by this
  user), has other hard links (a rename splits them; writing in place would change the file
  under its other names, which may be outside the tree), or its owner cannot be kept (not root).
- **All or nothing, then say.** Every replacement is written and checked before any file is
  replaced: a file changed since it was read (inode, size, mtime, ctime or content), or a
  replacement that cannot be written, replaces nothing. Then each file is checked again and
  renamed; a failure there (rare: the check or the rename) stops, naming what was written.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import os
import pathlib
import secrets
import stat
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field

from gpuzombie.errors import GpuzombieError

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC


@dataclass(frozen=True)
class Manifest:
    """One file read from its tree: where (``root``, then ``parts`` below it), its text and what it
    was when read."""

    shown: str
    root: str
    parts: tuple[str, ...]
    text: str
    digest: bytes
    """The SHA-256 of its bytes."""
    identity: tuple[int, int, int, int, int]
    """(device, inode, size, mtime ns, ctime ns)."""
    mode: int
    uid: int
    gid: int
    links: int

    @classmethod
    def of_text(cls, shown: str, text: str) -> Manifest:
        """A manifest that is no file (stdin): nothing to write back."""
        return cls(shown, "", (), text, b"", (0, 0, 0, 0, 0), 0, 0, 0, 0)


@dataclass(frozen=True)
class Skipped:
    shown: str
    why: str
    covered: bool = False
    """What it names is read in this run under its own name (a symbolic link to another input)."""


@dataclass
class WriteBack:
    """What ``write_back`` did: the files replaced, the ones it would not write, and the error that
    stopped it (then nothing was replaced, or only ``written``)."""

    written: list[str] = field(default_factory=list)
    skipped: list[Skipped] = field(default_factory=list)
    error: str | None = None


def _identity(st: os.stat_result) -> tuple[int, int, int, int, int]:
    return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns


def _reason(exc: OSError) -> str:
    return exc.strerror or str(exc)


def _trees() -> list[str]:
    """The working directory, as the kernel and as the shell name it."""
    here = os.getcwd()
    names = [here]
    logical = os.environ.get("PWD", "")
    with contextlib.suppress(OSError):
        if os.path.isabs(logical) and logical != here and os.path.samefile(logical, here):
            names.append(logical)
    return names


def locate(path: str, *, directory: bool) -> tuple[str, tuple[str, ...]]:
    """(the directory trusted as given, the names below it, none a link to be followed) for
    ``path``: the working directory for a path inside it, else the path's own directory (a
    directory argument: the path itself)."""
    absolute = os.path.abspath(path)
    for tree in _trees():
        if absolute == tree or absolute.startswith(tree.rstrip(os.sep) + os.sep):
            below = os.path.relpath(absolute, tree)
            return tree, () if below == "." else tuple(below.split(os.sep))
    if directory:
        return absolute, ()
    return os.path.dirname(absolute), (os.path.basename(absolute),)


class _Link(Exception):
    """A name on the way is a symbolic link (or a link was swapped in): not followed."""

    def __init__(self, where: str) -> None:
        super().__init__(where)
        self.where = where


def _open_dir(root: str, parts: Sequence[str]) -> int:
    """A descriptor of ``root``/``parts``, no link among ``parts`` followed (raises _Link)."""
    fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        for i, name in enumerate(parts):
            try:
                child = os.open(name, _DIR_FLAGS, dir_fd=fd)
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.ENOTDIR) and _is_link(name, fd):
                    raise _Link(os.path.join(*parts[: i + 1])) from exc
                raise
            os.close(fd)
            fd = child
    except BaseException:
        os.close(fd)
        raise
    return fd


def _link_why(link: _Link, parts: Sequence[str]) -> str:
    if link.where == os.path.join(*parts):
        return "a symbolic link: not followed"
    return f"a directory on its way, {link.where}, is a symbolic link: not followed"


_FILE_KINDS = {
    stat.S_IFIFO: "a FIFO",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
    stat.S_IFSOCK: "a socket",
    stat.S_IFDIR: "a directory",
}


def not_regular(mode: int) -> str:
    """Why a file of ``mode`` is not read as a manifest: ``"a FIFO, not a regular file"``."""
    return f"{_FILE_KINDS.get(stat.S_IFMT(mode), 'not a file')}, not a regular file"


def _is_link(name: str, dir_fd: int) -> bool:
    try:
        return stat.S_ISLNK(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode)
    except OSError:
        return False


def _read_at(dir_fd: int, name: str, shown: str, max_bytes: int) -> tuple[bytes, os.stat_result] | Skipped:
    """The bytes of the regular file ``name`` in ``dir_fd`` and its status; Skipped for a link or
    anything else but a regular file (never opened: a device may act on an open)."""
    try:
        before = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except OSError as exc:
        raise GpuzombieError(f"cannot read {shown}: {_reason(exc)}") from exc
    if stat.S_ISLNK(before.st_mode):
        return Skipped(shown, "a symbolic link: not followed")
    if not stat.S_ISREG(before.st_mode):
        return Skipped(shown, not_regular(before.st_mode))
    if before.st_size > max_bytes:
        raise GpuzombieError(f"{shown}: over {max_bytes // 2**20} MiB, not a manifest")
    try:
        fd = os.open(name, _FILE_FLAGS, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            return Skipped(shown, "a symbolic link: not followed")
        raise GpuzombieError(f"cannot read {shown}: {_reason(exc)}") from exc
    try:
        st = os.fstat(fd)
        if (st.st_dev, st.st_ino) != (before.st_dev, before.st_ino) or not stat.S_ISREG(st.st_mode):
            return Skipped(shown, "replaced while it was opened: not read")
        chunks = []
        left = max_bytes + 1
        while left > 0 and (chunk := os.read(fd, min(left, 1 << 20))):
            chunks.append(chunk)
            left -= len(chunk)
    except OSError as exc:
        raise GpuzombieError(f"cannot read {shown}: {_reason(exc)}") from exc
    finally:
        os.close(fd)
    data = b"".join(chunks)
    if len(data) > max_bytes:
        raise GpuzombieError(f"{shown}: over {max_bytes // 2**20} MiB, not a manifest")
    return data, st


def _decode(data: bytes, shown: str) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise GpuzombieError(f"cannot read {shown}: {exc}") from exc


def read_tree(
    arguments: Sequence[str], suffixes: Collection[str], max_bytes: int
) -> tuple[list[Manifest], list[Skipped]]:
    """Each argument (a file, or a directory's files ending in ``suffixes``, recursively), read as
    its tree allows; what was skipped, with why. Raises GpuzombieError (exit 2) for what cannot be
    read (a file that does not exist, not UTF-8, too large)."""
    manifests: list[Manifest] = []
    skipped: list[Skipped] = []
    walked: list[str] = []
    for argument in arguments:
        directory = os.path.isdir(argument)  # a link to one is found a link below, not walked
        root, parts = locate(argument, directory=directory)
        items = (
            _walk(root, parts, argument, suffixes, max_bytes)
            if directory
            else [_read(root, parts, argument, max_bytes)]
        )
        for item in items:
            if isinstance(item, Skipped):
                skipped.append(item)
            else:
                manifests.append(item)
        if directory and not any(s.shown == argument for s in skipped):
            walked.append(os.path.realpath(argument))
    read = {m.identity[:2] for m in manifests}
    return manifests, [_covered(s, read, walked) for s in skipped]


def _read(root: str, parts: tuple[str, ...], shown: str, max_bytes: int) -> Manifest | Skipped:
    try:
        dir_fd = _open_dir(root, parts[:-1])
    except _Link as link:
        return Skipped(shown, _link_why(link, parts))
    except OSError as exc:
        raise GpuzombieError(f"cannot read {shown}: {_reason(exc)}") from exc
    try:
        got = _read_at(dir_fd, parts[-1], shown, max_bytes)
    finally:
        os.close(dir_fd)
    if isinstance(got, Skipped):
        return got
    data, st = got
    return Manifest(
        shown=shown,
        root=root,
        parts=parts,
        text=_decode(data, shown),
        digest=hashlib.sha256(data).digest(),
        identity=_identity(st),
        mode=stat.S_IMODE(st.st_mode),
        uid=st.st_uid,
        gid=st.st_gid,
        links=st.st_nlink,
    )


def _walk(
    root: str, parts: tuple[str, ...], shown: str, suffixes: Collection[str], max_bytes: int
) -> list[Manifest | Skipped]:
    """The files of a directory ending in ``suffixes``, sorted by path, read; a link among them or
    to a directory, or what is not a regular file, skipped."""
    found: list[tuple[str, ...]] = []
    pending = [parts]
    while pending:
        here = pending.pop()
        try:
            fd = _open_dir(root, here)
        except _Link as link:
            if here == parts:  # the argument, or a directory on its way
                return [Skipped(shown, _link_why(link, here))]
            found.append(here)  # made a link since it was listed: read as one, skipped
            continue
        except OSError as exc:
            raise GpuzombieError(f"cannot read {pathlib.PurePath(shown, *here[len(parts) :])}: {_reason(exc)}") from exc
        try:
            with os.scandir(fd) as entries:  # classified while ``fd`` is open: a DirEntry may stat through it
                for entry in entries:
                    below = (*here, entry.name)
                    if entry.is_dir(follow_symlinks=False):
                        pending.append(below)
                    elif os.path.splitext(entry.name)[1] in suffixes:
                        found.append(below)
                    elif entry.is_symlink() and os.path.isdir(os.path.join(root, *below)):
                        found.append(below)  # a link to a directory: named, not walked
        finally:
            os.close(fd)
    return [
        _read(root, below, str(pathlib.PurePath(shown, *below[len(parts) :])), max_bytes) for below in sorted(found)
    ]


def _covered(skipped: Skipped, read: set[tuple[int, int]], walked: list[str]) -> Skipped:
    """``skipped`` marked covered when it is a link to a file read here, or to a directory under
    one walked here."""
    if "symbolic link" not in skipped.why:
        return skipped
    try:
        target = os.stat(skipped.shown)
    except OSError:
        return skipped
    if stat.S_ISDIR(target.st_mode):
        real = os.path.realpath(skipped.shown)
        inside = any(real == w or real.startswith(w.rstrip(os.sep) + os.sep) for w in walked)
        return Skipped(skipped.shown, skipped.why, covered=inside)
    return Skipped(skipped.shown, skipped.why, covered=(target.st_dev, target.st_ino) in read)


def _refusal(manifest: Manifest) -> str | None:
    """Why ``manifest``'s file is not to be replaced, known from when it was read."""
    if manifest.mode & 0o222 == 0:
        return f"read-only (mode {manifest.mode:04o}): not written"
    if manifest.links > 1:
        return (
            f"has {manifest.links} hard links: replacing it would split them, writing into it would "
            "change it under its other names: not written"
        )
    return None


def _unchanged(manifest: Manifest, dir_fd: int, max_bytes: int) -> str | None:
    """None when ``manifest``'s file is as it was read; else what changed."""
    name = manifest.parts[-1]
    try:
        got = _read_at(dir_fd, name, manifest.shown, max_bytes)
    except GpuzombieError as exc:
        return str(exc)
    if isinstance(got, Skipped):
        return f"{manifest.shown} changed since it was read ({got.why})"
    data, st = got
    if _identity(st) != manifest.identity or hashlib.sha256(data).digest() != manifest.digest:
        return f"{manifest.shown} changed since it was read (edited during the run?)"
    return None


@dataclass
class _Prepared:
    manifest: Manifest
    temporary: str


def write_back(changes: Sequence[tuple[Manifest, str]], max_bytes: int) -> WriteBack:
    """Replace each manifest's file with its new text, as the module says."""
    out = WriteBack()
    prepared: list[_Prepared] = []
    try:
        for manifest, text in changes:
            refusal = _refusal(manifest)
            if refusal is not None:
                out.skipped.append(Skipped(manifest.shown, refusal))
                continue
            outcome = _prepare(manifest, text.encode("utf-8"), max_bytes)
            if isinstance(outcome, Skipped):
                out.skipped.append(outcome)
            elif isinstance(outcome, str):
                out.error = f"{outcome}; nothing was written"
                return out
            else:
                prepared.append(outcome)
        for i, ready in enumerate(prepared):
            problem = _replace(ready, max_bytes)
            if problem is not None:
                written = ", ".join(out.written) or "none"
                out.error = f"{problem}; written before it: {written}; not written: " + ", ".join(
                    p.manifest.shown for p in prepared[i:]
                )
                return out
            out.written.append(ready.manifest.shown)
    finally:
        for ready in prepared:
            if ready.manifest.shown not in out.written:
                _remove(ready)
    return out


def _prepare(manifest: Manifest, data: bytes, max_bytes: int) -> _Prepared | Skipped | str:
    """The replacement written beside the file (owner, mode, synced); Skipped when the file cannot be
    written or its owner cannot be kept; a line when the file changed or the replacement cannot be
    written."""
    try:
        dir_fd = _open_dir(manifest.root, manifest.parts[:-1])
    except _Link as link:
        return f"{manifest.shown} changed since it was read ({link.where} is a symbolic link now)"
    except OSError as exc:
        return f"cannot write {manifest.shown}: {_reason(exc)}"
    temporary = ""
    try:
        changed = _unchanged(manifest, dir_fd, max_bytes)
        if changed is not None:
            return changed
        if not os.access(manifest.parts[-1], os.W_OK, dir_fd=dir_fd, effective_ids=True, follow_symlinks=False):
            why = "permissions, a read-only mount or the immutable flag"
            return Skipped(manifest.shown, f"not writable by uid {os.geteuid()} ({why}): not written")
        fd, temporary = _create(dir_fd, manifest.parts[-1])
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
            try:
                os.fchown(fd, manifest.uid, manifest.gid)
            except PermissionError:
                os.unlink(temporary, dir_fd=dir_fd)
                return Skipped(
                    manifest.shown,
                    f"its owner {manifest.uid}:{manifest.gid} cannot be kept by uid {os.geteuid()}: not written",
                )
            os.fchmod(fd, manifest.mode)  # after the chown, which clears set-id bits
            os.fsync(fd)
        finally:
            os.close(fd)
    except OSError as exc:
        with contextlib.suppress(OSError):
            if temporary:
                os.unlink(temporary, dir_fd=dir_fd)
        return f"cannot write {manifest.shown}: {_reason(exc)}"
    finally:
        os.close(dir_fd)
    return _Prepared(manifest, temporary)


def _create(dir_fd: int, name: str) -> tuple[int, str]:
    """A new file beside ``name`` (mode 0600, a hidden name that no manifest suffix ends), and its name."""
    while True:
        temporary = f".{name[:200]}.gpuzombie-{secrets.token_hex(4)}"
        try:
            flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
            return os.open(temporary, flags, 0o600, dir_fd=dir_fd), temporary
        except FileExistsError:
            continue


def _replace(ready: _Prepared, max_bytes: int) -> str | None:
    """Rename the replacement over the file, if the file is still as it was read; else why not."""
    manifest = ready.manifest
    try:
        dir_fd = _open_dir(manifest.root, manifest.parts[:-1])
    except (_Link, OSError) as exc:
        why = f"{exc.where} is a symbolic link now" if isinstance(exc, _Link) else _reason(exc)
        return f"cannot write {manifest.shown}: {why}"
    try:
        changed = _unchanged(manifest, dir_fd, max_bytes)
        if changed is not None:
            return changed
        os.replace(ready.temporary, manifest.parts[-1], src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        os.fsync(dir_fd)
    except OSError as exc:
        return f"cannot write {manifest.shown}: {_reason(exc)}"
    finally:
        os.close(dir_fd)
    return None


def _remove(ready: _Prepared) -> None:
    with contextlib.suppress(OSError, _Link):
        dir_fd = _open_dir(ready.manifest.root, ready.manifest.parts[:-1])
        try:
            os.unlink(ready.temporary, dir_fd=dir_fd)
        finally:
            os.close(dir_fd)
