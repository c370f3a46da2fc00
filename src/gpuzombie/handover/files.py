"""The gate's two files, each opened so that no path can make it block, follow a link or overwrite
what is not its own (issue 36, items 2 and 3): the termination message it writes for the kubelet,
and the recorded NVML snapshot it reads in the lab (``--nvml-standin``).

Standard library only: both run in the zipapp (``python3 -S -I preflight.pyz``).
"""

from __future__ import annotations

import errno
import os
import stat

STANDIN_LIMIT = 1 << 20
"""The most bytes of a stand-in snapshot read: a recorded 8-GPU node with its processes is a few KiB."""

_READ_FLAGS = os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOCTTY
_WRITE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOCTTY | os.O_NOFOLLOW


class RefusedFile(OSError):
    """A path the gate will not read or write: not a regular file, too large, or not its own to replace."""

    def __init__(self, path: str, why: str) -> None:
        super().__init__(errno.EINVAL, why, path)


def _kind(mode: int) -> str:
    return f"not a regular file ({stat.filemode(mode)})"


def read_bounded(path: str, limit: int = STANDIN_LIMIT) -> bytes:
    """The bytes of the regular file at ``path`` (a link to one is followed), at most ``limit``.

    Opened ``O_NONBLOCK`` and checked with ``fstat`` before a byte is read: a FIFO opens at once and is
    refused, as are a device (``/dev/zero``), a socket and a directory; a longer file is refused
    after ``limit + 1`` bytes. Raises OSError (RefusedFile for those)."""
    fd = os.open(path, _READ_FLAGS)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise RefusedFile(path, _kind(info.st_mode))
        chunks, size = [], 0
        while size <= limit:
            chunk = os.read(fd, limit + 1 - size)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    finally:
        os.close(fd)
    if size > limit:
        raise RefusedFile(path, f"larger than {limit} bytes")
    return b"".join(chunks)


def write_message(path: str, text: str) -> None:
    """Write ``text`` to ``path`` as the kubelet's terminationMessagePath is meant to be written.

    The kubelet makes that file itself (empty, 0666) and mounts it into the container, so the gate
    writes into a regular file and nothing else: a symlink is not followed (``O_NOFOLLOW``), a FIFO
    without a reader is refused at open (``O_NONBLOCK``: ENXIO) and one with a reader after it, a
    device, a socket or a directory after ``fstat``. A file is made when none is there; one that
    already holds bytes is replaced only when the gate owns it (its effective uid) and it has no
    other link, else refused: a hard link to another file is never truncated. Raises OSError
    (RefusedFile for those)."""
    try:
        before = os.lstat(path)
    except FileNotFoundError:
        before = None
    if before is not None and not stat.S_ISREG(before.st_mode):  # refused before an open can act on it
        raise RefusedFile(path, _kind(before.st_mode))
    fd = os.open(path, _WRITE_FLAGS, 0o644)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise RefusedFile(path, _kind(info.st_mode))
        if info.st_size:
            if info.st_uid != os.geteuid() or info.st_nlink != 1:
                raise RefusedFile(path, "holds bytes and is not the gate's own file to replace")
            os.ftruncate(fd, 0)
        data = text.encode("utf-8", "replace")
        while data:
            data = data[os.write(fd, data) :]
    finally:
        os.close(fd)
