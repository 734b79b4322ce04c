"""Files replaced whole (a reader, or a process that starts after a kill, sees the old content or the new, never a
part), and whether a path still names an open file."""

from __future__ import annotations

import os


def write_atomically(path: str, data: bytes, mode: int = 0o600) -> None:
    """Write ``data`` to ``<path>.tmp`` (created with ``mode`` if new, truncated if left by a killed writer),
    then put it in place with ``os.replace``. No fsync: it survives a killed process, not a lost machine."""
    tmp = f"{path}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)
    os.replace(tmp, path)


def same_file(fd: int, path: str) -> bool:
    """Whether ``path`` still names the file open as ``fd``."""
    try:
        opened, named = os.fstat(fd), os.stat(path)
    except OSError:
        return False
    return (opened.st_dev, opened.st_ino) == (named.st_dev, named.st_ino)
